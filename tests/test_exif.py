"""exif.py: the fields we keep, the date rules, and a parser that stays bounded on hostile input."""

from __future__ import annotations

import random
import struct
import time
import tracemalloc
from datetime import datetime
from typing import Any

import pytest

from picpeak_lite.media.exif import PhotoMetadata, read_metadata, read_orientation
from tests.corpus import PIEXIF_OOM
from tests.harness import figures
from tests.imagefactory import jpeg_segments, make_exif

CORPUS = PIEXIF_OOM
NOW = datetime(2024, 6, 1, 12, 0, 0)


def full_block(big_endian: bool = False) -> bytes:
    return make_exif(
        orientation=6, make="Canon", model="Canon EOS R5", lens="RF24-70mm F2.8 L IS USM",
        date_original="2023:05:20 14:03:07", date_digitized="2023:05:20 14:03:08",
        date_modified="2023:05:21 09:00:00", fnumber=(28, 10), exposure=(1, 250), iso=800, focal=(35, 1),
        gps=(52.52, -13.405), big_endian=big_endian,
    )


@pytest.mark.parametrize("big_endian", [False, True], ids=["II", "MM"])
def test_reads_every_field(big_endian: bool) -> None:
    assert read_metadata(full_block(big_endian), now=NOW) == PhotoMetadata(
        taken_at="2023-05-20T14:03:07", camera_make="Canon", camera_model="Canon EOS R5",
        lens="RF24-70mm F2.8 L IS USM", focal_length=35.0, aperture=2.8, exposure="1/250", iso=800,
        has_gps=True,
    )


def test_accepts_bare_tiff_without_exif_header() -> None:
    """WebP and some HEIC writers store the TIFF structure without the 'Exif\\0\\0' prefix."""
    block = full_block()[6:]
    assert read_metadata(block, now=NOW).camera_make == "Canon"
    assert read_orientation(block) == 6


def test_no_gps_ifd_means_no_gps() -> None:
    assert read_metadata(make_exif(make="Canon"), now=NOW).has_gps is False


@pytest.mark.parametrize(
    ("dates", "expected"),
    [
        ({"date_original": "2021:01:02 03:04:05"}, "2021-01-02T03:04:05"),
        ({"date_digitized": "2021:01:02 03:04:06", "date_modified": "2022:01:01 00:00:00"}, "2021-01-02T03:04:06"),
        ({"date_modified": "2021:01:02 03:04:07"}, "2021-01-02T03:04:07"),
        # A camera with a reset clock: the implausible date is skipped, the next one is used.
        ({"date_original": "1985:07:01 10:00:00", "date_digitized": "2019:07:01 10:00:00"}, "2019-07-01T10:00:00"),
        ({"date_original": "2099:01:01 00:00:00", "date_modified": "2020:02:02 02:02:02"}, "2020-02-02T02:02:02"),
        ({"date_original": "1985:07:01 10:00:00"}, None),
        ({"date_original": "2024:06:03 12:00:00"}, None),  # two days after NOW: the future
        ({"date_original": "2024:06:01 20:00:00"}, "2024-06-01T20:00:00"),  # camera clock in UTC+8
        ({"date_original": "0000:00:00 00:00:00"}, None),
        ({"date_original": "2021:13:45 99:00:00"}, None),
        ({"date_original": "    :  :     :  :  "}, None),
        ({"date_original": "2021-01-02T03:04:05"}, "2021-01-02T03:04:05"),
        ({}, None),
    ],
)
def test_capture_date_rules(dates: dict[str, str], expected: str | None) -> None:
    assert read_metadata(make_exif(make="X", **dates), now=NOW).taken_at == expected


def test_strings_are_cleaned() -> None:
    block = make_exif(make=b"  Canon\x01\x07 \x00trailing garbage", model="M" * 300, lens="\t \n")
    meta = read_metadata(block, now=NOW)
    assert meta.camera_make == "Canon"
    assert meta.camera_model == "M" * 100
    assert meta.lens is None


def test_non_utf8_text_is_kept_readable() -> None:
    assert read_metadata(make_exif(make=b"Caf\xe9"), now=NOW).camera_make == "Café"


@pytest.mark.parametrize(
    ("exposure", "expected"),
    [((1, 250), "1/250"), ((10, 2500), "1/250"), ((1, 3), "1/3"), ((3, 10), "0.3"), ((5, 2), "2.5"),
     ((30, 1), "30"), ((1, 1), "1"), ((1, 0), None), ((0, 1), None)],
)
def test_exposure_format(exposure: tuple[int, int], expected: str | None) -> None:
    assert read_metadata(make_exif(exposure=exposure), now=NOW).exposure == expected


def test_zero_and_broken_numbers_are_dropped() -> None:
    meta = read_metadata(make_exif(fnumber=(28, 0), focal=(0, 1), iso=0), now=NOW)
    assert (meta.aperture, meta.focal_length, meta.iso) == (None, None, None)


@pytest.mark.parametrize("orientation", range(1, 9))
def test_orientation(orientation: int) -> None:
    assert read_orientation(make_exif(orientation=orientation)) == orientation


@pytest.mark.parametrize("block", [None, b"", b"Exif\x00\x00", b"garbage" * 10, make_exif(orientation=9),
                                   make_exif(orientation=0), make_exif(make="only")])
def test_orientation_defaults_to_1(block: bytes | None) -> None:
    assert read_orientation(block) == 1


@pytest.mark.parametrize("block", [None, b"", b"\x00" * 100, b"Exif\x00\x00II*\x00\xff\xff\xff\xff",
                                   b"MM\x00*\x00\x00\x00\x08\xff\xff"])
def test_garbage_gives_empty_metadata(block: bytes | None) -> None:
    assert read_metadata(block, now=NOW) == PhotoMetadata()


def test_ifd_loops_terminate() -> None:
    """An Exif IFD pointer back to IFD0 (offset 8) must not loop."""
    tiff = bytearray(make_exif(make="Canon", iso=100)[6:])
    (count,) = struct.unpack_from("<H", tiff, 8)
    for i in range(count):
        if struct.unpack_from("<H", tiff, 10 + 12 * i)[0] == 0x8769:
            struct.pack_into("<L", tiff, 10 + 12 * i + 8, 8)
    assert read_metadata(bytes(tiff), now=NOW).camera_make == "Canon"


def bounded(block: bytes) -> tuple[float, int]:
    """Seconds and traced peak bytes of reading one block."""
    tracemalloc.start()
    started = time.perf_counter()
    try:
        read_metadata(block, now=NOW)
        read_orientation(block)
    finally:
        peak = tracemalloc.get_traced_memory()[1]
        tracemalloc.stop()
    return time.perf_counter() - started, peak


def report(capsys: Any, name: str, measured: list[tuple[float, int]]) -> None:
    """The figures of a bounded read: its time is printed here and bounded only in the slow variants (a busy CI
    box cannot promise any wall-clock figure); its memory is asserted by the test itself."""
    figures(capsys, f"exif {name}: reads={len(measured)} worst_ms={max(s for s, _ in measured) * 1000:.1f} "
                    f"peak_kb={max(p for _, p in measured) / 1024:.0f}")


def read_corpus_file() -> list[tuple[float, int]]:
    """The piexif OOM file: its APP1 segment, the bare TIFF inside it, and the whole JPEG."""
    data = CORPUS.read_bytes()
    app1 = next(body for marker, body in jpeg_segments(data) if marker == 0xE1)
    return [bounded(block) for block in (app1, app1[6:], data)]


def test_piexif_oom_corpus_file_is_read_in_bounded_memory(capsys: Any) -> None:
    """This file makes piexif.load grow memory without bound (a GPS pointer claiming 4 billion entries)."""
    measured = read_corpus_file()
    report(capsys, "piexif-corpus", measured)
    for _, peak in measured:
        assert peak < 1 << 20, f"{peak} bytes traced"
    app1 = next(body for marker, body in jpeg_segments(CORPUS.read_bytes()) if marker == 0xE1)
    assert read_metadata(app1, now=NOW) == PhotoMetadata(camera_make="Cam")


@pytest.mark.slow
def test_piexif_oom_corpus_file_is_read_promptly(capsys: Any) -> None:
    measured = read_corpus_file()
    report(capsys, "piexif-corpus", measured)
    for seconds, _ in measured:
        assert seconds < 0.5


def read_fuzzed_blocks() -> tuple[float, int]:
    """A few thousand random mutations of a real block, each read: no exception, sane values. Returns the
    seconds all of them took and the traced peak bytes."""
    rng = random.Random(1234)
    real = bytearray(full_block())
    tracemalloc.start()
    started = time.perf_counter()
    try:
        for _ in range(3000):
            block = bytearray(real)
            for _ in range(rng.randint(1, 8)):
                kind = rng.random()
                at = rng.randrange(len(block))
                if kind < 0.5:
                    block[at] = rng.randrange(256)
                elif kind < 0.8:  # a huge count or offset where a field was
                    block[at : at + 4] = rng.choice([b"\xff\xff\xff\xff", b"\xfb\xff\xff\xfe", b"\x00\x00\x00\x08"])
                else:
                    del block[at:]
                    break
            meta = read_metadata(bytes(block), now=NOW)
            assert isinstance(meta, PhotoMetadata)
            assert 1 <= read_orientation(bytes(block)) <= 8
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    return time.perf_counter() - started, peak


def test_fuzzed_blocks_never_raise_and_stay_bounded(capsys: Any) -> None:
    """A few thousand random mutations of a real block: no exception, no memory growth (no slow path: the
    slow variant bounds the time, which is printed here)."""
    seconds, peak = read_fuzzed_blocks()
    figures(capsys, f"exif fuzzed-blocks: blocks=3000 seconds={seconds:.1f} peak_kb={peak / 1024:.0f}")
    assert peak < 2 << 20, f"{peak} bytes traced"


@pytest.mark.slow
def test_fuzzed_blocks_are_read_within_10_s(capsys: Any) -> None:
    seconds, peak = read_fuzzed_blocks()
    figures(capsys, f"exif fuzzed-blocks: blocks=3000 seconds={seconds:.1f} peak_kb={peak / 1024:.0f}")
    assert seconds < 10
    assert peak < 2 << 20, f"{peak} bytes traced"


def read_oversized_blocks() -> list[tuple[float, int]]:
    rng = random.Random(5)
    return [bounded(block) for block in (rng.randbytes(200_000),
                                         b"Exif\x00\x00II*\x00\x08\x00\x00\x00" + b"\xff" * 5_000_000,
                                         full_block() + rng.randbytes(3_000_000))]


def test_oversized_and_random_blocks_stay_bounded(capsys: Any) -> None:
    measured = read_oversized_blocks()
    report(capsys, "oversized-blocks", measured)
    for _, peak in measured:
        assert peak < 3 << 20, f"{peak} bytes traced"


@pytest.mark.slow
def test_oversized_and_random_blocks_are_read_promptly(capsys: Any) -> None:
    measured = read_oversized_blocks()
    report(capsys, "oversized-blocks", measured)
    for seconds, _ in measured:
        assert seconds < 0.5
