"""``picpeak-lite bench``: how fast this box takes in and processes camera photos, through the real server.

No peer publishes such figures, and ours from a CI box say little about a user's NAS. So the command makes
camera-like JPEGs (:mod:`picpeak_lite.media.samples`) in a temp directory, starts the real ``picpeak-lite
serve`` as a subprocess on a fresh data directory on 127.0.0.1, uploads the photos as the bulk uploader does
(batches of at most 50 files and 500 MiB, one request at a time, streamed from disk), waits until every photo
is terminal and prints:

* photos/s end to end (first byte sent -> last photo complete);
* the 202 of the first request, and last 202 -> all complete;
* per photo 202 -> complete, p50 / p95 (negative: the photo was complete before its request was answered);
* per photo "own bytes sent -> complete" (the first photo's, and p50 / p95): what a photographer watching the
  gallery fill sees;
* server CPU per photo (user + system time of the server process and its children, the image children
  included, read from /proc: HTTP and processing);
* the peak RSS of the server and its children together, sampled every 0.1 s.

``bench/bench_e2e.py`` prints the same figures; it can run the server from another checkout's Python, so a
"before" and an "after" can be measured in one interleaved run.
"""

from __future__ import annotations

import http.client
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from picpeak_lite.media import samples
from picpeak_lite.store import db
from picpeak_lite.store.queries import photos as photo_q

MiB = 1024 * 1024
BATCH_FILES = 50
BATCH_BYTES = 500 * MiB
CHUNK = 256 * 1024
BOUNDARY = "picpeak-bench-3b1f0c"
PASSWORD = "bench password 123"
START_TIMEOUT = 60.0


@dataclass
class Result:
    photos: int
    megabytes: float
    requests: int
    complete: int
    failed: int
    first_202_s: float
    all_202_s: float
    all_complete_s: float
    last_202_to_complete_s: float
    per_photo_202_p50: float
    per_photo_202_p95: float
    first_complete_after_own_bytes_s: float
    own_bytes_p50: float
    own_bytes_p95: float
    cpu_per_photo_s: float
    peak_rss_mb: float
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def photos_per_s(self) -> float:
        return self.photos / self.all_complete_s if self.all_complete_s > 0 else 0.0

    def lines(self) -> list[str]:
        return [
            f"photos: {self.photos} ({self.megabytes:.0f} MB in {self.requests} requests); "
            f"complete {self.complete}, failed {self.failed}",
            f"all photos complete, s after the first byte: {self.all_complete_s:.2f}",
            f"photos/s end to end: {self.photos_per_s:.2f}",
            f"202 for the first request, s: {self.first_202_s:.2f}",
            f"last 202 -> all complete, s: {self.last_202_to_complete_s:.2f}",
            f"per photo, 202 -> complete, p50 / p95, s: {self.per_photo_202_p50:.2f} / {self.per_photo_202_p95:.2f}",
            f"per photo, own bytes sent -> complete, first / p50 / p95, s: "
            f"{self.first_complete_after_own_bytes_s:.2f} / {self.own_bytes_p50:.2f} / {self.own_bytes_p95:.2f}",
            f"server CPU per photo (upload + processing), s: {self.cpu_per_photo_s:.3f}",
            f"peak RSS, MB: {self.peak_rss_mb:.0f}",
        ]


def make_photos(folder: Path, count: int, megapixels: float) -> list[Path]:
    folder.mkdir(parents=True, exist_ok=True)
    paths = []
    for name, data in samples.camera_photos(count, megapixels):
        path = folder / name
        path.write_bytes(data)
        paths.append(path)
    return paths


def batches(paths: list[Path], max_files: int = BATCH_FILES, max_bytes: int = BATCH_BYTES) -> list[list[Path]]:
    """As the bulk uploader cuts them: at most ``max_files`` files and ``max_bytes`` bytes per request."""
    groups: list[list[Path]] = [[]]
    size = 0
    for path in paths:
        length = path.stat().st_size
        if groups[-1] and (len(groups[-1]) >= max_files or size + length > max_bytes):
            groups.append([])
            size = 0
        groups[-1].append(path)
        size += length
    return [g for g in groups if g]


class Server:
    """``picpeak-lite serve`` in a subprocess on ``data_dir``, port 0; ``python`` may be another checkout's."""

    def __init__(self, data_dir: Path, python: str = sys.executable, env: dict[str, str] | None = None,
                 args: tuple[str, ...] = ()) -> None:
        self.data_dir = data_dir
        self.args = args  # more `serve` flags (--processes N)
        self.python = python
        self.env = {**os.environ, "PICPEAK_ADMIN_PASSWORD": PASSWORD, "PICPEAK_LOG_LEVEL": "warning", **(env or {})}
        self.log_path = data_dir.parent / "server.log"
        data_dir.parent.mkdir(parents=True, exist_ok=True)
        self.proc: subprocess.Popen[bytes] | None = None
        self.url = ""
        self.token = ""
        # CPU seconds of a process the server works with (bench_e2e: the PostgreSQL server), read at the same two
        # moments as the server's own, so that both figures cover the same window.
        self.companion_cpu: Callable[[], float] = lambda: 0.0

    def start(self) -> None:
        self.token = subprocess.run(
            [self.python, "-m", "picpeak_lite", "admin", "token", "create", "--name", "bench",
             "--data-dir", str(self.data_dir)],
            capture_output=True, text=True, check=True, env=self.env, cwd=self.data_dir.parent,
        ).stdout.strip().splitlines()[-1]
        with open(self.log_path, "wb") as log:  # a file, not a pipe: nobody has to keep reading it
            self.proc = subprocess.Popen(
                [self.python, "-m", "picpeak_lite", "serve", "--port", "0", "--host", "127.0.0.1",
                 "--data-dir", str(self.data_dir), *self.args], stdout=log, stderr=subprocess.STDOUT, env=self.env,
                cwd=self.data_dir.parent)  # not ours: `-m` would import the package from the working directory
        deadline = time.monotonic() + START_TIMEOUT
        while time.monotonic() < deadline:
            printed = self.log_path.read_text("utf-8", "replace")
            match = re.search(r"running at (http://127\.0\.0\.1:\d+)/admin", printed)
            if match:
                self.url = match.group(1)
                return
            if self.proc.poll() is not None:
                break
            time.sleep(0.05)
        self.stop()
        raise RuntimeError(f"the server did not start: {self.log_path.read_text('utf-8', 'replace')[-2000:]}")

    @property
    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid

    def cpu_seconds(self) -> float:
        """User + system time of the server and every process below it (see :func:`tree_cpu_seconds`)."""
        return tree_cpu_seconds(self.pid)

    def rss_mb(self) -> float:
        """The resident memory of the server and every process below it, now."""
        total = 0
        for pid in process_tree(self.pid):
            try:
                status = Path(f"/proc/{pid}/status").read_text()
            except (FileNotFoundError, ProcessLookupError):
                continue
            total += next((int(line.split()[1]) for line in status.splitlines() if line.startswith("VmRSS:")), 0)
        return total / 1024

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


def _part_head(path: Path) -> bytes:
    return (f"--{BOUNDARY}\r\nContent-Disposition: form-data; name=\"photos\"; filename=\"{path.name}\"\r\n"
            "Content-Type: image/jpeg\r\n\r\n").encode()


def body_length(group: list[Path]) -> int:
    tail = len(f"--{BOUNDARY}--\r\n")
    return sum(len(_part_head(p)) + p.stat().st_size + 2 for p in group) + tail


def stream_body(group: list[Path], sent_at: dict[str, float]) -> Iterator[bytes]:
    """The multipart body read from disk as it is sent; notes when each file's last byte left."""
    for path in group:
        yield _part_head(path)
        with open(path, "rb") as f:
            while chunk := f.read(CHUNK):
                yield chunk
        sent_at[path.name] = time.time()
        yield b"\r\n"
    yield f"--{BOUNDARY}--\r\n".encode()


class _Client:
    """The standard library's HTTP client (the installed command has no test dependencies), one connection."""

    def __init__(self, url: str, token: str) -> None:
        parts = urlsplit(url)
        self.conn = http.client.HTTPConnection(parts.hostname or "127.0.0.1", parts.port, timeout=600)
        self.auth = {"Authorization": f"Bearer {token}"}

    def call(self, method: str, path: str, body: Any = None, headers: dict[str, str] | None = None
             ) -> tuple[int, Any]:
        self.conn.request(method, path, body=body, headers={**self.auth, **(headers or {})})
        response = self.conn.getresponse()
        data = response.read()
        if response.getheader("Connection", "").lower() == "close":
            self.conn.close()
        return response.status, json.loads(data) if data else None

    def upload(self, gallery_id: int, group: list[Path], sent_at: dict[str, float] | None = None
               ) -> tuple[int, Any]:
        """One multipart upload request of ``group``, streamed as the bulk uploader sends it."""
        return self.call("POST", f"/api/admin/galleries/{gallery_id}/upload",
                         stream_body(group, {} if sent_at is None else sent_at),
                         {"Content-Type": f"multipart/form-data; boundary={BOUNDARY}",
                          "Content-Length": str(body_length(group))})

    def close(self) -> None:
        self.conn.close()


def _quantile(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    if len(values) == 1:
        return values[0]
    return statistics.quantiles(values, n=100, method="inclusive")[round(q * 100) - 1]


def _upload_and_wait(server: Server, groups: list[list[Path]]) -> dict[str, Any]:
    sent_at: dict[str, float] = {}
    answered: dict[str, float] = {}  # upload id -> time of its 202
    client = _Client(server.url, server.token)
    try:
        _, gallery = client.call("POST", "/api/admin/galleries", json.dumps({"name": "Bench"}).encode(),
                                 {"Content-Type": "application/json"})
        cpu_before, companion_before = server.cpu_seconds(), server.companion_cpu()
        started = time.time()
        first_202 = 0.0
        for group in groups:
            status, answer = client.upload(gallery["id"], group, sent_at)
            now = time.time()
            if status != 202:
                raise RuntimeError(f"upload answered {status}: {str(answer)[:500]}")
            answered[answer["upload_id"]] = now
            first_202 = first_202 or now - started
        all_202 = time.time() - started
        total = sum(len(g) for g in groups)
        while True:
            done = 0
            for upload_id in answered:
                _, progress = client.call("GET", f"/api/admin/uploads/{upload_id}")
                done += progress["complete"] + progress["failed"]
            if done >= total:
                break
            time.sleep(0.05)
        cpu = server.cpu_seconds() - cpu_before
        companion = server.companion_cpu() - companion_before
    finally:
        client.close()
    return {"started": started, "first_202": first_202, "all_202": all_202, "answered": answered,
            "sent_at": sent_at, "cpu": cpu, "companion_cpu": companion}


def tree_cpu_seconds(*pids: int) -> float:
    """User + system time of each of ``pids`` and every process below them, all threads: the live ones' own,
    and what the ones that ended left in their parent's (cutime, cstime). Image work runs in children."""
    ticks = 0
    for top in pids:
        for pid in process_tree(top):
            try:
                fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
            except (FileNotFoundError, ProcessLookupError):
                continue  # it ended meanwhile: its time is in its parent's cutime from now on
            ticks += sum(int(f) for f in fields[11:15])
    return ticks / os.sysconf("SC_CLK_TCK")


def process_tree(pid: int) -> list[int]:
    """``pid`` and every process below it (children of every thread, recursively), as /proc shows them now."""
    found, todo = [], [pid]
    while todo:
        current = todo.pop()
        found.append(current)
        try:
            tasks = list(Path(f"/proc/{current}/task").iterdir())
        except FileNotFoundError:
            continue
        for task in tasks:
            try:
                todo.extend(int(child) for child in (task / "children").read_text().split())
            except FileNotFoundError:
                continue
    return found


class _PeakRss:
    """The highest :meth:`Server.rss_mb` seen, sampled every 0.1 s in a thread while the block runs."""

    def __init__(self, server: Server) -> None:
        self.server = server
        self.peak = 0.0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._sample, daemon=True)

    def __enter__(self) -> _PeakRss:
        self._thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self._stop.set()
        self._thread.join()

    def _sample(self) -> None:
        while True:
            self.peak = max(self.peak, self.server.rss_mb())
            if self._stop.wait(0.1):
                return


def _timings(server: Server) -> list[dict[str, Any]]:
    conn = db.connect(server.env.get("PICPEAK_DATABASE_URL") or server.data_dir / "picpeak.sqlite3")
    try:
        with db.transaction(conn, immediate=False):
            return photo_q.timings(conn)
    finally:
        conn.close()


def run(count: int, megapixels: float, *, workdir: Path | None = None, python: str = sys.executable,
        photos: list[Path] | None = None, env: dict[str, str] | None = None,
        on_server: Any = None) -> Result:
    """Make the photos (or use ``photos``), run one fresh server, upload, measure. ``on_server(server)`` is
    called once the server runs (bench_e2e attaches a profiler there)."""
    with tempfile.TemporaryDirectory(dir=workdir) as tmp:
        root = Path(tmp)
        paths = photos if photos is not None else make_photos(root / "photos", count, megapixels)
        server = Server(root / "data", python=python, env=env)
        server.start()
        try:
            if on_server is not None:
                on_server(server)
            return measure(server, paths)
        finally:
            server.stop()


def measure(server: Server, paths: list[Path]) -> Result:
    """Upload ``paths`` to a new gallery of a running server, wait until each is complete or failed, and give
    the figures of those files alone (rows of earlier uploads to the same server are left out)."""
    groups = batches(paths)
    with _PeakRss(server) as rss:
        measured = _upload_and_wait(server, groups)
    rows = [r for r in _timings(server) if r["upload_id"] in measured["answered"]]
    return summarise(paths, groups, measured, rows, rss.peak)


def summarise(paths: list[Path], groups: list[list[Path]], measured: dict[str, Any], rows: list[dict[str, Any]],
              peak_rss_mb: float) -> Result:
    started, answered, sent_at = measured["started"], measured["answered"], measured["sent_at"]
    done = [r for r in rows if r["completed_at"] is not None]
    last_complete = max((r["completed_at"] for r in done), default=started)
    after_202 = [r["completed_at"] - answered[r["upload_id"]] for r in done if r["upload_id"] in answered]
    after_bytes = [r["completed_at"] - sent_at[r["display_name"]] for r in done if r["display_name"] in sent_at]
    first_name = groups[0][0].name
    first = next((r for r in done if r["display_name"] == first_name), None)
    return Result(
        photos=len(paths), megabytes=sum(p.stat().st_size for p in paths) / 1e6, requests=len(groups),
        complete=sum(1 for r in rows if r["status"] == "complete"),
        failed=sum(1 for r in rows if r["status"] == "failed"),
        first_202_s=measured["first_202"], all_202_s=measured["all_202"],
        all_complete_s=last_complete - started, last_202_to_complete_s=last_complete - max(answered.values()),
        per_photo_202_p50=_quantile(after_202, 0.5), per_photo_202_p95=_quantile(after_202, 0.95),
        first_complete_after_own_bytes_s=(first["completed_at"] - sent_at[first_name]) if first else float("nan"),
        own_bytes_p50=_quantile(after_bytes, 0.5), own_bytes_p95=_quantile(after_bytes, 0.95),
        cpu_per_photo_s=measured["cpu"] / max(1, len(paths)), peak_rss_mb=peak_rss_mb,
        extra={"complete_before_202": sum(1 for v in after_202 if v < 0),
               "companion_cpu_per_photo_s": measured.get("companion_cpu", 0.0) / max(1, len(paths))},
    )
