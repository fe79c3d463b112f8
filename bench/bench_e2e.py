"""End to end through the real server: from the first upload byte to the last photo `complete`.

    python bench/bench_e2e.py --photos 50 --megapixels 12

Starts `picpeak-lite serve` as a subprocess on a temp data directory (port 0), uploads the photos in batches of
10 with 2 requests in parallel (as the bulk uploader does), and reports: time until every 202, the slowest
upload answer compared with the time to write its bytes to disk (the request path must not decode), and the
time until the last photo is complete, with photos/s.
"""

from __future__ import annotations

import argparse
import io
import os
import sys
import tempfile
import time
from pathlib import Path

import httpx
import trio
from PIL import Image

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from serve import start_server  # bench/serve.py: run as a script, its folder is on sys.path

from tests import imagefactory


def make_photos(count: int, megapixels: int, folder: Path) -> list[Path]:
    width = int((megapixels * 1e6 * 4 / 3) ** 0.5)
    height = int(width * 3 / 4)
    base = imagefactory.photo(width, height, seed=1)
    exif = imagefactory.make_exif(make="Canon", model="EOS R6", date_original="2026:06:20 15:00:00")
    paths = []
    for i in range(count):
        path = folder / f"IMG_{i:04d}.jpg"
        # Each file differs (a pixel row changes), so the server does not deduplicate them.
        image = base.copy()
        image.putpixel((i % width, 0), (i % 256, 0, 0))
        buffer = io.BytesIO()
        image.save(buffer, "JPEG", quality=92, exif=exif)
        path.write_bytes(buffer.getvalue())
        paths.append(path)
    return paths




def disk_write_seconds(paths: list[Path], folder: Path) -> float:
    """How long writing these bytes (with fsync, as the server does) takes on this disk."""
    started = time.perf_counter()
    for path in paths:
        target = folder / ("copy-" + path.name)
        with open(target, "wb") as f:
            f.write(path.read_bytes())
            f.flush()
            os.fsync(f.fileno())
        target.unlink()
    return time.perf_counter() - started


async def run(paths: list[Path], url: str, token: str, batch: int, parallel: int) -> None:
    headers = {"Authorization": f"Bearer {token}"}
    async with httpx.AsyncClient(base_url=url, headers=headers, timeout=600) as http:
        gallery = (await http.post("/api/admin/galleries", json={"name": "Bench"})).json()
        batches = [paths[i:i + batch] for i in range(0, len(paths), batch)]
        answers: list[float] = []
        upload_ids: list[str] = []
        limiter = trio.CapacityLimiter(parallel)
        started = time.perf_counter()

        async def send(group: list[Path]) -> None:
            async with limiter:
                files = [("photos", (p.name, p.read_bytes(), "image/jpeg")) for p in group]
                t0 = time.perf_counter()
                response = await http.post(f"/api/admin/galleries/{gallery['id']}/upload", files=files)
                answers.append(time.perf_counter() - t0)
                assert response.status_code == 202, response.text
                upload_ids.append(response.json()["upload_id"])

        async with trio.open_nursery() as nursery:
            for group in batches:
                nursery.start_soon(send, group)
        acked = time.perf_counter() - started
        while True:
            done = 0
            for upload_id in upload_ids:
                status = (await http.get(f"/api/admin/uploads/{upload_id}")).json()
                done += status["complete"] + status["failed"]
            if done == len(paths):
                break
            await trio.sleep(0.1)
        finished = time.perf_counter() - started
    size_mb = sum(p.stat().st_size for p in paths) / 1e6
    write_s = disk_write_seconds(paths[:batch], paths[0].parent)
    print(f"e2e: photos={len(paths)} total={size_mb:.0f}MB all_202_after={acked:.2f}s "
          f"slowest_upload_answer={max(answers):.2f}s (batch of {batch}; writing its bytes with fsync takes "
          f"{write_s:.2f}s) last_complete_after={finished:.2f}s throughput={len(paths) / finished:.2f} photos/s")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--photos", type=int, default=50)
    parser.add_argument("--megapixels", type=int, default=12)
    parser.add_argument("--batch", type=int, default=10)
    parser.add_argument("--parallel", type=int, default=2)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        print(f"generating {args.photos} photos of {args.megapixels} MP ...", flush=True)
        paths = make_photos(args.photos, args.megapixels, folder)
        proc, url, token = start_server(folder / "data")
        try:
            trio.run(run, paths, url, token, args.batch, args.parallel)
        finally:
            proc.terminate()
            proc.wait(timeout=30)


if __name__ == "__main__":
    Image.MAX_IMAGE_PIXELS = None
    main()
