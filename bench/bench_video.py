"""Video benchmark: probe + poster CPU and peak RSS, preview transcode speed, photo latency meanwhile.

Run: ``python bench/bench_video.py`` (a few minutes on 2 cores; most of it is making the clips). It makes, with
PyAV (tests/videofactory.py, ``camera=True``: a panned textured scene with fresh noise in every frame, at phone
bitrates, about 12 Mbit/s for 1080p HEVC):

* a 30 s 1080p H.264 clip (1 s key frame interval, as phones record) and a 4K HEVC clip, and for each runs the
  worker's child (``python -m picpeak_lite.media.video inspect``) a few times, reading the child's own CPU time
  (user + system) and peak RSS from ``os.wait4``: everything the server pays for one video, including the
  child's start (Python + FFmpeg's libraries), whose share is measured on its own (``start_*``);
* the preview transcode (``transcode``, the lane's child at nice 19) of a 1080p HEVC clip to H.264/AAC, as
  seconds of video made per second of wall time (``x_realtime``);
* through the real server (``picpeak-lite serve``, as ``picpeak-lite bench`` runs it): 10 x 12 MP photos
  uploaded alone, then the same photos uploaded while the preview lane transcodes a 1080p HEVC clip, each
  photo's time from its own bytes to complete (p50 / p95), and how much of that second upload the transcode
  child spent stopped (state T in /proc), to show the lower lane gives the photos their cores.

Targets (issue 13): probe + poster <= 0.3 s CPU for 1080p H.264, <= 1 s for 4K HEVC, peak RSS <= 150 MB; the
transcode >= 1x real time; photo latency kept.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from tests import procs  # noqa: E402
from tests import videofactory as vf  # noqa: E402


def child(args: list[str]) -> tuple[float, float, int]:
    """(wall s, CPU s, peak RSS MB) of one child run, from the kernel's accounting of that child alone."""
    start = time.perf_counter()
    process = subprocess.Popen([sys.executable, "-m", "picpeak_lite.media.video", *args],
                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    _, status, usage = os.wait4(process.pid, 0)
    wall = time.perf_counter() - start
    assert os.waitstatus_to_exitcode(status) == 0, args
    return wall, usage.ru_utime + usage.ru_stime, usage.ru_maxrss // 1024


def inspect_figures(label: str, clip: Path, runs: int) -> str:
    results = [child(["inspect", str(clip), "1600"]) for _ in range(runs)]
    cpu = min(r[1] for r in results)
    rss = max(r[2] for r in results)
    return f"{label}_cpu_s={cpu:.3f} {label}_rss_mb={rss}"


def lane_figures(clip: Path, photos: list[Path], work: Path) -> str:
    """Photos uploaded alone, then during a transcode, through the real server; see the module's docstring."""
    from picpeak_lite.ops import bench

    server = bench.Server(work / "data")
    server.start()
    try:
        alone = bench.measure(server, photos)
        video = bench.measure(server, [clip])  # complete once probed and given its poster
        assert video.complete == 1, video.lines()
        deadline = time.monotonic() + 60
        while not (children := procs.children_running(server.pid, b"transcode")):
            assert time.monotonic() < deadline, "the preview lane did not start"
            time.sleep(0.01)
        child = children[0]
        states: list[str] = []
        stop = threading.Event()

        def sample() -> None:
            while not stop.wait(0.01):
                states.append(procs.state(child))

        sampler = threading.Thread(target=sample)
        sampler.start()
        try:
            during = bench.measure(server, photos)
        finally:
            stop.set()
            sampler.join()
        began = time.monotonic()
        while procs.state(child) != "gone":
            time.sleep(0.05)
        rest = time.monotonic() - began
    finally:
        server.stop()
    stopped = states.count("T") / max(1, len(states))
    return (f"photos_12mp_own_bytes_to_complete_p50_alone={alone.own_bytes_p50:.2f} "
            f"p95_alone={alone.own_bytes_p95:.2f} p50_during_transcode={during.own_bytes_p50:.2f} "
            f"p95_during_transcode={during.own_bytes_p95:.2f} transcode_stopped_share={stopped:.2f} "
            f"transcode_went_on_for_s={rest:.1f}")


def make_clips(d: Path, seconds: float) -> None:
    """In its own process (``--make``): the encoders' memory must not count in the children's peak RSS, which
    Linux carries over from the forking process."""
    vf.make_clip(d / "h264.mp4", width=1920, height=1080, seconds=seconds, audio=True, crf=25, gop=30, camera=True)
    vf.make_clip(d / "hevc4k.mov", codec="libx265", width=3840, height=2160, seconds=2, crf=25, gop=30, camera=True)
    vf.make_clip(d / "hevc1080.mov", codec="libx265", width=1920, height=1080, seconds=TRANSCODE_SECONDS,
                 audio=True, crf=25, gop=30, camera=True)


TRANSCODE_SECONDS = 10


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--seconds", type=float, default=30.0, help="length of the 1080p H.264 clip")
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--make", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.make:
        make_clips(Path(args.make), args.seconds)
        return
    with tempfile.TemporaryDirectory() as tmp:
        d = Path(tmp)
        made = time.perf_counter()
        subprocess.run([sys.executable, __file__, "--make", tmp, "--seconds", str(args.seconds)], check=True)
        h264, hevc4k, hevc = d / "h264.mp4", d / "hevc4k.mov", d / "hevc1080.mov"
        print(f"clips made in {time.perf_counter() - made:.0f} s: " + ", ".join(
            f"{clip.name} {clip.stat().st_size * 8 / 1e6 / length:.1f} Mbit/s"
            for clip, length in ((h264, args.seconds), (hevc4k, 2), (hevc, TRANSCODE_SECONDS))), file=sys.stderr)
        start = [child(["probe", "/dev/null"]) for _ in range(args.runs)]  # refused before FFmpeg loads
        line = [f"start_cpu_s={min(r[1] for r in start):.3f} start_rss_mb={max(r[2] for r in start)}",
                inspect_figures("h264_1080p_30s", h264, args.runs), inspect_figures("hevc_4k", hevc4k, args.runs)]
        upload_probe = [child(["probe", str(h264)]) for _ in range(args.runs)]
        line.append(f"upload_probe_h264_cpu_s={min(r[1] for r in upload_probe):.3f}")

        target = d / "preview.mp4"
        began = time.perf_counter()
        process = subprocess.Popen([sys.executable, "-m", "picpeak_lite.media.video", "transcode", str(hevc),
                                    str(target)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        _, status, usage = os.wait4(process.pid, 0)
        wall = time.perf_counter() - began
        assert os.waitstatus_to_exitcode(status) == 0 and target.exists()
        cpu = usage.ru_utime + usage.ru_stime
        line.append(f"transcode_1080p_hevc_to_h264_x_realtime={TRANSCODE_SECONDS / wall:.2f} "
                    f"transcode_cpu_s_per_video_s={cpu / TRANSCODE_SECONDS:.2f} "
                    f"transcode_rss_mb={usage.ru_maxrss // 1024} load_avg={os.getloadavg()[0]:.1f}")
        from picpeak_lite.ops import bench

        photos = bench.make_photos(d / "photos", 10, 12)
        line.append(lane_figures(hevc, photos, d / "server"))
        print("bench_video: " + " ".join(line))


if __name__ == "__main__":
    main()
