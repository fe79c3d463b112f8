"""media/video.py and pipeline/video_jobs.py on clips made in code (tests/videofactory.py): the container check,
the probe (rotation, codecs, tags, no location), the poster, every bad file's sentence, and the child process
that keeps a decoder crash or a hang out of the server."""

from __future__ import annotations

import os
import signal
from pathlib import Path

import pytest
import trio

from picpeak_lite.media import images, video
from picpeak_lite.pipeline import video_jobs
from tests import videofactory as vf

DEADLINE = 120.0  # generous: CI is a loaded 2-core box; the deadline test below uses its own short one


def probe(path: Path) -> video.VideoInfo:
    return trio.run(lambda: video_jobs.probe(path, deadline=DEADLINE, max_pixels=video.MAX_FRAME_PIXELS))


@pytest.fixture(scope="module")
def clips(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    d = tmp_path_factory.mktemp("clips")
    made = {
        "rotated": vf.make_clip(d / "portrait.mp4", width=320, height=240, rotation=-90, audio=True, tags={
            "com.apple.quicktime.creationdate": "2026-06-01T20:15:00+0200",
            "com.apple.quicktime.make": "Apple", "com.apple.quicktime.model": "iPhone 15",
            "com.apple.quicktime.location.ISO6709": "+48.8577+002.2950+035.000/"}),
        "vp9": vf.make_clip(d / "clip.webm", codec="libvpx-vp9", width=256, height=144, seconds=1.0),
        "two": vf.make_clip(d / "two.mp4", frames=2),
        "audio": vf.make_audio_only(d / "audio.mp4"),
    }
    made["truncated"] = vf.truncated(made["rotated"], d / "cut.mp4")
    (d / "text.mp4").write_text("this is not a video, whatever its name says\n" * 20)
    made["text"] = d / "text.mp4"
    if vf.has_encoder("libx265"):
        made["hevc"] = vf.make_clip(d / "hevc.mov", codec="libx265", width=320, height=192, seconds=1.0)
    return made


def test_container_is_known_by_its_bytes(clips: dict[str, Path]) -> None:
    assert video.sniff_container(clips["rotated"].read_bytes()[:64]) == "mp4"
    assert video.sniff_container(clips["vp9"].read_bytes()[:64]) == "webm"
    assert video.sniff_container(clips["text"].read_bytes()[:64]) is None
    if "hevc" in clips:
        assert video.sniff_container(clips["hevc"].read_bytes()[:64]) == "mov"
    # a HEIC photo is an ISO file too, but not a video's
    assert video.sniff_container(b"\x00\x00\x00\x18ftypheic\x00\x00\x00\x00mif1heic") is None


def test_probe_turns_a_portrait_clip_upright_and_keeps_no_location(clips: dict[str, Path]) -> None:
    info = probe(clips["rotated"])
    assert (info.width, info.height, info.rotation) == (240, 320, 270)
    assert info.container == "mp4" and info.video_codec == "h264" and info.audio_codec == "aac"
    assert info.duration == pytest.approx(2.0, abs=0.1) and info.fps == pytest.approx(30)
    assert info.taken_at == "2026-06-01T20:15:00"  # Apple's local time, not converted to UTC
    assert (info.camera_make, info.camera_model) == ("Apple", "iPhone 15")
    assert info.has_gps is True
    assert "48.85" not in repr(info.to_json())  # the location itself is never read out
    assert info.browser_playable


def test_vp9_webm_and_a_two_frame_clip(clips: dict[str, Path]) -> None:
    webm = probe(clips["vp9"])
    assert (webm.container, webm.video_codec, webm.width, webm.height) == ("webm", "vp9", 256, 144)
    two = probe(clips["two"])
    assert two.duration < 0.2 and two.video_codec == "h264"


def test_hevc_mov_needs_a_playable_preview(clips: dict[str, Path]) -> None:
    if "hevc" not in clips:
        pytest.skip("this PyAV build has no HEVC encoder")
    info = probe(clips["hevc"])
    assert (info.container, info.video_codec) == ("mov", "hevc")
    assert not info.browser_playable


@pytest.mark.parametrize(("name", "reason"), [
    ("truncated", video.CORRUPT),
    ("text", video.UNSUPPORTED),
    ("audio", video.NO_VIDEO),
])
def test_bad_files_get_a_sentence(clips: dict[str, Path], name: str, reason: str) -> None:
    with pytest.raises(video.InvalidVideo) as caught:
        probe(clips[name])
    assert caught.value.reason == reason


def test_an_empty_mdat_has_no_frames(tmp_path: Path, clips: dict[str, Path]) -> None:
    """A header that lies: the moov box names samples the file does not hold (every byte of mdat zeroed)."""
    data = bytearray(clips["two"].read_bytes())
    at = data.find(b"mdat")
    size = int.from_bytes(data[at - 4 : at], "big")
    data[at + 4 : at - 4 + size] = bytes(size - 8)
    (tmp_path / "zeros.mp4").write_bytes(bytes(data))
    with pytest.raises(video.InvalidVideo) as caught:
        probe(tmp_path / "zeros.mp4")
    assert caught.value.reason in (video.NO_FRAMES, video.CORRUPT)


def test_poster_is_the_upright_frame_near_one_second_at_view_size(clips: dict[str, Path]) -> None:
    async def main() -> video_jobs.Inspected:
        return await video_jobs.inspect(clips["rotated"], deadline=DEADLINE, view_px=160,
                                        max_pixels=video.MAX_FRAME_PIXELS)

    got = trio.run(main)
    # As stored (landscape), shrunk to the view's long edge, with the orientation that makes it portrait.
    assert (got.poster_size, got.poster_orientation) == ((160, 120), 6)
    decoded = images.from_rgb(got.poster_rgb, got.poster_size, got.info.width, got.info.height, "mp4",
                              got.poster_orientation)
    view = images.make_view(decoded, images.RenderSpec(grid_px=64, view_px=160))
    assert view.image.size == (120, 160)
    grid = images.make_grid(view, images.RenderSpec(grid_px=64, view_px=160))
    jpeg = images.encode(grid, images.RenderSpec())
    assert images.sniff(jpeg).width == 48 and b"Exif" not in jpeg[:200]
    # not the first frame: the colour ramps with time, and the poster is taken at 10 % of 2 s
    first_shade = 40
    assert abs(view.image.getpixel((5, 150))[0] - first_shade) > 4


def test_a_crashing_decoder_fails_the_video_not_the_server(clips: dict[str, Path]) -> None:
    """The child is killed as a segfault would kill it: the caller gets the sentence and goes on."""

    async def main() -> str:
        async with trio.open_nursery() as nursery:
            async def kill_children() -> None:
                while True:  # the probe's child, once it exists
                    for pid in _children():
                        os.kill(pid, signal.SIGSEGV)
                        return
                    await trio.sleep(0.005)

            nursery.start_soon(kill_children)
            try:
                await video_jobs.probe(clips["rotated"], deadline=DEADLINE, max_pixels=video.MAX_FRAME_PIXELS)
            except video.InvalidVideo as error:
                return error.reason
            finally:
                nursery.cancel_scope.cancel()
        return "no error"

    reason = trio.run(main)
    assert reason == video_jobs.CRASHED.format(how="signal SIGSEGV")


async def test_a_hanging_decoder_is_given_up_at_its_deadline(tmp_path: Path, autojump_clock: trio.abc.Clock
                                                             ) -> None:
    """A child that never answers (a FIFO blocks its open) is killed when the deadline passes."""
    fifo = tmp_path / "never.mp4"
    os.mkfifo(fifo)
    with pytest.raises(video.InvalidVideo) as caught:
        await video_jobs.probe(fifo, deadline=30, max_pixels=video.MAX_FRAME_PIXELS)
    assert caught.value.reason == video_jobs.TOO_SLOW.format(seconds=30)
    assert not _children()


def _children() -> list[int]:
    """This process's video children only (the session may have others: a browser, a server): their command
    line names media/video.py's module."""
    me = os.getpid()
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                stat = Path(f"/proc/{entry}/stat").read_text()
                command = Path(f"/proc/{entry}/cmdline").read_bytes()
            except OSError:
                continue
            if int(stat.rsplit(")", 1)[1].split()[1]) == me and b"picpeak_lite.media.video" in command:
                found.append(int(entry))
    return found


def test_an_index_that_claims_millions_of_samples_is_refused_before_ffmpeg_reads_it(tmp_path: Path) -> None:
    """A real 2 KB H.264 MP4 whose stsz/stts/stsc claim 10 million samples: FFmpeg built an index of 730 MB for
    it (issue 27); the child now refuses it from its box headers, with the counts in the sentence."""
    bomb = vf.sample_table_bomb(tmp_path / "bomb.mp4")
    size = bomb.stat().st_size
    assert size < 4096
    with pytest.raises(video.InvalidVideo) as caught:
        probe(bomb)
    assert caught.value.reason == video.INDEX_CLAIMS.format(count=10_000_000, size=size)
    assert caught.value.reason.endswith("in a " + f"{size:,}" + "-byte file; it is damaged.")


def _rewrite(source: Path, target: Path, box: bytes, at: int, value: bytes) -> Path:
    data = bytearray(source.read_bytes())
    offset = vf._find(data, [*vf.STBL, box])[0]  # the first track's (the video)
    data[offset + at : offset + at + len(value)] = value
    target.write_bytes(bytes(data))
    return target


def test_each_sample_table_is_held_to_the_file_size(tmp_path: Path, clips: dict[str, Path]) -> None:
    """One lie at a time: a stts run, a stsc chunk, or a table whose entries do not fit in its box."""
    good = clips["rotated"]
    size = good.stat().st_size
    stts = _rewrite(good, tmp_path / "stts.mp4", b"stts", 16, (size + 1).to_bytes(4, "big"))
    stsc = _rewrite(good, tmp_path / "stsc.mp4", b"stsc", 20, (5_000_000).to_bytes(4, "big"))
    stco = _rewrite(good, tmp_path / "stco.mp4", b"stco", 12, (1_000_000).to_bytes(4, "big"))
    for path in (stts, stsc):
        with pytest.raises(video.InvalidVideo) as caught:
            video.check_index(str(path))
        assert caught.value.reason.startswith("The video's index claims ")
        assert caught.value.reason.endswith(f" frames in a {size:,}-byte file; it is damaged.")
    with pytest.raises(video.InvalidVideo) as caught:
        video.check_index(str(stco))
    assert caught.value.reason.startswith("The video's index is damaged: its stco table claims 1,000,000 entries")


def test_real_clips_pass_the_index_check(clips: dict[str, Path]) -> None:
    for name in ("rotated", "two", "audio", "truncated", "hevc"):
        if name in clips:
            video.check_index(str(clips[name]))  # raises nothing


@pytest.mark.skipif(not vf.has_encoder("libx265"), reason="this PyAV has no HEVC encoder")
def test_a_4k_hevc_clip_probes_within_the_probe_memory_limit(tmp_path: Path) -> None:
    """PROBE_MEMORY is sized from this clip (192 MB of address space measured) with headroom."""
    clip = vf.make_clip(tmp_path / "4k.mov", codec="libx265", width=3840, height=2160, frames=2, audio=True)
    info = probe(clip)
    assert (info.width, info.height, info.video_codec) == (3840, 2160, "hevc")


async def test_media_children_wait_their_turn_and_none_fails(clips: dict[str, Path]) -> None:
    """Eight probes at once with two places: never more than two children, and every probe answers."""
    most, answers = 0, []

    async def count() -> None:
        nonlocal most
        while True:
            most = max(most, len(_children()))
            await trio.sleep(0.002)

    async def one() -> None:
        answers.append(await video_jobs.probe(clips["two"], deadline=DEADLINE, max_pixels=video.MAX_FRAME_PIXELS,
                                              places=2))

    async with trio.open_nursery() as outer:
        outer.start_soon(count)
        async with trio.open_nursery() as nursery:
            for _ in range(8):
                nursery.start_soon(one)
        outer.cancel_scope.cancel()
    assert len(answers) == 8 and all(a.video_codec == "h264" for a in answers)
    assert 1 <= most <= 2
