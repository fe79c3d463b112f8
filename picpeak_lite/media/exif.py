"""What we keep from a photo's EXIF block, read by a small bounded parser of our own.

EXIF arrives from strangers (guest uploads), and ``piexif.load`` can grow memory without bound on a 655-byte
file whose GPS pointer claims four billion entries (``tests/test_exif.py`` keeps that file as a regression).
So we do not use piexif here at all: the block is a TIFF structure and we only need a dozen tags, so we read
exactly those with every offset bounds-checked, a set of visited IFDs against loops, a cap on entries per
IFD and on bytes per value. The work is therefore bounded by a constant, whatever the input, and garbage
gives empty metadata instead of an exception.

Pillow's own reader (``Image.Exif().load``) was measured as the replacement and kept out: it reads the piexif
file correctly, but on ``tests/test_exif.py``'s block of 5 MB of 0xff after a TIFF header it took 2.5 s and
10 MB (this parser: under 0.5 s and 3 MB, which that test asserts), and it raises a different exception type
for each kind of garbage.

Derivatives carry no metadata at all (``images.py`` re-encodes pixels only), so there is nothing to strip
here; this module decides what of the original we *keep* in the database.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

MAX_BLOCK = 1 << 20  # APP1 holds at most 64 KiB; other containers can be larger, none need this much
MAX_ENTRIES = 512  # per IFD; real cameras write under 100
MAX_VALUE_BYTES = 1024  # per tag value; the strings we keep are short and we cut them to MAX_TEXT
MAX_TEXT = 100
OLDEST = datetime(1990, 1, 1)
# EXIF times are the camera's local time with no zone, so "the future" allows for the widest UTC offset.
CLOCK_SLACK = timedelta(hours=14)

# Tags, by the IFD they live in.
MAKE, MODEL, ORIENTATION, MODIFY_DATE, EXIF_IFD, GPS_IFD = 0x010F, 0x0110, 0x0112, 0x0132, 0x8769, 0x8825
EXPOSURE_TIME, F_NUMBER, ISO = 0x829A, 0x829D, 0x8827
DATE_ORIGINAL, CREATE_DATE, FOCAL_LENGTH, LENS_MODEL = 0x9003, 0x9004, 0x920A, 0xA434
GPS_LATITUDE, GPS_LONGITUDE = 0x0002, 0x0004
IFD0_TAGS = frozenset({MAKE, MODEL, ORIENTATION, MODIFY_DATE, EXIF_IFD, GPS_IFD})
EXIF_TAGS = frozenset({EXPOSURE_TIME, F_NUMBER, ISO, DATE_ORIGINAL, CREATE_DATE, FOCAL_LENGTH, LENS_MODEL})
GPS_TAGS = frozenset({GPS_LATITUDE, GPS_LONGITUDE})

# TIFF field type -> (struct code, size in bytes). UNDEFINED (7) is read as bytes like ASCII.
TYPES: dict[int, tuple[str, int]] = {
    1: ("B", 1), 2: ("s", 1), 3: ("H", 2), 4: ("L", 4), 5: ("LL", 8), 7: ("s", 1),
    9: ("l", 4), 10: ("ll", 8), 11: ("f", 4), 12: ("d", 8), 13: ("L", 4),
}

Value = bytes | tuple[int | float, ...]


@dataclass(frozen=True)
class PhotoMetadata:
    """The facts about a photo we store and show. ``has_gps`` is recorded, the position never is."""

    taken_at: str | None = None  # 'YYYY-MM-DDTHH:MM:SS', camera local time
    camera_make: str | None = None
    camera_model: str | None = None
    lens: str | None = None
    focal_length: float | None = None  # mm
    aperture: float | None = None  # f-number
    exposure: str | None = None  # '1/250' or '2.5' (seconds)
    iso: int | None = None
    has_gps: bool = False


def read_metadata(exif_block: bytes | None, *, now: datetime | None = None) -> PhotoMetadata:
    """Metadata from an EXIF block (with or without the ``Exif\\0\\0`` header); empty on garbage.

    The capture date is the first plausible one of DateTimeOriginal, CreateDate (0x9004, called
    DateTimeDigitized by the EXIF spec) and ModifyDate (0x0132): after 1990 and not in the future, because a
    camera with a reset clock says 1980 or 2099 and sorting a gallery by that is worse than by upload time.
    """
    tags = _read_tags(exif_block)
    if not tags:
        return PhotoMetadata()
    limit = (now or datetime.now(UTC).replace(tzinfo=None)).replace(tzinfo=None) + CLOCK_SLACK
    taken_at = None
    for tag in (DATE_ORIGINAL, CREATE_DATE, MODIFY_DATE):
        when = _date(tags.get(tag))
        if when is not None and OLDEST < when <= limit:
            taken_at = when.isoformat(timespec="seconds")
            break
    aperture = _positive(_number(tags.get(F_NUMBER)))
    focal = _positive(_number(tags.get(FOCAL_LENGTH)))
    iso = _number(tags.get(ISO))
    return PhotoMetadata(
        taken_at=taken_at,
        camera_make=_text(tags.get(MAKE)),
        camera_model=_text(tags.get(MODEL)),
        lens=_text(tags.get(LENS_MODEL)),
        focal_length=round(focal, 1) if focal is not None and focal < 100_000 else None,
        aperture=round(aperture, 1) if aperture is not None and aperture < 1000 else None,
        exposure=_exposure(_number(tags.get(EXPOSURE_TIME))),
        iso=int(iso) if iso is not None and 0 < iso < 10_000_000 else None,
        has_gps=GPS_LATITUDE in tags and GPS_LONGITUDE in tags,
    )


def read_orientation(exif_block: bytes | None) -> int:
    """The EXIF orientation, 1-8; 1 (as stored) when missing or invalid."""
    value = _number(_read_tags(exif_block).get(ORIENTATION))
    return int(value) if value is not None and value in (1, 2, 3, 4, 5, 6, 7, 8) else 1


def _read_tags(block: bytes | None) -> dict[int, Value]:
    """The tags we know from IFD0, the Exif IFD and the GPS IFD, keyed by tag number (they do not clash)."""
    if not block:
        return {}
    data = _tiff(bytes(block[:MAX_BLOCK]))
    if data is None:
        return {}
    order = "<" if data[:2] == b"II" else ">"
    tags: dict[int, Value] = {}
    visited: set[int] = set()
    (ifd0,) = struct.unpack_from(order + "L", data, 4)
    _read_ifd(data, order, ifd0, IFD0_TAGS, tags, visited)
    for pointer, wanted in ((EXIF_IFD, EXIF_TAGS), (GPS_IFD, GPS_TAGS)):
        value = tags.pop(pointer, None)
        if isinstance(value, tuple) and len(value) == 1 and isinstance(value[0], int):
            _read_ifd(data, order, value[0], wanted, tags, visited)
    return tags


def _tiff(block: bytes) -> bytes | None:
    """The TIFF structure inside a block: bare, after ``Exif\\0\\0``, or after a short container prefix."""
    for start in range(17):
        head = block[start : start + 4]
        if head in (b"II*\x00", b"MM\x00*") and len(block) - start >= 8:
            return block[start:]
    return None


def _read_ifd(data: bytes, order: str, offset: int, wanted: frozenset[int], out: dict[int, Value],
              visited: set[int]) -> None:
    if offset in visited or not 8 <= offset <= len(data) - 2:
        return
    visited.add(offset)
    (count,) = struct.unpack_from(order + "H", data, offset)
    if count > MAX_ENTRIES:
        return
    for i in range(count):
        entry = offset + 2 + 12 * i
        if entry + 12 > len(data):
            return
        tag, kind, n = struct.unpack_from(order + "HHL", data, entry)
        if tag not in wanted or kind not in TYPES or tag in out:
            continue
        code, size = TYPES[kind]
        total = n * size
        if n == 0 or total > MAX_VALUE_BYTES:
            continue
        if total <= 4:
            start = entry + 8
        else:
            (start,) = struct.unpack_from(order + "L", data, entry + 8)
            if start + total > len(data):
                continue
        raw = data[start : start + total]
        if code == "s":
            out[tag] = raw
        elif len(code) == 2:  # rationals: numerator / denominator, 0 denominators become None later
            nums = struct.unpack(order + code[0] * (2 * n), raw)
            out[tag] = tuple(a / b if b else float("nan") for a, b in zip(nums[::2], nums[1::2], strict=True))
        else:
            out[tag] = struct.unpack(order + code * n, raw)


def _number(value: Value | None) -> float | None:
    if isinstance(value, tuple) and value and value[0] == value[0]:  # not NaN
        return value[0]
    return None


def _positive(value: float | None) -> float | None:
    return value if value is not None and value > 0 else None


def _text(value: Value | None) -> str | None:
    """Printable text: up to the first NUL, control characters removed, at most MAX_TEXT characters."""
    if not isinstance(value, bytes):
        return None
    raw = value.split(b"\x00", 1)[0]
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError:
        text = raw.decode("latin-1")
    text = "".join(c if c.isprintable() else " " for c in text)
    text = " ".join(text.split())[:MAX_TEXT].strip()
    return text or None


def _date(value: Value | None) -> datetime | None:
    """'YYYY:MM:DD HH:MM:SS' (the EXIF form; '-' or 'T' separators tolerated); None when not a real date."""
    text = _text(value)
    if text is None or len(text) < 19:
        return None
    text = text[:19].replace("-", ":").replace("T", " ")
    try:
        return datetime.strptime(text, "%Y:%m:%d %H:%M:%S")
    except ValueError:
        return None


def _exposure(seconds: float | None) -> str | None:
    """'1/250' for fractions of a second that are 1/N, else the seconds ('0.3', '2.5', '30')."""
    if seconds is None or not 0 < seconds < 100_000:
        return None
    if seconds < 1:
        inverse = 1 / seconds
        if abs(inverse - round(inverse)) < 0.01 * inverse:
            return f"1/{round(inverse)}"
    return f"{seconds:.2f}".rstrip("0").rstrip(".")
