"""Browser-side bulk upload: 200 photos of 12 MP through the admin uploader of a real server, in Chromium.

Prints the time from handing the files to the page (what a drop does) until the last one shows as done, and
the page's main-thread long tasks (PerformanceObserver 'longtask') during that time.

    python bench/bench_admin_upload.py [--count 200] [--workers N]

The photos are made once with tests/imagefactory.py (a few distinct 4000x3000 images, each copy made unique
by a JPEG comment so that none is a duplicate) and cached in the temp dir.
"""

from __future__ import annotations

import argparse
import os
import re
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tests import imagefactory  # noqa: E402
from tests.browser.conftest import CHROMIUM, CHROMIUM_ARGS, start_server, stop_server  # noqa: E402

BASES = 8
CACHE = Path(tempfile.gettempdir()) / "picpeak-bench-12mp"


def photos(count: int) -> list[Path]:
    CACHE.mkdir(exist_ok=True)
    bases = []
    for i in range(BASES):
        path = CACHE / f"base-{i}.jpg"
        if not path.exists():
            imagefactory.save(imagefactory.photo(4000, 3000, seed=i), "jpeg", path, quality=90)
        bases.append(path.read_bytes())
    out = []
    for i in range(count):
        path = CACHE / f"IMG_{i:04d}.jpg"
        if not path.exists():
            data = bases[i % BASES]
            comment = f"copy {i}".encode()
            path.write_bytes(data[:2] + b"\xff\xfe" + (len(comment) + 2).to_bytes(2, "big") + comment + data[2:])
        out.append(path)
    return out


OBSERVE = """() => {
  window.__longtasks = [];
  new PerformanceObserver((list) => { for (const e of list.getEntries()) window.__longtasks.push(e.duration); })
    .observe({ type: "longtask", buffered: false });
  window.__t0 = performance.now();
}"""


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--count", type=int, default=200)
    parser.add_argument("--workers", type=int, default=0)
    args = parser.parse_args()
    files = photos(args.count)
    size = sum(p.stat().st_size for p in files)
    print(f"{len(files)} photos of 4000x3000, {size / 1e6:.0f} MB in all; {os.cpu_count()} CPUs")
    with tempfile.TemporaryDirectory() as data_dir:
        extra = ["--workers", str(args.workers)] if args.workers else []
        server = start_server(Path(data_dir) / "data", env={"PICPEAK_WORKERS": str(args.workers)} if extra else None)
        try:
            run(server, files)
        finally:
            stop_server(server)


def run(server: object, files: list[Path]) -> None:
    from playwright.sync_api import sync_playwright

    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS, headless=True)
        page = browser.new_page(viewport={"width": 1280, "height": 900})
        page.goto(server.url + "/admin/login")  # type: ignore[attr-defined]
        page.fill("input[name=password]", server.admin_password)  # type: ignore[attr-defined]
        page.click("button[type=submit]")
        page.wait_for_url(re.compile(r".*/admin/$"))
        page.goto(server.url + "/admin/galleries/new")  # type: ignore[attr-defined]
        page.fill("input[name=name]", "Bench wedding")
        page.click("button:has-text('Create gallery')")
        page.wait_for_url(re.compile(r".*/admin/galleries/\d+$"))
        page.evaluate(OBSERVE)
        started = time.perf_counter()
        page.set_input_files("#file-input", [str(p) for p in files])
        page.wait_for_function(
            "n => document.getElementById('up-done').textContent === String(n)", arg=len(files),
            timeout=30 * 60_000, polling=100,
        )
        wall = time.perf_counter() - started
        result = page.evaluate("() => ({ elapsed: performance.now() - window.__t0, tasks: window.__longtasks,"
                               " failed: document.getElementById('up-failed').textContent })")
        tasks = sorted(result["tasks"])
        print(f"drop -> last shown done: {wall:.1f} s (page clock {result['elapsed'] / 1000:.1f} s), "
              f"{len(files) / wall:.1f} photos/s, failed: {result['failed']}")
        if tasks:
            print(f"long tasks: {len(tasks)}, total {sum(tasks):.0f} ms, longest {tasks[-1]:.0f} ms, "
                  f"median {tasks[len(tasks) // 2]:.0f} ms")
        else:
            print("long tasks: none over 50 ms")
        browser.close()


if __name__ == "__main__":
    main()
