"""The slow variant of the bad-input suite: fuzzing for a few minutes (run with ``pytest -m slow``).

* The image/EXIF path, with hypothesis: mutated corpus files through ``images.sniff``, ``images.decode`` and
  ``exif.read_metadata`` may raise ``InvalidImage`` or return, nothing else. A crash is written to
  ``tests/corpus/fuzz-<sha>.bin`` (with its expected outcome in ``.expect``) so the fast suite keeps it.
* The upload parser, with a mutation loop through the app's test client: random cuts, flips, repeats and
  inserted boundaries/headers in real multipart bodies must all be answered below 500.

``PICPEAK_FUZZ_SECONDS`` (default 120) bounds each of the two.
"""

from __future__ import annotations

import hashlib
import os
import random
import time
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from picpeak_lite.media import exif, images

from . import corpus
from .factories import published
from .harness import figures
from .test_badinput import BOUNDARY, body_of, file_part

pytestmark = [pytest.mark.slow, pytest.mark.system]
SECONDS = float(os.environ.get("PICPEAK_FUZZ_SECONDS", "120"))
SPEC = images.RenderSpec(max_pixels=20_000_000)  # mutated headers may ask for anything up to this
SEEDS = [c.data for c in corpus.build() if c.data and len(c.data) < 100_000] + [
    corpus.imagefactory.save(corpus.imagefactory.photo(64, 48, seed=5), "webp"),
    corpus.imagefactory.save(corpus.imagefactory.photo(64, 48, seed=6), "jpeg",
                             exif=corpus.imagefactory.make_exif(orientation=6, make="Canon", gps=(1.5, 2.5))),
]
TOKENS = [b"\xff\xd8", b"\xff\xd9", b"\xff\xe1", b"\xff\xc0", b"IHDR", b"IDAT", b"IEND", b"Exif\x00\x00",
          b"II*\x00", b"MM\x00*", b"\x00" * 8, b"\xff" * 8, b"RIFF", b"WEBPVP8 ", b"ftypheic"]


@st.composite
def mutated(draw: Any) -> bytes:
    data = bytearray(draw(st.sampled_from(SEEDS)))
    for _ in range(draw(st.integers(1, 8))):
        op = draw(st.sampled_from(("flip", "cut", "insert", "repeat", "token", "int")))
        at = draw(st.integers(0, max(0, len(data) - 1)))
        if op == "flip" and data:
            data[at] ^= 1 << draw(st.integers(0, 7))
        elif op == "cut":
            del data[at : at + draw(st.integers(1, 4096))]
        elif op == "insert":
            data[at:at] = draw(st.binary(min_size=1, max_size=64))
        elif op == "repeat":
            data[at:at] = data[at : at + draw(st.integers(1, 256))] * draw(st.integers(1, 8))
        elif op == "token":
            data[at:at] = draw(st.sampled_from(TOKENS))
        elif op == "int" and len(data) > at + 4:
            data[at : at + 4] = draw(st.sampled_from([b"\x00\x00\x00\x00", b"\xff\xff\xff\xff", b"\x7f\xff\xff\xff",
                                                     b"\x00\x01\x00\x00", b"\x00\x00\xff\xff"]))
    return bytes(data)


def keep_crash(data: bytes, expect: str) -> None:
    name = hashlib.sha256(data).hexdigest()[:12]
    (corpus.HERE / f"fuzz-{name}.bin").write_bytes(data)
    (corpus.HERE / f"fuzz-{name}.expect").write_text(expect + "\n")


def image_path(data: bytes) -> None:
    try:
        images.sniff(data, max_pixels=SPEC.max_pixels)
    except images.InvalidImage:
        return
    except BaseException:
        keep_crash(data, "4xx")
        raise
    try:
        decoded = images.decode(data, SPEC)
        exif.read_metadata(decoded.exif)
    except images.InvalidImage:
        return
    except BaseException:
        keep_crash(data, "failed")
        raise


def test_fuzz_image_and_exif_path(capsys: pytest.CaptureFixture[str]) -> None:
    runs = {"n": 0}
    deadline = time.monotonic() + SECONDS

    # Hypothesis counts examples, not seconds: rounds of 500 until the time is up.
    @settings(max_examples=500, deadline=None, database=None, suppress_health_check=list(HealthCheck))
    @given(mutated(), st.binary(max_size=2048))
    def fuzz(data: bytes, raw_exif: bytes) -> None:
        runs["n"] += 1
        image_path(data)
        exif.read_metadata(raw_exif)
        exif.read_metadata(b"Exif\x00\x00II*\x00\x08\x00\x00\x00" + raw_exif)
        exif.read_orientation(b"MM\x00*\x00\x00\x00\x08" + raw_exif)

    started = time.monotonic()
    while time.monotonic() < deadline:
        fuzz()
    figures(capsys, f"fuzz images: inputs={runs['n']} seconds={time.monotonic() - started:.0f} crashes=0")


def mutate_body(rng: random.Random, body: bytes) -> bytes:
    data = bytearray(body)
    pieces = [f"--{BOUNDARY}\r\n".encode(), f"--{BOUNDARY}--".encode(), b"\r\n\r\n", b"\r\n",
              b'Content-Disposition: form-data; name="photos"; filename="', b'filename*=UTF-8\'\'%00%0d%0a',
              b"Content-Type: multipart/mixed; boundary=x\r\n", b'name="csrf_token"', b"\x00", b'"']
    for _ in range(rng.randint(1, 6)):
        at = rng.randrange(len(data) + 1)
        op = rng.random()
        if op < 0.3:
            data[at:at] = rng.choice(pieces)
        elif op < 0.5:
            del data[at : at + rng.randint(1, 512)]
        elif op < 0.7 and data:
            data[min(at, len(data) - 1)] = rng.randrange(256)
        elif op < 0.85:
            data[at:at] = data[at : at + rng.randint(1, 200)] * rng.randint(2, 20)
        else:
            data = data[:at]
    return bytes(data)


async def test_fuzz_upload_multipart(admin: Any, capsys: pytest.CaptureFixture[str]) -> None:
    gallery = await published(admin, name="Fuzz")
    rng = random.Random(int(os.environ.get("PICPEAK_FUZZ_SEED", "7")))
    seeds = [body_of(file_part(c.filename, c.data)) for c in corpus.build()[:12]]
    seeds.append(body_of(file_part("a.jpg", corpus.jpeg(1)), file_part("b.png", corpus.png(2))))
    statuses: dict[int, int] = {}
    server_errors: list[bytes] = []
    deadline = time.monotonic() + SECONDS
    headers = {**admin.headers(), "Content-Type": f"multipart/form-data; boundary={BOUNDARY}"}
    while time.monotonic() < deadline:
        body = mutate_body(rng, rng.choice(seeds))
        response = await admin.client.post(f"/api/admin/galleries/{gallery['id']}/upload", data=body,
                                           headers=headers)
        statuses[response.status_code] = statuses.get(response.status_code, 0) + 1
        if response.status_code >= 500:
            server_errors.append(body)
            keep_crash_body(body)
    figures(capsys, f"fuzz upload: bodies={sum(statuses.values())} statuses={dict(sorted(statuses.items()))} "
                    f"5xx={len(server_errors)}")
    assert server_errors == []


def keep_crash_body(body: bytes) -> None:
    name = hashlib.sha256(body).hexdigest()[:12]
    (corpus.HERE / f"multipart-{name}.body").write_bytes(body)
