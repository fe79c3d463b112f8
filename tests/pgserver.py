"""A real PostgreSQL server for the tests, started once per test run when the run asks for it.

``pytest --engine postgresql`` runs the suite on PostgreSQL: the first test that makes settings starts a
server from Debian's packages (``postgresql-15`` or newer; ``.ci/apt-packages``) in a temp directory, as an
unprivileged user (``postgres`` when the tests run as root: ``initdb`` refuses root), listening on a free
loopback port and a socket in that directory. Each data directory a test makes gets a fresh database of its own,
copied from a template that already holds the schema, so that a server restarted on the same data directory
(the crash suite) finds its own database again, as it would find its SQLite file. The databases a test made
are dropped after it; the server stops when the run ends.
"""

from __future__ import annotations

import atexit
import contextlib
import glob
import itertools
import os
import pwd
import shutil
import socket
import subprocess
import tempfile
from pathlib import Path

ENGINES = ("sqlite", "postgresql")

#: Set by ``--engine`` (tests/conftest.py).
engine = "sqlite"

_server: PostgresServer | None = None
_by_data_dir: dict[str, str] = {}
_made: list[str] = []


def _bindir() -> Path:
    found = shutil.which("pg_config")
    if found:
        out = subprocess.run([found, "--bindir"], capture_output=True, text=True, check=False).stdout.strip()
        if out and Path(out, "initdb").exists():
            return Path(out)
    versions = sorted(glob.glob("/usr/lib/postgresql/*/bin/initdb"), key=lambda p: int(Path(p).parts[-3]))
    if not versions:
        raise RuntimeError("PostgreSQL is not installed (Debian: apt-get install postgresql-15)")
    return Path(versions[-1]).parent


PREFIX = "picpeak-pg-"


def _stop_orphans(bindir: Path) -> None:
    """Stop and remove the clusters of test runs that were killed (their atexit never ran): the directory names
    the pid of the run that made it."""
    for root in Path(tempfile.gettempdir()).glob(f"{PREFIX}*-*"):
        pid = root.name[len(PREFIX):].split("-", 1)[0]
        if not pid.isdigit() or Path(f"/proc/{pid}").exists():
            continue
        if (root / "data" / "postmaster.pid").exists():
            command = [str(bindir / "pg_ctl"), "-D", str(root / "data"), "-m", "immediate", "stop"]
            if os.geteuid() == 0:
                command = ["runuser", "-u", "postgres", "--", *command]
            subprocess.run(command, capture_output=True, check=False)
        shutil.rmtree(root, ignore_errors=True)


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class PostgresServer:
    """One throwaway cluster: fsync off (a crash of the test machine loses nothing of value)."""

    def __init__(self, *, listen: tuple[str, ...] = ("127.0.0.1",), clients: tuple[str, ...] = ()) -> None:
        """``listen``: the addresses to listen on; ``clients``: networks (CIDR) besides loopback whose
        connections are trusted (the multi-host suite's namespaces)."""
        self.listen = listen
        self.clients = clients
        self.bindir = _bindir()
        _stop_orphans(self.bindir)
        self.root = Path(tempfile.mkdtemp(prefix=f"{PREFIX}{os.getpid()}-"))
        self.user: str | None = None
        if os.geteuid() == 0:
            self.user = "postgres"
            uid = pwd.getpwnam(self.user).pw_uid
            os.chown(self.root, uid, -1)
        self.data = self.root / "data"
        self.port = 0
        self.options = ""  # the server's command-line settings, kept for ``start_again``
        self.counter = itertools.count(1)

    def _run(self, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        command = list(args)
        if self.user is not None:
            command = ["runuser", "-u", self.user, "--", *command]
        return subprocess.run(command, capture_output=True, text=True, check=check, cwd=self.root)

    def start(self) -> None:
        self._run(str(self.bindir / "initdb"), "-D", str(self.data), "-U", "postgres", "-A", "trust", "-E", "UTF8",
                  "--no-sync", "--locale=C")
        if self.clients:
            with open(self.data / "pg_hba.conf", "a") as hba:  # appended: the file stays the server user's
                hba.writelines(f"host all all {network} trust\n" for network in self.clients)
        for _ in range(5):
            self.port = _free_port()
            options = (f"-c listen_addresses={','.join(self.listen)} -p {self.port} -k {self.root} -c fsync=off "
                       "-c synchronous_commit=off -c full_page_writes=off -c max_connections=400 "
                       "-c shared_buffers=64MB")
            done = self._run(str(self.bindir / "pg_ctl"), "-D", str(self.data), "-o", options, "-l",
                             str(self.root / "log"), "-w", "start", check=False)
            if done.returncode == 0:
                self.options = options
                break
        else:
            raise RuntimeError("PostgreSQL did not start:\n" + (self.root / "log").read_text()[-4000:])
        self.admin_sql("CREATE DATABASE picpeak_template")
        from picpeak_lite.store import db, schema

        conn = db.connect(self.url("picpeak_template"))
        try:
            schema.migrate(conn)
        finally:
            conn.close()

    def stop_server(self) -> None:
        """Stop the server as an operator's ``pg_ctl stop -m fast`` does (its clients' connections are ended), but
        keep its data: :meth:`start_again` starts it on the same data and port (the multi-host suite's restart of
        PostgreSQL under load)."""
        self._run(str(self.bindir / "pg_ctl"), "-D", str(self.data), "-m", "fast", "-w", "stop")

    def start_again(self) -> None:
        """Start the server stopped by :meth:`stop_server`, with the same settings and port; returns once it
        accepts connections."""
        assert self.options, "never started"
        self._run(str(self.bindir / "pg_ctl"), "-D", str(self.data), "-o", self.options, "-l",
                  str(self.root / "log"), "-w", "start")

    def url(self, name: str, host: str = "127.0.0.1") -> str:
        return f"postgresql://postgres@{host}:{self.port}/{name}"

    def admin_sql(self, sql: str) -> None:
        import psycopg

        with psycopg.connect(self.url("postgres"), autocommit=True) as conn:
            conn.execute(sql)  # type: ignore[arg-type]  # our own fixed statements

    def new_database(self, *, empty: bool = False) -> str:
        name = f"t{os.getpid()}_{next(self.counter)}"
        template = "template0" if empty else "picpeak_template"
        self.admin_sql(f"CREATE DATABASE {name} TEMPLATE {template} STRATEGY FILE_COPY")
        _made.append(name)
        return self.url(name)

    def drop(self, name: str) -> None:
        self.admin_sql(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")

    def stop(self) -> None:
        self._run(str(self.bindir / "pg_ctl"), "-D", str(self.data), "-m", "immediate", "stop", check=False)
        shutil.rmtree(self.root, ignore_errors=True)


def server() -> PostgresServer:
    global _server
    if _server is None:
        started = PostgresServer()
        started.start()
        atexit.register(started.stop)
        _server = started
    return _server


def database_for(data_dir: str | os.PathLike[str]) -> str | None:
    """The database of a data directory when the run is on PostgreSQL (made on first use), else None."""
    if engine != "postgresql":
        return None
    key = str(Path(data_dir).resolve())
    if key not in _by_data_dir:
        _by_data_dir[key] = server().new_database()
    return _by_data_dir[key]


def empty_database_for(data_dir: str | os.PathLike[str]) -> str | None:
    """A new, empty database (no schema: what ``picpeak-lite restore`` loads a dump into) as the database of a data
    directory from now on, when the run is on PostgreSQL; else None."""
    if engine != "postgresql":
        return None
    key = str(Path(data_dir).resolve())
    _by_data_dir[key] = server().new_database(empty=True)
    return _by_data_dir[key]


def env_for(args: tuple[str, ...] | list[str]) -> dict[str, str]:
    """``PICPEAK_DATABASE_URL`` for a command line that names ``--data-dir`` (when the run is on PostgreSQL)."""
    if "--data-dir" not in args:
        return {}
    database = database_for(args[list(args).index("--data-dir") + 1])
    return {"PICPEAK_DATABASE_URL": database} if database else {}


def drop_made() -> None:
    """Drop the databases made since the last call (after each test)."""
    if _server is None:
        return
    while _made:
        name = _made.pop()
        with contextlib.suppress(Exception):
            _server.drop(name)
    _by_data_dir.clear()

