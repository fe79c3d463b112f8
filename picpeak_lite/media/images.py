"""Pure Pillow: a cheap header check for uploads, and the derivatives a guest sees.

This is the only module that imports PIL (and pillow_heif). Everything here is sync and CPU-bound; the worker
runs :func:`derivatives` (:func:`decode`, :func:`make_view`, :func:`make_grid`, :func:`add_watermark`,
:func:`encode`) as one job in an image child (``pipeline/imageprocs.py``), which is killed at its deadline;
downloads run them in threads, and Pillow releases the GIL inside them (encoding too: ``_encoder_file``).

Three rules shape the code:

* Every failure a file can cause becomes :class:`InvalidImage` with a reason a photographer can read. The
  format comes from the bytes, never the name, and the pixel limit is checked on the header before any pixel
  is decoded, so a 100000x100000 PNG costs a few hundred bytes of reading, not 30 GB.
* Derivatives carry no metadata: we re-encode pixels with explicit save parameters and an emptied ``info``,
  so no EXIF (GPS!), XMP or comment survives. The ICC profile is kept because it is colour, not personal data.
  Downloads (the web size and watermarked copies) add back exactly the photographer's rights, rebuilt from
  the original rather than copied: EXIF Artist and Copyright, XMP dc:creator and dc:rights (:func:`rights_of`).
* Big JPEGs are decoded at 1/8, 2/8, 3/8 or 4/8 scale by libjpeg itself (``_decode_at``), and the view is
  sized from that scale when it lands within 1/16 below ``view_px`` (VIEW_SLACK): a 6000 px photo gives a
  1500 px view (2/8) and a 4243 px one a 1592 px view (3/8) straight from the decoder, with no resampling at
  all, instead of a larger decode and a resampling pass. What is still too large is shrunk by bilinear, the
  grid image is made from the view, and derivatives are optimised baseline JPEGs (progressive cost twice the
  encoder time for the same bytes). Measured on camera-like photos: within 0.2 dB (24 MP) and 0.5 dB (12 MP)
  PSNR of a full-resolution Lanczos reference once both are JPEG-encoded (``bench/bench_quality.py``).
* Memory is known before it is spent. A 560 KB PNG can claim 12000x12000 RGBA (576 MB of pixels, 1.8 GB with
  the working copies), so :func:`plan` and :func:`plan_watermark` estimate, from the header alone, the peak a
  render or a watermarked copy will need (``Cost``, calibrated against VmHWM per format: the decoded mode's
  bytes per pixel as Pillow stores them, the decoder's own buffers, every full-size copy). The caller holds that
  much of the process's decode budget (``runtime/budget.py``) around the work; what could not fit even alone
  is refused with a sentence that names its size. Fewer copies also means a smaller estimate: greys and
  alpha are shrunk or flattened without the extra RGBA copy, and the view is turned upright after shrinking.

Longer than 400 lines on purpose: the cost estimates describe the exact copies the decode and render code
makes, so they change together; kept side by side, a change to one shows in the diff of the other.
"""

from __future__ import annotations

import functools
import io
import os
import xml.etree.ElementTree as ET
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from typing import BinaryIO, cast
from xml.sax.saxutils import escape

import pillow_heif
from PIL import Image, ImageCms, ImageDraw, ImageFile, ImageFont, ImageOps, features

from picpeak_lite.media.exif import read_orientation

pillow_heif.register_heif_opener()
# Our limit (RenderSpec.max_pixels) is checked in _open on the header of every image this module opens, before
# any decode. Pillow's own check is process-global, only warns below twice its default and cannot be per call.
Image.MAX_IMAGE_PIXELS = None

Source = str | os.PathLike[str] | bytes

MIN_SIDE = 10
LOGO_MAX_PIXELS = 25_000_000
MAX_ICC = 4 << 20
# our format name -> (Pillow plugin, MIME type)
FORMATS = {
    "jpeg": ("JPEG", "image/jpeg"),
    "png": ("PNG", "image/png"),
    "webp": ("WEBP", "image/webp"),
    "heif": ("HEIF", "image/heic"),
}
HEIF_BRANDS = {b"heic", b"heix", b"heim", b"heis", b"hevc", b"hevx", b"hevm", b"hevs", b"mif1", b"msf1"}


def N_(message: str) -> str:
    """Marks a fixed refusal for translation where it reaches a person (pipeline/intake.py); the image children
    this module runs in do not load the translation machinery."""
    return message


UNSUPPORTED = N_("Not a supported image (JPEG, PNG, WebP or HEIC)")
CORRUPT = N_("The image file is truncated or corrupt")
POSITIONS = ("top-left", "top-right", "bottom-left", "bottom-right", "center")
# EXIF orientation -> the transpose that shows the photo upright (the same table as ImageOps.exif_transpose).
ORIENT = {
    2: Image.Transpose.FLIP_LEFT_RIGHT,
    3: Image.Transpose.ROTATE_180,
    4: Image.Transpose.FLIP_TOP_BOTTOM,
    5: Image.Transpose.TRANSPOSE,
    6: Image.Transpose.ROTATE_270,
    7: Image.Transpose.TRANSVERSE,
    8: Image.Transpose.ROTATE_90,
}
SRGB = ImageCms.createProfile("sRGB")
# deflate compresses at most about 1032:1, and a PNG row holds at least one bit per pixel and a filter byte, so a
# PNG shorter than that bound claims a size its data cannot have: a bomb's header or a cut-off file.
DEFLATE_MAX_RATIO = 1032
MB = 1024 * 1024
# Only the first frame of an animated WebP, APNG or HEIF sequence is decoded; more frames than this is a file
# made to exhaust the demuxer's tables, not a photo.
MAX_FRAMES = 1000
# libjpeg walks every block of a component once per scan, however few bytes the scan has: a progressive "scan
# bomb" of 20,000 scans of 30 bytes each (runs of empty blocks) holds a decode for minutes. Encoders write far
# fewer (libjpeg's progressive default 10 (6 grey), mozjpeg's searched scripts about 10-20, Photoshop 3-5);
# libjpeg-turbo's own answer is a scan limit (djpeg -maxscans, TJPARAM_SCANLIMIT). At 100 the worst case
# measured on a 2-core box (refinement scans of runs of empty blocks, the costliest per byte) is about 5 s for
# a 49 MP image and 11 s for 144 MP, within the decode deadline. Only JPEGs that are not sequential Huffman
# (progressive, arithmetic, lossless) are counted: a sequential Huffman scan costs at least two bits a block,
# so its decode time is bounded by the file's size.
MAX_SCANS = 100
SOS = b"\xff\xda"  # in entropy-coded data 0xFF is always stuffed as FF 00: FF DA starts a scan (or sits in
# a metadata segment's bytes, which only makes the count an upper bound)


class InvalidImage(ValueError):
    """A file we cannot or will not process. ``reason`` is shown to the uploader; ``detail`` is for logs."""

    def __init__(self, reason: str, detail: str = "", *, too_large: bool = False) -> None:
        super().__init__(reason)
        self.reason = reason
        self.detail = detail
        self.too_large = too_large  # refused for its size (pixels, frames or memory): an upload answers 413


@dataclass(frozen=True)
class ImageHeader:
    """What the upload request learns from the header. Width and height are as displayed (EXIF-oriented)."""

    format: str  # 'jpeg', 'png', 'webp' or 'heif'
    mime: str
    width: int
    height: int
    frames: int = field(default=1, compare=False)
    memory: int = field(default=0, compare=False)  # estimated peak bytes of making its view and grid images


@dataclass(frozen=True)
class Watermark:
    text: str = ""
    logo_path: str | None = None  # a PNG with alpha; used instead of the text when set
    position: str = "bottom-right"  # one of POSITIONS
    opacity: float = 0.5  # 0.05-1
    size: float = 0.2  # share of the image width, 0.02-1

    def __post_init__(self) -> None:
        if self.position not in POSITIONS:
            raise ValueError(f"watermark position must be one of {', '.join(POSITIONS)}")
        if not (0.05 <= self.opacity <= 1 and 0.02 <= self.size <= 1):
            raise ValueError("watermark opacity must be 0.05-1 and size 0.02-1")


@dataclass(frozen=True)
class RenderSpec:
    grid_px: int = 400  # long edge of the grid image
    view_px: int = 1600  # long edge of the view image
    quality: int = 85
    max_pixels: int = 150_000_000
    watermark: Watermark | None = None  # on the view, and so on the grid made from it: every size a guest sees


@dataclass(frozen=True)
class Decoded:
    """An upright RGB image in memory (``image``) and what we know of the original it came from.

    ``width`` and ``height`` are the original's displayed size, even when ``image`` was decoded at reduced
    scale or is a derivative. ``icc`` is the profile the pixels are in (None: sRGB).
    """

    image: Image.Image
    format: str
    width: int
    height: int
    exif: bytes | None
    icc: bytes | None
    orientation: int = 1  # the EXIF orientation still to apply to ``image``: make_view turns it upright


@dataclass(frozen=True)
class Rendered:
    format: str
    width: int  # of the original, upright
    height: int
    view_jpeg: bytes
    grid_jpeg: bytes
    exif: bytes | None  # the original's EXIF block as found, for exif.read_metadata


def sniff(source: Source, *, max_pixels: int = 150_000_000, max_bytes: int | None = None,
          view_px: int = 1600) -> ImageHeader:
    """Check an upload from its magic bytes and header only: no pixel is decoded, nothing large allocated.

    With ``max_bytes``, an image whose view would need more memory than that (``plan``) is refused here, so that
    the worker never meets it. A progressive (or arithmetic) JPEG's scans are counted, which reads the file once
    (``MAX_SCANS``; about 3 ms a MB).
    """
    with _open(source, max_pixels, count_scans=True) as (im, fmt):
        width, height = _upright(im.size, read_orientation(_exif(im)))
        frames = _frames(im)
        memory = _view_cost(im, fmt, view_px)
    if max_bytes is not None:
        _check_fits(memory, max_bytes, width, height)
    return ImageHeader(fmt, FORMATS[fmt][1], width, height, frames, memory)


def plan(source: Source, spec: RenderSpec, max_bytes: int | None = None) -> int:
    """The peak bytes :func:`render` (or the worker's steps) will need for this file with this spec, from its
    header; with ``max_bytes``, InvalidImage(too_large) when that cannot fit."""
    with _open(source, spec.max_pixels) as (im, fmt):
        width, height = _upright(im.size, read_orientation(_exif(im)))
        memory = _view_cost(im, fmt, spec.view_px) + _logo_cost(spec.watermark)
    if max_bytes is not None:
        _check_fits(memory, max_bytes, width, height)
    return memory


def plan_watermark(source: Source, watermark: Watermark, *, max_pixels: int = 150_000_000,
                   max_bytes: int | None = None) -> int:
    """The peak bytes of :func:`apply_watermark` with the same ``max_bytes`` (which picks a JPEG's scale)."""
    with _open(source, max_pixels) as (im, fmt):
        width, height = _upright(im.size, read_orientation(_exif(im)))
        _, memory = _full_scale(im, fmt, watermark, max_bytes)
    if max_bytes is not None:
        _check_fits(memory, max_bytes, width, height)
    return memory


def too_large_for_memory(width: int, height: int, needed: int, limit: int) -> str:
    return (f"Image is too large to process: {width}x{height} pixels would need about {_mb(needed)} MB of "
            f"memory, and this server allows {_mb(limit)} MB.")


def render(source: Source, spec: RenderSpec) -> Rendered:
    """:func:`derivatives` of ``source`` in one call, for tests and scripts."""
    view, view_jpeg, grid_jpeg = derivatives(functools.partial(decode, source, spec), spec)
    return Rendered(view.format, view.width, view.height, view_jpeg, grid_jpeg, view.exif)


def derivatives(decode: Callable[[], Decoded], spec: RenderSpec) -> tuple[Decoded, bytes, bytes]:
    """(the view, its JPEG, the grid's JPEG), watermarked when ``spec`` says so, without metadata: the steps
    every picture takes, a photo's decode and a video's poster (:func:`from_rgb`) alike.

    ``decode`` is a call without arguments that makes the decoded picture: this function then holds the only
    reference to it, and it is freed as soon as the view exists (a 144 MP PNG decodes to hundreds of MB; the
    view is a few). The worker runs it in an image child (``pipeline/imagejobs.py``), which is killed at its
    deadline: no step needs to look at the clock."""
    decoded = decode()
    view = make_view(decoded, spec)
    del decoded
    if spec.watermark is not None:
        # Before the grid: a guest's browser may show either size in a tile (srcset), and a watermarked gallery
        # must never show an unmarked one. The grid shrinks the mark with the photo, so it keeps its place and
        # its share of the width at every size.
        view = add_watermark(view, spec.watermark)
    grid = make_grid(view, spec)
    view_jpeg = encode(view, spec)
    return view, view_jpeg, encode(grid, spec)


def decode(source: Source, spec: RenderSpec) -> Decoded:
    """Decode, upright and in RGB, at the smallest JPEG scale that still covers ``spec.view_px``."""
    return _load(source, spec.max_pixels, spec.view_px)


def from_rgb(rgb: bytes, size: tuple[int, int], width: int, height: int, fmt: str, orientation: int = 1) -> Decoded:
    """A video's poster frame (RGB bytes from media/video.py's child, as stored, with the EXIF ``orientation``
    that turns it upright) as a decoded picture, which then takes the photos' path: make_view (which turns it),
    make_grid, add_watermark, encode. ``width``/``height``: the video's, upright."""
    return Decoded(Image.frombytes("RGB", size, rgb), fmt, width, height, None, None, orientation)


def make_view(decoded: Decoded, spec: RenderSpec) -> Decoded:
    """Shrink, then turn upright: transposing the view costs a few MB, the decoded image hundreds.

    A decode already within VIEW_SLACK of ``view_px`` is the view as it is. What is left after the DCT scale
    is less than 2x, and there Pillow's (antialiased) bilinear came closer to a full-resolution Lanczos
    reference than bicubic or Lanczos from the same decode did (12 MP: 41.4 against 40.9 and 40.4 dB), in
    fewer bytes, at 26 ms against 44 and 56."""
    image = _shrink(decoded.image, spec.view_px, Image.Resampling.BILINEAR)
    if decoded.orientation in ORIENT:
        image = image.transpose(ORIENT[decoded.orientation])
    return replace(decoded, image=image, orientation=1)


def make_grid(view: Decoded, spec: RenderSpec) -> Decoded:
    """From the view image, not a second decode. A 3x box reduce leaves Lanczos only the last 1.25x: 3.0
    against 4.9 ms for a 1500 px view, 47.5 dB from Lanczos all the way (the 2x reduce: 53 dB)."""
    return replace(view, image=_shrink(view.image, spec.grid_px, reducing_gap=GRID_REDUCING_GAP))


def add_watermark(picture: Decoded, watermark: Watermark) -> Decoded:
    return replace(picture, image=_watermarked(picture.image.copy(), watermark))


def encode(picture: Decoded, spec: RenderSpec) -> bytes:
    return _jpeg(picture.image, spec.quality, picture.icc)


WEB_PX = 2048  # long edge of the "web size" download: sharp on any screen, a fraction of a camera file
# What a web copy weighs against its original, for the estimate shown before a web-size zip (issue 35 #17: "about
# 32 MB" was a 15.6 MB zip, when the estimate was the original's bytes times the pixel share). Measured with
# web_copy on picpeak_lite.media.samples' camera-like photos (quality 90, sensor grain) from 1 to 36 MP: scaled to
# s = WEB_PX / long edge, a copy weighs the pixel share s*s times (WEB_SCALED_BASE + WEB_SCALED_SLOPE * s) of the
# original (0.60 at s = 0.97, 0.34 at 12 MP, 0.23 at 36 MP: the downscale averages the grain away, so each pixel
# costs fewer bytes the more it shrinks); not scaled (s >= 1), it is only re-encoded at quality 88: 0.885.
WEB_SCALED_BASE = 0.072
WEB_SCALED_SLOPE = 0.547
WEB_UNSCALED = 0.885
ARTIST, COPYRIGHT = 0x013B, 0x8298
MAX_XMP = 64 << 10  # one APP1 segment; a bigger packet is not read for rights
NS = {"x": "adobe:ns:meta/", "rdf": "http://www.w3.org/1999/02/22-rdf-syntax-ns#",
      "dc": "http://purl.org/dc/elements/1.1/"}


@dataclass(frozen=True)
class Rights:
    """Who made the photo and who may use it, as the photographer's camera or editor wrote them."""

    artist: str = ""
    copyright: str = ""
    creators: tuple[str, ...] = ()
    rights: str = ""

    def exif(self) -> bytes:
        """An EXIF block with Artist and Copyright only: no GPS, serial numbers or anything else."""
        block = Image.Exif()
        if self.artist:
            block[ARTIST] = self.artist
        if self.copyright:
            block[COPYRIGHT] = self.copyright
        return block.tobytes() if len(block) else b""

    def xmp(self) -> bytes:
        """A minimal XMP packet with dc:creator and dc:rights, or b"" when there are neither."""
        if not self.creators and not self.rights:
            return b""
        parts = []
        if self.creators:
            items = "".join(f"<rdf:li>{escape(c)}</rdf:li>" for c in self.creators)
            parts.append(f"<dc:creator><rdf:Seq>{items}</rdf:Seq></dc:creator>")
        if self.rights:
            parts.append(f'<dc:rights><rdf:Alt><rdf:li xml:lang="x-default">{escape(self.rights)}</rdf:li>'
                         "</rdf:Alt></dc:rights>")
        return (f'<x:xmpmeta xmlns:x="{NS["x"]}"><rdf:RDF xmlns:rdf="{NS["rdf"]}">'
                f'<rdf:Description rdf:about="" xmlns:dc="{NS["dc"]}">{"".join(parts)}</rdf:Description>'
                "</rdf:RDF></x:xmpmeta>").encode()


def rights_of(source: Source, *, max_pixels: int = 150_000_000) -> Rights:
    """The original's Artist, Copyright, dc:creator and dc:rights (header only, no pixels decoded). An
    unreadable EXIF or XMP block gives empty fields rather than an error: a download never fails for them."""
    with _open(source, max_pixels) as (im, _):
        try:
            block = im.getexif()
            artist, copyright = (_tag_text(block.get(tag)) for tag in (ARTIST, COPYRIGHT))
        except Exception:  # Pillow's EXIF parser on a damaged block
            artist = copyright = ""
        xmp = im.info.get("xmp")
    creators: tuple[str, ...] = ()
    rights = ""
    if isinstance(xmp, bytes | bytearray) and 0 < len(xmp) <= MAX_XMP:
        try:
            root = ET.fromstring(bytes(xmp).strip(b"\x00 \r\n"))
        except ET.ParseError:
            root = None
        if root is not None:
            creators = tuple(t for li in root.iterfind(".//dc:creator//rdf:li", NS) if (t := _clean(li.text)))
            rights = next((t for li in root.iterfind(".//dc:rights//rdf:li", NS) if (t := _clean(li.text))), "")
    return Rights(artist, copyright, creators[:10], rights)


def _tag_text(value: object) -> str:
    if isinstance(value, bytes):
        value = value.decode("utf-8", "replace")
    return _clean(value) if isinstance(value, str) else ""


def _clean(text: str | None) -> str:
    return " ".join((text or "").replace("\x00", " ").split())[:300]


def plan_web(source: Source, watermark: Watermark | None, *, max_pixels: int = 150_000_000,
             max_bytes: int | None = None) -> int:
    """The peak bytes of :func:`web_copy`: the same as a view image of that size."""
    return plan(source, RenderSpec(view_px=WEB_PX, max_pixels=max_pixels, watermark=watermark), max_bytes)


def studio_logo(source: Source, *, max_side: int, max_pixels: int) -> bytes:
    """A studio's logo as we serve it: decoded (JPEG, PNG, WebP or HEIF, checked as every upload is), turned
    upright, shrunk to ``max_side`` on its long edge and written as a new PNG with its transparency and no
    metadata. Guests are never sent the uploaded bytes: whatever else the file carried (text chunks, a second
    image, a polyglot's other half) is gone."""
    with _open(source, max_pixels) as (im, _fmt):
        try:
            im.load()
        except InvalidImage:
            raise
        except Exception as exc:  # only Pillow decoders run here
            raise InvalidImage(CORRUPT, f"{type(exc).__name__}: {exc}") from exc
        orientation = read_orientation(_exif(im))
        has_alpha = im.mode in ("RGBA", "LA", "PA") or (im.mode == "P" and "transparency" in im.info)
        image = im.convert("RGBA" if has_alpha else "RGB")
    if orientation in ORIENT:
        image = image.transpose(ORIENT[orientation])
    if max(image.size) > max_side:
        image = _shrink(image, max_side)
    out = io.BytesIO()
    image.info = {}
    image.save(out, "PNG", optimize=True)
    return out.getvalue()


def face_pixels(source: Source, *, max_side: int, max_pixels: int) -> tuple[int, int, bytes]:
    """(width, height, RGB bytes) of an image, upright and at most ``max_side`` on its long edge: what the face
    detector reads (``media/faces.py``). Checked as every upload is (format by its bytes, pixel limit, scans); a
    JPEG is decoded at the smallest DCT scale that still covers ``max_side``."""
    with _open(source, max_pixels) as (im, fmt):
        try:
            if fmt == "jpeg":
                im.draft("RGB", (max_side, max_side))
            im.load()
        except InvalidImage:
            raise
        except Exception as exc:  # only Pillow decoders run here
            raise InvalidImage(CORRUPT, f"{type(exc).__name__}: {exc}") from exc
        orientation = read_orientation(_exif(im))
        image = im.convert("RGB")
    if max(image.size) > max_side:
        image = _shrink(image, max_side)
    if orientation in ORIENT:
        image = image.transpose(ORIENT[orientation])
    return image.width, image.height, image.tobytes()


def web_copy(source: Source, watermark: Watermark | None, *, quality: int = 88,
             max_pixels: int = 150_000_000) -> bytes:
    """The "web size" download: upright, ~2048 px on the long edge (never enlarged), watermarked when given,
    with the photographer's rights and nothing else of the original's metadata (no GPS)."""
    spec = RenderSpec(view_px=WEB_PX, max_pixels=max_pixels, quality=quality, watermark=watermark)
    rights = rights_of(source, max_pixels=max_pixels)
    picture = make_view(decode(source, spec), spec)
    if watermark is not None:
        picture = add_watermark(picture, watermark)
    return _jpeg(picture.image, quality, picture.icc, rights=rights)


def apply_watermark(source: Source, watermark: Watermark, *, quality: int = 92, max_pixels: int = 150_000_000,
                    max_bytes: int | None = None) -> bytes:
    """A full-size, upright, watermarked JPEG for guest downloads, carrying only the photographer's rights
    (:class:`Rights`); the original is only read.

    A JPEG too big for ``max_bytes`` at full size is decoded at the largest 1/2, 1/4 or 1/8 scale that fits
    (:func:`plan_watermark` says how much that takes). Saved baseline and not optimised: libjpeg would otherwise
    keep every DCT coefficient of the image (3 bytes a pixel) for the second pass.
    """
    with _open(source, max_pixels) as (im, fmt):
        scale, _ = _full_scale(im, fmt, watermark, max_bytes)
    rights = rights_of(source, max_pixels=max_pixels)
    picture = _load(source, max_pixels, None, scale=scale, upright_first=True)
    return _jpeg(_watermarked(picture.image, watermark), quality, picture.icc, compact=True, rights=rights)


@contextmanager
def _open(source: Source, max_pixels: int, *, count_scans: bool = False) -> Iterator[tuple[Image.Image, str]]:
    """Open lazily (header only) with the one Pillow plugin the magic bytes name, and check the size.

    Pillow reads through a :class:`_Feed`, which stops a JPEG's decode at MAX_SCANS scans; ``count_scans``
    counts them here already (the upload's check)."""
    with io.BytesIO(source) if isinstance(source, bytes) else open(source, "rb") as fp:
        head = fp.read(64)
        fmt = _format(head)
        fp.seek(0)
        canvas = _webp_canvas(head) if fmt == "webp" else None
        if canvas is not None:  # Pillow's WebP decoder allocates the canvas when it opens: check it first
            _check_pixels(*canvas, max_pixels)
        feed = _Feed(fp)
        try:
            im = Image.open(cast(BinaryIO, feed), formats=[FORMATS[fmt][0]])
        except Exception as exc:  # only Pillow runs here; its plugins raise many types
            raise InvalidImage(CORRUPT, f"{type(exc).__name__}: {exc}") from exc
        width, height = im.size
        if width < MIN_SIDE or height < MIN_SIDE:
            raise InvalidImage(
                f"Image is too small ({width}x{height}); at least {MIN_SIDE}x{MIN_SIDE} pixels"
            )
        _check_pixels(width, height, max_pixels)
        if fmt == "jpeg":
            im.decodermaxblock = JPEG_READ_BLOCK
        frames = _frames(im)
        if frames > MAX_FRAMES:
            raise InvalidImage(f"The image has {frames:,} frames; at most {MAX_FRAMES:,} are accepted "
                               "(only the first is shown)", too_large=True)
        if fmt == "png" and _file_size(fp) < height * (1 + (width + 7) // 8) // DEFLATE_MAX_RATIO:
            raise InvalidImage(CORRUPT, f"{width}x{height} cannot fit in {_file_size(fp)} bytes")
        if fmt == "jpeg" and not _sequential_huffman(fp):
            if count_scans and _has_more_scans(fp, MAX_SCANS):
                raise InvalidImage(TOO_MANY_SCANS)
            feed.count_scans(MAX_SCANS)  # from here on only the decode reads: it sees at most MAX_SCANS
        yield im, fmt


TOO_MANY_SCANS = (f"The JPEG has more than {MAX_SCANS} scans, far more than any camera or encoder writes; a file "
                  "like this only makes decoding slow")


class _Feed:
    """The file as Pillow reads it: a JPEG cut off before its scan after
    the allowed ones (the next read raises InvalidImage), so that no file can make one decoder call walk the
    image more than MAX_SCANS times, even one that an older version accepted at upload.

    Pillow hands the decoder what one read returns (``decodermaxblock``): cutting the block there is what bounds
    the work of one call, whose scans run in C."""

    def __init__(self, fp: BinaryIO) -> None:
        self.fp = fp
        self.scans_left: int | None = None  # None: not counting
        self.tail = b""  # b"\xff" when the last block ended with one: a marker may straddle two blocks

    def count_scans(self, limit: int) -> None:
        self.scans_left = limit
        self.tail = b""

    def read(self, size: int = -1) -> bytes:
        if self.scans_left is not None and self.scans_left < 0:
            raise InvalidImage(TOO_MANY_SCANS)
        data = self.fp.read(size)
        if self.scans_left is None or not data:
            return data
        joined = self.tail + data
        found = joined.count(SOS)
        if found > self.scans_left:
            at = -1
            for _ in range(self.scans_left + 1):
                at = joined.find(SOS, at + 1)
            cut = at - len(self.tail)
            self.scans_left = -1
            if cut <= 0:
                raise InvalidImage(TOO_MANY_SCANS)
            return data[:cut]
        self.scans_left -= found
        self.tail = data[-1:] if data[-1:] == b"\xff" else b""
        return data

    def seek(self, offset: int, whence: int = os.SEEK_SET) -> int:
        self.tail = b""
        return self.fp.seek(offset, whence)

    def tell(self) -> int:
        return self.fp.tell()

    def __getattr__(self, name: str) -> object:
        return getattr(self.fp, name)


SEQUENTIAL_HUFFMAN = (0xC0, 0xC1)  # SOF0 (baseline) and SOF1 (extended): what cameras write


def _sequential_huffman(fp: BinaryIO) -> bool:
    """Whether the JPEG's frame (its SOF marker, found by walking the segments before it) is sequential
    Huffman. Anything odd on the way counts as not, so that its scans are counted."""
    here = fp.tell()
    try:
        fp.seek(2)
        while True:
            head = fp.read(4)
            if len(head) < 4 or head[0] != 0xFF:
                return False
            marker = head[1]
            if 0xC0 <= marker <= 0xCF and marker not in (0xC4, 0xC8, 0xCC):
                return marker in SEQUENTIAL_HUFFMAN
            if marker in (0xDA, 0xD9, 0xFF):
                return False
            fp.seek(int.from_bytes(head[2:4], "big") - 2, os.SEEK_CUR)
    finally:
        fp.seek(here)


def _has_more_scans(fp: BinaryIO, limit: int) -> bool:
    """Whether the file holds more than ``limit`` scan markers, read in blocks (a 50 MB file is not held)."""
    here = fp.tell()
    fp.seek(0)
    found = 0
    tail = b""
    try:
        while block := fp.read(JPEG_READ_BLOCK):
            found += (tail + block).count(SOS)
            if found > limit:
                return True
            tail = block[-1:] if block[-1:] == b"\xff" else b""
        return False
    finally:
        fp.seek(here)


def _check_pixels(width: int, height: int, max_pixels: int) -> None:
    if width * height > max_pixels:
        raise InvalidImage(
            f"Image is too large ({_megapixels(width * height)} megapixels; the limit is {_megapixels(max_pixels)})",
            too_large=True,
        )


def _check_fits(memory: int, max_bytes: int, width: int, height: int) -> None:
    if memory > max_bytes:
        raise InvalidImage(too_large_for_memory(width, height, memory, max_bytes), too_large=True)


def _webp_canvas(head: bytes) -> tuple[int, int] | None:
    """The canvas size a WebP header claims (the same fields Pillow's plugin reads), or None if unreadable."""
    chunk = head[12:16]
    if chunk == b"VP8 " and len(head) >= 30 and head[23:26] == b"\x9d\x01\x2a":
        return (int.from_bytes(head[26:28], "little") & 0x3FFF, int.from_bytes(head[28:30], "little") & 0x3FFF)
    if chunk == b"VP8X" and len(head) >= 30:
        return int.from_bytes(head[24:27], "little") + 1, int.from_bytes(head[27:30], "little") + 1
    if chunk == b"VP8L" and len(head) >= 25 and head[20] == 0x2F:
        bits = int.from_bytes(head[21:25], "little")
        return (bits & 0x3FFF) + 1, ((bits >> 14) & 0x3FFF) + 1
    return None


def _frames(im: Image.Image) -> int:
    frames = getattr(im, "n_frames", 1)
    return frames if isinstance(frames, int) and frames > 0 else 1


# --- what decoding costs ----------------------------------------------------------------------------------
# Calibrated on 12 MP files of each kind (peak VmHWM over a fresh process, bench-style), rounded up.

SHRINK_SHARE = 0.6  # reduce() output plus the resize's intermediate, as a share of the image being shrunk
JPEG_COEF_BYTES = 2  # libjpeg keeps one 16-bit coefficient per sample for a multi-scan (progressive) JPEG
# Pillow feeds a JPEG to libjpeg in blocks it reads in Python, taking the GIL back for each one; at its 64 KiB,
# a 9 MB photo is 140 hand-backs, each a wait while the event loop or the other image thread holds the GIL.
# At 1 MiB: 200 x 12 MP photos end to end went from 12.90 to 13.82 photos/s (median of 3 interleaved pairs),
# and the first 202 from 1.97 to 1.59 s. What it holds: the block read, the unread rest, and their join.
JPEG_READ_BLOCK = 1 << 20
JPEG_READ_BYTES = 3 * JPEG_READ_BLOCK
ENCODED_BYTES_PER_PIXEL = 2  # a full-size JPEG's output buffer as it grows, and the copy getvalue() makes


def _pixel_bytes(mode: str) -> int:
    """Bytes per pixel as Pillow stores the mode: RGB, LA and the like take 4, not 3."""
    if mode in ("1", "L", "P"):
        return 1
    if mode.startswith("I;16"):
        return 2
    return 4


def _needs_flatten(im: Image.Image) -> bool:
    return im.mode in ("RGBA", "LA", "PA", "RGBa", "La") or (im.mode == "P" and "transparency" in im.info)


def _rgb_copies(im: Image.Image) -> int:
    """Full-size 4-byte copies ``_to_rgb`` makes on the way to RGB (one per convert or flatten)."""
    if im.mode == "RGB":
        return 0
    if im.mode.startswith("I") or im.mode == "F":
        return 3  # to I, scaled, and (after a 1-byte L) to RGB
    if _needs_flatten(im):
        return 1 if im.mode in ("RGBA", "LA") else 2
    return 1


def _decoder_bytes(im: Image.Image, fmt: str) -> int:
    """What the decoder holds besides the image it fills, at the image's full (header) size."""
    width, height = im.size
    if fmt == "webp":
        return 3 * width * height * 4  # libwebp's canvas and previous canvas, and the frame as Python bytes
    if fmt == "heif":
        return width * height * 4  # libheif's decoded planes, copied into the Pillow image
    if fmt == "png" and _frames(im) > 1:
        return width * height * _pixel_bytes(im.mode)  # APNG keeps the previous frame for disposal
    if fmt == "jpeg" and im.info.get("progressive"):
        layers = getattr(im, "layer", None) or [("", 1, 1, 0)] * len(im.getbands())
        h_max = max(layer[1] for layer in layers) or 1
        v_max = max(layer[2] for layer in layers) or 1
        samples = sum(width * height * layer[1] * layer[2] / (h_max * v_max) for layer in layers)
        return int(JPEG_COEF_BYTES * samples) + JPEG_READ_BYTES
    if fmt == "jpeg":
        return JPEG_READ_BYTES
    return 0


VIEW_SLACK = 16  # a view may be up to 1/16 smaller than view_px when the JPEG's DCT scale lands there
LIBJPEG_TURBO = bool(features.check_feature("libjpeg_turbo"))
# The reduced scales a view is decoded at (5/8-7/8 would cost nearly a full decode); 3/8 only with libjpeg-turbo.
DCT_EIGHTHS = (1, 2, 3, 4) if LIBJPEG_TURBO else (1, 2, 4)


def view_floor(view_px: int) -> int:
    """The smallest long edge a view image may have (1500 for 1600): the draft scale is chosen against this."""
    return view_px - view_px // VIEW_SLACK


def _eighths(size: tuple[int, int], view_px: int) -> int:
    """The M/8 scale a JPEG of ``size`` is decoded at for a view: the smallest M of 1-4 whose long edge still
    reaches ``view_floor``, or 8 (full size) when even 4/8 misses it (3/8 needs libjpeg-turbo: ``_decode_at``)."""
    floor = view_floor(view_px)
    for eighths in DCT_EIGHTHS:
        if max(_scaled(size, eighths)) >= floor:
            return eighths
    return 8


def _draft_size(im: Image.Image, fmt: str, view_px: int) -> tuple[int, int]:
    """The size ``_load`` decodes at for a view image: a JPEG's DCT scale, else the full size."""
    return _scaled(im.size, _eighths(im.size, view_px)) if fmt == "jpeg" else im.size


def _scaled(size: tuple[int, int], eighths: int) -> tuple[int, int]:
    """``size`` at ``eighths``/8, rounded up as libjpeg rounds it."""
    return -(-size[0] * eighths // 8), -(-size[1] * eighths // 8)


def _decode_at(im: Image.Image, eighths: int) -> None:
    """Make a lazily opened JPEG decode at ``eighths``/8 of its size (1, 2, 3 or 4; 8 leaves it full).

    Pillow's ``draft`` knows 1/2, 1/4 and 1/8 only. libjpeg-turbo also scales by 3/8, which gives a 12 MP
    photo (4243 px) its 1592 px view straight from the decoder, where 1/2 needs a bilinear pass after it: 45
    against 61 ms, 0.5 dB from the reference once delivered (``bench/bench_quality.py``). Pillow hands its
    scale to libjpeg as 1/n, and libjpeg-turbo decodes 1/3 at the smallest M/8 not below it, 3/8: so the
    draft is made for 1/2, then given n = 3 and the 3/8 size. Pillow sizes its row buffer from that size, so it
    must be libjpeg's exactly: only with libjpeg-turbo, whose rounding ``_scaled`` follows
    (tests/test_images.py checks the size and the pixels)."""
    if eighths >= 8 or not isinstance(im, ImageFile.ImageFile):
        return
    full = im.size
    n = 8 // eighths  # 3/8 is first drafted at 1/2, which is also what it stays without libjpeg-turbo
    im.draft("RGB", (max(1, full[0] // n), max(1, full[1] // n)))  # draft() takes the largest 1/n not below
    if eighths != 3 or not LIBJPEG_TURBO or im.decoderconfig != (2, 0):
        return
    size = _scaled(full, 3)
    tile = im.tile[0]
    im.tile = [tile._replace(extents=(0, 0, *size))]
    im._size = size
    im.decoderconfig = (3, 0)


def _view_cost(im: Image.Image, fmt: str, view_px: int) -> int:
    """Peak bytes of decode + make_view + make_grid + add_watermark + encode for a lazily opened image."""
    width, height = _draft_size(im, fmt, view_px)
    pixels = width * height
    decoded = pixels * _pixel_bytes(im.mode)
    working = _rgb_copies(im) * pixels * 4 + int(SHRINK_SHARE * pixels * 4)
    outputs = 3 * view_px * view_px * 4  # view, grid, the watermarked view and the encoders' buffers
    if fmt == "webp":
        return _webp_cost(im, pixels, working + outputs)
    return decoded + _decoder_bytes(im, fmt) + working + outputs


# Measured (VmHWM over a fresh process, render of one file; Pillow 13, libwebp 1.6): the peak of a WebP's
# view is the load itself, 16 bytes a pixel (libwebp's two RGBA canvases, the frame copied out as Python bytes,
# Pillow's image) plus the file, held by the decoder: 4 MP 68.7 MB, 12 MP 183.7, 20 MP 305.6 (lossy) / 289.3
# (lossless), 40 MP 595.0 / 575.6, the same for an animated file (first frame only) and with alpha. After the
# load the decoder's canvases stay with the image until the view is made (12 bytes a pixel), and the
# conversion and shrink come on top of those, which for an RGB image stays under the load's peak.
WEBP_LOAD_BYTES_PER_PIXEL = 16
WEBP_KEPT_BYTES_PER_PIXEL = 12
WEBP_MARGIN = 1.05


def _webp_cost(im: Image.Image, pixels: int, after_load: int) -> int:
    """Peak bytes of a WebP's view: the larger of the load and what follows it, with a small margin."""
    load = WEBP_LOAD_BYTES_PER_PIXEL * pixels
    kept = WEBP_KEPT_BYTES_PER_PIXEL * pixels + after_load
    return int(max(load, kept) * WEBP_MARGIN) + _source_bytes(im)


def _source_bytes(im: Image.Image) -> int:
    """The size of the file ``im`` was opened from (libwebp's decoder holds all of it)."""
    fp = getattr(im, "fp", None)
    return _file_size(fp) if fp is not None else 0


def _full_cost(im: Image.Image, fmt: str, watermark: Watermark, scale: int) -> int:
    """Peak bytes of apply_watermark at 1/``scale`` (1 unless a JPEG)."""
    width, height = _scaled(im.size, 8 // scale)
    pixels = width * height
    copies = _rgb_copies(im)
    if read_orientation(_exif(im)) in ORIENT:
        copies += 1
    mark_width = max(1, round(width * watermark.size))
    mark = min(pixels, mark_width * min(height, mark_width)) * 4 * 3  # the mark, the region, its RGBA copy
    return (pixels * _pixel_bytes(im.mode) + _decoder_bytes(im, fmt) + copies * pixels * 4
            + ENCODED_BYTES_PER_PIXEL * pixels + mark + _logo_cost(watermark))


def _full_scale(im: Image.Image, fmt: str, watermark: Watermark, max_bytes: int | None) -> tuple[int, int]:
    """(scale, bytes) for a watermarked copy: full size if it fits, else a JPEG's largest scale that does."""
    scales = (1, 2, 4, 8) if fmt == "jpeg" and max_bytes is not None else (1,)
    costs = [(scale, _full_cost(im, fmt, watermark, scale)) for scale in scales]
    return next(((s, c) for s, c in costs if max_bytes is None or c <= max_bytes), costs[-1])


LOGO_BYTES_PER_PIXEL = 12  # decoded RGBA, its RGBA conversion, and the resized copy's share


def logo_max_pixels(max_bytes: int) -> int:
    """The largest logo accepted under a decode budget: a quarter of it at most, since every watermarked render
    decodes the logo on top of its photo."""
    return max(100, min(LOGO_MAX_PIXELS, max_bytes // 4 // LOGO_BYTES_PER_PIXEL))


def _logo_cost(watermark: Watermark | None) -> int:
    """A logo watermark is decoded and converted to RGBA for every image it marks (header read only)."""
    if watermark is None or not watermark.logo_path:
        return 0
    try:
        with _open(watermark.logo_path, LOGO_MAX_PIXELS) as (logo, _):
            return logo.width * logo.height * LOGO_BYTES_PER_PIXEL
    except (InvalidImage, OSError):
        return 0  # _mark says why it cannot be used


def _mb(size: int) -> str:
    return f"{-(-size // MB):,}"


def _file_size(fp: BinaryIO) -> int:
    here = fp.tell()
    size = fp.seek(0, os.SEEK_END)
    fp.seek(here)
    return size


def _format(head: bytes) -> str:
    if not head:
        raise InvalidImage(N_("The file is empty"))
    if head.startswith(b"\xff\xd8\xff"):
        return "jpeg"
    if head.startswith(b"\x89PNG\r\n\x1a\n"):
        return "png"
    if head[:4] == b"RIFF" and head[8:12] == b"WEBP":
        return "webp"
    if head[4:8] == b"ftyp":
        box = int.from_bytes(head[:4], "big")
        brands = [head[i : i + 4] for i in range(8, min(box, len(head)) - 3, 4) if i != 12]
        if b"avif" not in brands and any(brand in HEIF_BRANDS for brand in brands):
            return "heif"
    raise InvalidImage(UNSUPPORTED)


def _load(source: Source, max_pixels: int, draft_px: int | None, *, scale: int = 1,
          upright_first: bool = False) -> Decoded:
    """Decode to RGB. For a view (``draft_px``), the image stays as it is stored and is turned upright by
    make_view after shrinking; a full-size copy (``upright_first``) is turned here."""
    with _open(source, max_pixels) as (im, fmt):
        raw_size = im.size
        if fmt == "jpeg" and draft_px:
            _decode_at(im, _eighths(raw_size, draft_px))
        elif fmt == "jpeg" and scale > 1:
            _decode_at(im, 8 // scale)
        try:
            im.load()
        except InvalidImage:  # the feed's: too many scans
            raise
        except Exception as exc:  # only Pillow decoders run here
            raise InvalidImage(CORRUPT, f"{type(exc).__name__}: {exc}") from exc
        exif = _exif(im)
        icc = im.info.get("icc_profile") or None
        orientation = read_orientation(exif)
        image, icc = _to_rgb(im, icc)
        if upright_first and orientation in ORIENT:
            image = image.transpose(ORIENT[orientation])
            orientation = 1
    image.info = {}  # no derivative may inherit a comment, XMP or EXIF from here
    width, height = _upright(raw_size, read_orientation(exif))
    return Decoded(image, fmt, width, height, exif, icc, orientation)


def _exif(im: Image.Image) -> bytes | None:
    exif = im.info.get("exif")
    return bytes(exif) if isinstance(exif, bytes | bytearray) and exif else None


def _to_rgb(im: Image.Image, icc: bytes | None) -> tuple[Image.Image, bytes | None]:
    """8-bit RGB and the profile it is in: CMYK and grey profiles are converted to sRGB, RGB ones kept."""
    space = icc[16:20] if icc and 128 <= len(icc) <= MAX_ICC else b""
    if space in (b"CMYK", b"GRAY") and im.mode in ("CMYK", "L"):
        try:
            source = ImageCms.ImageCmsProfile(io.BytesIO(icc or b""))
            converted = ImageCms.profileToProfile(im, source, SRGB, outputMode="RGB")
            if converted is not None:  # None only when asked to convert in place, which we never do
                return converted, None
        except (ImageCms.PyCMSError, OSError, ValueError):
            pass  # a broken profile: fall back to Pillow's plain conversion below
    kept = icc if space == b"RGB " else None
    if im.mode.startswith("I") or im.mode == "F":  # 16-bit PNG grey: scale, do not clip at 255
        im = im.convert("I").point(lambda v: v * (1 / 256)).convert("L")
    if _needs_flatten(im):
        # RGBA and LA paste onto RGB as they are, their alpha as the mask: one new image, no RGBA copy.
        rgba = im if im.mode in ("RGBA", "LA") else im.convert("RGBA")
        flat = Image.new("RGB", rgba.size, (255, 255, 255))
        flat.paste(rgba, mask=rgba)
        return flat, kept
    return (im if im.mode == "RGB" else im.convert("RGB")), kept


def _upright(size: tuple[int, int], orientation: int) -> tuple[int, int]:
    return (size[1], size[0]) if orientation >= 5 else size


def _fit(size: tuple[int, int], long_edge: int) -> tuple[int, int]:
    scale = long_edge / max(size)
    return max(1, round(size[0] * scale)), max(1, round(size[1] * scale))


REDUCING_GAP = 1.5  # what is left for the resampling filter after reduce()
GRID_REDUCING_GAP = 1.0  # the grid image: reduce() as far as it stays above the size


def _shrink(image: Image.Image, long_edge: int, resample: Image.Resampling = Image.Resampling.LANCZOS, *,
            reducing_gap: float = REDUCING_GAP) -> Image.Image:
    """Down to ``long_edge``, never up. From twice ``reducing_gap`` on, an integer box reduce() does all but
    the last ``reducing_gap`` to twice that (Pillow's idea, but by the long edge: its per-axis rounding skipped
    the reduce for 1500->400, and the reduce halves the cost of the grid image: 8.5 against 17.6 ms).
    """
    if max(image.size) <= long_edge:
        return image
    factor = int(max(image.size) / long_edge / reducing_gap)
    if factor >= 2:
        image = image.reduce(factor)
    return image.resize(_fit(image.size, long_edge), resample)


def _jpeg(image: Image.Image, quality: int, icc: bytes | None, *, compact: bool = False,
          rights: Rights | None = None) -> bytes:
    """Optimised baseline JPEG with explicit metadata: the ICC profile, and for downloads the ``rights``,
    nothing else. Progressive gave the same bytes for twice the encoder time (16 against 7 ms for a 1500 px
    view). ``compact``: not optimised, for full-size images, whose encoder then holds a few rows instead of
    every coefficient."""
    image.info = {}
    with _encoder_file() as out:
        image.save(out, "JPEG", quality=quality, optimize=not compact, icc_profile=icc,
                   exif=rights.exif() if rights else b"", comment=b"", xmp=rights.xmp() if rights else b"")
        out.seek(0)
        return out.read()


@contextmanager
def _encoder_file() -> Iterator[BinaryIO]:
    """Where an encoder writes: a file in memory with a descriptor of its own (Linux), else a BytesIO.

    Pillow lets go of the GIL while it encodes only into a file it can write to by descriptor. Into a BytesIO,
    an optimised JPEG is one call that holds the GIL from the first row to the last byte (its buffer is the
    size of the image), so the event loop and the other image thread stand still for those milliseconds, and
    two encodes never run at once: two threads took 22.9 ms of wall time per encode of a noisy 1592 x 1061
    image, against 13.1 ms into this file (one thread: 22 against 24). The bytes are the same."""
    try:
        fd = os.memfd_create("picpeak-encode", os.MFD_CLOEXEC)
    except (AttributeError, OSError):  # not Linux, or no descriptor to be had: the same bytes, holding the GIL
        yield io.BytesIO()
        return
    with open(fd, "w+b") as out:
        yield out


def _watermarked(base: Image.Image, watermark: Watermark) -> Image.Image:
    """``base`` with the watermark composited in place (callers pass an image they own)."""
    mark = _mark(watermark, base.size)
    if mark is None:
        return base
    margin = round(min(base.size) * 0.03)
    vertical, _, horizontal = watermark.position.partition("-")  # 'center' leaves both centred
    free_x, free_y = base.width - mark.width, base.height - mark.height
    x = {"left": margin, "right": free_x - margin}.get(horizontal, free_x // 2)
    y = {"top": margin, "bottom": free_y - margin}.get(vertical, free_y // 2)
    box = (max(0, x), max(0, y), max(0, x) + mark.width, max(0, y) + mark.height)
    region = base.crop(box).convert("RGBA")
    region.alpha_composite(mark)
    base.paste(region.convert("RGB"), box[:2])
    return base


def _mark(watermark: Watermark, size: tuple[int, int]) -> Image.Image | None:
    """The watermark as RGBA, ``size`` share of the image width, opacity applied; None when there is none."""
    width = max(1, round(size[0] * watermark.size))
    if watermark.logo_path:
        try:
            with _open(watermark.logo_path, LOGO_MAX_PIXELS) as (logo, _):
                mark = logo.convert("RGBA")
        except (InvalidImage, OSError) as exc:
            raise InvalidImage(f"The watermark logo cannot be used: {getattr(exc, 'reason', exc)}") from exc
        mark = mark.resize((width, max(1, round(mark.height * width / mark.width))), Image.Resampling.LANCZOS)
    elif watermark.text.strip():
        text = " ".join(watermark.text.split())[:200]
        left, _, right, _ = ImageFont.load_default(size=100).getbbox(text)
        points = max(6, min(size[1], round(100 * width / max(1, right - left))))
        font = ImageFont.load_default(size=points)
        stroke = max(1, points // 25)  # a dark outline keeps white text readable on light photos
        left, top, right, bottom = font.getbbox(text, stroke_width=stroke)
        mark = Image.new("RGBA", (max(1, round(right - left)), max(1, round(bottom - top))))
        ImageDraw.Draw(mark).text((-left, -top), text, font=font, fill=(255, 255, 255, 255),
                                  stroke_width=stroke, stroke_fill=(0, 0, 0, 255))
    else:
        return None
    if mark.width > size[0] or mark.height > size[1]:
        mark = ImageOps.contain(mark, size, Image.Resampling.LANCZOS)
    mark.putalpha(mark.getchannel("A").point(lambda a: round(a * watermark.opacity)))
    return mark


def _megapixels(pixels: int) -> str:
    return f"{pixels / 1e6:,.0f}" if pixels >= 10_000_000 else f"{pixels / 1e6:.2g}"
