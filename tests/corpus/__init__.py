"""The bad-input corpus, generated in code (plus the few small files committed beside this module).

Each :class:`Case` is one upload: bytes, the file name the client sends, and what must become of it:

* ``"4xx"``: refused in the upload answer with a readable error (never stored);
* ``"failed"``: accepted (the cheap header check passes) but the worker fails it with a readable reason;
* ``"complete"``: a valid image that must be processed, and served safely (its names cleaned, its metadata
  stripped from derivatives).

``build()`` makes the fast corpus; ``BIG_JPEG_SIZE`` is the 102 MP photo, built by :func:`big_jpeg` once per
run because it takes a few seconds. Files that the fuzzer found are committed here as ``*.bin`` with a
``*.expect`` next to them (one word: 4xx, failed or complete) and are part of every run; upload bodies it
found a 5xx with are ``*.body`` files, which ``tests/test_badinput.py`` sends as they are.
"""

from __future__ import annotations

import io
import struct
import zlib
from dataclasses import dataclass
from pathlib import Path

from PIL import Image

from .. import imagefactory

HERE = Path(__file__).resolve().parent
PIEXIF_OOM = HERE / "piexif_oom_655b.jpg"  # a copy of ../shared/corpus/piexif_oom_655b.jpg
BIG_JPEG_SIZE = (12400, 8300)  # 102.9 MP: under the 150 MP limit, so it must complete
CLAIMED_144MP = (14400, 10000)
REAL_144MP = (12000, 12000)
HTML = b"<!DOCTYPE html><html><body><script>alert(document.cookie)</script></body></html>\n"
SVG = (b'<?xml version="1.0"?><svg xmlns="http://www.w3.org/2000/svg" width="100" height="100">'
       b"<script>alert(1)</script><rect width='100' height='100'/></svg>")
OUTCOMES = ("4xx", "failed", "complete")


@dataclass(frozen=True)
class Case:
    label: str
    filename: str
    data: bytes
    expect: str  # one of OUTCOMES

    def __post_init__(self) -> None:
        assert self.expect in OUTCOMES, self.expect


def jpeg(seed: int, size: tuple[int, int] = (96, 64), **kw: object) -> bytes:
    return imagefactory.save(imagefactory.photo(*size, seed=seed), "jpeg", **kw)  # type: ignore[arg-type]


def png(seed: int, size: tuple[int, int] = (64, 48)) -> bytes:
    return imagefactory.save(imagefactory.photo(*size, seed=seed), "png")


def png_chunk(kind: bytes, body: bytes) -> bytes:
    return struct.pack(">L", len(body)) + kind + body + struct.pack(">L", zlib.crc32(kind + body))


def png_with_size(data: bytes, width: int, height: int) -> bytes:
    """A real PNG whose IHDR (with a correct CRC) now claims another size than its pixel data has."""
    assert data[12:16] == b"IHDR"
    ihdr = struct.pack(">LL", width, height) + data[24:29]
    return data[:8] + png_chunk(b"IHDR", ihdr) + data[33:]


def jpeg_with_size(data: bytes, width: int, height: int) -> bytes:
    """A real JPEG whose SOF segment claims another size: the header says one thing, the scan another."""
    pos = 2
    while pos + 4 <= len(data):
        marker = data[pos + 1]
        (length,) = struct.unpack(">H", data[pos + 2 : pos + 4])
        if marker in (0xC0, 0xC1, 0xC2):
            return data[: pos + 5] + struct.pack(">HH", height, width) + data[pos + 9 :]
        pos += 2 + length
    raise AssertionError("no SOF segment")


def jpeg_with_app1(data: bytes, payload: bytes) -> bytes:
    """Insert one APP1 segment right after SOI (payload at most 65533 bytes, as the format allows)."""
    assert len(payload) <= 65533
    return data[:2] + b"\xff\xe1" + struct.pack(">H", len(payload) + 2) + payload + data[2:]


def garbage_exif() -> bytes:
    """A TIFF header whose IFD offsets and counts point everywhere: loops, past the end, huge counts."""
    body = bytearray(b"Exif\x00\x00II*\x00" + struct.pack("<L", 8))
    entries = [
        (0x0112, 3, 1, 0xFFFF),  # orientation 65535
        (0x8769, 4, 1, 8),  # Exif IFD pointing back at IFD0: a loop
        (0x8825, 4, 1, 0xFFFFFFF0),  # GPS IFD far past the end
        (0x010F, 2, 0x7FFFFFFF, 0x10),  # Make with a 2 GB count
        (0x0132, 5, 0x40000000, 0x20),  # ModifyDate as a billion rationals
    ]
    body += struct.pack("<H", len(entries))
    for tag, kind, count, value in entries:
        body += struct.pack("<HHLL", tag, kind, count, value)
    body += struct.pack("<L", 8)  # next IFD: itself again
    body += bytes(range(256)) * 4
    return bytes(body)


def oversized_exif() -> bytes:
    """The largest APP1 a JPEG can carry, full of one IFD with thousands of entries and long strings."""
    entries = 5000
    body = bytearray(b"Exif\x00\x00II*\x00" + struct.pack("<L", 8) + struct.pack("<H", entries))
    for i in range(entries):
        body += struct.pack("<HHLL", 0x010F if i % 2 else 0x0110, 2, 60000, 8)
    body += struct.pack("<L", 0)
    body += b"A" * (65533 - len(body))
    return bytes(body[:65533])


def html_jpeg_polyglot(seed: int) -> bytes:
    """A valid JPEG that is also an HTML page to a sniffing browser: the markup sits in a comment segment."""
    return jpeg(seed, comment=b"*/" + HTML + b"/*")


def tiny_jpeg() -> bytes:
    out = io.BytesIO()
    Image.new("RGB", (4, 4), "red").save(out, "JPEG")
    return out.getvalue()


def build() -> list[Case]:
    """The fast corpus: every case is small (the largest is a few hundred KB)."""
    good = jpeg(1, (320, 240))
    cases = [
        Case("zero bytes", "empty.jpg", b"", "4xx"),
        Case("truncated JPEG (header only)", "cut-short.jpg", good[:400], "4xx"),
        Case("truncated JPEG (half)", "cut-half.jpg", jpeg(2, (320, 240))[: len(good) // 2], "failed"),
        Case("SOI only", "soi.jpg", b"\xff\xd8\xff", "4xx"),
        Case("PNG bomb 100k x 100k", "bomb.png", imagefactory.png_claiming(100_000, 100_000), "4xx"),
        Case("PNG claiming 4 GB wide", "wide.png", imagefactory.png_claiming(2**31 - 1, 16), "4xx"),
        Case("PNG header lies (bigger)", "liar-big.png", png_with_size(png(3), 4000, 3000), "failed"),
        Case("PNG header lies (smaller)", "liar-small.png", png_with_size(png(4, (200, 150)), 20, 15), "failed"),
        Case("PNG with a bad CRC", "crc.png", png(5)[:-20] + b"\x00" * 20, "failed"),
        # libjpeg finds its end marker early, warns and fills the rest with grey: a (grey) 144 MP photo,
        # decoded at 1/8 scale, so it completes within the pixel limit at a few MB of memory.
        Case("JPEG claiming 144 MP", "claims-144mp.jpg", jpeg_with_size(jpeg(6), *CLAIMED_144MP), "complete"),
        # 69 bytes cannot hold 144 MP even at deflate's best: refused before a 432 MB buffer is allocated.
        Case("PNG claiming 144 MP", "claims-144mp.png", imagefactory.png_claiming(*CLAIMED_144MP), "4xx"),
        Case("JPEG claiming 200 MP", "claims-200mp.jpg", jpeg_with_size(jpeg(7), 20000, 10000), "4xx"),
        Case("JPEG claiming 0x0", "zero-size.jpg", jpeg_with_size(jpeg(8), 0, 0), "4xx"),
        Case("image under 10x10", "tiny.jpg", tiny_jpeg(), "4xx"),
        Case("HTML-in-JPEG polyglot", "polyglot.jpg", html_jpeg_polyglot(9), "complete"),
        Case("HTML named .jpg", "page.jpg", HTML, "4xx"),
        Case("SVG named .jpg", "drawing.jpg", SVG, "4xx"),
        Case("garbage EXIF", "garbage-exif.jpg", jpeg_with_app1(jpeg(10), garbage_exif()), "complete"),
        Case("oversized EXIF", "big-exif.jpg", jpeg_with_app1(jpeg(11), oversized_exif()), "complete"),
        Case("random bytes", "noise.jpg", bytes((i * 7919 + 13) % 256 for i in range(4096)), "4xx"),
        Case("GIF", "anim.jpg", b"GIF89a" + bytes(200), "4xx"),
        # File names: the bytes are fine, the names are hostile; each must come back cleaned.
        Case("name with ../", "../../etc/passwd.jpg", jpeg(20), "complete"),
        Case("name with backslashes", "..\\..\\windows\\win.ini.jpg", jpeg(21), "complete"),
        Case("name with NUL", "evil\x00.php.jpg", jpeg(22), "complete"),
        Case("name with bidi override", "photo\u202egpj.exe", jpeg(23), "complete"),
        Case("name CON", "CON", jpeg(24), "complete"),
        Case("name of 300 characters", "a" * 296 + ".jpg", jpeg(25), "complete"),
        Case("name with CR/LF", "line\r\nX-Injected: 1.jpg", jpeg(26), "complete"),
        Case("name of dots", "...", jpeg(27), "complete"),
    ]
    cases.append(Case("piexif OOM file", "piexif_oom.jpg", PIEXIF_OOM.read_bytes(), "4xx"))
    for path in sorted(HERE.glob("*.bin")):
        expect = path.with_suffix(".expect").read_text().strip()
        cases.append(Case(f"fuzz find {path.stem}", path.stem + ".jpg", path.read_bytes(), expect))
    return cases


def big_png() -> bytes:
    """A real 144 MP PNG (12000x12000, one flat colour, 445 KB): decoded in full, 432 MB of pixels."""
    width, height = REAL_144MP
    compressor = zlib.compressobj(9)
    row = b"\x00" + b"\x80\x60\x40" * width
    idat = b"".join([compressor.compress(row) for _ in range(height)] + [compressor.flush()])
    ihdr = struct.pack(">LLBBBBB", width, height, 8, 2, 0, 0, 0)
    return (b"\x89PNG\r\n\x1a\n" + png_chunk(b"IHDR", ihdr) + png_chunk(b"IDAT", idat)
            + png_chunk(b"IEND", b""))


def big_jpeg() -> bytes:
    """The 102 MP photo: smooth gradients and a few shapes (photo-like noise at this size would take a minute
    to make and be 60 MB; the decoder's work and memory depend on the pixel count, not the content)."""
    width, height = BIG_JPEG_SIZE
    ramp = Image.linear_gradient("L").resize((width, height), Image.Resampling.NEAREST)
    image = Image.merge("RGB", (ramp, ramp.transpose(Image.Transpose.FLIP_TOP_BOTTOM),
                                ramp.transpose(Image.Transpose.FLIP_LEFT_RIGHT)))
    del ramp
    out = io.BytesIO()
    image.save(out, "JPEG", quality=70)
    return out.getvalue()
