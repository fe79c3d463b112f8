"""Upload throughput over loopback against a raw write + fsync of the same bytes on the same disk.

    python bench/bench_upload.py --mb 200 --files 2

Starts the real server (hypercorn, port 0, processing off) on a temp data directory, uploads ``--files`` files of
``--mb`` MB each in one multipart request with httpx (streamed from a generator, no body in memory), and reports
MB/s next to writing the same bytes in 1 MiB blocks plus an fsync.
"""

from __future__ import annotations

import argparse
import io
import os
import tempfile
import time
from collections.abc import AsyncIterator
from pathlib import Path

import httpx
import trio
from PIL import Image

from picpeak_lite import server
from picpeak_lite.config import load_settings
from picpeak_lite.ops import bootstrap
from picpeak_lite.store import db

BOUNDARY = "bench-boundary-5c1e"
BLOCK = 1024 * 1024


def photo_head() -> bytes:
    out = io.BytesIO()
    Image.new("RGB", (64, 48), "teal").save(out, "JPEG")
    return out.getvalue()


async def body(files: int, size: int, head: bytes) -> AsyncIterator[bytes]:
    block = os.urandom(BLOCK)
    for i in range(files):
        yield (f"--{BOUNDARY}\r\nContent-Disposition: form-data; name=\"photos\"; filename=\"{i}.jpg\"\r\n"
               "Content-Type: image/jpeg\r\n\r\n").encode() + head + i.to_bytes(8, "big")
        left = size - len(head) - 8
        while left > 0:
            yield block[: min(left, BLOCK)]
            left -= BLOCK
        yield b"\r\n"
    yield f"--{BOUNDARY}--\r\n".encode()


def raw_write(path: Path, size: int) -> float:
    block = os.urandom(BLOCK)
    start = time.perf_counter()
    with open(path, "wb") as f:
        for _ in range(0, size, BLOCK):
            f.write(block)
        f.flush()
        os.fsync(f.fileno())
    elapsed = time.perf_counter() - start
    path.unlink()
    return elapsed


async def main(mb: int, files: int) -> None:
    with tempfile.TemporaryDirectory(dir=os.environ.get("BENCH_DIR")) as tmp:
        settings = load_settings(environ={}, overrides={"data_dir": tmp, "port": 0, "processing_enabled": False,
                                                        "admin_max_file_mb": mb + 1})
        bootstrap.prepare(settings)
        bootstrap.ensure_admin(settings, {"PICPEAK_ADMIN_PASSWORD": "bench password 123"})
        conn = db.connect(settings.database)
        with db.transaction(conn):
            token = bootstrap.create_api_token(conn, "bench", time.time())
            conn.execute("INSERT INTO galleries (slug, share_token, name, created_at, updated_at) "
                         "VALUES ('bench', 'bench', 'Bench', 0, 0)")
        conn.close()
        size = mb * BLOCK
        disk = raw_write(Path(tmp) / "raw.bin", size * files)
        async with trio.open_nursery() as nursery:
            running = await nursery.start(server.run, settings)
            async with httpx.AsyncClient(base_url=running.url, timeout=None) as http:
                start = time.perf_counter()
                response = await http.post(
                    "/api/admin/galleries/1/upload", content=body(files, size, photo_head()),
                    headers={"Authorization": f"Bearer {token}",
                             "Content-Type": f"multipart/form-data; boundary={BOUNDARY}"})
                upload = time.perf_counter() - start
            running.stop()
        assert response.status_code == 202, response.text
        total = mb * files
        print(f"raw write+fsync: {total / disk:8.1f} MB/s  ({total} MB in {disk:.2f} s)")
        print(f"upload (loopback): {total / upload:6.1f} MB/s  ({total} MB in {upload:.2f} s, "
              f"{response.json()['count']} files accepted)")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mb", type=int, default=200, help="size of each file in MB")
    parser.add_argument("--files", type=int, default=2, help="files in the one request")
    args = parser.parse_args()
    trio.run(main, args.mb, args.files)
