"""tus against multipart (issue 14): the same photos through the real server, both ways, as the pages send them.

    python bench/bench_tus.py [--photos 200] [--chunk-mb 8]

A real hypercorn on 127.0.0.1, port 0, a fresh data directory, processing off (only receiving is measured).
Multipart: batches of 20 files, 3 requests at a time (the old admin uploader). tus: one upload per file, the
file's pieces of --chunk-mb, 3 files at a time. Prints MB/s for each, their ratio, and the process CPU seconds
per tus request beyond multipart's (server and client share the process, so that figure includes both sides).
"""

from __future__ import annotations

import argparse
import base64
import secrets
import struct
import sys
import tempfile
import time
from pathlib import Path

import httpx
import trio

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from picpeak_lite import server
from picpeak_lite.config import load_settings
from picpeak_lite.ops import bootstrap
from picpeak_lite.store import db
from tests import imagefactory
from tests.factories import gallery_row

BOUNDARY = "----bench-tus-4b1c"
PARALLEL = 3


def photos(count: int) -> list[bytes]:
    """12 MP camera-like JPEGs: one encoded, then made distinct by a comment segment (fast, distinct sha256)."""
    base = imagefactory.save(imagefactory.photo(4000, 3000, seed=1), "jpeg", quality=92)
    out = []
    for i in range(count):
        comment = f"bench {i} {secrets.token_hex(8)}".encode()
        out.append(base[:2] + b"\xff\xfe" + struct.pack(">H", len(comment) + 2) + comment + base[2:])
    return out


def multipart_body(files: list[bytes], offset: int) -> bytes:
    parts = [f"--{BOUNDARY}\r\nContent-Disposition: form-data; name=\"photos\"; filename=\"{offset + i}.jpg\"\r\n"
             "Content-Type: image/jpeg\r\n\r\n".encode() + data + b"\r\n" for i, data in enumerate(files)]
    return b"".join(parts) + f"--{BOUNDARY}--\r\n".encode()


async def run_multipart(http: httpx.AsyncClient, files: list[bytes], gallery: int) -> None:
    batches = [files[i:i + 20] for i in range(0, len(files), 20)]
    limiter = trio.CapacityLimiter(PARALLEL)

    async def one(index: int, batch: list[bytes]) -> None:
        async with limiter:
            answer = await http.post(f"/api/admin/galleries/{gallery}/upload", content=multipart_body(batch, index),
                                     headers={"Content-Type": f"multipart/form-data; boundary={BOUNDARY}"})
            assert answer.status_code == 202, answer.text

    async with trio.open_nursery() as nursery:
        for index, batch in enumerate(batches):
            nursery.start_soon(one, index * 20, batch)


async def run_tus(http: httpx.AsyncClient, files: list[bytes], gallery: int, chunk: int) -> int:
    limiter = trio.CapacityLimiter(PARALLEL)
    requests = 0

    async def one(index: int, data: bytes) -> None:
        nonlocal requests
        async with limiter:
            name = base64.b64encode(f"t{index}.jpg".encode()).decode()
            created = await http.post(f"/api/admin/galleries/{gallery}/tus", headers={
                "Tus-Resumable": "1.0.0", "Upload-Length": str(len(data)), "Upload-Metadata": f"filename {name}"})
            assert created.status_code == 201, created.text
            requests += 1
            for start in range(0, len(data), chunk):
                answer = await http.patch(created.headers["location"], content=data[start:start + chunk], headers={
                    "Tus-Resumable": "1.0.0", "Upload-Offset": str(start),
                    "Content-Type": "application/offset+octet-stream"})
                assert answer.status_code == 204, answer.text
                requests += 1

    async with trio.open_nursery() as nursery:
        for index, data in enumerate(files):
            nursery.start_soon(one, index, data)
    return requests


async def main(count: int, chunk_mb: int) -> None:
    files = photos(count)
    total_mb = sum(len(f) for f in files) / 2**20
    with tempfile.TemporaryDirectory() as tmp:
        settings = load_settings(environ={}, overrides={"data_dir": str(Path(tmp) / "data"), "port": 0,
                                                        "processing_enabled": False, "shutdown_grace_seconds": 1})
        bootstrap.prepare(settings)
        conn = db.connect(settings.database)
        with db.transaction(conn):
            token = bootstrap.create_api_token(conn, "bench", time.time())
            first, second = gallery_row(conn, "multipart"), gallery_row(conn, "tus")
        conn.close()
        async with trio.open_nursery() as nursery:
            running = await nursery.start(server.run, settings)
            async with httpx.AsyncClient(base_url=running.url, timeout=600,
                                         headers={"Authorization": f"Bearer {token}"}) as http:
                cpu, wall = time.process_time(), time.perf_counter()
                await run_multipart(http, files, first)
                multipart_s, multipart_cpu = time.perf_counter() - wall, time.process_time() - cpu
                cpu, wall = time.process_time(), time.perf_counter()
                requests = await run_tus(http, files, second, chunk_mb * 2**20)
                tus_s, tus_cpu = time.perf_counter() - wall, time.process_time() - cpu
            running.stop()
    per_request_ms = 1000 * max(0.0, tus_cpu - multipart_cpu) / requests
    print(f"bench_tus: photos={count} MB={total_mb:.0f} chunk_mb={chunk_mb} "
          f"multipart_MBps={total_mb / multipart_s:.1f} tus_MBps={total_mb / tus_s:.1f} "
          f"ratio={multipart_s / tus_s:.2f} tus_requests={requests} cpu_multipart_s={multipart_cpu:.2f} "
          f"cpu_tus_s={tus_cpu:.2f} extra_cpu_ms_per_tus_request={per_request_ms:.2f}")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--photos", type=int, default=200)
    parser.add_argument("--chunk-mb", type=int, default=8)
    args = parser.parse_args()
    trio.run(main, args.photos, args.chunk_mb)
