"""Guest gallery benchmark: the first page of a 2,000-photo gallery, the first screen on a phone, zip streaming.

Run: ``python bench/bench_gallery.py`` (about a minute; needs Chromium at /usr/bin/chromium for the phone part).
A real ``picpeak-lite serve`` runs in a subprocess on a data dir staged here: 2,000 complete photo rows whose
derivatives are realistic JPEGs (one ~400 px grid and one ~1600 px view image made in code, hard-linked under
every key, so the bytes per image are real but the disk holds two files), and a second gallery of 200 distinct
~1 MB originals for the zip. It prints:

* ``GET /g/<slug>`` (first 60 photos, server-rendered) over 200 sequential requests: p50/p95 in ms, measured
  at the client on loopback (so it includes HTTP overhead); the same for a JSON page deep in the listing
  (after photo 1,900) in both orders, which shows whether a page's cost depends on its position;
* bytes transferred until the network is idle for a 390x844 phone (DPR 3) opening the gallery: total,
  and how many of the image requests were grid vs view images;
* zip streaming of the 200 originals (MB/s at the client) against reading the same files from disk in Python
  (MB/s), both with a warm page cache.
"""

from __future__ import annotations

import hashlib
import os
import re
import secrets
import statistics
import sys
import tempfile
import time
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from picpeak_lite.config import load_settings  # noqa: E402
from picpeak_lite.ops import bootstrap  # noqa: E402
from picpeak_lite.store import db  # noqa: E402
from picpeak_lite.store.storage import LocalStorage, new_key  # noqa: E402
from tests import imagefactory  # noqa: E402
from tests.browser.conftest import CHROMIUM, CHROMIUM_ARGS, start_server, stop_server  # noqa: E402

PHOTOS = 2000
ZIP_PHOTOS = 200
REQUESTS = 200


def stage(data_dir: Path) -> tuple[str, str]:
    settings = load_settings(environ={}, overrides={"data_dir": str(data_dir), "port": 0})
    bootstrap.prepare(settings)
    storage = LocalStorage(settings.data_path)
    storage.create_dirs()
    grid = imagefactory.save(imagefactory.photo(400, 267, seed=1), "jpeg", quality=85)
    view = imagefactory.save(imagefactory.photo(1600, 1067, seed=2), "jpeg", quality=85)
    shared = {}
    for kind, data in (("grid", grid), ("view", view), ("orig", view)):
        path = data_dir / f"shared.{kind}"
        path.write_bytes(data)
        shared[kind] = path
    conn = db.connect(settings.database)
    slugs = []
    with db.transaction(conn):
        for name, count in (("Big wedding", PHOTOS), ("Zip me", ZIP_PHOTOS)):
            slug = f"bench-{secrets.token_hex(4)}"
            gallery_id = conn.execute(
                "INSERT INTO galleries (slug, share_token, name, is_draft, welcome_message, created_at, updated_at) "
                "VALUES (?, ?, ?, 0, 'Thank you for coming!', 0, 0) RETURNING id",
                (slug, secrets.token_hex(16), name)).fetchall()[0]["id"]
            upload_id = secrets.token_hex(16)
            conn.execute("INSERT INTO uploads (id, gallery_id, uploaded_by, created_at) VALUES (?, ?, 'admin', 0)",
                         (upload_id, gallery_id))
            for i in range(count):
                key = new_key()
                if name == "Zip me":
                    original = imagefactory.save(imagefactory.photo(1000, 700, seed=i % 20), "jpeg", quality=97)
                    original += secrets.token_bytes(16)  # distinct files, each read from disk on its own
                    path = storage.original_path(key)
                    path.parent.mkdir(exist_ok=True)
                    path.write_bytes(original)
                    size = len(original)
                else:
                    path = storage.original_path(key)
                    path.parent.mkdir(exist_ok=True)
                    os.link(shared["orig"], path)
                    size = len(view)
                for kind in ("grid", "view"):
                    target = storage.derived_path(key, kind)
                    target.parent.mkdir(exist_ok=True)
                    os.link(shared[kind], target)
                taken = f"2024-06-{20 + i // 1000:02d}T{(i // 60) % 24:02d}:{i % 60:02d}:00"
                conn.execute(
                    "INSERT INTO photos (gallery_id, upload_id, storage_key, sha256, display_name, size, format, "
                    "uploaded_by, status, width, height, taken_at, camera_make, camera_model, created_at, "
                    "completed_at) VALUES (?, ?, ?, ?, ?, ?, 'jpeg', 'admin', 'complete', 1600, 1067, ?, 'Canon', "
                    "'Canon EOS R5', ?, ?)",
                    (gallery_id, upload_id, key, hashlib.sha256(key.encode()).hexdigest(), f"IMG_{i:04d}.jpg",
                     size, taken, 1.7e9 + i, 1.7e9 + i))
            slugs.append(slug)
    conn.close()
    return slugs[0], slugs[1]


def percentiles(samples: list[float]) -> str:
    ordered = sorted(samples)
    p95 = ordered[int(len(ordered) * 0.95) - 1]
    return f"p50 {statistics.median(ordered) * 1000:.1f} ms, p95 {p95 * 1000:.1f} ms"


def timed(http: httpx.Client, url: str, **params: str) -> list[float]:
    http.get(url, params=params)  # warm up
    samples = []
    for _ in range(REQUESTS):
        start = time.perf_counter()
        response = http.get(url, params=params)
        samples.append(time.perf_counter() - start)
        assert response.status_code == 200, response.text[:200]
    return samples


def deep_cursor(http: httpx.Client, slug: str, sort: str) -> str:
    body = http.get(f"/api/g/{slug}/photos", params={"sort": sort, "limit": 200}).json()
    for _ in range(8):
        body = http.get(f"/api/g/{slug}/photos", params={"sort": sort, "limit": 200, "after": body["next"]}).json()
    return body["next"]


def phone_bytes(url: str) -> None:
    from playwright.sync_api import sync_playwright

    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS, headless=True)
        context = browser.new_context(viewport={"width": 390, "height": 844}, device_scale_factor=3,
                                      is_mobile=True, has_touch=True)
        page = context.new_page()
        finished: list[object] = []
        page.on("requestfinished", lambda request: finished.append(request))
        page.goto(url, wait_until="networkidle")
        total = 0
        kinds = {"grid": 0, "view": 0, "other": 0}
        for request in finished:
            sizes = request.sizes()
            total += sizes["responseBodySize"] + sizes["responseHeadersSize"]
            match = re.search(r"/photos/\d+/(grid|view)$", request.url)
            kinds[match.group(1) if match else "other"] += 1
        print(f"phone 390x844 first screen (until network idle): {total / 1024:.0f} KiB over {len(finished)} requests "
              f"(grid images {kinds['grid']}, view images {kinds['view']} [the cover], other {kinds['other']})")
        browser.close()


def zip_speed(http: httpx.Client, data_dir: Path, slug: str) -> None:
    originals = sorted((data_dir / "originals").rglob("*"))
    conn = db.connect(data_dir / "picpeak.sqlite3")
    keys = [r["storage_key"] for r in conn.execute(
        "SELECT storage_key FROM photos p JOIN galleries g ON g.id = p.gallery_id WHERE g.slug = ?", (slug,))]
    conn.close()
    paths = [p for p in originals if p.name in set(keys)]
    raw_bytes = sum(p.stat().st_size for p in paths)
    for _ in range(2):  # warm the cache, then measure
        start = time.perf_counter()
        for path in paths:
            with open(path, "rb") as f:
                while f.read(256 * 1024):
                    pass
        raw = time.perf_counter() - start
    for _ in range(2):
        start = time.perf_counter()
        received = 0
        with http.stream("GET", f"/g/{slug}/download") as response:
            for piece in response.iter_raw():
                received += len(piece)
        streamed = time.perf_counter() - start
    mb = raw_bytes / 1e6
    print(f"zip of {len(paths)} originals ({mb:.0f} MB): streamed {received / 1e6 / streamed:.0f} MB/s "
          f"({streamed:.2f} s); raw disk read {mb / raw:.0f} MB/s ({raw:.2f} s); ratio {raw / streamed:.2f}")


def main() -> None:
    with tempfile.TemporaryDirectory() as tmp:
        data_dir = Path(tmp) / "data"
        print("staging ...", flush=True)
        big, small = stage(data_dir)
        server = start_server(data_dir)
        try:
            with httpx.Client(base_url=server.url, timeout=60) as http:
                print(f"gallery page, {PHOTOS} photos, first 60: {percentiles(timed(http, f'/g/{big}'))}")
                for sort in ("uploaded", "taken"):
                    cursor = deep_cursor(http, big, sort)
                    first = timed(http, f"/api/g/{big}/photos", sort=sort)
                    deep = timed(http, f"/api/g/{big}/photos", sort=sort, after=cursor)
                    print(f"JSON page ({sort}) first: {percentiles(first)}; after photo 1,800: {percentiles(deep)}")
                zip_speed(http, data_dir, small)
            if Path(CHROMIUM).exists():
                phone_bytes(f"{server.url}/g/{big}")
        finally:
            stop_server(server)


if __name__ == "__main__":
    main()
