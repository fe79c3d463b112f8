"""Shared helpers for the suites that run the real server in its own process (crash, load, disk full).

* :class:`ServerProcess`: ``python -m picpeak_lite serve --port 0`` with a config file, its URL read from
  its output, stopped by SIGTERM or killed by SIGKILL, its peak RSS read from ``/proc``.
* :class:`WebhookReceiver`: an HTTP server on 127.0.0.1 (in a thread) that checks signatures and counts
  deliveries per event, so that a test can see an event delivered under two ids.
* :func:`guest_client`: a guest's session on a gallery with a password.
* :func:`multipart` builds an upload body; :func:`unique_jpeg` makes distinct photos cheaply.
* :func:`tmpfs` mounts a small real file system (root only), for tests that need a disk that really fills.
* :func:`figures` prints a suite's one line of figures where CI shows it, and appends it to
  ``test-artifacts/figures.txt``.

Nothing here talks to anything but 127.0.0.1.
"""

from __future__ import annotations

import collections
import contextlib
import functools
import hashlib
import hmac
import json
import os
import re
import resource
import secrets
import signal
import struct
import subprocess
import sys
import threading
import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import httpx
import pytest

from picpeak_lite.store import db

from . import imagefactory, pgserver

ADMIN_PASSWORD = "correct horse battery"
WEBHOOK_SECRET = "crash-suite-secret-0123456789"
BOUNDARY = "----picpeak-harness-5c1e"
REPO = Path(__file__).resolve().parent.parent
URL_LINE = re.compile(r"running at (http://[0-9.]+:\d+)/admin")


def cli(*args: str, env: dict[str, str] | None = None, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    """``picpeak-lite ARGS`` in a subprocess, as an operator runs it."""
    return subprocess.run([sys.executable, "-m", "picpeak_lite", *args], capture_output=True, text=True,
                          timeout=timeout, env={**os.environ, **pgserver.env_for(args), **(env or {})})


CSRF_INPUT = re.compile(r'name="csrf_token" value="([^"]+)"')


async def guest_client(url: str, slug: str, password: str, *, request_seconds: float = 120
                       ) -> tuple[httpx.AsyncClient, str]:
    """A guest's own session on a gallery with a password, as a browser gets one (the page's CSRF token, the
    password form): the client, which the caller closes, and the token for its uploads."""
    client = httpx.AsyncClient(base_url=url, timeout=request_seconds)  # a hang guard, not a bound
    page = await client.get(f"/g/{slug}")
    csrf = CSRF_INPUT.search(page.text)
    assert csrf, page.text[:500]
    entered = await client.post(f"/g/{slug}/password", data={"password": password, "csrf_token": csrf.group(1)})
    assert entered.status_code == 302, entered.text
    return client, csrf.group(1)


def write_config(path: Path, *, webhook_url: str | None = None, **values: Any) -> Path:
    """A picpeak.toml with flat keys, and a ``[[webhooks]]`` table when ``webhook_url`` is given."""
    url = pgserver.database_for(values["data_dir"]) if "data_dir" in values else None
    if url is not None and "database_url" not in values:
        values["database_url"] = url  # the data directory's database on PostgreSQL, as make_settings gives it
    lines = [f"{key} = {json.dumps(value)}" for key, value in values.items()]
    if webhook_url is not None:
        lines += ["", "[[webhooks]]", f"url = {json.dumps(webhook_url)}", f"secret = {json.dumps(WEBHOOK_SECRET)}"]
    path.write_text("\n".join(lines) + "\n")
    return path


def create_token(data_dir: Path, config: Path | None = None) -> str:
    args = ["admin", "token", "create", "--name", f"t{secrets.token_hex(4)}", "--data-dir", str(data_dir)]
    if config is not None:
        args += ["--config", str(config)]
    # Before the first start the command makes the owner too (issue 33: a token belongs to an account), with
    # the password the server processes are given.
    done = cli(*args, env={"PICPEAK_ADMIN_PASSWORD": ADMIN_PASSWORD})
    assert done.returncode == 0, done.stderr
    return done.stdout.strip()


def _limit_nofile(limit: int) -> None:
    resource.setrlimit(resource.RLIMIT_NOFILE, (limit, limit))


class ServerProcess:
    """One ``picpeak-lite serve`` process at a time on a data directory; restartable."""

    def __init__(self, data_dir: Path, config: Path, *, env: dict[str, str] | None = None,
                 nofile: int | None = None, netns: str | None = None, host: str = "127.0.0.1", port: int = 0,
                 database_url: str | None = None, args: tuple[str, ...] = ()) -> None:
        self.data_dir = data_dir
        self.args = args  # more `serve` flags (e.g. --processes 2)
        self.config = config
        self.nofile = nofile  # RLIMIT_NOFILE, soft and hard, for the server (as a unit's LimitNOFILE sets it)
        # The multi-host suite (tests/multihost.py): a network namespace to run in (``ip netns exec`` execs the
        # server itself, so its pid is the server's), the address and port it listens on there (each namespace has
        # ports of its own: every host may take 8080, as behind a balancer), and a database shared by every host
        # instead of this data directory's own.
        self.netns = netns
        self.host = host
        self.port = port
        database = database_url or pgserver.database_for(data_dir)
        self.env = {**os.environ, "PICPEAK_ADMIN_PASSWORD": ADMIN_PASSWORD, "PICPEAK_WEBHOOK_ALLOW_PRIVATE": "true",
                    **({"PICPEAK_DATABASE_URL": database} if database else {}), **(env or {})}
        self.proc: subprocess.Popen[str] | None = None
        self.url = ""
        self.output: collections.deque[str] = collections.deque(maxlen=4000)
        self.starts = 0

    def start(self, timeout: float = 120) -> str:
        """Start and return the URL once the server says it is serving (recovery has run by then)."""
        assert self.proc is None, "already running"
        wrap = ["ip", "netns", "exec", self.netns] if self.netns else []
        self.proc = subprocess.Popen(
            [*wrap, sys.executable, "-m", "picpeak_lite", "serve", "--host", self.host, "--port", str(self.port),
             "--data-dir", str(self.data_dir), "--config", str(self.config), *self.args],
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=self.env,
            preexec_fn=None if self.nofile is None else functools.partial(_limit_nofile, self.nofile),
        )
        self.starts += 1
        ready = threading.Event()
        threading.Thread(target=self._drain, args=(self.proc, ready), daemon=True).start()
        if not ready.wait(timeout) or not self.url:
            self.kill()
            raise AssertionError("the server did not print its URL:\n" + self.log_tail())
        return self.url

    def _drain(self, proc: subprocess.Popen[str], ready: threading.Event) -> None:
        assert proc.stdout is not None
        for line in proc.stdout:
            self.output.append(line)
            match = URL_LINE.search(line)
            if match and not ready.is_set():
                self.url = match.group(1)
                ready.set()
        ready.set()

    @property
    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid

    def kill(self) -> None:
        """SIGKILL: no handler runs, nothing is flushed, nothing is handed back."""
        if self.proc is None:
            return
        self.proc.kill()
        self.proc.wait(timeout=30)
        self.proc = None

    def stop(self, timeout: float = 120) -> int:
        """SIGTERM and wait: returns the exit status."""
        assert self.proc is not None
        self.proc.send_signal(signal.SIGTERM)
        code = self.proc.wait(timeout=timeout)
        self.proc = None
        return code

    def peak_rss_mb(self) -> float:
        """The kernel's high-water marks of resident memory (VmHWM) of the server and of every process below it
        (the image children), added up: at least the peak of their sum, never less."""
        from .hostile import tree_pids  # hostile.py imports this module

        kb = 0
        for pid in tree_pids(self.pid):
            with contextlib.suppress(FileNotFoundError, ProcessLookupError):
                status = Path(f"/proc/{pid}/status").read_text()
                found = re.search(r"^VmHWM:\s+(\d+) kB", status, re.MULTILINE)
                kb += int(found.group(1)) if found else 0
        return kb / 1024

    def log_tail(self, lines: int = 60) -> str:
        return "".join(list(self.output)[-lines:])

    def tracebacks(self) -> list[str]:
        """Each traceback the server printed, with the 40 lines that follow it (the frames and the error).

        Left out: an image child that the server was starting when it was killed (``kill -9``) finds its start-up
        data never written and multiprocessing prints an EOFError from ``spawn_main`` (the child shares the
        server's stderr). That is the kill's doing, and the only traceback a child prints itself: its jobs'
        errors go back to the server through the pipe."""
        lines = list(self.output)
        found = []
        for i, line in enumerate(lines):
            if "Traceback" not in line:
                continue
            text = "".join(lines[i:i + 40])
            if _orphaned_spawn(lines[i:i + 10]):
                continue
            found.append(text)
        return found


def _orphaned_spawn(head: list[str]) -> bool:
    """The first lines of a traceback: multiprocessing's spawn_main reading start-up data that never came."""
    text = "".join(head)
    return "multiprocessing/spawn.py" in text and "preparation_data = reduction.pickle.load(from_parent)" in text \
        and "EOFError: Ran out of input" in text


# --- webhooks ----------------------------------------------------------------------------------------------

@dataclass
class WebhookReceiver:
    """Counts deliveries by (event type, subject) and by id; refuses bad signatures with 401."""

    delay: float = 0.0  # seconds each delivery takes, to widen the window for a kill during delivery
    host: str = "127.0.0.1"  # the address to listen on (the multi-host suite's bridge address)
    ids_by_event: dict[tuple[str, str], set[str]] = field(default_factory=dict)
    deliveries: int = 0
    bad_signatures: int = 0
    _lock: threading.Lock = field(default_factory=threading.Lock)
    _server: ThreadingHTTPServer | None = None

    @property
    def url(self) -> str:
        assert self._server is not None
        return f"http://{self.host}:{self._server.server_address[1]}/hook"

    def __enter__(self) -> WebhookReceiver:
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
                receiver._record(dict(self.headers), body)
                if receiver.delay:
                    time.sleep(receiver.delay)
                ok = receiver._signed(dict(self.headers), body)
                self.send_response(200 if ok else 401)
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, *args: Any) -> None:
                pass

        self._server = ThreadingHTTPServer((self.host, 0), Handler)
        self._server.daemon_threads = True
        threading.Thread(target=self._server.serve_forever, daemon=True).start()
        return self

    def __exit__(self, *exc: object) -> None:
        assert self._server is not None
        self._server.shutdown()
        self._server.server_close()

    def _signed(self, headers: dict[str, str], body: bytes) -> bool:
        signed = f"{headers.get('X-PicPeak-Id')}.{headers.get('X-PicPeak-Timestamp')}.".encode() + body
        expected = hmac.new(WEBHOOK_SECRET.encode(), signed, hashlib.sha256).hexdigest()
        if not hmac.compare_digest(headers.get("X-PicPeak-Signature", ""), f"sha256={expected}"):
            with self._lock:
                self.bad_signatures += 1
            return False
        return True

    def _record(self, headers: dict[str, str], body: bytes) -> None:
        event = json.loads(body)
        data = event["data"]
        subject = str(data.get("photo_id") if "photo_id" in data else data.get("upload_id"))
        with self._lock:
            self.deliveries += 1
            self.ids_by_event.setdefault((event["type"], subject), set()).add(headers.get("X-PicPeak-Id", ""))

    def duplicate_ids(self) -> int:
        """Events that arrived under more than one id: must be 0 (the same id twice is fine)."""
        with self._lock:
            return sum(1 for ids in self.ids_by_event.values() if len(ids) > 1)

    def events(self) -> int:
        with self._lock:
            return len(self.ids_by_event)


# --- uploads -----------------------------------------------------------------------------------------------

def multipart(files: Iterable[tuple[str, bytes]], fields: Iterable[tuple[str, str]] = ()) -> tuple[bytes,
                                                                                                 dict[str, str]]:
    """A multipart/form-data body: form fields first, then each file in the ``photos`` field."""

    def part(headers: str, data: bytes) -> bytes:
        return f"--{BOUNDARY}\r\n{headers}\r\n\r\n".encode() + data + b"\r\n"

    parts = [part(f'Content-Disposition: form-data; name="{n}"', v.encode()) for n, v in fields]
    parts += [part(f'Content-Disposition: form-data; name="photos"; filename="{name}"\r\n'
                   "Content-Type: image/jpeg", data) for name, data in files]
    body = b"".join(parts) + f"--{BOUNDARY}--\r\n".encode()
    return body, {"Content-Type": f"multipart/form-data; boundary={BOUNDARY}"}


def base_jpeg(width: int, height: int, *, quality: int = 90, seed: int = 0) -> bytes:
    return imagefactory.save(imagefactory.photo(width, height, seed=seed), "jpeg", quality=quality)


def unique_jpeg(base: bytes, tag: str) -> bytes:
    """``base`` with a JPEG comment segment right after SOI: a distinct file (and sha256) for the same pixels,
    made in microseconds instead of encoding a new photo."""
    assert base[:2] == b"\xff\xd8"
    comment = f"picpeak-harness {tag} {secrets.token_hex(8)}".encode()
    return base[:2] + b"\xff\xfe" + struct.pack(">H", len(comment) + 2) + comment + base[2:]


def sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def file_sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(1 << 20):
            digest.update(chunk)
    return digest.hexdigest()


# --- a disk that really fills ----------------------------------------------------------------------------

@contextlib.contextmanager
def tmpfs(mount: Path, size_mb: int, *, inodes: int | None = None, why: str = "") -> Iterator[Path]:
    """A ``size_mb`` tmpfs (and at most ``inodes`` files, if given) mounted at ``mount``: a real full disk,
    with the kernel's own ENOSPC, instead of a patched write. Needs root; the test is skipped otherwise."""
    if os.geteuid() != 0:
        pytest.skip(f"{why or 'this test'} mounts a {size_mb} MB tmpfs and needs root; run it as root to include it")
    mount.mkdir(parents=True, exist_ok=True)
    options = f"size={size_mb}m" + (f",nr_inodes={inodes}" if inodes is not None else "")
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", options, "tmpfs", str(mount)], capture_output=True,
                          text=True)
    if done.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {done.stderr.strip()}")
    try:
        yield mount
    finally:
        subprocess.run(["umount", "--lazy", str(mount)], check=False)


# --- the data directory, read as the operator's tools would ------------------------------------------------

def integrity_check(data_dir: Path) -> str:
    """"ok", or what the database engine found wrong with its own structures."""
    conn = db.connect(pgserver.database_for(data_dir) or data_dir / "picpeak.sqlite3")
    try:
        return db.integrity_check(conn)
    finally:
        conn.close()


def query(data_dir: Path, sql: str, *args: Any) -> list[dict[str, Any]]:
    conn = db.connect(pgserver.database_for(data_dir) or data_dir / "picpeak.sqlite3")
    try:
        return conn.execute(sql, args).fetchall()
    finally:
        conn.close()


def stored_files(data_dir: Path) -> dict[str, list[Path]]:
    """Every original and derivative by storage key."""
    out: dict[str, list[Path]] = {}
    for sub in ("originals", "derived"):
        base = data_dir / sub
        if base.exists():
            for path in base.rglob("*"):
                if path.is_file():
                    out.setdefault(path.name.split(".", 1)[0], []).append(path)
    return out


def temp_files(data_dir: Path) -> list[Path]:
    tmp = data_dir / "tmp"
    return sorted(tmp.iterdir()) if tmp.exists() else []


def percentile(values: list[float], share: float) -> float:
    if not values:
        return 0.0
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(share * (len(ordered) - 1)))]


FIGURES = REPO / "test-artifacts" / "figures.txt"


def figures(capsys: Any, line: str) -> None:
    """Print a suite's figures line where CI shows it (outside pytest's capture) and keep it in a file. The line
    ends with the engine the run is on, so that the two passes' lines tell themselves apart. In a run over
    several processes (``-n``), what a worker prints is not shown: the run's own process prints the lines its
    workers kept in the file at the end (:func:`figures_since`, tests/conftest.py)."""
    line = f"{line} engine={pgserver.engine}"
    FIGURES.parent.mkdir(exist_ok=True)
    with open(FIGURES, "a") as f:
        f.write(f"{time.strftime('%Y-%m-%dT%H:%M:%S')} {line}\n")
    if capsys is None:
        print(line, flush=True)
        return
    with capsys.disabled():
        print("\n" + line, flush=True)


def figures_size() -> int:
    """Where the figures file ends now: :func:`figures_since` reads from here."""
    return FIGURES.stat().st_size if FIGURES.exists() else 0


def figures_since(offset: int, engine: str) -> list[str]:
    """The figures lines of ``engine`` kept in the file after ``offset`` (without their time stamps). The other
    engine's pass writes to the same file at the same time, so lines are told apart by the engine they end with."""
    if not FIGURES.exists():
        return []
    with open(FIGURES, "rb") as f:
        f.seek(offset)
        text = f.read().decode(errors="replace")
    lines = [line.split(" ", 1)[-1] for line in text.splitlines()]
    return [line for line in lines if line.endswith(f" engine={engine}")]


async def get_idempotent(http: httpx.AsyncClient, url: str, **kwargs: Any) -> httpx.Response:
    """GET, once more on a new connection if a kept-alive one was closed under the request (as browsers do for
    idempotent requests). A server may close an idle connection the moment the client reuses it; on a loaded
    machine a poll met that race ("Connection reset by peer") and failed a test by chance."""
    try:
        return await http.get(url, **kwargs)
    except (httpx.ReadError, httpx.RemoteProtocolError, httpx.WriteError):
        return await http.get(url, **kwargs)  # httpx has dropped the broken connection from its pool
