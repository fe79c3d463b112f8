"""Videos made in code with PyAV, for the tests and the benchmark (the way imagefactory.py makes photos).

Frames are flat colours that change over time, with a bright bar that moves, so a poster taken at 1 s differs
from the first frame and an encoder has something to encode. Every clip is a few KB to a few hundred KB.

``camera=True`` makes what a phone records instead, for the benchmark: a textured scene the camera pans
across, with fresh sensor noise in every frame, so the encoder and the decoder work as hard as on real
footage (a 1080p HEVC clip comes out at several Mbit/s, not a few hundred kbit/s).
"""

from __future__ import annotations

from fractions import Fraction
from pathlib import Path

import av
from PIL import Image, ImageChops, ImageFilter


def has_encoder(name: str) -> bool:
    return name in av.codecs_available


def make_clip(path: Path, *, codec: str = "libx264", container: str | None = None, width: int = 320,
              height: int = 240, fps: int = 30, seconds: float = 2.0, frames: int | None = None, rotation: int = 0,
              audio: bool = False, tags: dict[str, str] | None = None, crf: int = 30, gop: int | None = None,
              camera: bool = False) -> Path:
    """Write a clip; ``rotation`` sets the display matrix (degrees counter-clockwise, as FFmpeg)."""
    options = {"movflags": "use_metadata_tags"} if path.suffix.lower() in (".mp4", ".mov", ".m4v") else {}
    count = frames if frames is not None else round(seconds * fps)
    with av.open(str(path), "w", format=container, options=options) as out:
        for key, value in (tags or {}).items():
            out.metadata[key] = value
        stream = out.add_stream(codec, rate=fps)
        stream.width, stream.height = width, height
        stream.pix_fmt = "yuv420p"
        if codec in ("libx264", "libx265"):
            stream.options = {"crf": str(crf), "preset": "ultrafast"}
            if codec == "libx265":
                stream.options["x265-params"] = "log-level=error"
        elif codec == "libvpx-vp9":
            stream.options = {"crf": "40", "b:v": "0", "deadline": "realtime", "cpu-used": "8"}
        if gop is not None:
            stream.codec_context.gop_size = gop
        if rotation:
            stream.set_display_rotation(rotation)
        sound = None
        if audio:
            sound = out.add_stream("aac", rate=48000)
            sound.layout = "mono"
        scene = _scene(width, height, count) if camera else None
        for i in range(count):
            frame = _frame(width, height, i, count) if scene is None else _camera_frame(scene, width, height, i)
            frame.pts = i
            frame.time_base = Fraction(1, fps)
            for packet in stream.encode(frame):
                out.mux(packet)
        for packet in stream.encode():
            out.mux(packet)
        if sound is not None:
            _write_silence(out, sound, count / fps)
    return path


def make_audio_only(path: Path, seconds: float = 1.0) -> Path:
    with av.open(str(path), "w") as out:
        sound = out.add_stream("aac", rate=48000)
        sound.layout = "mono"
        _write_silence(out, sound, seconds)
    return path


def _write_silence(out: av.container.OutputContainer, sound: av.AudioStream, seconds: float) -> None:
    samples = 1024
    for i in range(int(seconds * 48000 / samples) + 1):
        chunk = av.AudioFrame(format="fltp", layout="mono", samples=samples)
        chunk.planes[0].update(bytes(samples * 4))
        chunk.sample_rate = 48000
        chunk.pts = i * samples
        for packet in sound.encode(chunk):
            out.mux(packet)
    for packet in sound.encode():
        out.mux(packet)


def _frame(width: int, height: int, index: int, count: int) -> av.VideoFrame:
    shade = (40 + 200 * index // max(1, count - 1)) % 256
    row = bytearray(bytes((shade, 80, 255 - shade)) * width)
    bar = (index * 7) % max(1, width - 16)
    row[bar * 3 : (bar + 16) * 3] = b"\xff" * 48
    rgb = av.VideoFrame(width, height, "rgb24")
    plane = rgb.planes[0]
    line = bytes(row) + bytes(plane.line_size - width * 3)
    plane.update(line * height)
    return rgb.reformat(format="yuv420p")


PAN_PX = 3  # per frame: a slow pan, as a hand-held phone drifts
NOISE_SIGMA = 10  # sensor noise left after a phone's own denoising, at the level that gives phone bitrates


def _scene(width: int, height: int, count: int) -> Image.Image:
    """Wide enough for the pan: soft shapes (blurred noise) over a gradient, with fine texture."""
    size = (width + PAN_PX * count, height)
    coarse = Image.effect_noise((max(1, size[0] // 32), max(1, size[1] // 32)), 60)
    blobs = coarse.resize(size, Image.Resampling.BICUBIC)
    ramp = Image.linear_gradient("L").resize(size, Image.Resampling.BILINEAR)
    detail = Image.effect_noise(size, 40).filter(ImageFilter.GaussianBlur(1.5))
    return Image.merge("RGB", (blobs, ramp, ImageChops.blend(blobs, detail, 0.5)))


def _camera_frame(scene: Image.Image, width: int, height: int, index: int) -> av.VideoFrame:
    view = scene.crop((index * PAN_PX, 0, index * PAN_PX + width, height))
    grain = Image.effect_noise((width, height), NOISE_SIGMA).convert("RGB")
    return av.VideoFrame.from_image(ImageChops.add(view, grain, offset=-128)).reformat(format="yuv420p")


def truncated(source: Path, target: Path, keep: float = 0.5) -> Path:
    data = source.read_bytes()
    target.write_bytes(data[: int(len(data) * keep)])
    return target


def _boxes(data: bytes | bytearray, start: int, end: int) -> list[tuple[bytes, int, int]]:
    """The boxes between ``start`` and ``end``: (type, offset of the box, its end); 32-bit sizes only (enough
    for the factory's own small files)."""
    found, at = [], start
    while at + 8 <= end:
        size, kind = int.from_bytes(data[at : at + 4], "big"), bytes(data[at + 4 : at + 8])
        if size < 8:
            break
        found.append((kind, at, at + size))
        at += size
    return found


def _find(data: bytes | bytearray, path: list[bytes], start: int = 0, end: int | None = None) -> list[int]:
    """Offsets of every box at ``path`` (e.g. moov/trak/mdia/minf/stbl/stsz)."""
    end = len(data) if end is None else end
    hits = []
    for kind, at, stop in _boxes(data, start, end):
        if kind == path[0]:
            hits += [at] if len(path) == 1 else _find(data, path[1:], at + 8, stop)
    return hits


STBL = [b"moov", b"trak", b"mdia", b"minf", b"stbl"]


def sample_table_bomb(path: Path, *, samples: int = 10_000_000, variant: int = 0) -> Path:
    """A real 64x64 H.264 MP4 (about 2 KB) whose sample tables claim ``samples`` one-byte samples of one tick
    each in one chunk: ``stsz`` a constant size of 1, ``stts`` one run of ``samples``, ``stsc`` one chunk of
    ``samples``. Every box keeps its size (the tables' old entries are left as unread bytes), so the file is as
    well-formed as before; only the counts lie. FFmpeg builds an index entry per claimed sample (about 75
    bytes each) before it reads a frame. ``variant`` changes the clip's colours so files differ."""
    make_clip(path, width=64, height=64, fps=10, frames=3 + variant % 5, crf=40)
    data = bytearray(path.read_bytes())
    (stsz,) = _find(data, [*STBL, b"stsz"])
    data[stsz + 12 : stsz + 20] = (1).to_bytes(4, "big") + samples.to_bytes(4, "big")
    (stts,) = _find(data, [*STBL, b"stts"])
    data[stts + 12 : stts + 24] = (1).to_bytes(4, "big") + samples.to_bytes(4, "big") + (1).to_bytes(4, "big")
    (stsc,) = _find(data, [*STBL, b"stsc"])
    data[stsc + 12 : stsc + 28] = b"".join(n.to_bytes(4, "big") for n in (1, 1, samples, 1))
    path.write_bytes(bytes(data))
    return path
