"""Is the server still responsive while it processes at full speed? Issue 18's third table, from outside.

    python bench/bench_responsive.py [--photos 30] [--megapixels 24] [--guests 20]
                                     [--build NAME=PYTHON ... --rounds 3] [--find-me off on]
                                     [--processes 1 2] [--client-processes 4]

Runs ``picpeak-lite serve`` (``picpeak_lite.ops.bench.Server``: a fresh data directory, port 0, its defaults)
and measures, on one published gallery:

* **idle**: ``--guests`` guests each asking for the gallery's listing (``GET /api/g/<slug>/photos``, the page
  the guest grid scrolls through) every 0.2 s for 5 s: latency p50 / p95 at the client; after each listing
  that has photos, a guest also fetches one of their thumbnails (a random photo's ``grid_url``), timed on its
  own line;
* **busy**: the same guests while ``--photos`` camera-like photos (``picpeak_lite.media.samples``) are uploaded
  in one request and processed, and an admin WebSocket (``/ws/admin/galleries/<id>``) follows the gallery:
  for each photo, the time from its row's ``completed_at`` (the commit, written by the server's clock) to the
  arrival of its ``photo`` message with status ``complete`` at the client (p50 / p95 / max), and the guests'
  latency meanwhile (listing and thumbnails);
* **settled**: the guests again for 5 s once every photo is processed, so the idle thumbnail line has photos
  to fetch (the idle phase's gallery is still empty): listing and thumbnail latency.

``--find-me off on`` runs each build with "Find me" off and on for the gallery (issue 36: indexing must delay
neither a photo nor a guest page): with it on, the face indexer's lane runs after each photo is complete, so the
busy and settled phases carry its work; the bench photos hold no faces, so what it costs is the detection that
every photo pays. It prints how long until every photo was complete and how many the indexer had scanned when
the settled phase ended.

The guests are spread over ``--client-processes`` client processes (default 4; 1 runs them all in this one, as
the figures before this option were measured): twenty guests in one Python event loop delayed each other's
responses, and that wait counted in the server's latency (the settled listing's p95 was 79-82 ms with one client
process and 43-56 ms with four, the same server, 20 guests).

``--processes 1 2`` runs each build as ``serve --processes N`` for each N (issue 29): guests' requests and the
upload are then spread over N event loops.

Targets (issue 18): live push p95 < 50 ms, guest listing p95 < 100 ms while busy and < 50 ms idle.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import random
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import AsyncIterator
from pathlib import Path

import httpx
import trio
from trio_websocket import open_websocket_url

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from picpeak_lite.ops import bench
from picpeak_lite.store import db
from picpeak_lite.store.queries import faces as faces_q
from picpeak_lite.store.queries import photos as photo_q

POLL_SECONDS = 0.2
IDLE_SECONDS = 5.0


def quantiles(values: list[float]) -> str:
    ms = sorted(v * 1000 for v in values)
    if not ms:
        return "none"
    p95 = ms[max(0, round(len(ms) * 0.95) - 1)]
    return f"p50={statistics.median(ms):.0f}ms p95={p95:.0f}ms max={ms[-1]:.0f}ms n={len(ms)}"


def make_clients(url: str, guests: int) -> list[httpx.AsyncClient]:
    """One client per guest, made before the phase that uses them: each builds an SSL context (about 30 ms of
    this process's CPU), which, made as each guest started, counted in the other guests' first latencies (a max
    near 500 ms)."""
    return [httpx.AsyncClient(base_url=url, timeout=60) for _ in range(guests)]


async def guests_poll(clients: list[httpx.AsyncClient], slug: str, latencies: list[float],
                      thumbnails: list[float], stop: trio.Event) -> None:
    """Each client a guest until ``stop``; the clients are closed when it returns.

    Each guest begins at a random moment of the first poll interval, as browsers opened by different people do:
    started in the same instant, the twenty stayed in step and asked all at once every 0.2 s, so the last of
    each burst waited for the nineteen before it (with 30 photos listed, the settled listing's p50 was 15-22 ms
    and its p95 56-70 ms)."""
    async def guest(client: httpx.AsyncClient) -> None:
        async with client:
            with trio.move_on_after(random.uniform(0, POLL_SECONDS)):
                await stop.wait()
            while not stop.is_set():
                began = time.perf_counter()
                answer = await client.get(f"/api/g/{slug}/photos")
                latencies.append(time.perf_counter() - began)
                assert answer.status_code == 200, answer.text[:200]
                photos = answer.json()["photos"]
                if photos:
                    began = time.perf_counter()
                    image = await client.get(random.choice(photos)["grid_url"])
                    thumbnails.append(time.perf_counter() - began)
                    assert image.status_code == 200 and image.content, image.status_code
                with trio.move_on_after(POLL_SECONDS):
                    await stop.wait()

    async with trio.open_nursery() as nursery:
        for client in clients:
            nursery.start_soon(guest, client)


class Guests:
    """The guests of every phase, spread over ``--client-processes`` client processes started once per server.

    Twenty guests are twenty browsers. In one Python event loop their own work (the responses' parsing, JSON, the
    loop) took about a third of a core, and a response that arrived while the loop was busy with the others
    waited there: that wait counted in the server's latency. Each child says ``ready`` once it has imported and
    made its clients, and only when all have does a phase begin (``go``), so no client's start-up (an
    interpreter, its imports, its SSL contexts: about half a second of CPU each) runs beside the measured
    requests. At ``stop`` a child prints its latencies as a JSON line and gets ready for the next phase; a closed
    standard input ends it. With one process the guests run in this one, as before the option."""

    def __init__(self, url: str, slug: str, guests: int, processes: int) -> None:
        self.url, self.slug = url, slug
        self.shares = [guests // processes + (1 if i < guests % processes else 0) for i in range(processes)]
        self.children: list[tuple[trio.Process, LineReader]] = []

    async def start(self) -> None:
        if len(self.shares) <= 1:
            return
        for share in self.shares:
            if share:
                child = await trio.lowlevel.open_process(
                    [sys.executable, __file__, "--guest-child", self.url, self.slug, str(share)],
                    stdin=subprocess.PIPE, stdout=subprocess.PIPE)
                assert child.stdout is not None
                self.children.append((child, LineReader(child.stdout)))
        await self._all_say(b"ready")

    async def run(self, latencies: list[float], thumbnails: list[float], stop: trio.Event) -> None:
        """One phase: the guests poll until ``stop``; their latencies are added to the lists."""
        if not self.children:
            await guests_poll(make_clients(self.url, sum(self.shares)), self.slug, latencies, thumbnails, stop)
            return
        await self._tell(b"go\n")
        await stop.wait()
        await self._tell(b"stop\n")
        for _, lines in self.children:
            measured = json.loads(await lines.next())
            latencies += measured["listing"]
            thumbnails += measured["thumbnail"]
        await self._all_say(b"ready")

    async def aclose(self) -> None:
        for child, _ in self.children:
            assert child.stdin is not None
            await child.stdin.aclose()
        for child, _ in self.children:
            assert await child.wait() == 0, "a guest process failed"

    async def _tell(self, line: bytes) -> None:
        for child, _ in self.children:
            assert child.stdin is not None
            await child.stdin.send_all(line)

    async def _all_say(self, word: bytes) -> None:
        for _, lines in self.children:
            assert await lines.next() == word, f"a guest process did not say {word!r}"


class LineReader:
    """Lines from a child's standard output (trio streams give bytes as they come)."""

    def __init__(self, stream: trio.abc.ReceiveStream) -> None:
        self.stream = stream
        self.buffer = b""

    async def next(self) -> bytes:
        while b"\n" not in self.buffer:
            data = await self.stream.receive_some()
            assert data, "a guest process ended early"
            self.buffer += data
        line, self.buffer = self.buffer.split(b"\n", 1)
        return line


def guest_child(url: str, slug: str, guests: int) -> None:
    """One client process of :class:`Guests`: ``ready``, then a phase per ``go`` ... ``stop``, until standard
    input closes."""

    def say(text: str) -> None:
        sys.stdout.write(text + "\n")
        sys.stdout.flush()

    async def run() -> None:
        while True:
            clients = make_clients(url, guests)
            say("ready")
            if await trio.to_thread.run_sync(sys.stdin.readline) != "go\n":
                for client in clients:
                    await client.aclose()
                return
            latencies: list[float] = []
            thumbnails: list[float] = []
            stop = trio.Event()
            async with trio.open_nursery() as nursery:
                nursery.start_soon(guests_poll, clients, slug, latencies, thumbnails, stop)
                await trio.to_thread.run_sync(sys.stdin.readline)
                stop.set()
            say(json.dumps({"listing": latencies, "thumbnail": thumbnails}))

    trio.run(run)


async def body(paths: list[Path], sent_at: dict[str, float]) -> AsyncIterator[bytes]:
    for chunk in bench.stream_body(paths, sent_at):
        yield chunk
        await trio.lowlevel.checkpoint()


async def measure(server: bench.Server, paths: list[Path], guests: int, find_me: bool = False,
                  clients: int = 1) -> None:
    auth = {"Authorization": f"Bearer {server.token}"}
    async with httpx.AsyncClient(base_url=server.url, headers=auth, timeout=600) as api:
        answer = await api.post("/api/admin/galleries", json={"name": "Responsive"})
        assert answer.status_code in (200, 201), answer.text
        gallery = answer.json()
        answer = await api.post(f"/api/admin/galleries/{gallery['id']}/publish")
        assert answer.status_code == 200, answer.text
        if find_me:
            answer = await api.post(f"/admin/galleries/{gallery['id']}/findme", data={"find_me": "on"})
            assert answer.status_code in (200, 302, 303), answer.text[:300]
        guests_ = Guests(server.url, gallery["slug"], guests, clients)
        await guests_.start()
        idle: list[float] = []
        idle_thumbnails: list[float] = []  # stays empty: the gallery has no photos yet
        stop = trio.Event()
        async with trio.open_nursery() as nursery:
            nursery.start_soon(guests_.run, idle, idle_thumbnails, stop)
            await trio.sleep(IDLE_SECONDS)
            stop.set()
        busy: list[float] = []
        busy_thumbnails: list[float] = []
        received: dict[int, float] = {}
        stop = trio.Event()
        ws_url = server.url.replace("http://", "ws://") + f"/ws/admin/galleries/{gallery['id']}"
        async with trio.open_nursery() as nursery:
            async def follow(task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
                async with open_websocket_url(ws_url, extra_headers=list(auth.items())) as ws:
                    assert json.loads(await ws.get_message())["type"] == "snapshot"
                    task_status.started()
                    while len(received) < len(paths):
                        message = json.loads(await ws.get_message())
                        if message["type"] == "photo" and message["status"] in ("complete", "failed"):
                            received.setdefault(message["id"], time.time())
                stop.set()

            await nursery.start(follow)
            nursery.start_soon(guests_.run, busy, busy_thumbnails, stop)
            sent_at: dict[str, float] = {}
            began = time.time()
            answer = await api.post(
                f"/api/admin/galleries/{gallery['id']}/upload", content=body(paths, sent_at),
                headers={"Content-Type": f"multipart/form-data; boundary={bench.BOUNDARY}",
                         "Content-Length": str(bench.body_length(paths))})
            assert answer.status_code == 202, answer.text[:300]
            with trio.fail_after(600):
                await stop.wait()
            all_complete_s = time.time() - began
        settled: list[float] = []
        settled_thumbnails: list[float] = []
        stop = trio.Event()
        async with trio.open_nursery() as nursery:
            nursery.start_soon(guests_.run, settled, settled_thumbnails, stop)
            await trio.sleep(IDLE_SECONDS)
            stop.set()
        await guests_.aclose()
    conn = db.connect(server.data_dir / "picpeak.sqlite3")
    try:
        with db.transaction(conn, immediate=False):
            rows = photo_q.timings(conn)
            scanned = faces_q.progress(conn, gallery["id"])
    finally:
        conn.close()
    push = [received[r["id"]] - r["completed_at"] for r in rows if r["id"] in received and r["completed_at"]]
    print(f"responsive: photos={len(paths)} guests={guests} find_me={'on' if find_me else 'off'} "
          f"all_complete_s={all_complete_s:.2f} faces_scanned={dict(scanned)}", flush=True)
    print(f"responsive: photos={len(paths)} guests={guests} guest_listing_idle {quantiles(idle)}", flush=True)
    print(f"responsive: guest_listing_busy {quantiles(busy)}", flush=True)
    print(f"responsive: guest_thumbnail_idle {quantiles(settled_thumbnails)} (after processing, "
          f"{len(paths)} photos listed); guest_thumbnail_busy {quantiles(busy_thumbnails)}", flush=True)
    print(f"responsive: guest_listing_settled {quantiles(settled)} (idle, {len(paths)} photos listed)", flush=True)
    print(f"responsive: live_push_complete_to_client {quantiles(push)} (targets: push p95 < 50 ms, listing p95 "
          f"< 100 ms busy, < 50 ms idle)", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--photos", type=int, default=30)
    parser.add_argument("--megapixels", type=float, default=24)
    parser.add_argument("--guests", type=int, default=20)
    parser.add_argument("--build", action="append", default=[], metavar="NAME=PYTHON",
                        help="run the server of each build in turn (a name and its venv's Python), same photos; "
                             "default: this checkout's")
    parser.add_argument("--find-me", nargs="+", choices=["off", "on"], default=["off"],
                        help="run each build with Find me off and/or on for the gallery")
    parser.add_argument("--rounds", type=int, default=1, help="how many times the builds run, interleaved")
    parser.add_argument("--processes", type=int, nargs="+", default=[1],
                        help="run each build with `serve --processes N` for each N given")
    parser.add_argument("--client-processes", type=int, default=4,
                        help="the guests spread over this many client processes (1: all in this one, as before)")
    parser.add_argument("--guest-child", nargs=3, metavar=("URL", "SLUG", "GUESTS"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.guest_child:
        url, slug, guests = args.guest_child
        guest_child(url, slug, int(guests))
        return
    # Absolute, as the server starts in its data directory's parent (not resolved: a venv's python is a link).
    builds = [(name, os.path.abspath(python)) for name, python in (b.split("=", 1) for b in args.build)]
    builds = builds or [("this", sys.executable)]
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        paths = bench.make_photos(root / "photos", args.photos, args.megapixels)
        for round_ in range(args.rounds):
            for (name, python), find_me, processes in itertools.product(builds, args.find_me, args.processes):
                print(f"responsive: round {round_ + 1}, build {name}, find me {find_me}, processes {processes}",
                      flush=True)
                server = bench.Server(root / "data", python=python,
                                      args=("--processes", str(processes)) if processes > 1 else ())
                server.start()
                try:
                    trio.run(measure, server, paths, args.guests, find_me == "on", args.client_processes)
                finally:
                    server.stop()
                    shutil.rmtree(server.data_dir)  # 30 originals and their images: a fresh directory per run


if __name__ == "__main__":
    main()
