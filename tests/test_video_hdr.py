"""HDR clips (10-bit HLG and PQ, BT.2020, made in code by tests/videofactory.py) get a poster and a playable
preview tone-mapped to SDR BT.709, judged by measured colour: each patch of a known SDR appearance (grey, skin,
saturated red/green/blue, dark) against its SDR value, as the mean absolute difference per channel (0..255).
The same frame shown as it is (the plain scaler, what the poster and the preview were before) is measured too,
so the figures say how washed out that was. SDR clips take the plain scaler, as before."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import av
import pytest
import trio

from picpeak_lite.media import video
from picpeak_lite.pipeline import video_jobs
from tests import videofactory as vf

pytestmark = pytest.mark.skipif(not vf.has_encoder("libx265"), reason="this PyAV build has no HEVC encoder")

DEADLINE = 120.0  # generous: CI is a loaded 2-core box
# Within this many levels per channel (mean absolute difference, 0..255) a patch looks like its SDR self; the
# tone-mapped poster measured at most 1.7, the H.264 preview at most 2.7 (its 4:2:0 chroma and CRF 23).
CLOSE = 4.0
# The untone-mapped frame measured a mean over the patches of 18.2 (HLG) and 32.5 (PQ).
WASHED_OUT = 10.0


def differences(rgb: bytes, width: int, height: int) -> dict[str, float]:
    means = vf.mean_patches(rgb, width, height)
    return {name: sum(abs(m - r) for m, r in zip(means[name], vf.HDR_PATCHES[name], strict=True)) / 3
            for name in means}


def packed(frame: av.VideoFrame) -> bytes:
    plane, row = frame.planes[0], frame.width * 3
    view = memoryview(plane)
    return b"".join(view[y * plane.line_size : y * plane.line_size + row] for y in range(frame.height))


def first_frame_rgb(path: Path) -> tuple[bytes, int, int, av.VideoFrame]:
    """The first frame as the plain scaler makes it RGB (the old poster's way), and the frame."""
    with av.open(str(path)) as container:
        frame = next(container.decode(video=0))
        rgb = frame.reformat(format="rgb24", interpolation="AREA")
        return packed(rgb), rgb.width, rgb.height, frame


def line(label: str, diffs: dict[str, float]) -> str:
    mean = sum(diffs.values()) / len(diffs)
    return f"{label}: mean {mean:.1f} " + " ".join(f"{name}={d:.1f}" for name, d in diffs.items())


@pytest.fixture(scope="module", params=["hlg", "pq"])
def hdr(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> tuple[str, Path]:
    transfer = request.param
    return transfer, vf.make_hdr_clip(tmp_path_factory.mktemp("hdr") / f"{transfer}.mov", transfer)


def test_the_clip_is_really_hdr(hdr: tuple[str, Path]) -> None:
    transfer, path = hdr
    *_, frame = first_frame_rgb(path)
    assert (frame.format.name, frame.color_primaries, frame.colorspace) == ("yuv420p10le", 9, 9)
    assert frame.color_trc == vf.HDR_TRANSFERS[transfer]


def test_the_poster_is_tone_mapped_to_sdr(hdr: tuple[str, Path], capsys: pytest.CaptureFixture[str]) -> None:
    transfer, path = hdr
    old_rgb, width, height, _ = first_frame_rgb(path)
    old = differences(old_rgb, width, height)

    async def main() -> video_jobs.Inspected:
        return await video_jobs.inspect(path, deadline=DEADLINE, view_px=1600, max_pixels=video.MAX_FRAME_PIXELS)

    got = trio.run(main)
    assert got.poster_size == (width, height)
    new = differences(got.poster_rgb, width, height)
    with capsys.disabled():
        print(f"\n{transfer} poster {line('as it was', old)}\n{transfer} poster {line('tone-mapped', new)}")
    assert sum(old.values()) / len(old) > WASHED_OUT  # the old way is measurably washed out
    assert max(new.values()) <= CLOSE, new


def test_the_preview_is_tone_mapped_and_tagged_bt709(hdr: tuple[str, Path], tmp_path: Path,
                                                     capsys: pytest.CaptureFixture[str]) -> None:
    transfer, path = hdr
    target = tmp_path / "preview.mp4"
    trio.run(lambda: video_jobs.transcode(path, target, deadline=DEADLINE))
    with av.open(str(target)) as container:
        stream = container.streams.video[0]
        context = stream.codec_context
        assert (context.name, context.pix_fmt) == ("h264", "yuv420p")
        # BT.709 primaries, transfer and matrix, limited range: what the picture now is
        assert (context.color_primaries, context.color_trc, context.colorspace, context.color_range) == (1, 1, 1, 1)
        frame = next(container.decode(stream))
        rgb = frame.reformat(format="rgb24", src_colorspace="ITU709", src_color_range="MPEG")
    new = differences(packed(rgb), rgb.width, rgb.height)
    with capsys.disabled():
        print(f"\n{transfer} preview {line('tone-mapped', new)}")
    assert max(new.values()) <= CLOSE, new


def test_an_sdr_poster_is_unchanged(tmp_path: Path) -> None:
    """An SDR clip takes the plain scaler: its poster is byte for byte the plain scaler's frame."""
    path = vf.make_clip(tmp_path / "sdr.mov", codec="libx265", width=320, height=192, seconds=1.0, gop=1)
    _, poster = video.inspect(str(path), view_px=160)
    with av.open(str(path)) as container:
        frames = list(container.decode(video=0))
    chosen = next(f for f in frames if f.time is not None and f.time >= 0.1 - 0.001)
    assert chosen.color_trc not in video.HDR_TRANSFERS
    plain = chosen.reformat(width=160, height=96, format="rgb24", interpolation="AREA")
    assert (poster.width, poster.height) == (160, 96) and poster.rgb == packed(plain)


def test_a_4k_hlg_poster_fits_half_the_child_memory(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """The tone mapping runs after the frame is shrunk to the view size, so a 4K HLG poster needs 384 MB of
    address space (measured; an SDR 4K HEVC poster 256 MB, the mapping at 4K 480 MB): it is run here under
    half of CHILD_MEMORY."""
    clip = vf.make_hdr_clip(tmp_path / "4k.mov", "hlg", width=3840, height=2160, seconds=0.08)
    memory = video_jobs.CHILD_MEMORY // 2
    done = subprocess.run([sys.executable, "-m", "picpeak_lite.media.video", "inspect", str(clip), "1600",
                           str(video.MAX_FRAME_PIXELS), str(memory)], capture_output=True, check=True)
    head, _, rest = done.stdout.partition(b"\n")
    answer = json.loads(head)
    assert "error" not in answer, answer
    assert (answer["info"]["width"], answer["info"]["height"]) == (3840, 2160)
    poster = answer["poster"]
    assert (poster["width"], poster["height"]) == (1600, 900) and len(rest) == 1600 * 900 * 3
    new = differences(rest, 1600, 900)
    with capsys.disabled():
        print(f"\n4K hlg poster under {memory // video_jobs.MB} MB {line('tone-mapped', new)}")
    assert max(new.values()) <= CLOSE, new
