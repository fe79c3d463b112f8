"""The hostile suite's watch: what an attack did to a real server process, as one figures line.

Each attack in ``tests/test_hostile_*.py`` starts a real ``picpeak-lite serve`` (``harness.ServerProcess``),
then runs its attack inside :meth:`Watch.during`. Meanwhile the watch

* samples the resident memory of the server **and every process below it** (probe, inspect and transcode
  children count: an attack that spawns children must not hide its memory there) and keeps the peak;
* asks ``/healthz`` every 0.25 s on a fresh connection, keeping each answer's status and time (a request that
  fails or is not answered counts as ``healthz_failed``), so the line says whether the service stayed up;
* counts the 5xx answers the attack itself saw (the attack calls :meth:`Watch.saw` with each status).

:meth:`Watch.line` prints ``hostile <attack>: ...`` with those figures plus the tracebacks in the server's
log; times are printed, never asserted (CI runs on a busy 2-core machine). :meth:`Watch.check` asserts what
must hold whatever the machine's speed: no 5xx, no traceback, ``/healthz`` never failed, and peak memory
within the decode budget plus :data:`RSS_MARGIN_MB`.

Nothing here talks to anything but 127.0.0.1.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path

import trio

from picpeak_lite.ops.bench import process_tree as tree_pids

from .harness import ServerProcess, figures, percentile

RSS_MARGIN_MB = 150  # the bound: decode budget + 150 MB for the server and its children together
HEALTH_EVERY = 0.25
HEALTH_SECONDS = 60.0  # a /healthz with no answer for this long counts as failed (a hang, not slowness)


async def healthz(host: str, port: int) -> tuple[int, bytes]:
    """``GET /healthz`` on a new connection, as a load balancer's check or a new guest makes it (an attack on
    connections or descriptors starves these first); plain HTTP/1.1 so that the figure is the server's time,
    not a client library's set-up."""
    stream = await trio.open_tcp_stream(host, port)
    async with stream:
        await stream.send_all(f"GET /healthz HTTP/1.1\r\nHost: {host}:{port}\r\nConnection: close\r\n\r\n"
                              .encode())
        answer = bytearray()
        while b"\r\n\r\n" not in answer or len(answer) < _length(answer):
            chunk = await stream.receive_some(65536)
            if not chunk:
                raise ValueError(f"the connection closed after {bytes(answer[:200])!r}")
            answer += chunk
    head, _, body = bytes(answer).partition(b"\r\n\r\n")
    return int(head.split(b" ", 2)[1]), body


def _length(answer: bytearray) -> int:
    """The whole answer's length once its head has arrived (head, blank line, ``Content-Length`` bytes)."""
    head, _, _ = bytes(answer).partition(b"\r\n\r\n")
    for line in head.split(b"\r\n")[1:]:
        name, _, value = line.partition(b":")
        if name.strip().lower() == b"content-length":
            return len(head) + 4 + int(value)
    return len(answer)


def rss_kb(pid: int) -> int:
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except FileNotFoundError:
        return 0
    for line in status.splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    return 0  # a zombie has no VmRSS


def tree_rss_mb(pid: int) -> float:
    """Resident memory of ``pid`` and its descendants together, in MB."""
    return sum(rss_kb(p) for p in tree_pids(pid)) / 1024


def _is_media_child(pid: int) -> bool:
    """A video child (``python -m picpeak_lite.media.video ...``, pipeline/video_jobs.py)."""
    try:
        return b"picpeak_lite.media.video" in Path(f"/proc/{pid}/cmdline").read_bytes()
    except (FileNotFoundError, ProcessLookupError):
        return False


@dataclass
class Watch:
    """One attack's figures; see the module docstring."""

    server: ServerProcess
    name: str
    budget_mb: int = 256
    peak_mb: float = 0.0
    media_children_peak: int = 0  # video children at once (image children are a fixed pool, not counted)
    health_ms: list[float] = field(default_factory=list)
    health_failed: list[str] = field(default_factory=list)
    statuses: list[int] = field(default_factory=list)
    seconds: float = 0.0
    extra: dict[str, object] = field(default_factory=dict)

    def saw(self, status: int) -> None:
        """An answer the attack got (5xx are counted against the server)."""
        self.statuses.append(status)

    @property
    def server_errors(self) -> int:
        return sum(1 for status in self.statuses if status >= 500)

    def sample(self) -> None:
        pids = tree_pids(self.server.pid)
        media = sum(1 for pid in pids[1:] if _is_media_child(pid))
        self.media_children_peak = max(self.media_children_peak, media)
        self.peak_mb = max(self.peak_mb, sum(rss_kb(p) for p in pids) / 1024)

    @contextlib.asynccontextmanager
    async def during(self) -> AsyncIterator[Watch]:
        """Sample memory and ``/healthz`` while the body runs the attack."""
        started = time.monotonic()
        async with trio.open_nursery() as nursery:
            nursery.start_soon(self._memory)
            nursery.start_soon(self._health)
            try:
                yield self
            finally:
                nursery.cancel_scope.cancel()
        self.sample()
        self.seconds = time.monotonic() - started

    async def _memory(self) -> None:
        while True:
            await trio.to_thread.run_sync(self.sample)
            await trio.sleep(0.05)

    async def _health(self) -> None:
        host, _, port = self.server.url.removeprefix("http://").partition(":")
        while True:
            began = time.monotonic()
            try:
                with trio.fail_after(HEALTH_SECONDS):
                    status, body = await healthz(host, int(port))
            except (OSError, trio.TooSlowError, ValueError) as error:
                self.health_failed.append(repr(error))
            else:
                if status == 200:
                    self.health_ms.append((time.monotonic() - began) * 1000)
                else:
                    self.health_failed.append(f"{status} {body[:100]!r}")
            await trio.sleep(HEALTH_EVERY)

    def line(self, capsys: object, **more: object) -> str:
        """Print and return this attack's figures line."""
        self.extra.update(more)
        words = [f"hostile {self.name}:", f"seconds={self.seconds:.1f}",
                 f"peak_rss_mb={self.peak_mb:.0f}", f"peak_limit_mb={self.budget_mb + RSS_MARGIN_MB}",
                 f"media_children_peak={self.media_children_peak}",
                 f"healthz_p95_ms={percentile(self.health_ms, 0.95):.0f}",
                 f"healthz_max_ms={max(self.health_ms, default=0):.0f}",
                 f"healthz_answered={len(self.health_ms)}", f"healthz_failed={len(self.health_failed)}",
                 f"5xx={self.server_errors}", f"tracebacks={len(self.server.tracebacks())}"]
        words += [f"{key}={value}" for key, value in self.extra.items()]
        text = " ".join(words)
        figures(capsys, text)
        return text

    def check(self) -> None:
        """What must hold whatever the machine's speed."""
        assert self.server.tracebacks() == [], self.server.tracebacks()[:3]
        assert self.server_errors == 0, [s for s in self.statuses if s >= 500]
        assert self.health_failed == [], self.health_failed[:5]
        assert self.health_ms, "/healthz was never answered during the attack"
        assert self.peak_mb <= self.budget_mb + RSS_MARGIN_MB, f"peak RSS {self.peak_mb:.0f} MB"
