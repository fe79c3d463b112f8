"""Videos: the container check from the header bytes, and the probe and poster frame made with PyAV.

This is the only module that imports ``av`` (PyAV, whose wheels carry FFmpeg, so no system package is needed),
and it imports it only inside :func:`probe` and :func:`poster`. Those two run in a child process, never in the
server: ``python -m picpeak_lite.media.video probe|inspect PATH VIEW_PX`` (:func:`main`), started by
``pipeline/video_jobs.py`` with a deadline and a memory limit. FFmpeg's demuxers and decoders are C code fed with
files from strangers; a crash there (a segfault, an abort, a runaway allocation) ends the child, and the photo
fails with a sentence, while the server and its other workers go on. A thread could not give that: a segfault
in any thread ends the whole process. The price is the child's start (Python and FFmpeg's libraries: about
0.1 s of CPU, ``bench/bench_video.py``), small next to a video's upload.

What the server process uses from here is pure Python: :func:`sniff_container` (the magic bytes),
:class:`VideoInfo` and :class:`InvalidVideo`.

Rules, as for images (``media/images.py``): the container is recognised by its bytes, never its name; every
failure is :class:`InvalidVideo` with a reason an uploader can read; the poster is one frame decoded alone
(a seek to the key frame before min(1 s, 10 %), decoded on to that time, never the whole stream), turned upright by the
stream's display matrix, shrunk to the view size by FFmpeg's scaler before it becomes a Pillow image, and it
carries no metadata. Location tags are never read out: ``has_gps`` only says whether one was present, as for
photos.

HDR clips (HLG or PQ, as phones record them) are tone-mapped to SDR BT.709 in the poster and in the playable
preview (:class:`_ToSdr`, FFmpeg's own scaler, whose colour management maps transfer, primaries and peak);
shown as they are, their signal looks pale and flat on an ordinary screen. SDR clips take the plain scaler.
"""

from __future__ import annotations

import json
import math
import os
import resource
import sys
from dataclasses import asdict, dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

# our container name -> MIME type served with the original
CONTAINERS = {"mp4": "video/mp4", "mov": "video/quicktime", "webm": "video/webm"}
EXTENSIONS = {"mp4": "mp4", "mov": "mov", "webm": "webm"}
QUICKTIME_BRANDS = {b"qt  "}
# ISO base media brands of video files (HEIF/AVIF image brands are media/images.py's, checked before this)
MP4_BRANDS = {b"isom", b"iso2", b"iso4", b"iso5", b"iso6", b"mp41", b"mp42", b"avc1", b"M4V ", b"M4VH", b"M4VP",
              b"dash", b"3gp4", b"3gp5", b"3gp6", b"3g2a", b"MSNV", b"XAVC", b"hvc1", b"av01", b"mmp4", b"f4v "}
# QuickTime files from older cameras begin with one of these atoms instead of ftyp
QUICKTIME_FIRST_ATOMS = {b"moov", b"mdat", b"wide", b"free", b"skip", b"pnot"}
EBML_MAGIC = b"\x1a\x45\xdf\xa3"
# Codecs the lightbox can play as they are in Chromium and Firefox; anything else needs a playable preview.
BROWSER_CODECS = {"h264", "vp8", "vp9", "av1"}
OLDEST = datetime(1990, 1, 1)
LOCATION_KEYS = ("location", "location-eng", "com.apple.quicktime.location.iso6709", "\xa9xyz")
MAX_POSTER_FRAMES = 120  # frames decoded after the seek at most, to reach the poster's time
# A key frame this many seconds after the poster's time is still a good poster, and it decodes alone.
KEY_FRAME_LOOKAHEAD = 2.0
MAX_FRAME_PIXELS = 8192 * 8192  # a frame larger than 8K on a side is a header made to exhaust memory

def N_(message: str) -> str:
    """Marks a fixed refusal for translation where it reaches a person (pipeline/video_intake.py); the child
    process this module runs as does not load the translation machinery."""
    return message


UNSUPPORTED = N_("Not a supported video (MP4, MOV, M4V or WebM)")
CORRUPT = N_("The video file is truncated or corrupt")
NO_VIDEO = N_("The file has no video track (is it audio only?)")
NO_FRAMES = N_("The video has no frame that could be decoded: the file is truncated, empty or corrupt")
INDEX_CLAIMS = "The video's index claims {count:,} frames in a {size:,}-byte file; it is damaged."
INDEX_TABLE = "The video's index is damaged: its {box} table claims {count:,} entries in {room:,} bytes."


class InvalidVideo(ValueError):
    """A video we cannot or will not process. ``reason`` is shown to the uploader; ``detail`` is for logs."""

    def __init__(self, reason: str, detail: str = "", *, too_large: bool = False) -> None:
        super().__init__(reason)
        self.reason = reason
        self.detail = detail
        self.too_large = too_large


@dataclass(frozen=True)
class VideoInfo:
    """What the probe learns. ``width``/``height`` are as displayed: the display matrix's rotation applied."""

    container: str  # 'mp4', 'mov' or 'webm' (from the bytes)
    width: int
    height: int
    duration: float  # seconds
    fps: float | None
    video_codec: str
    audio_codec: str | None
    rotation: int  # degrees counter-clockwise the stored frames are turned to be shown (0, 90, 180, 270)
    taken_at: str | None = None  # 'YYYY-MM-DDTHH:MM:SS', camera local time when the file says so
    camera_make: str | None = None
    camera_model: str | None = None
    has_gps: bool = False  # a location tag was present (never read out)

    @property
    def mime(self) -> str:
        return CONTAINERS[self.container]

    @property
    def browser_playable(self) -> bool:
        """Whether Chromium plays the original: H.264, VP8/9 or AV1 (HEVC and others need a preview)."""
        return self.video_codec in BROWSER_CODECS and self.container in CONTAINERS

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> VideoInfo:
        return cls(**{k: data[k] for k in cls.__dataclass_fields__ if k in data})


def sniff_container(head: bytes) -> str | None:
    """The video container the first bytes show ('mp4', 'mov', 'webm'), or None when they are not a video's.

    Pure bytes: the server calls this on every upload without loading FFmpeg. A ``.mp4`` name on a text file
    is not a video; an MP4 named ``.jpg`` is.
    """
    if len(head) >= 12 and head[4:8] == b"ftyp":
        size = int.from_bytes(head[:4], "big")
        brands = [head[8:12]] + [head[i : i + 4] for i in range(16, min(size, len(head)) - 3, 4)]
        if head[8:12] in QUICKTIME_BRANDS:
            return "mov"
        if any(brand in MP4_BRANDS for brand in brands):
            return "mp4"
        if any(brand in QUICKTIME_BRANDS for brand in brands):
            return "mov"
        return None
    if len(head) >= 8 and head[4:8] in QUICKTIME_FIRST_ATOMS and int.from_bytes(head[:4], "big") >= 8:
        return "mov"
    if head.startswith(EBML_MAGIC) and b"\x42\x82" in head[:64] and b"webm" in head[:64]:
        return "webm"
    return None


def probe(path: str, *, max_pixels: int = MAX_FRAME_PIXELS) -> VideoInfo:
    """Read the container's header and decode the first frame (the rotation lives in the frame's display matrix,
    and a file whose first frame cannot be decoded is refused now rather than failing later). Sync; child only."""
    container_name = _container_name(path)
    with _open(path) as container:
        return _facts(container, container_name, max_pixels)


def inspect(path: str, *, max_pixels: int = MAX_FRAME_PIXELS, view_px: int = 1600) -> tuple[VideoInfo, Poster]:
    """:func:`probe` and the poster on one opened container (the worker's call: one open, one demuxer), from
    one decoded frame: the poster frame also gives the rotation and the size (and proves the stream decodes).
    Decoding the first frame for the facts and then the poster cost a 4K HEVC clip 57 MB more at its peak.

    The poster (:class:`Poster`) is no larger than ``view_px`` on its long edge, from the key frame at or
    shortly after min(1 s, 10 %), decoded alone, or else decoded on from the key frame before that time (never
    the whole stream); one frame is converted."""
    container_name = _container_name(path)
    with _open(path) as container:
        stream = _video_stream(container)
        frame = _poster_frame(container, stream, _duration(container, stream))
        info = _facts(container, container_name, max_pixels, frame)
        return info, _poster_image(frame, view_px)


def _container_name(path: str) -> str:
    with open(path, "rb") as fp:
        container_name = sniff_container(fp.read(64))
    if container_name is None:
        raise InvalidVideo(UNSUPPORTED)
    if container_name in ("mp4", "mov"):
        check_index(path)
    return container_name


# --- the MP4/MOV index, checked before FFmpeg reads it ------------------------------------------------------
# FFmpeg's MOV demuxer builds an index entry (about 75 bytes with its side tables) for every sample the sample
# tables claim, before it decodes a frame: a 2 KB file whose stsz/stts/stsc claim 10 million samples made a
# probe child take 730 MB. A sample is at least one byte of the file and a table entry is its bytes in the
# box, so a claim larger than the file is a lie that costs nothing to spot. Only box headers and the stts/ctts
# runs are read (seeks, never past the file's end, never more boxes than INDEX_MAX_BOXES).

INDEX_CONTAINERS = {b"moov", b"trak", b"mdia", b"minf", b"stbl", b"moof", b"traf"}
INDEX_MAX_BOXES = 200_000  # a long fragmented file has one moof per second or two; past this, FFmpeg's own limits
INDEX_MAX_DEPTH = 8
# table box -> (bytes before its entries after the full-box header, bytes per entry)
INDEX_TABLES = {b"stts": 8, b"ctts": 8, b"stsc": 12, b"stco": 4, b"co64": 8, b"stss": 4}


def check_index(path: str) -> None:
    """Refuse (:class:`InvalidVideo`) an MP4/MOV whose sample tables claim more samples than its size allows:
    every table's entries must fit in its box, and no track (nor all fragments together) may claim more samples
    than the file has bytes. Pure, bounded reads; run in the child before FFmpeg opens the file."""
    with open(path, "rb") as fp:
        size = os.fstat(fp.fileno()).st_size
        state = {"boxes": 0, "fragment_samples": 0}
        _check_boxes(fp, 0, size, size, 0, state)
        if state["fragment_samples"] > size:
            raise InvalidVideo(INDEX_CLAIMS.format(count=state["fragment_samples"], size=size))


def _check_boxes(fp: Any, start: int, end: int, size: int, depth: int, state: dict[str, int]) -> None:
    at = start
    while at + 8 <= end:
        state["boxes"] += 1
        if state["boxes"] > INDEX_MAX_BOXES:
            return
        fp.seek(at)
        head = fp.read(16)
        if len(head) < 8:
            return
        length, kind, body = int.from_bytes(head[:4], "big"), head[4:8], at + 8
        if length == 1:  # a 64-bit size follows the type
            if len(head) < 16:
                return
            length, body = int.from_bytes(head[8:16], "big"), at + 16
        elif length == 0:  # to the end of the enclosing box
            length = end - at
        if length < body - at or at + length > end:
            return  # a box past its parent's end: FFmpeg's own checks see that; nothing to count here
        stop = at + length
        if kind in INDEX_CONTAINERS and depth < INDEX_MAX_DEPTH:
            _check_boxes(fp, body, stop, size, depth + 1, state)
        elif kind in (b"stsz", b"stz2"):
            _check_sizes(fp, kind, body, stop, size)
        elif kind in INDEX_TABLES:
            _check_table(fp, kind, body, stop, size)
        elif kind == b"trun":
            state["fragment_samples"] += _check_run(fp, body, stop, size)
        at = stop


def _full_box(fp: Any, body: int, stop: int, fields: int) -> list[int] | None:
    """The full box's flags and then ``fields`` 32-bit fields after its version/flags, or None when short."""
    fp.seek(body)
    raw = fp.read(4 + 4 * fields)
    if len(raw) < 4 + 4 * fields or body + len(raw) > stop:
        return None
    return [int.from_bytes(raw[1:4], "big")] + [int.from_bytes(raw[i : i + 4], "big")
                                                 for i in range(4, len(raw), 4)]


def _claims(count: int, size: int) -> None:
    if count > size:
        raise InvalidVideo(INDEX_CLAIMS.format(count=count, size=size))


def _room(kind: bytes, count: int, each: float, room: int) -> None:
    if count * each > room:
        raise InvalidVideo(INDEX_TABLE.format(box=kind.decode("latin-1"), count=count, room=room))


def _check_sizes(fp: Any, kind: bytes, body: int, stop: int, size: int) -> None:
    """stsz: one size for all (then count x size bytes of samples) or a 4-byte entry per sample; stz2: entries
    of 4, 8 or 16 bits."""
    fields = _full_box(fp, body, stop, 2)
    if fields is None:
        return
    _, first, count = fields
    _claims(count, size)
    if kind == b"stsz":
        if first:
            _claims(count * first, size)
        else:
            _room(kind, count, 4, stop - body - 12)
    else:
        _room(kind, count, max(4, first & 0xFF) / 8, stop - body - 12)


def _check_table(fp: Any, kind: bytes, body: int, stop: int, size: int) -> None:
    """An entry-count table: its entries must fit in the box; stts/ctts runs may not add up to more samples
    than the file has bytes, nor may one stsc chunk hold more."""
    fields = _full_box(fp, body, stop, 1)
    if fields is None:
        return
    count, each = fields[1], INDEX_TABLES[kind]
    room = stop - body - 8
    _room(kind, count, each, room)
    if kind not in (b"stts", b"ctts", b"stsc"):
        _claims(count, size)
        return
    total, left = 0, count * each
    while left > 0:
        chunk = fp.read(min(left, 1 << 16) // each * each)
        if not chunk:
            return
        left -= len(chunk)
        if kind == b"stsc":  # first chunk, samples per chunk, description: one chunk's samples are the claim
            total = max([total] + [int.from_bytes(chunk[i + 4 : i + 8], "big") for i in range(0, len(chunk), 12)])
        else:  # sample count, then duration or offset
            total += sum(int.from_bytes(chunk[i : i + 4], "big") for i in range(0, len(chunk), 8))
        _claims(total, size)


def _check_run(fp: Any, body: int, stop: int, size: int) -> int:
    """trun (a fragment's samples): its count, with the per-sample fields its flags name fitting in the box."""
    fields = _full_box(fp, body, stop, 1)
    if fields is None:
        return 0
    flags, count = fields
    before = 4 * bool(flags & 0x1) + 4 * bool(flags & 0x4)
    each = 4 * sum(bool(flags & bit) for bit in (0x100, 0x200, 0x400, 0x800))
    _claims(count, size)
    _room(b"trun", count, each, stop - body - 8 - before)
    return count


def _facts(container: Any, container_name: str, max_pixels: int, first: Any = None) -> VideoInfo:
    """The facts of the video stream; ``first``: a frame already decoded (else the first is decoded here)."""
    stream = _video_stream(container)
    if first is None:
        first = _first_frame(container, stream)
    rotation = _rotation(first)
    width, height = _check_size(stream, first, max_pixels)
    if rotation in (90, 270):
        width, height = height, width
    tags = _tags(container, stream)
    audio = container.streams.audio[0].codec_context.name if container.streams.audio else None
    return VideoInfo(
        container=container_name,
        width=width,
        height=height,
        duration=_duration(container, stream),
        fps=_fps(stream),
        video_codec=stream.codec_context.name,
        audio_codec=audio,
        rotation=rotation,
        taken_at=_taken_at(tags),
        camera_make=_text(tags.get("com.apple.quicktime.make") or tags.get("make")),
        camera_model=_text(tags.get("com.apple.quicktime.model") or tags.get("model")),
        has_gps=any(tags.get(key) for key in LOCATION_KEYS),
    )


def _poster_frame(container: Any, stream: Any, duration: float) -> Any:
    target = min(1.0, duration * 0.1) if duration > 0 else 0.0
    frame = None
    if target > 0 and stream.time_base:
        try:
            container.seek(int(target / stream.time_base), stream=stream, backward=True, any_frame=False)
            key = _key_frame_after(container, stream, target)
            if key is not None:
                frame = _decode_alone(stream, key)
            else:
                container.seek(int(target / stream.time_base), stream=stream, backward=True, any_frame=False)
                frame = _frame_at(container, stream, target)
        except Exception:  # an unseekable file (no index): its first frame below is still a poster
            frame = None
    if frame is None:
        container.seek(0)
        frame = _first_frame(container, stream)
    return frame


@dataclass(frozen=True)
class Poster:
    """The poster frame as stored in the stream (not yet upright), as packed RGB bytes, and the EXIF
    orientation that turns it upright: the server turns it with the photos' code (images.make_view), so the
    child never loads Pillow (8 MB) nor holds a second copy of the pixels."""

    width: int
    height: int
    rgb: bytes
    orientation: int


# The display matrix's rotation (counter-clockwise) as the EXIF orientation that undoes it.
ROTATION_ORIENTATION = {0: 1, 90: 8, 180: 3, 270: 6}


def _poster_image(frame: Any, view_px: int) -> Poster:
    scale = min(1.0, view_px / max(frame.width, frame.height))
    w, h = max(1, round(frame.width * scale)), max(1, round(frame.height * scale))
    orientation = ROTATION_ORIENTATION[_rotation(frame)]
    if _is_hdr(frame):  # 16 bits from the tone mapping, then cut to 8 (see _ToSdr)
        picture = _ToSdr(w, h, "rgb48le", "area").convert(frame).reformat(format="rgb24")
    else:
        picture = frame.reformat(width=w, height=h, format="rgb24", interpolation="AREA")
    plane, row = picture.planes[0], w * 3
    view = memoryview(plane)
    if plane.line_size == row:
        pixels = bytes(view[: row * h])
    else:  # rows padded for alignment: pack them
        pixels = b"".join(view[y * plane.line_size : y * plane.line_size + row] for y in range(h))
    return Poster(w, h, pixels, orientation)


# --- HDR to SDR --------------------------------------------------------------------------------------------
# The transfers (AVCOL_TRC_*) of HDR video: PQ (SMPTE ST 2084, HDR10 and Dolby Vision's base layer) and HLG
# (ARIB STD-B67, what most phones record), by the names FFmpeg's scale filter takes.
HDR_TRANSFERS = {16: "smpte2084", 18: "arib-std-b67"}
UNSPECIFIED = 2  # AVCOL_PRI_UNSPECIFIED, AVCOL_SPC_UNSPECIFIED
# What an ordinary screen (and a browser's <video> with an untagged or BT.709 stream) expects.
TO_SDR = "out_primaries=bt709:out_transfer=bt709:out_color_matrix=bt709:intent=relative_colorimetric"


def _is_hdr(frame: Any) -> bool:
    return frame.color_trc in HDR_TRANSFERS


class _ToSdr:
    """Frames of an HLG or PQ stream scaled and tone-mapped to SDR BT.709 in ``format`` by FFmpeg's scale
    filter: FFmpeg 8's scaler converts transfer and primaries itself, with tone and gamut mapping (a 3D table
    of a few hundred KB, built once per graph), so neither zscale (missing from PyAV's FFmpeg) nor numpy is
    needed. Shown as it is, an HDR signal on an SDR screen is pale and flat (HLG's mid grey comes out 16 levels
    too dark, PQ's skin tones lose most of their colour: tests/test_video_hdr.py measures both).

    The intent is relative colorimetric: HDR reference white (203 cd/m2, BT.2408) becomes SDR white and
    everything up to it keeps its colour (grey, skin and saturated patches within a few levels of their SDR
    values); brighter highlights clip to white. The perceptual intent rolls highlights off instead, but with no
    mastering metadata it compresses from the format's peak (1000 cd/m2 for HLG, 10000 for PQ) and made mid
    grey 105 (HLG) or 92 (PQ) instead of 128: darker than doing nothing. Its 8-bit RGB output was off by up to
    8 levels in saturated colours where 16-bit output then cut to 8 bits was within 1, hence ``rgb48le`` for
    the poster.

    A frame that does not say its primaries or matrix is taken as BT.2020, the only ones HDR video is made in
    in practice. One graph per frame size and format (a stream that changes size mid-way gets a new one)."""

    def __init__(self, width: int, height: int, format: str, flags: str) -> None:
        self.size, self.format, self.flags = (width, height), format, flags
        self._graph: Any = None
        self._key: tuple[int, int, str, int, int, int, int] | None = None

    def convert(self, frame: Any) -> Any:
        key = (frame.width, frame.height, frame.format.name, frame.color_trc, frame.color_primaries,
               frame.colorspace, frame.color_range)
        if key != self._key:
            self._graph, self._key = self._build(frame), key
        self._graph.push(frame)
        return self._graph.pull()

    def _build(self, frame: Any) -> Any:
        import av

        graph = av.filter.Graph()
        graph.threads = 2  # as the decoder: FFmpeg's default is one per core, each with its own arena
        source = graph.add("buffer", video_size=f"{frame.width}x{frame.height}",
                           pix_fmt=frame.format.name,
                           time_base=str(frame.time_base or "1/1000"), pixel_aspect="1/1",
                           colorspace=str(int(frame.colorspace)), range=str(int(frame.color_range)))
        given = f"in_transfer={HDR_TRANSFERS[frame.color_trc]}"
        if frame.color_primaries == UNSPECIFIED:
            given += ":in_primaries=bt2020"
        if frame.colorspace == UNSPECIFIED:
            given += ":in_color_matrix=bt2020"
        out_range = "pc" if self.format.startswith(("rgb", "bgr", "gbr")) else "tv"
        width, height = self.size
        # first to the output size in the frame's own format (a plain scale), then the colour: mapped at 4K, the
        # scaler's float planes took a 4K poster child from 256 MB of address space to 480 MB
        shrink = graph.add("scale", f"w={width}:h={height}:flags={self.flags}")
        scale = graph.add("scale", f"{given}:{TO_SDR}:out_range={out_range}")
        convert = graph.add("format", f"pix_fmts={self.format}")
        sink = graph.add("buffersink")
        source.link_to(shrink)
        shrink.link_to(scale)
        scale.link_to(convert)
        convert.link_to(sink)
        graph.configure()
        return graph


class _open:
    """``av.open`` with the errors turned into sentences, closed on exit (a context manager PyAV types loosely)."""

    def __init__(self, path: str) -> None:
        import av  # here, not at the top: only the child process loads FFmpeg

        self._av = av
        try:
            self.container = av.open(path, metadata_errors="replace")
        except av.error.FFmpegError as exc:
            raise InvalidVideo(CORRUPT, f"{type(exc).__name__}: {exc}") from exc

    def __enter__(self) -> Any:
        return self.container

    def __exit__(self, exc_type: object, exc: object, tb: object) -> None:
        self.container.close()
        if isinstance(exc, self._av.error.FFmpegError):
            raise InvalidVideo(CORRUPT, f"{type(exc).__name__}: {exc}") from exc


def _video_stream(container: Any) -> Any:
    streams = [s for s in container.streams.video if not (s.disposition.value & 0x400)]  # not an attached picture
    if not streams:
        raise InvalidVideo(NO_VIDEO)
    stream = streams[0]
    if stream.codec_context is None:
        name = getattr(stream.codec, "name", None) or "unknown"
        raise InvalidVideo(f"The video uses a codec this server cannot read ({name})")
    if not stream.codec_context.is_open:  # a second call on the same container (inspect) finds it open
        stream.codec_context.thread_count = 2
    return stream


def _first_frame(container: Any, stream: Any) -> Any:
    frame = _next_frame(container, stream)
    if frame is None:
        raise InvalidVideo(NO_FRAMES)
    return frame


def _next_frame(container: Any, stream: Any) -> Any:
    """The first frame the decoder gives from here; packets are demuxed and fed until it does (a few at most
    for a well-formed file; a file of thousands of undecodable packets ends at the deadline of the child)."""
    for frame in container.decode(stream):
        return frame
    return None


def _key_frame_after(container: Any, stream: Any, target: float) -> Any:
    """The packet of the first key frame at or after ``target`` seconds and at most
    :data:`KEY_FRAME_LOOKAHEAD` later, found by demuxing only (packets are not decoded); None if there is none.
    Phones and cameras put a key frame every second or two, so this is the usual poster: decoded alone, it costs
    one frame's memory (about 12 MB in 4K) instead of every reference frame from the previous key frame on."""
    for packet in container.demux(stream):
        if packet.pts is None or packet.size == 0:
            continue
        when = float(packet.pts * stream.time_base)
        if when > target + KEY_FRAME_LOOKAHEAD:
            return None
        if packet.is_keyframe and when >= target - 0.001:
            return packet
    return None


def _decode_alone(stream: Any, packet: Any) -> Any:
    """The frame of one key-frame packet: sent, then the decoder drained (frame threads hold it back)."""
    frames = stream.codec_context.decode(packet) + stream.codec_context.decode(None)
    return frames[0] if frames else None


def _frame_at(container: Any, stream: Any, target: float) -> Any:
    """The first frame at or after ``target`` seconds, decoding on from the key frame the seek landed on, at
    most :data:`MAX_POSTER_FRAMES` of them (phones put a key frame every second or two; a file with none but
    its first gives the frame reached). Only the chosen frame is scaled and converted to RGB."""
    chosen = None
    for count, frame in enumerate(container.decode(stream)):
        chosen = frame
        if count >= MAX_POSTER_FRAMES or (frame.time is not None and frame.time >= target - 0.001):
            break
    return chosen


def _rotation(frame: Any) -> int:
    """The display matrix's rotation as 0, 90, 180 or 270 degrees counter-clockwise (FFmpeg's sign)."""
    degrees = getattr(frame, "rotation", 0) or 0
    return round(degrees / 90) % 4 * 90


def _check_size(stream: Any, frame: Any, max_pixels: int) -> tuple[int, int]:
    width, height = frame.width or stream.width, frame.height or stream.height
    if width < 2 or height < 2:
        raise InvalidVideo(NO_FRAMES, f"{width}x{height}")
    if width * height > max_pixels:
        raise InvalidVideo(f"The video's frames are too large ({width}x{height}); the limit is "
                           f"{max_pixels / 1e6:.0f} megapixels", too_large=True)
    return width, height


def _duration(container: Any, stream: Any) -> float:
    if container.duration:
        return round(container.duration / 1_000_000, 3)
    if stream.duration and stream.time_base:
        return round(float(stream.duration * stream.time_base), 3)
    return 0.0


def _fps(stream: Any) -> float | None:
    rate = stream.average_rate or stream.guessed_rate or stream.base_rate
    if not rate:
        return None
    fps = float(rate)
    return round(fps, 3) if math.isfinite(fps) and 0 < fps < 1000 else None


def _tags(container: Any, stream: Any) -> dict[str, str]:
    tags = {str(k).lower(): str(v) for k, v in stream.metadata.items()}
    tags.update({str(k).lower(): str(v) for k, v in container.metadata.items()})
    return tags


def _taken_at(tags: dict[str, str], now: datetime | None = None) -> str | None:
    """Apple's creationdate (camera local time, with its offset), else creation_time (UTC); kept only when after
    1990 and not in the future, as for photos."""
    now = now or datetime.now(UTC).replace(tzinfo=None)
    for key, local in (("com.apple.quicktime.creationdate", True), ("creation_time", False)):
        value = tags.get(key)
        if not value:
            continue
        try:
            when = datetime.fromisoformat(value.strip().replace("Z", "+00:00"))
        except ValueError:
            continue
        if when.tzinfo is not None:
            if not local:
                when = when.astimezone(UTC)
            when = when.replace(tzinfo=None)
        if OLDEST <= when <= now + timedelta(days=1):
            return when.isoformat(timespec="seconds")
    return None


def _text(value: str | None) -> str | None:
    if not value:
        return None
    text = "".join(c for c in value if c.isprintable()).strip()
    return text[:100] or None


def transcode(source: str, target: str, *, box: tuple[int, int] = (1920, 1080)) -> None:
    """A playable copy for browsers that cannot play the original (HEVC in Chromium): H.264 (yuv420p, CRF 23,
    superfast: about 0.6 s of CPU per second of 1080p, bench/bench_video.py) and AAC in an MP4 whose index is at
    the front (it starts playing before it has all arrived), fitted inside ``box`` (1080p, either orientation),
    the display matrix kept so a portrait clip stays portrait. Timestamps are the source's, so sound and
    picture stay together. No metadata is copied. An HLG or PQ clip is tone-mapped to SDR and tagged BT.709
    (:class:`_ToSdr`); an SDR clip's colours pass as they are. The mapping costs CPU: its table about 3 s once
    (the poster pays it too: a 4K HLG poster 4.1 s of CPU against 0.2 s for SDR), then about 0.1 s per 1080p
    frame; a 1 s 4K HLG clip took 7.2 s of CPU against 1.4 s for SDR on a loaded 2-core box, inside the
    deadline's 20 s per second, and 640 to 896 MB of address space against under 640 MB (the limit: 2 GB)."""
    import av

    _container_name(source)  # the index check, as for the probe
    with _open(source) as inp, av.open(target, "w", format="mp4", options={"movflags": "+faststart"}) as out:
        vin = _video_stream(inp)
        vin.thread_type = "AUTO"
        ain = inp.streams.audio[0] if inp.streams.audio and inp.streams.audio[0].codec_context else None
        first = _first_frame(inp, vin)
        rotation = _rotation(first)
        inp.seek(0)
        long_edge, short_edge = max(box), min(box)
        scale = min(1.0, long_edge / max(first.width, first.height), short_edge / min(first.width, first.height))
        width, height = (max(2, round(first.width * scale / 2) * 2), max(2, round(first.height * scale / 2) * 2))
        vout = out.add_stream("libx264", rate=vin.average_rate or 30)
        vout.width, vout.height, vout.pix_fmt = width, height, "yuv420p"
        vout.time_base = vin.time_base
        vout.options = {"preset": "superfast", "crf": "23"}
        vout.codec_context.thread_count = 2
        to_sdr = None
        if _is_hdr(first):  # tone-mapped to SDR, and the stream says so (a player would guess otherwise)
            to_sdr = _ToSdr(width, height, "yuv420p", "bilinear")
            context = vout.codec_context
            context.color_primaries = context.color_trc = context.colorspace = 1  # BT.709
            context.color_range = 1  # limited ("tv"), as H.264 players expect
        if rotation:
            vout.set_display_rotation(rotation)
        aout = None
        if ain is not None:
            aout = out.add_stream("aac", rate=ain.codec_context.sample_rate or 48000)
            aout.layout = ain.codec_context.layout.name if ain.codec_context.layout else "stereo"
        streams = [vin] if ain is None else [vin, ain]
        for packet in inp.demux(*streams):
            for frame in packet.decode():
                if packet.stream is vin:
                    if to_sdr is not None:
                        picture = to_sdr.convert(frame)
                    else:
                        picture = frame.reformat(width=width, height=height, format="yuv420p")
                    picture.pts, picture.time_base = frame.pts, frame.time_base
                    out.mux(vout.encode(picture))
                elif aout is not None:
                    frame.pts = None  # the encoder numbers audio samples itself: gaps would break AAC
                    out.mux(aout.encode(frame))
        out.mux(vout.encode(None))
        if aout is not None:
            out.mux(aout.encode(None))


# --- the child process -------------------------------------------------------------------------------------
# stdout: one JSON line ({"info": ..., "poster": {"width", "height", "bytes", "orientation"}} or {"error", "detail",
# "too_large"}), then, for a poster, its RGB bytes (width * height * 3). Exit 0 for a good or a bad video; any
# other exit is a crash, which pipeline/video_jobs.py turns into a sentence.


def main(argv: list[str]) -> int:
    """``probe|inspect PATH [VIEW_PX [MAX_PIXELS [MEMORY_BYTES]]]`` (inspect: probe and poster) or
    ``transcode PATH TARGET [MAX_PIXELS [MEMORY_BYTES]]``."""
    mode, path = argv[0], argv[1]
    view_px = int(argv[2]) if len(argv) > 2 and mode != "transcode" else 1600
    max_pixels = int(argv[3]) if len(argv) > 3 else MAX_FRAME_PIXELS
    if len(argv) > 4:  # before FFmpeg is loaded: a runaway allocation fails here, not in the server
        memory = int(argv[4])
        resource.setrlimit(resource.RLIMIT_AS, (memory, memory))
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))  # a crash leaves no core file behind
    out = sys.stdout.buffer
    if mode == "transcode":  # PATH TARGET: lowest CPU priority, so that photos' workers go first
        os.nice(19)
        try:
            transcode(path, argv[2])
        except InvalidVideo as error:
            out.write(json.dumps({"error": error.reason, "detail": error.detail}).encode() + b"\n")
        else:
            out.write(b'{"done": true}\n')
        out.flush()
        return 0
    try:
        pixels = b""
        if mode == "inspect":
            info, poster = inspect(path, max_pixels=max_pixels, view_px=view_px)
            pixels = poster.rgb
        else:
            info = probe(path, max_pixels=max_pixels)
        head: dict[str, Any] = {"info": info.to_json()}
        if mode == "inspect":
            head["poster"] = {"width": poster.width, "height": poster.height, "bytes": len(pixels),
                              "orientation": poster.orientation}
    except InvalidVideo as error:
        head, pixels = {"error": error.reason, "detail": error.detail, "too_large": error.too_large}, b""
    except MemoryError:
        head, pixels = {"error": "The video needs more memory than this server allows for one video."}, b""
    out.write(json.dumps(head).encode() + b"\n")
    out.write(pixels)
    out.flush()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
