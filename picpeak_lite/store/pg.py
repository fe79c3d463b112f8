"""PostgreSQL connections: the one home of psycopg.

picpeak-lite's SQL is written once, for both engines, with SQLite's ``?`` placeholders (``store/queries/``). A
:class:`PgConnection` gives psycopg the same face that ``store/db.py`` gives apsw (:class:`db.Connection`), so
every ``fn(conn, ...)`` runs unchanged on either engine:

* ``?`` becomes ``%s``, ``:name`` becomes ``%(name)s`` and a literal ``%`` becomes ``%%``, outside quoted strings
  and identifiers, once per distinct statement (cached). Values are bound client-side (psycopg's ``ClientCursor``):
  a ``NULL`` or a number in any position has a type PostgreSQL can infer, as it does in SQLite, and a script of
  several statements (the schema) runs in one call.
* Rows are dicts keyed by column name. The two result types SQLite does not have are loaded as SQLite gives them:
  ``numeric`` (what ``sum`` and ``avg`` of integers return) as an int when it is whole, else a float, and
  ``boolean`` (a comparison selected as a value) as 0 or 1; a Python bool is bound as 0 or 1. No column of ours is
  of either type.
* ``changes()`` is the number of rows the last statement touched. ``last_insert_rowid()`` has no equivalent:
  queries use ``RETURNING id``.
* Unique, foreign-key and check violations raise :class:`ConstraintError` (a subclass of ``db.ConstraintError``,
  which callers catch), and a full disk raises ``InsufficientStorage``, as with SQLite.

The connection runs in autocommit mode: ``db.transaction`` opens and ends each transaction with explicit
statements, as it does on SQLite (``BEGIN IMMEDIATE`` is read as ``BEGIN``: PostgreSQL has no database-wide
write lock; where correctness needs one writer at a time a named lock says so, see ``store/locks.py``).
"""

from __future__ import annotations

import contextlib
import functools
import re
from collections.abc import Iterable, Iterator, Sequence
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import psycopg
from psycopg import errors as pg_errors
from psycopg import sql
from psycopg.adapt import Loader
from psycopg.pq import ConnStatus, TransactionStatus
from psycopg.rows import dict_row
from psycopg.types.numeric import Int8Dumper

from picpeak_lite.errors import DatabaseError, DatabaseUnavailable, InsufficientStorage
from picpeak_lite.store import db

URL_SCHEMES = ("postgresql://", "postgres://")
CONNECT_TIMEOUT_SECONDS = 10
# How a connection notices that the database's host is gone without a word (a cut network, a host that died),
# so that the call waiting on it fails (DatabaseUnavailable: the request is told 503, a background task starts
# again) and the next call opens a new connection, instead of waiting on the old one for TCP's retransmissions.
# After a 30 s cut, a host could stay idle for another 30 s (a call sent during the cut waits for TCP's next
# retransmission, as does a notification sent to its LISTEN connection), while the others, woken at once, took
# all the work. Keepalive probes go out after KEEPALIVE_IDLE_SECONDS without a byte received (a query waiting for its
# answer too: a slow query's server still answers the probes) and end the connection after KEEPALIVE_COUNT
# unanswered ones, KEEPALIVE_INTERVAL_SECONDS apart; sent data unacknowledged for TCP_USER_TIMEOUT_MS ends it
# likewise. So a dead peer is found within about 20 s, and a slow one is not mistaken for it.
KEEPALIVE_IDLE_SECONDS = 5
KEEPALIVE_INTERVAL_SECONDS = 5
KEEPALIVE_COUNT = 3
TCP_USER_TIMEOUT_MS = 20_000
LIVENESS: dict[str, Any] = {"keepalives": 1, "keepalives_idle": KEEPALIVE_IDLE_SECONDS,
                            "keepalives_interval": KEEPALIVE_INTERVAL_SECONDS, "keepalives_count": KEEPALIVE_COUNT,
                            "tcp_user_timeout": TCP_USER_TIMEOUT_MS}


def is_url(target: object) -> bool:
    return isinstance(target, str) and target.startswith(URL_SCHEMES)


def redact(url: str) -> str:
    """The URL without its password, for messages and logs."""
    parts = urlsplit(url)
    if parts.password is None:
        return url
    netloc = parts.netloc.rsplit("@", 1)
    return urlunsplit(parts._replace(netloc=netloc[0].split(":", 1)[0] + ":***@" + netloc[1]))


class ConstraintError(db.ConstraintError):
    """A constraint PostgreSQL refused, raised as the SQLite error callers already catch."""


class _NumericLoader(Loader):
    def load(self, data: Any) -> int | float:
        text = bytes(data).decode()
        if text.lstrip("-").isdigit():
            return int(text)
        return float(text)


class _BooleanLoader(Loader):
    def load(self, data: Any) -> int:
        return 1 if bytes(data) == b"t" else 0


# A token of SQL that may hold a ? or % that is not a placeholder (strings, quoted names, comments), or one that is.
_TOKENS = re.compile(r"""'(?:[^']|'')*'|"(?:[^"]|"")*"|--[^\n]*|/\*.*?\*/|\?|%|(?<!:):(?!:)[A-Za-z_]\w*""", re.DOTALL)


@functools.lru_cache(maxsize=2048)
def translate(sql: str) -> str:
    """SQLite-style SQL as psycopg wants it: ``?`` -> ``%s``, ``:name`` -> ``%(name)s`` (values given as a dict)
    and ``%`` -> ``%%`` outside quotes and comments (a ``::`` cast is left alone); ``BEGIN IMMEDIATE`` ->
    ``BEGIN``."""
    if sql == "BEGIN IMMEDIATE":
        return "BEGIN"

    def replace(match: re.Match[str]) -> str:
        token = match.group(0)
        if token == "?":
            return "%s"
        if token == "%":
            return "%%"
        if token.startswith(":"):
            return f"%({token[1:]})s"
        return token.replace("%", "%%") if token.startswith("'") else token

    return _TOKENS.sub(replace, sql)


class PgCursor:
    """A psycopg cursor read the way apsw's is: a statement without a result reads as no rows."""

    def __init__(self, cursor: psycopg.Cursor[Any]) -> None:
        self._cursor = cursor

    def fetchall(self) -> list[db.Row]:
        return self._cursor.fetchall() if self._cursor.description is not None else []

    def fetchone(self) -> db.Row | None:
        return self._cursor.fetchone() if self._cursor.description is not None else None

    def __iter__(self) -> Iterator[db.Row]:
        return iter(self.fetchall())

    def __next__(self) -> db.Row:
        row = self.fetchone()
        if row is None:
            raise StopIteration
        return row


@contextlib.contextmanager
def _translated(disk_full: str) -> Iterator[None]:
    """psycopg's errors as the callers of ``db.Connection`` catch them (as apsw's are in ``db.transaction``): a
    constraint violation, a full disk (``disk_full`` is the sentence the client gets), a server that did not
    answer."""
    try:
        yield
    except pg_errors.IntegrityError as error:
        raise ConstraintError(str(error).strip()) from error
    except pg_errors.DiskFull as error:
        raise InsufficientStorage(disk_full) from error
    except psycopg.OperationalError as error:
        raise DatabaseUnavailable(f"The database server did not answer: {str(error).strip()}") from error


class PgConnection:
    """One psycopg connection behind ``db.Connection``'s methods."""

    dialect = "postgresql"

    def __init__(self, url: str) -> None:
        self.url = url
        self._conn = psycopg.connect(url, autocommit=True, row_factory=dict_row,
                                     cursor_factory=psycopg.ClientCursor, connect_timeout=CONNECT_TIMEOUT_SECONDS,
                                     **LIVENESS)
        self._conn.adapters.register_loader("numeric", _NumericLoader)
        self._conn.adapters.register_loader("bool", _BooleanLoader)
        self._conn.adapters.register_dumper(bool, Int8Dumper)  # True is 1, as SQLite stores it
        self._changes = 0

    @property
    def in_transaction(self) -> bool:
        return self._conn.info.transaction_status != TransactionStatus.IDLE

    @property
    def filename(self) -> str:
        return redact(self.url)

    @property
    def broken(self) -> bool:
        """The server dropped this connection (it restarted, the network was cut): only a new one will do."""
        return self._conn.broken or self._conn.closed

    @property
    def raw(self) -> psycopg.Connection[dict[str, Any]]:
        """The psycopg connection itself, for what only PostgreSQL has (LISTEN, COPY)."""
        return self._conn

    def execute(self, statements: str, bindings: Any = None) -> PgCursor:
        if isinstance(statements, db.Prepared):
            return self._execute_prepared(statements, bindings)
        cursor = self._conn.cursor()
        # Without values psycopg reads no placeholders, so a % must then stay as it is.
        query = translate(statements) if bindings else ("BEGIN" if statements == "BEGIN IMMEDIATE" else statements)
        with _translated("The database server's disk is full; the photo was not saved."):
            cursor.execute(query, bindings or None)
        self._changes = max(cursor.rowcount, 0)
        return PgCursor(cursor)

    def _execute_prepared(self, statement: db.Prepared, bindings: Any) -> PgCursor:
        """A :class:`db.Prepared` statement: a server-side prepared statement of this connection (made on its first
        use), with its values bound by the server; every int is sent as a bigint (psycopg would pick the smallest
        type that holds the value, and so plan the statement once per size)."""
        cursor = psycopg.Cursor(self._conn)
        cursor.adapters.register_dumper(int, Int8Dumper)
        with _translated("The database server's disk is full; the photo was not saved."):
            cursor.execute(translate(statement) if bindings else statement, bindings or None, prepare=True)
        self._changes = max(cursor.rowcount, 0)
        return PgCursor(cursor)

    def copy_rows(self, table: str, columns: Sequence[str], rows: Iterable[Sequence[Any]]) -> None:
        """Write many rows with ``COPY ... FROM STDIN`` (in the caller's transaction): what the database move
        (``ops/dbmove.py``) writes with, many times faster than an INSERT of as many values."""
        statement = sql.SQL("COPY {} ({}) FROM STDIN").format(
            sql.Identifier(table), sql.SQL(", ").join(sql.Identifier(c) for c in columns))
        with _translated("The database server's disk is full."), self._conn.cursor() as cursor, \
                cursor.copy(statement) as copy:
            for row in rows:
                copy.write_row(row)

    def changes(self) -> int:
        return self._changes

    def last_insert_rowid(self) -> int:
        raise NotImplementedError("PostgreSQL has no last_insert_rowid: use INSERT ... RETURNING id")

    def close(self, force: bool = False) -> None:
        self._conn.close()


def connect(url: str) -> PgConnection:
    try:
        return PgConnection(url)
    except psycopg.OperationalError as error:
        raise DatabaseUnavailable(f"cannot connect to the database at {redact(url)}: {str(error).strip()}") from None


class Notifications:
    """A connection of its own that LISTENs on ``channels`` (``events/listener.py`` is its one user).

    Opened (``LISTEN`` issued) by the constructor, which blocks: call it in a thread. Then the caller waits
    until :meth:`fileno` is readable (in trio, without a thread) and calls :meth:`take`, which does not block:
    libpq reads what the socket holds and hands over the notifications in it. A connection that was closed or
    broken raises :class:`DatabaseError` from :meth:`take`; the caller opens a new one."""

    def __init__(self, url: str, channels: tuple[str, ...]) -> None:
        try:
            self._conn = psycopg.connect(url, autocommit=True, connect_timeout=CONNECT_TIMEOUT_SECONDS, **LIVENESS,
                                         application_name="picpeak-lite listener")  # so pg_stat_activity names it
        except psycopg.OperationalError as error:
            raise DatabaseError(f"cannot connect to the database at {redact(url)}: {str(error).strip()}") from None
        try:
            for channel in channels:
                self._conn.execute(sql.SQL("LISTEN {}").format(sql.Identifier(channel)))
            self._fileno = self._conn.pgconn.socket
        except psycopg.Error as error:
            self._conn.close()
            raise DatabaseError(f"could not listen for notifications: {str(error).strip()}") from None

    @property
    def backend_pid(self) -> int:
        """The server process behind this connection (what ``pg_terminate_backend`` takes)."""
        return self._conn.info.backend_pid

    def fileno(self) -> int:
        return self._fileno

    def take(self) -> set[str]:
        """The channels notified since the last call (empty when the socket held something else). Never blocks."""
        pgconn = self._conn.pgconn
        try:
            pgconn.consume_input()
        except psycopg.OperationalError as error:
            raise DatabaseError(f"the listening connection was lost ({' '.join(str(error).split())})") from None
        channels: set[str] = set()
        while (notify := pgconn.notifies()) is not None:
            channels.add(notify.relname.decode())
        if pgconn.status != ConnStatus.OK:
            raise DatabaseError("the listening connection was lost")
        return channels

    def close(self) -> None:
        self._conn.close()
