"""The guest listing (``GET /api/g/<slug>/photos``) of a 200-photo gallery: latency and server CPU per request.

    python bench/bench_listing.py [--photos 200] [--megapixels 0.5] [--requests 300] [--concurrency 8]
                                  [--profile OUT.prof]

Runs ``picpeak-lite serve`` (``picpeak_lite.ops.bench.Server``: a fresh data directory, port 0, its defaults),
uploads ``--photos`` camera-like photos (``picpeak_lite.media.samples``) into one published gallery, waits until
they are processed, and then asks for the listing as a guest (one session cookie, as the gallery page leaves):

* ``full``: every photo in one page (``limit=200``, the most a page may hold), ``--requests`` times in a row;
* ``page``: the default first page (60 photos), ``--requests`` times in a row;
* ``full, concurrent``: ``--concurrency`` clients in threads, each ``--requests / --concurrency`` full pages;
* ``thumbnail``: one photo's ``grid_url`` from the listing, ``--requests`` times in a row (for comparison: what
  a guest's grid asks for after each listing).

For each: p50 / p95 at the client (loopback, one keep-alive connection per client, so HTTP is included) and
the server process's CPU seconds per request (user + system, all threads, from /proc).

``--py-spy OUT.txt`` records the server with py-spy (``--format raw``, all threads, from after the photos are
processed; root or ptrace allowed) while it answers; ``bench/profile_summary.py`` and ``grep`` read it.
``--profile OUT.prof`` runs the server under cProfile (much slower; for where the time goes, not for figures)
and writes its stats when the server stops: read them with ``python -m pstats OUT.prof``.
"""

from __future__ import annotations

import argparse
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from picpeak_lite.ops import bench

PAGE = 60


def quantiles(samples: list[float]) -> str:
    ms = sorted(s * 1000 for s in samples)
    p95 = ms[max(0, round(len(ms) * 0.95) - 1)]
    return f"p50 {statistics.median(ms):.1f} ms, p95 {p95:.1f} ms"


def publish(server: bench.Server, paths: list[Path]) -> str:
    """A published gallery holding ``paths``, every one processed; its slug."""
    auth = {"Authorization": f"Bearer {server.token}"}
    with httpx.Client(base_url=server.url, headers=auth, timeout=600) as api:
        answer = api.post("/api/admin/galleries", json={"name": "Listing"})
        assert answer.status_code in (200, 201), answer.text
        gallery = answer.json()
        for group in bench.batches(paths):
            answer = api.post(
                f"/api/admin/galleries/{gallery['id']}/upload", content=bench.stream_body(group, {}),
                headers={"Content-Type": f"multipart/form-data; boundary={bench.BOUNDARY}",
                         "Content-Length": str(bench.body_length(group))})
            assert answer.status_code == 202, answer.text[:300]
        answer = api.post(f"/api/admin/galleries/{gallery['id']}/publish")
        assert answer.status_code == 200, answer.text
        slug: str = gallery["slug"]
    with httpx.Client(base_url=server.url, timeout=60) as guest:
        deadline = time.monotonic() + 600
        while len(guest.get(f"/api/g/{slug}/photos", params={"limit": 200}).json()["photos"]) < len(paths):
            assert time.monotonic() < deadline, "the photos were not processed in 10 minutes"
            time.sleep(0.5)
    return slug


def guest_client(server: bench.Server, slug: str) -> httpx.Client:
    """A guest's client with the session cookie the gallery page sets (as a browser's would be)."""
    client = httpx.Client(base_url=server.url, timeout=60)
    assert client.get(f"/g/{slug}").status_code == 200
    return client


def run_requests(client: httpx.Client, url: str, params: dict[str, str | int], count: int,
                 samples: list[float]) -> None:
    for _ in range(count):
        began = time.perf_counter()
        answer = client.get(url, params=params)
        samples.append(time.perf_counter() - began)
        assert answer.status_code == 200, answer.text[:200]


def sequential(server: bench.Server, slug: str, params: dict[str, str | int], count: int, url: str = "") -> str:
    client = guest_client(server, slug)
    try:
        url = url or f"/api/g/{slug}/photos"
        run_requests(client, url, params, 10, [])  # warm up
        samples: list[float] = []
        cpu = server.cpu_seconds()
        run_requests(client, url, params, count, samples)
        cpu = server.cpu_seconds() - cpu
    finally:
        client.close()
    return f"{quantiles(samples)}, server CPU {cpu / count * 1000:.1f} ms/request"


def concurrent(server: bench.Server, slug: str, params: dict[str, str | int], count: int, clients: int) -> str:
    url = f"/api/g/{slug}/photos"
    guests = [guest_client(server, slug) for _ in range(clients)]
    samples: list[list[float]] = [[] for _ in guests]
    for client in guests:
        run_requests(client, url, params, 2, [])
    each = max(1, count // clients)
    threads = [threading.Thread(target=run_requests, args=(client, url, params, each, mine))
               for client, mine in zip(guests, samples, strict=True)]
    cpu = server.cpu_seconds()
    began = time.perf_counter()
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    wall = time.perf_counter() - began
    cpu = server.cpu_seconds() - cpu
    for client in guests:
        client.close()
    flat = [s for mine in samples for s in mine]
    return (f"{quantiles(flat)}, {len(flat) / wall:.0f} requests/s, "
            f"server CPU {cpu / len(flat) * 1000:.1f} ms/request")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--photos", type=int, default=200)
    parser.add_argument("--megapixels", type=float, default=0.5)
    parser.add_argument("--requests", type=int, default=300)
    parser.add_argument("--concurrency", type=int, default=8)
    parser.add_argument("--py-spy", help="record the server with py-spy into this file while it answers")
    parser.add_argument("--profile", help="run the server under cProfile and write its stats here")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        paths = bench.make_photos(root / "photos", args.photos, args.megapixels)
        python = sys.executable
        if args.profile:
            # Server runs `<python> -m picpeak_lite ...`: a wrapper that puts cProfile in front of that.
            wrapper = root / "python-profiled"
            wrapper.write_text(f'#!/bin/sh\nif [ "$3" = serve ]; then exec {sys.executable} -m cProfile '
                               f'-o {Path(args.profile).resolve()} "$@"; fi\nexec {sys.executable} "$@"\n')
            wrapper.chmod(0o755)
            python = str(wrapper)
        server = bench.Server(root / "data", python=python)
        server.start()
        try:
            slug = publish(server, paths)
            spy = None
            if args.py_spy:
                exe = shutil.which("py-spy") or str(Path(sys.executable).with_name("py-spy"))
                spy = subprocess.Popen([exe, "record", "--format", "raw", "--rate", "250", "--threads", "-o",
                                        args.py_spy, "--pid", str(server.pid)],
                                       stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
                time.sleep(1.0)  # let it attach before the first request
            print(f"listing: {args.photos} photos; full (limit=200), {args.requests} sequential: "
                  f"{sequential(server, slug, {'limit': 200}, args.requests)}", flush=True)
            print(f"listing: first page ({PAGE}), {args.requests} sequential: "
                  f"{sequential(server, slug, {}, args.requests)}", flush=True)
            print(f"listing: full, {args.concurrency} concurrent clients: "
                  f"{concurrent(server, slug, {'limit': 200}, args.requests, args.concurrency)}", flush=True)
            with httpx.Client(base_url=server.url, timeout=60) as guest:
                grid_url = guest.get(f"/api/g/{slug}/photos").json()["photos"][0]["grid_url"]
            print(f"listing: thumbnail ({grid_url.rsplit('/', 1)[-1]}), {args.requests} sequential: "
                  f"{sequential(server, slug, {}, args.requests, grid_url)}", flush=True)
            if spy is not None:
                spy.send_signal(signal.SIGINT)  # py-spy writes its file on SIGINT
                spy.wait(timeout=60)
        finally:
            server.stop()
            shutil.rmtree(server.data_dir)


if __name__ == "__main__":
    main()
