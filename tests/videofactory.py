"""Videos made in code with PyAV, for the tests and the benchmark (the way imagefactory.py makes photos).

Frames are flat colours that change over time, with a bright bar that moves, so a poster taken at 1 s differs
from the first frame and an encoder has something to encode. Every clip is a few KB to a few hundred KB.

``camera=True`` makes what a phone records instead, for the benchmark: a textured scene the camera pans
across, with fresh sensor noise in every frame, so the encoder and the decoder work as hard as on real
footage (a 1080p HEVC clip comes out at several Mbit/s, not a few hundred kbit/s).
"""

from __future__ import annotations

import math
from fractions import Fraction
from pathlib import Path

import av
from PIL import Image, ImageChops, ImageFilter


def has_encoder(name: str) -> bool:
    return name in av.codecs_available


X265_BFRAME_DELAY = 2  # frames x265 holds back for B-frames with b-pyramid (its default, ultrafast included)


def x265_params(count: int) -> str:
    """libx265's parameters for a clip of ``count`` frames: no B-frames when the clip is too short for them.

    x265 (4.x) works out each packet's DTS as ``pts - m_bframeDelayTime``, a member it sets only when frame number
    X265_BFRAME_DELAY arrives and never initialises. A clip of 2 frames or fewer therefore gets whatever the heap
    held as its DTS: 0 in a fresh process (nothing shows), a huge negative number after pytest has churned the
    heap, and then the MOV muxer refuses the packet ("pts/dts pair unsupported"). Without B-frames x265 has no
    delay and the DTS is the PTS, the same every time; such a clip has no frame a B-frame could use anyway."""
    return "log-level=error" if count > X265_BFRAME_DELAY else "log-level=error:bframes=0"


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
                stream.options["x265-params"] = x265_params(count)
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


# --- HDR clips: colour patches with a known SDR appearance, carried as HLG or PQ (BT.2020) ------------------
# Each patch is an SDR colour (8-bit BT.709 values, shown with the BT.1886 gamma 2.4); the clip carries the
# light an SDR display shows for it, placed as ITU-R BT.2408 places SDR in HDR: SDR white at the HDR reference
# white of 203 cd/m2, BT.709 primaries inside BT.2020. A tone mapping back to SDR BT.709 should give each patch
# its SDR colour again; the HDR signal shown as it is (no tone mapping) is pale and flat.
HDR_PATCHES = {
    "grey": (128, 128, 128),
    "skin": (205, 150, 125),
    "red": (200, 40, 40),
    "green": (50, 170, 60),
    "blue": (40, 60, 190),
    "dark": (50, 50, 50),
}
HDR_TRANSFERS = {"hlg": 18, "pq": 16}  # AVCOL_TRC_ARIB_STD_B67, AVCOL_TRC_SMPTE2084
REFERENCE_WHITE = 203.0  # cd/m2, BT.2408
HLG_PEAK = 1000.0  # cd/m2, the nominal HLG display of BT.2100
BT709_TO_BT2020 = ((0.6274, 0.3293, 0.0433), (0.0691, 0.9195, 0.0114), (0.0164, 0.0880, 0.8956))


def hdr_signal(rgb: tuple[int, int, int], transfer: str) -> tuple[float, float, float]:
    """The BT.2020 R'G'B' signal (0..1) of an SDR BT.709 colour in an HLG or PQ stream (BT.2408 placement)."""
    linear = [(v / 255) ** 2.4 for v in rgb]
    light = [REFERENCE_WHITE * sum(m * c for m, c in zip(row, linear, strict=True)) for row in BT709_TO_BT2020]
    if transfer == "pq":
        m1, m2, c1, c2, c3 = 0.1593017578125, 78.84375, 0.8359375, 18.8515625, 18.6875
        r, g, b = (((c1 + c2 * (f / 10000) ** m1) / (1 + c3 * (f / 10000) ** m1)) ** m2 for f in light)
        return r, g, b
    # HLG: the display light back to scene light (the inverse OOTF, system gamma 1.2), then the OETF
    luma = 0.2627 * light[0] + 0.6780 * light[1] + 0.0593 * light[2]
    scene = [(luma / HLG_PEAK) ** (1 / 1.2 - 1) * f / HLG_PEAK for f in light]
    a, b_, c = 0.17883277, 0.28466892, 0.55991073
    r, g, b = (math.sqrt(3 * e) if e <= 1 / 12 else a * math.log(12 * e - b_) + c for e in scene)
    return r, g, b


def _ycbcr10(signal: tuple[float, float, float]) -> tuple[int, int, int]:
    """BT.2020 non-constant-luminance Y'CbCr, 10-bit limited range."""
    r, g, b = signal
    y = 0.2627 * r + 0.6780 * g + 0.0593 * b
    cb, cr = (b - y) / 1.8814, (r - y) / 1.4746
    return round(64 + 876 * y), round(512 + 896 * cb), round(512 + 896 * cr)


def patch_columns(width: int) -> list[tuple[str, int, int]]:
    """Where each patch of :data:`HDR_PATCHES` lies across a frame ``width`` wide: (name, first x, end x)."""
    names = list(HDR_PATCHES)
    step = width // len(names) // 2 * 2
    return [(name, i * step, (i + 1) * step if i < len(names) - 1 else width) for i, name in enumerate(names)]


def make_hdr_clip(path: Path, transfer: str, *, codec: str = "libx265", width: int = 384, height: int = 216,
                  fps: int = 25, seconds: float = 2.0, gop: int = 25) -> Path:
    """A 10-bit HLG or PQ clip (``transfer``: 'hlg' or 'pq') tagged BT.2020 (primaries, matrix) with the
    transfer, as a phone records HDR video: vertical bars of :data:`HDR_PATCHES`, the same in every frame."""
    columns = patch_columns(width)
    codes = {name: _ycbcr10(hdr_signal(HDR_PATCHES[name], transfer)) for name in HDR_PATCHES}
    luma_row = b"".join(codes[name][0].to_bytes(2, "little") * (end - start) for name, start, end in columns)
    cb_row = b"".join(codes[name][1].to_bytes(2, "little") * ((end - start) // 2) for name, start, end in columns)
    cr_row = b"".join(codes[name][2].to_bytes(2, "little") * ((end - start) // 2) for name, start, end in columns)
    count = round(seconds * fps)
    with av.open(str(path), "w") as out:
        stream = out.add_stream(codec, rate=fps)
        stream.width, stream.height, stream.pix_fmt = width, height, "yuv420p10le"
        context = stream.codec_context
        context.color_primaries, context.color_trc, context.colorspace, context.color_range = (
            9, HDR_TRANSFERS[transfer], 9, 1)  # BT.2020, the transfer, BT.2020 NCL, limited range
        stream.options = {"crf": "18", "preset": "ultrafast"}
        if codec == "libx265":
            stream.options["x265-params"] = x265_params(count)
        context.gop_size = gop
        for i in range(count):
            frame = av.VideoFrame(width, height, "yuv420p10le")
            for plane, row, rows in ((frame.planes[0], luma_row, height), (frame.planes[1], cb_row, height // 2),
                                     (frame.planes[2], cr_row, height // 2)):
                plane.update((row + bytes(plane.line_size - len(row))) * rows)
            frame.color_primaries, frame.color_trc, frame.colorspace, frame.color_range = (
                9, HDR_TRANSFERS[transfer], 9, 1)
            frame.pts, frame.time_base = i, Fraction(1, fps)
            out.mux(stream.encode(frame))
        out.mux(stream.encode(None))
    return path


def mean_patches(rgb: bytes, width: int, height: int) -> dict[str, tuple[float, ...]]:
    """The mean R, G, B of each patch's middle (a quarter of its width and height, away from edges and chroma
    bleed) in packed RGB24 pixels of a frame of :func:`make_hdr_clip` (scaled to ``width``)."""
    means = {}
    for name, start, end in patch_columns(width):
        x0, x1 = start + (end - start) * 3 // 8, start + (end - start) * 5 // 8
        y0, y1 = height * 3 // 8, height * 5 // 8
        sums, n = [0, 0, 0], 0
        for y in range(y0, max(y1, y0 + 1)):
            for x in range(x0, max(x1, x0 + 1)):
                at = (y * width + x) * 3
                for c in range(3):
                    sums[c] += rgb[at + c]
                n += 1
        means[name] = tuple(s / n for s in sums)
    return means
