"""Decompression bombs of every format Pillow opens for us, made in code in well under a second each (issue 11).

Each is a small file whose header is true, or true enough for the header check: it claims a pixel size (or a
frame count) whose decode would take hundreds of MB to GB. ``variant`` makes the bytes differ (an ancillary
chunk or comment), so that many of them are not each other's duplicates in one gallery.
"""

from __future__ import annotations

import functools
import io
import struct
import zlib
from dataclasses import dataclass

from PIL import Image

from picpeak_lite.media import images  # noqa: F401  (registers the HEIF opener with Pillow)

from .corpus import jpeg_with_size, png_chunk

SIDE = 12000  # 144 MP: under the 150 MP limit, as in the issue


@dataclass(frozen=True)
class Bomb:
    label: str
    filename: str
    make: functools.partial[bytes]
    size: str  # what its refusal must name: "12000x12000" or a frame count
    accepted_format: bool = True  # GIF and TIFF are not: refused as unsupported (415), never opened


@functools.cache
def _png_idat(width: int, height: int, bands: int, level: int) -> bytes:
    compressor = zlib.compressobj(level)
    row = b"\x00" * (1 + width * bands)
    return b"".join([compressor.compress(row) for _ in range(height)] + [compressor.flush()])


def png_zeros(variant: int = 0, *, width: int = SIDE, height: int = SIDE, colour_type: int = 6,
              extra: bytes = b"", level: int = 9) -> bytes:
    """The issue's file: IHDR 12000,12000,8,6 and 12000 rows of zeros at zlib level 9 (560 KB for RGBA; the
    other kinds use level 1, which makes them in a fraction of the time)."""
    bands = {0: 1, 2: 3, 4: 2, 6: 4}[colour_type]
    ihdr = struct.pack(">LLBBBBB", width, height, 8, colour_type, 0, 0, 0)
    return (b"\x89PNG\r\n\x1a\n" + png_chunk(b"IHDR", ihdr) + extra
            + png_chunk(b"tEXt", b"variant\x00" + str(variant).encode())
            + png_chunk(b"IDAT", _png_idat(width, height, bands, level)) + png_chunk(b"IEND", b""))


def apng_frame_count(variant: int = 0) -> bytes:
    """An APNG whose acTL claims 100,000 frames on a small canvas (Pillow counts the default image too)."""
    actl = png_chunk(b"acTL", struct.pack(">LL", 100_000, 0))
    return png_zeros(variant, width=64, height=64, colour_type=2, extra=actl)


@functools.cache
def _small_webp(frames: int) -> bytes:
    tiles = [Image.new("RGBA", (16, 16), (i % 256, 0, 0, 255)) for i in range(frames)]
    out = io.BytesIO()
    tiles[0].save(out, "WEBP", save_all=True, append_images=tiles[1:], lossless=True, duration=40)
    return out.getvalue()


def webp_canvas(variant: int = 0) -> bytes:
    """A real animated WebP of small frames whose VP8X canvas says 12000x12000: libwebp's decoder would hold
    two 576 MB canvases plus the frame's copy."""
    data = bytearray(_small_webp(2))
    assert data[12:16] == b"VP8X"
    data[24:27] = (SIDE - 1).to_bytes(3, "little")
    data[27:30] = (SIDE - 1).to_bytes(3, "little")
    return _riff_with_chunk(bytes(data), b"XMP ", f"variant {variant}".encode())


def webp_frame_count(variant: int = 0) -> bytes:
    """1,500 frames of 16x16: more frames than MAX_FRAMES."""
    return _riff_with_chunk(_small_webp(1500), b"XMP ", f"variant {variant}".encode())


def _riff_with_chunk(data: bytes, tag: bytes, payload: bytes) -> bytes:
    payload += b"\x00" * (len(payload) % 2)
    body = data[12:] + tag + struct.pack("<L", len(payload)) + payload
    return b"RIFF" + struct.pack("<L", 4 + len(body)) + b"WEBP" + body


@functools.cache
def _progressive_jpeg() -> bytes:
    out = io.BytesIO()
    Image.new("RGB", (64, 64), (90, 120, 150)).save(out, "JPEG", progressive=True, quality=80)
    return out.getvalue()


def jpeg_progressive(variant: int = 0) -> bytes:
    """A progressive JPEG claiming 12000x12000: libjpeg keeps every DCT coefficient of a multi-scan image, at
    full size whatever the draft scale (432 MB at 4:2:0), and zeroes them before the first scan."""
    data = jpeg_with_size(_progressive_jpeg(), SIDE, SIDE)
    comment = f"variant {variant}".encode()
    return data[:2] + b"\xff\xfe" + struct.pack(">H", len(comment) + 2) + comment + data[2:]


@functools.cache
def _small_heic() -> bytes:
    out = io.BytesIO()
    Image.new("RGB", (64, 64), (90, 120, 150)).save(out, "HEIF", quality=50)
    return out.getvalue()


def heic_claiming(variant: int = 0) -> bytes:
    """A HEIC whose image spatial extents (``ispe``) claim 12000x12000."""
    data = bytearray(_small_heic())
    at = data.find(b"ispe")
    assert at > 0
    data[at + 8 : at + 16] = struct.pack(">LL", SIDE, SIDE)
    return bytes(data) + f"variant {variant}".encode()  # after the last box: ignored by readers


def gif_claiming(variant: int = 0) -> bytes:
    """A GIF whose screen and image say 12000x12000 (GIF is not accepted at all)."""
    out = io.BytesIO()
    Image.new("P", (16, 16)).save(out, "GIF", comment=f"variant {variant}".encode())
    data = bytearray(out.getvalue())
    data[6:10] = struct.pack("<HH", SIDE, SIDE)
    return bytes(data)


def tiff_claiming(variant: int = 0) -> bytes:
    out = io.BytesIO()
    Image.new("L", (16, 16)).save(out, "TIFF", description=f"variant {variant}")
    return out.getvalue().replace(struct.pack("<HHLH", 256, 3, 1, 16), struct.pack("<HHLH", 256, 3, 1, 60000))


BOMBS = [
    Bomb("PNG 12000x12000 RGBA of zeros (the issue's)", "zeros-rgba.png", functools.partial(png_zeros),
         "12000x12000"),
    Bomb("PNG 12000x12000 grey of zeros", "zeros-grey.png", functools.partial(png_zeros, colour_type=0, level=1),
         "12000x12000"),
    Bomb("PNG 12000x12000 RGB of zeros", "zeros-rgb.png", functools.partial(png_zeros, colour_type=2, level=1),
         "12000x12000"),
    Bomb("APNG claiming 100,000 frames", "frames.png", functools.partial(apng_frame_count), "100,001 frames"),
    Bomb("animated WebP on a 12000x12000 canvas", "canvas.webp", functools.partial(webp_canvas), "12000x12000"),
    Bomb("WebP of 1,500 frames", "frames.webp", functools.partial(webp_frame_count), "1,500 frames"),
    Bomb("progressive JPEG claiming 12000x12000", "progressive.jpg", functools.partial(jpeg_progressive),
         "12000x12000"),
    Bomb("HEIC claiming 12000x12000", "claims.heic", functools.partial(heic_claiming), "12000x12000"),
    Bomb("GIF claiming 12000x12000", "claims.gif", functools.partial(gif_claiming), "", accepted_format=False),
    Bomb("TIFF claiming 60000 wide", "claims.tif", functools.partial(tiff_claiming), "", accepted_format=False),
]


def png_fits(variant: int = 0) -> bytes:
    """20 MP RGB of zeros: about 160 MB to decode and shrink, so it fits the default 256 MB alone, but two at once
    do not: the second waits."""
    return png_zeros(variant, width=5000, height=4000, colour_type=2, level=1)


@functools.cache
def _big_jpeg() -> bytes:
    out = io.BytesIO()
    Image.new("RGB", (9000, 7000), (90, 120, 150)).save(out, "JPEG", quality=80)
    return out.getvalue()


def jpeg_big(variant: int = 0) -> bytes:
    """A real 63 MP baseline JPEG: its view decodes at 1/4 scale; a full-size watermarked copy would need some
    380 MB, so under the default budget it is made at 1/2 scale (4500x3500)."""
    comment = f"variant {variant}".encode()
    data = _big_jpeg()
    return data[:2] + b"\xff\xfe" + struct.pack(">H", len(comment) + 2) + comment + data[2:]


class _Bits:
    """An entropy-coded segment written bit by bit: 0xFF stuffed as FF 00, the last byte padded with ones."""

    def __init__(self) -> None:
        self.out = bytearray()
        self.acc = 0
        self.count = 0

    def put(self, value: int, length: int) -> None:
        for shift in range(length - 1, -1, -1):
            self.acc = (self.acc << 1) | ((value >> shift) & 1)
            self.count += 1
            if self.count == 8:
                self._byte()

    def _byte(self) -> None:
        self.out.append(self.acc)
        if self.acc == 0xFF:
            self.out.append(0)
        self.acc = self.count = 0

    def done(self) -> bytes:
        if self.count:
            self.acc = (self.acc << (8 - self.count)) | ((1 << (8 - self.count)) - 1)
            self._byte()
        return bytes(self.out)


def _segment(marker: int, payload: bytes) -> bytes:
    return bytes((0xFF, marker)) + struct.pack(">H", len(payload) + 2) + payload


def jpeg_scans(scans: int, *, width: int = 4000, height: int = 4000, refine: bool = False, variant: int = 0
               ) -> bytes:
    """The issue's progressive-JPEG "scan bomb": a grey SOF2 header, one DC scan, then ``scans`` identical AC
    scans (Ss=1..63) coded as runs of empty blocks (EOB14, up to 32767 blocks a symbol), 15-55 bytes each, so
    that the file stays small while libjpeg walks every block of the image once per scan. ``refine``: the AC
    scans are refinement scans (Ah=1), in which libjpeg also looks at each of a block's 63 coefficients."""
    blocks = -(-width // 8) * -(-height // 8)
    dc = _Bits()
    for _ in range(blocks):
        dc.put(0, 1)  # DC category 0: no change
    ac = _Bits()
    left = blocks
    while left:
        run = min(left, 32767)
        if run >= 16384:
            ac.put(0, 1)  # EOB14, then 14 bits: the run is 16384 + those
            ac.put(run - 16384, 14)
        else:  # the last, shorter run: EOBr, r = its bit length - 1, then r bits
            r = run.bit_length() - 1
            ac.put(0b10000 | r, 5)
            ac.put(run - (1 << r), r)
        left -= run
    ac_data = ac.done()
    comment = f"variant {variant}".encode()
    head = (b"\xff\xd8" + _segment(0xFE, comment) + _segment(0xDB, b"\x00" + b"\x01" * 64)
            + _segment(0xC2, struct.pack(">BHHB", 8, height, width, 1) + b"\x01\x11\x00")
            + _segment(0xC4, b"\x00" + bytes([1] + [0] * 15) + b"\x00"))
    # AC table (canonical codes): EOB14 (0xE0) is 0, EOBr for r = 0..13 is 1rrrr.
    ac_table = _segment(0xC4, b"\x10" + bytes([1, 0, 0, 0, 14] + [0] * 11) + b"\xe0"
                        + bytes(r << 4 for r in range(14)))
    dc_scan = _segment(0xDA, b"\x01\x01\x00\x00\x00\x00") + dc.done()
    ah_al = 0x10 if refine else 0x00
    ac_scan = _segment(0xDA, b"\x01\x01\x00\x01\x3f" + bytes([ah_al])) + ac_data
    return head + ac_table + dc_scan + ac_scan * scans + b"\xff\xd9"
