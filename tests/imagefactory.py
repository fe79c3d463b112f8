"""Real images made in code, so tests say exactly what is in a file instead of keeping binary fixtures.

``photo`` gives noisy, photo-like pixels (they compress like a photo, not like a flat fill); ``marked`` an
image with one coloured corner, so that orientation can be checked pixel by pixel; ``make_exif`` writes a
small TIFF/EXIF block by hand (so tests can also write what a broken camera writes); ``save`` puts pixels and
metadata into any of the four formats we accept.
"""

from __future__ import annotations

import functools
import io
import random
import struct
import zlib
from pathlib import Path

import pillow_heif
from PIL import Image, ImageChops, ImageCms, ImageDraw

pillow_heif.register_heif_opener()

RED = (230, 20, 20)
BLUE = (20, 40, 200)
XMP = (
    b'<?xpacket begin="\xef\xbb\xbf" id="W5M0MpCehiHzreSzNTczkc9d"?>'
    b'<x:xmpmeta xmlns:x="adobe:ns:meta/"><rdf:RDF xmlns:rdf="http://www.w3.org/1999/02/22-rdf-syntax-ns#">'
    b'<rdf:Description xmlns:xmp="http://ns.adobe.com/xap/1.0/" xmp:CreatorTool="factory"/>'
    b"</rdf:RDF></x:xmpmeta><?xpacket end='w'?>"
)
XMP_NS = b"http://ns.adobe.com/xap/1.0/"


def photo(width: int, height: int, *, seed: int = 0, noise: float = 0.35) -> Image.Image:
    """Gradient, random shapes and per-channel noise: roughly the entropy of a real photo."""
    rng = random.Random(seed)
    ramp = Image.linear_gradient("L").resize((width, height), Image.Resampling.BILINEAR)
    image = Image.merge("RGB", (ramp, ramp.transpose(Image.Transpose.ROTATE_180), ramp.transpose(
        Image.Transpose.FLIP_LEFT_RIGHT)))
    draw = ImageDraw.Draw(image)
    for _ in range(40):
        x, y = rng.randrange(width), rng.randrange(height)
        r = rng.randrange(max(2, width // 40), max(3, width // 6))
        colour = (rng.randrange(256), rng.randrange(256), rng.randrange(256))
        if rng.random() < 0.5:
            draw.ellipse((x - r, y - r, x + r, y + r), fill=colour)
        else:
            draw.rectangle((x - r, y - r // 2, x + r, y + r // 2), fill=colour)
    grain = Image.merge("RGB", [Image.effect_noise((width, height), 60) for _ in range(3)])
    return Image.blend(image, grain, noise)


def marked(width: int = 40, height: int = 20) -> Image.Image:
    """Blue, with the top-left quarter red: after any transpose the red corner says which one it was."""
    image = Image.new("RGB", (width, height), BLUE)
    image.paste(RED, (0, 0, width // 2, height // 2))
    return image


FLAT = (90, 120, 150)


def flat(width: int, height: int) -> Image.Image:
    """One colour everywhere: anything drawn on it (a watermark) shows in :func:`largest_change_from_flat`."""
    return Image.new("RGB", (width, height), FLAT)


def largest_change_from_flat(data: bytes) -> int:
    """How far the most changed pixel of an encoded :func:`flat` image is from the flat colour (JPEG: a few)."""
    with Image.open(io.BytesIO(data)) as image:
        pixels = image.convert("RGB")
    difference = ImageChops.difference(pixels, Image.new("RGB", pixels.size, FLAT))
    return max(high for _, high in difference.getextrema())


@functools.cache
def srgb_icc() -> bytes:
    """One sRGB profile per run: a new one carries its creation time, so two calls a second apart differ."""
    return ImageCms.ImageCmsProfile(ImageCms.createProfile("sRGB")).tobytes()


def make_exif(*, orientation: int | None = None, make: str | bytes | None = None, model: str | None = None,
              lens: str | None = None, date_original: str | None = None, date_digitized: str | None = None,
              date_modified: str | None = None, fnumber: tuple[int, int] | None = None,
              exposure: tuple[int, int] | None = None, iso: int | None = None,
              focal: tuple[int, int] | None = None, gps: tuple[float, float] | None = None,
              big_endian: bool = False) -> bytes:
    """An ``Exif\\0\\0`` + TIFF block with IFD0, an Exif IFD and a GPS IFD as asked. Dates are EXIF text."""
    order = ">" if big_endian else "<"
    ifd0: list[tuple[int, int, int, bytes]] = []
    sub: list[tuple[int, int, int, bytes]] = []
    gps_ifd: list[tuple[int, int, int, bytes]] = []

    def ascii_(text: str | bytes) -> tuple[int, int, bytes]:
        raw = (text.encode() if isinstance(text, str) else text) + b"\x00"
        return 2, len(raw), raw

    def rational(*pairs: tuple[int, int]) -> tuple[int, int, bytes]:
        return 5, len(pairs), b"".join(struct.pack(order + "LL", a, b) for a, b in pairs)

    def put(ifd: list[tuple[int, int, int, bytes]], tag: int, value: tuple[int, int, bytes]) -> None:
        ifd.append((tag, *value))

    if make is not None:
        put(ifd0, 0x010F, ascii_(make))
    if model is not None:
        put(ifd0, 0x0110, ascii_(model))
    if orientation is not None:
        put(ifd0, 0x0112, (3, 1, struct.pack(order + "H", orientation)))
    if date_modified is not None:
        put(ifd0, 0x0132, ascii_(date_modified))
    if exposure is not None:
        put(sub, 0x829A, rational(exposure))
    if fnumber is not None:
        put(sub, 0x829D, rational(fnumber))
    if iso is not None:
        put(sub, 0x8827, (3, 1, struct.pack(order + "H", iso)))
    if date_original is not None:
        put(sub, 0x9003, ascii_(date_original))
    if date_digitized is not None:
        put(sub, 0x9004, ascii_(date_digitized))
    if focal is not None:
        put(sub, 0x920A, rational(focal))
    if lens is not None:
        put(sub, 0xA434, ascii_(lens))
    if gps is not None:
        for ref_tag, tag, value, sign in ((1, 2, gps[0], b"NS"), (3, 4, gps[1], b"EW")):
            put(gps_ifd, ref_tag, (2, 2, bytes([sign[value < 0]]) + b"\x00"))
            degrees = abs(value)
            put(gps_ifd, tag, rational((int(degrees), 1), (int(degrees * 60 % 60), 1),
                                       (round(degrees * 3600 % 60 * 100), 100)))
    # Pointer values do not change sizes, so lay out once with zeros, then again with real offsets.
    pointers = [(0x8769, sub), (0x8825, gps_ifd)]
    for tag, ifd in pointers:
        if ifd:
            put(ifd0, tag, (4, 1, bytes(4)))
    first = _ifd(ifd0, 8, order)
    offset = 8 + len(first)
    blobs = []
    ifd0 = [entry for entry in ifd0 if entry[0] not in (0x8769, 0x8825)]
    for tag, ifd in pointers:
        if ifd:
            put(ifd0, tag, (4, 1, struct.pack(order + "L", offset)))
            blobs.append(_ifd(ifd, offset, order))
            offset += len(blobs[-1])
    head = (b"II*\x00" if order == "<" else b"MM\x00*") + struct.pack(order + "L", 8)
    return b"Exif\x00\x00" + head + _ifd(ifd0, 8, order) + b"".join(blobs)


def _ifd(entries: list[tuple[int, int, int, bytes]], start: int, order: str) -> bytes:
    data_at = start + 2 + 12 * len(entries) + 4
    head, data = struct.pack(order + "H", len(entries)), b""
    for tag, kind, count, raw in sorted(entries):
        if len(raw) <= 4:
            field = raw.ljust(4, b"\x00")
        else:
            field = struct.pack(order + "L", data_at + len(data))
            data += raw + b"\x00" * (len(raw) % 2)
        head += struct.pack(order + "HHL", tag, kind, count) + field
    return head + struct.pack(order + "L", 0) + data


def save(image: Image.Image, fmt: str = "jpeg", path: Path | None = None, *, exif: bytes | None = None,
         comment: bytes | None = None, xmp: bytes | None = None, icc: bytes | None = None,
         quality: int = 92) -> bytes:
    """``image`` as 'jpeg', 'png', 'webp' or 'heif' with the metadata asked; written to ``path`` if given."""
    params: dict[str, object] = {}
    if exif is not None:
        params["exif"] = exif
    if icc is not None:
        params["icc_profile"] = icc
    if xmp is not None:
        params["xmp"] = xmp
    if comment is not None:
        params["comment"] = comment
    if fmt in ("jpeg", "webp", "heif"):
        params["quality"] = quality
    out = io.BytesIO()
    image.save(out, {"jpeg": "JPEG", "png": "PNG", "webp": "WEBP", "heif": "HEIF"}[fmt], **params)
    data = out.getvalue()
    if path is not None:
        path.write_bytes(data)
    return data


def png_claiming(width: int, height: int) -> bytes:
    """A well-formed PNG (valid CRCs) claiming a size, with a tiny IDAT: a decompression bomb's header."""

    def chunk(kind: bytes, body: bytes) -> bytes:
        return struct.pack(">L", len(body)) + kind + body + struct.pack(">L", zlib.crc32(kind + body))

    ihdr = struct.pack(">LLBBBBB", width, height, 8, 2, 0, 0, 0)
    return (b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", ihdr) + chunk(b"IDAT", zlib.compress(b"\x00" * 64))
            + chunk(b"IEND", b""))


def jpeg_segments(data: bytes) -> list[tuple[int, bytes]]:
    """The (marker, payload) segments of a JPEG up to the start of scan: the metadata a file carries."""
    assert data[:2] == b"\xff\xd8", "not a JPEG"
    segments, pos = [], 2
    while pos + 4 <= len(data):
        assert data[pos] == 0xFF, f"no marker at {pos}"
        marker = data[pos + 1]
        (length,) = struct.unpack(">H", data[pos + 2 : pos + 4])
        segments.append((marker, data[pos + 4 : pos + 2 + length]))
        if marker == 0xDA:  # start of scan: entropy-coded data follows
            break
        pos += 2 + length
    return segments
