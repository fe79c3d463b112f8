"""Pure Pillow: a cheap header check for uploads, and the derivatives a guest sees.

This is the only module that imports PIL (and pillow_heif). Everything here is sync and CPU-bound; the worker
runs each step (:func:`decode`, :func:`make_view`, :func:`make_grid`, :func:`add_watermark`, :func:`encode`)
in a thread of its own, so a cancellation can land between steps, and Pillow releases the GIL inside them.

Three rules shape the code:

* Every failure a file can cause becomes :class:`InvalidImage` with a reason a photographer can read. The
  format comes from the bytes, never the name, and the pixel limit is checked on the header before any pixel
  is decoded, so a 100000x100000 PNG costs a few hundred bytes of reading, not 30 GB.
* Derivatives carry no metadata: we re-encode pixels with explicit save parameters and an emptied ``info``,
  so no EXIF (GPS!), XMP or comment survives. The ICC profile is kept because it is colour, not personal data.
* Big JPEGs are decoded at 1/2, 1/4 or 1/8 scale by libjpeg itself (``draft``), never smaller than the view
  image, and the grid image is made from the view: a 24 MP photo costs under a quarter of the memory and
  under half the CPU of the usual full decode + exif_transpose + thumbnail (``bench/bench_pipeline.py``).
"""

from __future__ import annotations

import io
import os
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, replace
from typing import BinaryIO

import pillow_heif
from PIL import Image, ImageCms, ImageDraw, ImageFont, ImageOps

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
UNSUPPORTED = "Not a supported image (JPEG, PNG, WebP or HEIC)"
CORRUPT = "The image file is truncated or corrupt"
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


class InvalidImage(ValueError):
    """A file we cannot or will not process. ``reason`` is shown to the uploader; ``detail`` is for logs."""

    def __init__(self, reason: str, detail: str = "") -> None:
        super().__init__(reason)
        self.reason = reason
        self.detail = detail


@dataclass(frozen=True)
class ImageHeader:
    """What the upload request learns from the header. Width and height are as displayed (EXIF-oriented)."""

    format: str  # 'jpeg', 'png', 'webp' or 'heif'
    mime: str
    width: int
    height: int


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
    watermark: Watermark | None = None  # applied to the view image only, never to the grid


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


@dataclass(frozen=True)
class Rendered:
    format: str
    width: int  # of the original, upright
    height: int
    view_jpeg: bytes
    grid_jpeg: bytes
    exif: bytes | None  # the original's EXIF block as found, for exif.read_metadata


def sniff(source: Source, *, max_pixels: int = 150_000_000) -> ImageHeader:
    """Check an upload from its magic bytes and header only: no pixel is decoded, nothing large allocated."""
    with _open(source, max_pixels) as (im, fmt):
        width, height = _upright(im.size, read_orientation(_exif(im)))
    return ImageHeader(fmt, FORMATS[fmt][1], width, height)


def render(source: Source, spec: RenderSpec) -> Rendered:
    """All steps in one call, for tests and scripts; the worker runs the steps itself, one thread hop each."""
    decoded = decode(source, spec)
    view = make_view(decoded, spec)
    del decoded  # the decoded image is the largest buffer we hold: free it before encoding
    grid = make_grid(view, spec)
    if spec.watermark is not None:
        view = add_watermark(view, spec.watermark)
    return Rendered(view.format, view.width, view.height, encode(view, spec), encode(grid, spec), view.exif)


def decode(source: Source, spec: RenderSpec) -> Decoded:
    """Decode, upright and in RGB, at the smallest JPEG scale that still covers ``spec.view_px``."""
    return _load(source, spec.max_pixels, spec.view_px)


def make_view(decoded: Decoded, spec: RenderSpec) -> Decoded:
    return replace(decoded, image=_shrink(decoded.image, spec.view_px))


def make_grid(view: Decoded, spec: RenderSpec) -> Decoded:
    """From the view image, not a second decode: 1600 -> 400 px costs a few milliseconds."""
    return replace(view, image=_shrink(view.image, spec.grid_px))


def add_watermark(picture: Decoded, watermark: Watermark) -> Decoded:
    return replace(picture, image=_watermarked(picture.image.copy(), watermark))


def encode(picture: Decoded, spec: RenderSpec) -> bytes:
    return _jpeg(picture.image, spec.quality, picture.icc)


def apply_watermark(source: Source, watermark: Watermark, *, quality: int = 92,
                    max_pixels: int = 150_000_000) -> bytes:
    """A full-size, upright, metadata-free watermarked JPEG for guest downloads; the original is only read."""
    picture = _load(source, max_pixels, None)
    return _jpeg(_watermarked(picture.image, watermark), quality, picture.icc)


@contextmanager
def _open(source: Source, max_pixels: int) -> Iterator[tuple[Image.Image, str]]:
    """Open lazily (header only) with the one Pillow plugin the magic bytes name, and check the size."""
    with io.BytesIO(source) if isinstance(source, bytes) else open(source, "rb") as fp:
        fmt = _format(fp.read(64))
        fp.seek(0)
        try:
            im = Image.open(fp, formats=[FORMATS[fmt][0]])
        except Exception as exc:  # only Pillow runs here; its plugins raise many types
            raise InvalidImage(CORRUPT, f"{type(exc).__name__}: {exc}") from exc
        width, height = im.size
        if width < MIN_SIDE or height < MIN_SIDE:
            raise InvalidImage(
                f"Image is too small ({width}x{height}); at least {MIN_SIDE}x{MIN_SIDE} pixels"
            )
        if width * height > max_pixels:
            raise InvalidImage(
                f"Image is too large ({_megapixels(width * height)} megapixels; "
                f"the limit is {_megapixels(max_pixels)})"
            )
        if fmt == "png" and _file_size(fp) < height * (1 + (width + 7) // 8) // DEFLATE_MAX_RATIO:
            raise InvalidImage(CORRUPT, f"{width}x{height} cannot fit in {_file_size(fp)} bytes")
        yield im, fmt


def _file_size(fp: BinaryIO) -> int:
    here = fp.tell()
    size = fp.seek(0, os.SEEK_END)
    fp.seek(here)
    return size


def _format(head: bytes) -> str:
    if not head:
        raise InvalidImage("The file is empty")
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


def _load(source: Source, max_pixels: int, draft_px: int | None) -> Decoded:
    with _open(source, max_pixels) as (im, fmt):
        raw_size = im.size
        if fmt == "jpeg" and draft_px and max(raw_size) > 2 * draft_px:
            im.draft("RGB", _fit(raw_size, draft_px))  # libjpeg picks the largest 1/n scale not below this
        try:
            im.load()
        except Exception as exc:  # only Pillow decoders run here
            raise InvalidImage(CORRUPT, f"{type(exc).__name__}: {exc}") from exc
        exif = _exif(im)
        icc = im.info.get("icc_profile") or None
        orientation = read_orientation(exif)
        image, icc = _to_rgb(im, icc)
        if orientation in ORIENT:
            image = image.transpose(ORIENT[orientation])
    image.info = {}  # no derivative may inherit a comment, XMP or EXIF from here
    width, height = _upright(raw_size, orientation)
    return Decoded(image, fmt, width, height, exif, icc)


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
    if im.mode in ("RGBA", "LA", "PA", "RGBa", "La") or (im.mode == "P" and "transparency" in im.info):
        rgba = im.convert("RGBA")
        flat = Image.new("RGB", rgba.size, (255, 255, 255))
        flat.paste(rgba, mask=rgba.getchannel("A"))
        return flat, kept
    return (im if im.mode == "RGB" else im.convert("RGB")), kept


def _upright(size: tuple[int, int], orientation: int) -> tuple[int, int]:
    return (size[1], size[0]) if orientation >= 5 else size


def _fit(size: tuple[int, int], long_edge: int) -> tuple[int, int]:
    scale = long_edge / max(size)
    return max(1, round(size[0] * scale)), max(1, round(size[1] * scale))


def _shrink(image: Image.Image, long_edge: int) -> Image.Image:
    """Lanczos down to ``long_edge``, never up. From 4x on, an integer box reduce() does all but the last 2-4x
    (Pillow's reducing_gap=2 idea, but by the long edge: its per-axis rounding skipped the reduce for 1600->400).
    """
    if max(image.size) <= long_edge:
        return image
    factor = int(max(image.size) / long_edge / 2)
    if factor >= 2:
        image = image.reduce(factor)
    return image.resize(_fit(image.size, long_edge), Image.Resampling.LANCZOS)


def _jpeg(image: Image.Image, quality: int, icc: bytes | None) -> bytes:
    """Progressive optimised JPEG with explicit metadata: the ICC profile, and nothing else."""
    out = io.BytesIO()
    image.info = {}
    image.save(out, "JPEG", quality=quality, optimize=True, progressive=True, icc_profile=icc,
               exif=b"", comment=b"")
    return out.getvalue()


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
