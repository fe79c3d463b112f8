"""The live wall in real Chromium: how soon a newly completed photo is shown, and the page's memory over a run.

    python bench/bench_wall.py                    # a short run: 1 minute, 20 uploads a minute
    python bench/bench_wall.py --minutes 60       # the hour the issue asks about

Starts `picpeak-lite serve` as a subprocess, makes a published gallery with a wall link (as the admin does, on
the gallery page), opens the wall in headless Chromium and uploads one photo every 60/rate seconds through the
admin API. For each photo: its ``completed_at`` (the server's commit, read from the database) to the moment the
wall began showing it (``window.PicpeakWall.shown``: performance.timeOrigin + now, the same machine's clock),
p50 / p95 / max. Every ``--sample`` seconds the page's JS heap after a forced garbage collection and its DOM
node count (Chrome DevTools Protocol ``Performance.getMetrics``): start, end, max, and the growth per hour of a
least-squares line through the samples. The issue's target: p95 within 1 s, and a flat heap.
"""

from __future__ import annotations

import argparse
import contextlib
import re
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from picpeak_lite.store import db  # noqa: E402
from tests import imagefactory  # noqa: E402
from tests.browser.conftest import CHROMIUM, CHROMIUM_ARGS, api_client, start_server, stop_server  # noqa: E402

BASES = 4
WALL_KEY = re.compile(r'value="[^"]*/wall\?key=([A-Za-z0-9_-]+)" id="wall-link"')


def photo_bytes(count: int, size: tuple[int, int]) -> list[bytes]:
    """``count`` distinct JPEGs from a few bases (a JPEG comment makes each copy unique, so none is a
    duplicate of another)."""
    bases = [imagefactory.save(imagefactory.photo(*size, seed=i), "jpeg", quality=88) for i in range(BASES)]
    out = []
    for i in range(count):
        data = bases[i % BASES]
        comment = f"wall bench {i} {time.time()}".encode()
        out.append(data[:2] + b"\xff\xfe" + (len(comment) + 2).to_bytes(2, "big") + comment + data[2:])
    return out


def completed_at(database: Path, photo_ids: list[int]) -> dict[int, float]:
    conn = db.connect(database)
    try:
        marks = ", ".join("?" * len(photo_ids))
        rows = conn.execute(f"SELECT id, completed_at FROM photos WHERE id IN ({marks}) AND status = 'complete'",
                            photo_ids).fetchall()
    finally:
        conn.close()
    return {r["id"]: r["completed_at"] for r in rows}


def metrics(cdp: Any) -> dict[str, float]:
    cdp.send("HeapProfiler.collectGarbage")
    return {m["name"]: m["value"] for m in cdp.send("Performance.getMetrics")["metrics"]}


def slope_per_hour(samples: list[tuple[float, float]]) -> float:
    if len(samples) < 2:
        return 0.0
    xs, ys = [t for t, _ in samples], [v for _, v in samples]
    mx, my = statistics.fmean(xs), statistics.fmean(ys)
    den = sum((x - mx) ** 2 for x in xs)
    return 0.0 if den == 0 else sum((x - mx) * (y - my) for x, y in zip(xs, ys, strict=True)) / den * 3600


def percentile(values: list[float], share: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(share * (len(ordered) - 1))))]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--minutes", type=float, default=1.0, help="how long to upload (default: 1)")
    parser.add_argument("--rate", type=float, default=20.0, help="uploads a minute (default: 20)")
    parser.add_argument("--width", type=int, default=2400, help="photo width in pixels (height: 2/3 of it)")
    parser.add_argument("--sample", type=float, default=10.0, help="seconds between memory samples")
    args = parser.parse_args()
    count = max(1, round(args.minutes * args.rate))
    interval = 60.0 / args.rate
    images = photo_bytes(count, (args.width, args.width * 2 // 3))

    from playwright.sync_api import sync_playwright

    photo_ids: list[int] = []
    shown: dict[int, float] = {}
    samples: list[tuple[float, dict[str, float]]] = []
    with tempfile.TemporaryDirectory(prefix="picpeak-wall-bench-") as tmp:
        server = start_server(Path(tmp) / "data")
        try:
            with contextlib.contextmanager(api_client)(server) as api:
                created = api.post("/api/admin/galleries", json={"name": "Wall bench", "allow_guest_uploads": True})
                gallery = created.json()
                api.post(f"/api/admin/galleries/{gallery['id']}/publish").raise_for_status()
                api.post(f"/admin/galleries/{gallery['id']}/wall-link")
                key = WALL_KEY.search(api.get(f"/admin/galleries/{gallery['id']}").text)
                assert key, "no wall link on the gallery page"
                wall_url = f"{server.url}/g/{gallery['slug']}/wall?key={key.group(1)}"
                with sync_playwright() as playwright:
                    browser = playwright.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS,
                                                         headless=True)
                    page = browser.new_page(viewport={"width": 1920, "height": 1080})
                    cdp = page.context.new_cdp_session(page)
                    cdp.send("Performance.enable")
                    page.goto(wall_url)
                    page.wait_for_function("() => window.PicpeakWall")
                    start = time.monotonic()
                    samples.append((0.0, metrics(cdp)))
                    next_sample = start + args.sample
                    def collect() -> None:
                        # wall.js keeps only its last 200 entries (LOG): read them as the run goes, not only at the end.
                        for entry in page.evaluate("() => window.PicpeakWall.shown"):
                            if entry["fresh"]:
                                shown.setdefault(entry["id"], entry["at"] / 1000)

                    for i, data in enumerate(images):
                        due = start + i * interval
                        while time.monotonic() < due:
                            if time.monotonic() >= next_sample:
                                samples.append((time.monotonic() - start, metrics(cdp)))
                                collect()
                                next_sample += args.sample
                            page.wait_for_timeout(min(200, max(1, (due - time.monotonic()) * 1000)))
                        answer = api.post(f"/api/admin/galleries/{gallery['id']}/upload",
                                          files=[("photos", (f"IMG_{i:04d}.jpg", data, "image/jpeg"))])
                        answer.raise_for_status()
                        photo_ids += answer.json()["photo_ids"]
                    deadline = time.monotonic() + 120
                    while time.monotonic() < deadline:
                        collect()
                        if all(p in shown for p in photo_ids):
                            break
                        page.wait_for_timeout(500)
                    samples.append((time.monotonic() - start, metrics(cdp)))
                    browser.close()
        finally:
            stop_server(server)
            done = completed_at(server.data_dir / "picpeak.sqlite3", photo_ids) if photo_ids else {}

    latencies = [(shown[p] - done[p]) * 1000 for p in photo_ids if p in shown and p in done]
    heap = [(t, m["JSHeapUsedSize"] / 1024) for t, m in samples]
    nodes = [(t, m["Nodes"]) for t, m in samples]
    p95 = percentile(latencies, 0.95) if latencies else float("nan")
    print(f"wall: minutes={args.minutes:g} rate_per_min={args.rate:g} uploads={len(photo_ids)} "
          f"shown_fresh={len(latencies)} missed={len(photo_ids) - len(latencies)}")
    if latencies:
        print(f"wall latency completed->shown: p50_ms={percentile(latencies, 0.5):.0f} p95_ms={p95:.0f} "
              f"max_ms={max(latencies):.0f} target_p95_ms=1000 {'ok' if p95 <= 1000 else 'OVER'}")
    print(f"wall memory: samples={len(heap)} js_heap_kb_start={heap[0][1]:.0f} js_heap_kb_end={heap[-1][1]:.0f} "
          f"js_heap_kb_max={max(v for _, v in heap):.0f} js_heap_kb_per_hour={slope_per_hour(heap):+.0f} "
          f"dom_nodes_start={nodes[0][1]:.0f} dom_nodes_end={nodes[-1][1]:.0f}")


if __name__ == "__main__":
    main()
