"""PostgreSQL's own client tools, ``pg_dump`` and ``pg_restore``, for ``backup`` and ``restore``.

A PostgreSQL database is backed up the way PostgreSQL backs itself up: ``pg_dump`` in its custom format (one
compressed file that ``pg_restore`` reads), ``--no-owner`` so that it restores into a database owned by any role.
The dump is taken in a snapshot that our own connection exported (:func:`snapshot`): the photo rows the backup
reads to know which files to copy are then exactly the rows in the dump.

The tools must be at least as new as the server (an older ``pg_dump`` refuses a newer server, and a dump must
not silently lack what it does not know). Debian installs each major version in ``/usr/lib/postgresql/<N>/bin``,
with ``/usr/bin/pg_dump`` a wrapper that may pick another one; :func:`find_tool` prefers the version of the server,
else the newest newer one, and refuses with one sentence when all it finds is older.

The password of a ``database_url`` is handed to the tool in ``PGPASSWORD``, never on its command line (which any
local user can read in ``ps``). Each run has a deadline for the locks it waits on, so a backup never hangs behind
a schema change.
"""

from __future__ import annotations

import contextlib
import glob
import os
import re
import shutil
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import unquote, urlsplit, urlunsplit

from picpeak_lite.errors import CommandFailed, ConfigError
from picpeak_lite.store.db import Connection

LOCK_WAIT = "60s"
_VERSION = re.compile(r"\(PostgreSQL\)\s+(\d+)(?:\.(\d+))?")


def server_version(conn: Connection) -> tuple[int, int]:
    """(major, minor) of the server behind ``conn``: 150018 is (15, 18)."""
    number = int(conn.execute("SHOW server_version_num").fetchall()[0]["server_version_num"])
    return number // 10000, number % 10000


def tool_version(path: Path) -> tuple[int, int] | None:
    """(major, minor) that ``path --version`` reports, or None when it is no PostgreSQL tool that runs."""
    try:
        out = subprocess.run([str(path), "--version"], capture_output=True, text=True, timeout=30, check=False)
    except (OSError, subprocess.SubprocessError):
        return None
    found = _VERSION.search(out.stdout)
    return (int(found.group(1)), int(found.group(2) or 0)) if found else None


def candidates(name: str) -> list[Path]:
    """Where ``name`` may be: ``pg_config --bindir``, every Debian major version's directory, then ``PATH``."""
    dirs: list[Path] = []
    pg_config = shutil.which("pg_config")
    if pg_config:
        with contextlib.suppress(OSError, subprocess.SubprocessError):
            out = subprocess.run([pg_config, "--bindir"], capture_output=True, text=True, timeout=30, check=False)
            if out.stdout.strip():
                dirs.append(Path(out.stdout.strip()))
    dirs += [Path(p).parent for p in glob.glob(f"/usr/lib/postgresql/*/bin/{name}")]
    found = [d / name for d in dirs if (d / name).exists()]
    on_path = shutil.which(name)
    if on_path:
        found.append(Path(on_path))
    return list(dict.fromkeys(found))


def choose(name: str, versions: dict[Path, tuple[int, int]], server: tuple[int, int]) -> Path:
    """The tool to use among ``versions`` (path -> version): one of the server's major version, else the newest
    newer one. Raises ConfigError (one sentence) when there is none or all are older than the server."""
    if not versions:
        raise ConfigError(f"{name} is not installed; install PostgreSQL {server[0]}'s client tools "
                          f"(Debian: apt-get install postgresql-client-{server[0]})")
    same = [p for p, v in versions.items() if v[0] == server[0]]
    if same:
        return max(same, key=lambda p: versions[p])
    newer = [p for p, v in versions.items() if v[0] > server[0]]
    if newer:
        return max(newer, key=lambda p: versions[p])
    best = max(versions, key=lambda p: versions[p])
    have = ".".join(map(str, versions[best]))
    raise ConfigError(f"{name} {have} ({best}) is older than the database server ({server[0]}.{server[1]}); install "
                      f"PostgreSQL {server[0]}'s client tools (Debian: apt-get install postgresql-client-{server[0]})")


def find_tool(name: str, server: tuple[int, int]) -> Path:
    """``pg_dump`` or ``pg_restore`` for a server of version ``server`` (see :func:`choose`)."""
    versions = {path: v for path in candidates(name) if (v := tool_version(path)) is not None}
    return choose(name, versions, server)


@dataclass(frozen=True)
class Tools:
    """The pair of tools for one server, found before any work starts (so that a refusal leaves nothing)."""

    pg_dump: Path
    pg_restore: Path

    @classmethod
    def find(cls, server: tuple[int, int]) -> Tools:
        return cls(find_tool("pg_dump", server), find_tool("pg_restore", server))


def _libpq(url: str) -> tuple[str, dict[str, str]]:
    """The URL without its password, and the environment that carries the password instead."""
    parts = urlsplit(url)
    env = {**os.environ, "PGCONNECT_TIMEOUT": os.environ.get("PGCONNECT_TIMEOUT", "10")}
    if parts.password is None:
        return url, env
    userinfo, host = parts.netloc.rsplit("@", 1)
    user = userinfo.split(":", 1)[0]
    env["PGPASSWORD"] = unquote(parts.password)
    return urlunsplit(parts._replace(netloc=f"{user}@{host}")), env


def _run(command: list[str], env: dict[str, str], what: str) -> None:
    done = subprocess.run(command, capture_output=True, text=True, env=env, check=False)
    if done.returncode != 0:
        lines = [line.strip() for line in done.stderr.splitlines() if line.strip()]
        reason = lines[-1] if lines else f"exit status {done.returncode}"
        raise CommandFailed(f"{what} failed: {reason}")


@contextlib.contextmanager
def snapshot(conn: Connection) -> Iterator[str]:
    """A read-only repeatable-read transaction on ``conn`` and its exported snapshot's id, for ``pg_dump
    --snapshot``: what ``conn`` reads inside and what the dump holds are the same state of the database. The
    snapshot can be used only while this transaction is open, so the dump runs inside the ``with``."""
    conn.execute("BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY")
    try:
        yield str(conn.execute("SELECT pg_export_snapshot() AS id").fetchall()[0]["id"])
    finally:
        conn.execute("ROLLBACK")  # read only: nothing to keep


def dump(tools: Tools, url: str, path: Path, *, snapshot_id: str) -> None:
    """The whole database of ``url`` as ``pg_dump`` custom format at ``path``, taken in ``snapshot_id``."""
    target, env = _libpq(url)
    _run([str(tools.pg_dump), "--format=custom", "--no-owner", f"--snapshot={snapshot_id}",
          f"--lock-wait-timeout={LOCK_WAIT}", f"--file={path}", f"--dbname={target}"], env, "pg_dump")


def verify(tools: Tools, path: Path) -> None:
    """Read the whole dump back as ``pg_restore`` would (every data block decompressed, written to /dev/null):
    the file is a complete, readable archive."""
    _run([str(tools.pg_restore), f"--file={os.devnull}", str(path)], dict(os.environ),
         "reading the dump back (pg_restore)")


def is_empty(conn: Connection) -> bool:
    """Whether the database has no table, sequence, view or function of its own (a fresh ``CREATE DATABASE``)."""
    rows = conn.execute(
        "SELECT (SELECT count(*) FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace "
        "        WHERE n.nspname NOT IN ('pg_catalog', 'information_schema') AND n.nspname NOT LIKE 'pg_toast%') "
        "     + (SELECT count(*) FROM pg_proc p JOIN pg_namespace n ON n.oid = p.pronamespace "
        "        WHERE n.nspname NOT IN ('pg_catalog', 'information_schema')) AS n").fetchall()
    return int(rows[0]["n"]) == 0


def restore(tools: Tools, url: str, path: Path) -> None:
    """Load a dump into the empty database of ``url``, in one transaction (all of it or nothing), owned by the
    connecting role (``--no-owner --no-privileges``)."""
    target, env = _libpq(url)
    _run([str(tools.pg_restore), "--no-owner", "--no-privileges", "--single-transaction", "--exit-on-error",
          f"--dbname={target}", str(path)], env, "pg_restore")
