"""SQLite connections and the one bridge from async code to them.

Nothing else in the project opens SQLite. Every connection gets the same setup (WAL, ``synchronous=FULL``,
a busy timeout measured in seconds, foreign keys, no double-quoted string literals). SQL itself lives in sync
functions ``fn(conn, ...)`` under ``picpeak_lite.store.queries``; async code runs them through :class:`Database`,
which hands them to worker threads with explicit capacity limiters:

* ``await db.write(fn, ...)`` runs ``fn`` inside ``BEGIN IMMEDIATE ... COMMIT`` on the single writer
  connection. Writers in this process queue on a trio lock, so they never fight each other for SQLite's write
  lock; another process (``picpeak-lite worker``) is handled by the busy timeout, which ``BEGIN IMMEDIATE``
  honours.
* ``await db.read(fn, ...)`` runs ``fn`` inside a deferred transaction (one consistent snapshot) on one of a
  small pool of reader connections, so page views never wait behind a long write. On PostgreSQL it runs ``fn``
  with no transaction around it: each statement commits by itself. Under READ COMMITTED (the default, which we
  keep) every statement takes a snapshot of its own even inside a transaction, so ``BEGIN`` and ``COMMIT`` there
  would give a read nothing and cost the server two round trips: two thirds of a one-statement read's cost.

A connection the server dropped (PostgreSQL restarted, the network to it cut) is found by the next transaction's
``BEGIN`` (or a read's first statement), replaced by a new one and the work run once more, since nothing of it
was done; while the server refuses connections, each call raises ``DatabaseUnavailable`` (503, Retry-After).

Thread hops are not cancellable: a write that has started always finishes and commits or rolls back, even if
the request that asked for it is cancelled. That is what we want for durability.
"""

from __future__ import annotations

import contextlib
import logging
import os
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, ParamSpec, Protocol, TypeVar, cast

import apsw
import trio

from picpeak_lite.errors import DatabaseError, DatabaseUnavailable, InsufficientStorage

log = logging.getLogger(__name__)

P = ParamSpec("P")
T = TypeVar("T")

#: A row as every query returns it: ``connect`` installs a row tracer that keys values by column name.
Row = dict[str, Any]


class Cursor(Protocol):
    """What ``Connection.execute`` returns, with rows typed as our row tracer makes them."""

    def fetchall(self) -> list[Row]: ...
    def fetchone(self) -> Row | None: ...
    def __iter__(self) -> Iterator[Row]: ...
    def __next__(self) -> Row: ...


class Connection(Protocol):
    """The part of ``apsw.Connection`` our SQL uses, which ``store/pg.py``'s PostgreSQL connection offers too.
    apsw's own stubs type rows as tuples, which ours are not; this type lets mypy check every query's use of its
    rows. ``dialect``: "sqlite" or "postgresql", for the few statements written once per engine."""

    @property
    def dialect(self) -> str: ...
    @property
    def in_transaction(self) -> bool: ...
    @property
    def filename(self) -> str: ...
    @property
    def broken(self) -> bool: ...
    def execute(self, statements: str, bindings: Any = None) -> Cursor: ...
    def changes(self) -> int: ...
    def last_insert_rowid(self) -> int: ...
    def close(self, force: bool = False) -> None: ...

class Prepared(str):
    """A statement run for every photo (the change feed's read, the claim): PostgreSQL plans it once per
    connection and reuses the plan (``store/pg.py``), where planning an ad-hoc statement cost more server CPU than
    running it. SQLite caches every statement's compiled form by its text anyway, so there it is a plain string.
    Mark only statements whose every ``?`` has a type PostgreSQL can tell from its place (a column compared or
    assigned, a LIMIT): the values are then sent apart from the text, not written into it."""

    __slots__ = ()


BUSY_TIMEOUT_MS = 10_000
# SQLite's INTEGER range. A Python int outside it cannot be bound as a parameter (apsw raises OverflowError), so
# every id or number that comes from outside is checked against it before it gets near a query: no row has such
# an id, so the caller answers "not found" (or "not valid") instead of failing.
INTEGER_MIN = -(2**63)
INTEGER_MAX = 2**63 - 1


def fits_integer(value: int) -> bool:
    """Whether ``value`` can be stored in, or compared with, an SQLite INTEGER column."""
    return INTEGER_MIN <= value <= INTEGER_MAX

# Re-exported so that callers can catch constraint violations without importing apsw themselves.
ConstraintError = apsw.ConstraintError


SQLITE_URL = "sqlite:///"


class SqliteConnection(apsw.Connection):
    dialect = "sqlite"
    broken = False  # a file has no server to lose


def sqlite_path(target: str | os.PathLike[str]) -> Path | None:
    """The file behind ``target`` (a path or a ``sqlite:///`` URL), or None for a PostgreSQL URL."""
    text = os.fspath(target)
    if text.startswith(("postgresql://", "postgres://")):
        return None
    return Path(text[len(SQLITE_URL):] if text.startswith(SQLITE_URL) else text)


def connect(target: str | os.PathLike[str]) -> Connection:
    """Open one connection: to the SQLite file at ``target`` (a path or ``sqlite:///path``) with the project's
    pragmas, or to the PostgreSQL database of a ``postgresql://`` URL. Used by the bridge, the CLI and the tests."""
    path = sqlite_path(target)
    if path is None:
        from picpeak_lite.store import pg  # psycopg is imported only where PostgreSQL is used

        return pg.connect(os.fspath(target))
    conn = SqliteConnection(str(path))
    conn.set_busy_timeout(BUSY_TIMEOUT_MS)
    # Double-quoted identifiers that silently became strings have hidden typos for years elsewhere.
    conn.config(apsw.SQLITE_DBCONFIG_DQS_DML, 0)
    conn.config(apsw.SQLITE_DBCONFIG_DQS_DDL, 0)
    conn.execute("PRAGMA journal_mode = WAL")
    # FULL, never NORMAL: in WAL mode NORMAL may lose the last commits on power loss, and an acknowledged
    # upload must survive that.
    conn.execute("PRAGMA synchronous = FULL")
    conn.execute("PRAGMA foreign_keys = ON")
    conn.row_trace = _row_as_dict
    return cast(Connection, conn)


def _row_as_dict(cursor: apsw.Cursor, row: tuple[Any, ...]) -> dict[str, Any]:
    """Rows come back as plain dicts keyed by column name."""
    return {desc[0]: value for desc, value in zip(cursor.get_description(), row, strict=True)}


@contextlib.contextmanager
def transaction(conn: Connection, *, immediate: bool = True, begun: bool = False) -> Iterator[Connection]:
    """One unit of work: ``BEGIN [IMMEDIATE]`` ... ``COMMIT``, rolled back on any exception.

    When SQLite hits disk-full or an I/O error it rolls the transaction back by itself; our own ``ROLLBACK``
    then fails with "cannot rollback - no transaction is active" and would hide the real error. We raise the
    real cause instead, translated into our own error types. ``begun``: the caller sent the ``BEGIN``.
    """
    if not begun:
        conn.execute("BEGIN IMMEDIATE" if immediate else "BEGIN")
    try:
        yield conn
    except BaseException as error:
        if not conn.in_transaction:
            raise _translate(error) from error
        with contextlib.suppress(Exception):  # the engine's own error; the first one is the one to raise
            conn.execute("ROLLBACK")
        raise _translate(error) from error
    else:
        try:
            conn.execute("COMMIT")
        except Exception as error:
            if conn.in_transaction:
                with contextlib.suppress(Exception):
                    conn.execute("ROLLBACK")
            raise _translate(error) from error


def _translate(error: BaseException) -> BaseException:
    """Map SQLite's storage failures to errors that carry an HTTP status; leave everything else alone."""
    if isinstance(error, apsw.FullError):
        return InsufficientStorage("The server's disk is full; the photo was not saved.")
    if isinstance(error, apsw.IOError):
        return DatabaseError(f"Disk I/O error in the database: {error}")
    return error


class Database:
    """The async bridge: a single writer connection and a small pool of readers, each used by one thread
    at a time, with explicit capacity limiters."""

    def __init__(self, target: str | os.PathLike[str], *, readers: int = 4) -> None:
        self.target = os.fspath(target)
        self._writer = connect(self.target)
        self.dialect = self._writer.dialect
        self._write_lock = trio.Lock()
        self._write_limiter = trio.CapacityLimiter(1)
        self._readers = [connect(self.target) for _ in range(readers)]
        self._read_limiter = trio.CapacityLimiter(readers)
        self._closed = False
        # Called (sync, non-blocking) after every successful write transaction, e.g. to poke the change feed.
        self.commit_listeners: list[Callable[[], None]] = []

    async def write(self, fn: Callable[..., T], *args: Any) -> T:
        """Run ``fn(conn, *args)`` in one ``BEGIN IMMEDIATE`` transaction on the writer connection."""
        async with self._write_lock:
            result = await trio.to_thread.run_sync(self._write_in_thread, fn, args, limiter=self._write_limiter)
        for listener in self.commit_listeners:
            listener()
        return result

    async def read(self, fn: Callable[..., T], *args: Any) -> T:
        """Run ``fn(conn, *args)`` in one deferred (read) transaction on a reader connection (SQLite), or each of
        its statements in its own snapshot (PostgreSQL, see the module's docstring)."""
        async with self._read_limiter:
            held = [self._readers.pop()]
            try:
                return await trio.to_thread.run_sync(self._read_in_thread, held, fn, args)
            finally:
                self._readers.append(held[0])

    def _write_in_thread(self, fn: Callable[..., T], args: tuple[Any, ...]) -> T:
        self._writer = self._begun(self._writer, immediate=True)
        with transaction(self._writer, begun=True):
            return fn(self._writer, *args)

    def _read_in_thread(self, held: list[Connection], fn: Callable[..., T], args: tuple[Any, ...]) -> T:
        if self.dialect == "sqlite":
            held[0] = self._begun(held[0], immediate=False)
            with transaction(held[0], immediate=False, begun=True):
                return fn(held[0], *args)
        # PostgreSQL: no BEGIN/COMMIT. A read only reads, so when it finds the connection dropped (a restart
        # while it sat idle), it runs again, once, on a new one.
        for attempt in range(2):
            held[0] = self._reopened(held[0])
            try:
                return fn(held[0], *args)
            except DatabaseUnavailable:
                if attempt or not held[0].broken:
                    raise
        raise AssertionError("unreachable")

    def _begun(self, conn: Connection, *, immediate: bool) -> Connection:
        """A connection with a transaction begun on it: ``conn``, or a new connection in its place when the
        server dropped it (PostgreSQL restarted). A drop found by ``BEGIN`` sent nothing of the work, so it is
        opened again once, at once: after a restart no request fails for a connection that sat idle through it.
        While the server is down, connecting raises ``DatabaseUnavailable`` (503, Retry-After) and the next
        request tries again."""
        for attempt in range(2):
            conn = self._reopened(conn)
            try:
                conn.execute("BEGIN IMMEDIATE" if immediate else "BEGIN")
                return conn
            except DatabaseUnavailable:
                if attempt or not conn.broken:
                    raise
        raise AssertionError("unreachable")

    def _reopened(self, conn: Connection) -> Connection:
        """``conn``, or a new connection in its place when the server dropped it (never after :meth:`close`:
        what runs after the bridge was closed fails, as on SQLite, instead of opening connections nobody closes)."""
        if not conn.broken:
            return conn
        if self._closed:
            raise DatabaseError("The database connections were closed.")
        fresh = connect(self.target)
        log.warning("database: a dropped connection was opened again (%s)", fresh.filename)
        with contextlib.suppress(Exception):
            conn.close()
        return fresh

    def close(self) -> None:
        """Close every connection; the writer last, so that it can checkpoint the WAL."""
        if self._closed:
            return
        self._closed = True
        for conn in self._readers:
            conn.close()
        if self.dialect == "sqlite":
            with contextlib.suppress(apsw.Error):
                self._writer.execute("PRAGMA optimize")
        self._writer.close()


def backup_to(conn: Connection, path: str | os.PathLike[str]) -> None:
    """Copy the database behind ``conn`` to a new file at ``path`` with SQLite's online backup API.

    One step copies every page under one read transaction: a consistent snapshot, taken while other
    connections (the running server) go on writing, since readers never block writers in WAL mode.
    """
    dest = apsw.Connection(str(path))
    try:
        with dest.backup("main", cast(apsw.Connection, conn), "main") as backup:
            backup.step(-1)
    finally:
        dest.close()


def integrity_check(conn: Connection) -> str:
    """"ok", or what is wrong with the database's own structures. SQLite checks every page and index;
    PostgreSQL keeps its pages checksummed and its indexes consistent itself, so there the answer is whether the
    schema is readable and no index is left invalid (a ``CREATE INDEX CONCURRENTLY`` that failed half-way leaves one
    that queries silently stop using and that no longer enforces its uniqueness)."""
    if conn.dialect == "postgresql":
        check(conn)
        invalid = [r["name"] for r in conn.execute(
            "SELECT c.relname AS name FROM pg_index i JOIN pg_class c ON c.oid = i.indexrelid "
            "JOIN pg_namespace n ON n.oid = c.relnamespace WHERE NOT (i.indisvalid AND i.indisready) "
            "AND n.nspname NOT IN ('pg_catalog', 'information_schema') ORDER BY c.relname")]
        return "ok" if not invalid else "invalid index " + ", ".join(invalid) + " (drop it, or REINDEX it)"
    return "; ".join(r["integrity_check"] for r in conn.execute("PRAGMA integrity_check"))


def check(conn: Connection) -> None:
    """A cheap liveness check for ``/healthz``: the file is readable and the schema is there."""
    conn.execute("SELECT count(*) FROM galleries").fetchall()
