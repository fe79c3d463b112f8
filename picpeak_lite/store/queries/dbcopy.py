"""SQL for copying a whole library between the engines (``ops/dbmove.py``): the schema's own description of its
tables, each table's rows read in key order and written in batches, the counters that give the next ids, and the
mark a copy in progress leaves in its target.

Table and column names are never taken from outside: they come from :func:`describe` (SQLite's own catalogue of a
schema made by ``schema.migrate``), and :func:`_name` refuses anything that is not a plain identifier before it is
put into a statement.
"""

from __future__ import annotations

import re
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

from picpeak_lite.store.db import Connection, Row

#: What a copy in progress leaves in its target: which source it comes from. Removed once the copy is verified, so
#: a target that holds rows but no mark (or another source's) is a library of its own and is not written to.
MARK_TABLE = "picpeak_copy_in_progress"

_IDENTIFIER = re.compile(r"[a-z_][a-z0-9_]*")


def _name(name: str) -> str:
    if not _IDENTIFIER.fullmatch(name):
        raise ValueError(f"not a table or column name of ours: {name!r}")
    return name


@dataclass(frozen=True)
class Column:
    name: str
    kind: str  # the declared SQLite type: INTEGER, REAL, TEXT or BLOB
    not_null: bool


@dataclass(frozen=True)
class Table:
    name: str
    columns: tuple[Column, ...]
    key: tuple[str, ...]  # the primary key's columns, in order; () for the counter table
    references: tuple[tuple[str, str, bool], ...]  # (column, table it references, column is NOT NULL)

    @property
    def integer_key(self) -> str | None:
        """The one INTEGER column of the primary key, if that is what it is (an id, a seq, a photo_id)."""
        if len(self.key) == 1 and self.column(self.key[0]).kind == "INTEGER":
            return self.key[0]
        return None

    def column(self, name: str) -> Column:
        return next(c for c in self.columns if c.name == name)


def describe(conn: Connection) -> list[Table]:
    """Every table of a SQLite database (made by ``schema.migrate``), as SQLite's catalogue describes it."""
    tables = []
    names = [r["name"] for r in conn.execute(
        "SELECT name FROM sqlite_master WHERE type = 'table' AND name NOT LIKE 'sqlite_%' ORDER BY name")]
    for name in names:
        info = conn.execute(f"PRAGMA table_info({_name(name)})").fetchall()
        columns = tuple(Column(r["name"], r["type"].upper(), bool(r["notnull"])) for r in info)
        key = tuple(r["name"] for r in sorted((r for r in info if r["pk"]), key=lambda r: r["pk"]))
        not_null = {c.name: c.not_null for c in columns}
        references = tuple((r["from"], r["table"], not_null[r["from"]])
                           for r in conn.execute(f"PRAGMA foreign_key_list({_name(name)})"))
        tables.append(Table(name, columns, key, references))
    return tables


def schema_version(conn: Connection) -> int | None:
    """The schema version the database holds: 0 when it holds no tables at all (a new, empty database), None when
    it holds tables but no picpeak-lite schema."""
    if conn.dialect == "sqlite":
        version = conn.execute("PRAGMA user_version").fetchall()[0]["user_version"]
        if version:
            return int(version)
        tables = conn.execute("SELECT count(*) AS n FROM sqlite_master WHERE type = 'table'").fetchall()[0]["n"]
        return 0 if tables == 0 else None
    has_schema = conn.execute("SELECT to_regclass('picpeak_schema') IS NOT NULL AS found").fetchall()[0]["found"]
    if has_schema:
        rows = conn.execute("SELECT application, version FROM picpeak_schema").fetchall()
        if rows and rows[0]["application"] == "picpeak-lite":
            return int(rows[0]["version"])
    tables = conn.execute("SELECT count(*) AS n FROM information_schema.tables "
                          "WHERE table_schema = current_schema()").fetchall()[0]["n"]
    return 0 if tables == 0 else None


def column_names(conn: Connection, table: str) -> set[str]:
    """The columns the table has on this engine."""
    if conn.dialect == "sqlite":
        return {r["name"] for r in conn.execute(f"PRAGMA table_info({_name(table)})")}
    return {r["column_name"] for r in conn.execute(
        "SELECT column_name FROM information_schema.columns WHERE table_schema = current_schema() "
        "AND table_name = ?", (table,))}


def count(conn: Connection, table: str) -> int:
    return int(conn.execute(f"SELECT count(*) AS n FROM {_name(table)}").fetchall()[0]["n"])


def max_key(conn: Connection, table: str, column: str) -> int:
    """The highest value of an integer key column, 0 for an empty table."""
    rows = conn.execute(f"SELECT coalesce(max({_name(column)}), 0) AS top FROM {_name(table)}").fetchall()
    return int(rows[0]["top"])


def rows_after(conn: Connection, table: Table, columns: Sequence[str], after: tuple[Any, ...] | None,
               limit: int) -> list[Row]:
    """The next ``limit`` rows in primary-key order, after the key ``after`` (from the start when None); a table
    without a key is read whole. Keyset paging (a row-value comparison, which both engines have) costs the same
    for the last page as for the first."""
    select = ", ".join(_name(c) for c in columns)
    if not table.key:
        return conn.execute(f"SELECT {select} FROM {_name(table.name)}").fetchall()
    key = ", ".join(_name(c) for c in table.key)
    if after is None:
        return conn.execute(f"SELECT {select} FROM {_name(table.name)} ORDER BY {key} LIMIT ?", (limit,)).fetchall()
    marks = ", ".join("?" for _ in table.key)
    where = f"({key}) > ({marks})" if len(table.key) > 1 else f"{key} > ?"
    return conn.execute(f"SELECT {select} FROM {_name(table.name)} WHERE {where} ORDER BY {key} LIMIT ?",
                        (*after, limit)).fetchall()


def each_batch(conn: Connection, table: Table, columns: Sequence[str], limit: int,
               after: tuple[Any, ...] | None = None) -> Iterator[list[Row]]:
    """Every row after ``after``, ``limit`` at a time (a keyless table in one batch)."""
    while True:
        rows = rows_after(conn, table, columns, after, limit)
        if rows:
            yield rows
        if not table.key or len(rows) < limit:
            return
        after = tuple(rows[-1][c] for c in table.key)


def insert_rows(conn: Connection, table: str, columns: Sequence[str], rows: Sequence[Sequence[Any]]) -> None:
    """The rows in one statement: ``COPY`` on PostgreSQL, one multi-row INSERT on SQLite (the caller keeps rows x
    columns under SQLite's 32,766 parameters)."""
    if not rows:
        return
    if conn.dialect == "postgresql":
        from picpeak_lite.store.pg import PgConnection

        assert isinstance(conn, PgConnection)
        conn.copy_rows(_name(table), [_name(c) for c in columns], rows)
        return
    names = ", ".join(_name(c) for c in columns)
    row_marks = "(" + ", ".join("?" for _ in columns) + ")"
    values = ", ".join(row_marks for _ in rows)
    conn.execute(f"INSERT INTO {_name(table)} ({names}) VALUES {values}", [v for row in rows for v in row])


def delete_all(conn: Connection, table: str) -> None:
    conn.execute(f"DELETE FROM {_name(table)}")


def set_column(conn: Connection, table: str, key: str, column: str, pairs: Sequence[tuple[Any, Any]]) -> None:
    """``column = value`` on each row ``key = id`` of ``pairs`` ((id, value), ...)."""
    for row_id, value in pairs:
        conn.execute(f"UPDATE {_name(table)} SET {_name(column)} = ? WHERE {_name(key)} = ?", (value, row_id))


def not_null_values(conn: Connection, table: str, key: str, column: str) -> list[tuple[Any, Any]]:
    """(key, value) of every row whose ``column`` is set."""
    return [(r["k"], r["v"]) for r in conn.execute(
        f"SELECT {_name(key)} AS k, {_name(column)} AS v FROM {_name(table)} WHERE {_name(column)} IS NOT NULL "
        f"ORDER BY {_name(key)}")]


class Triggers:
    """The table's own triggers held off while copied rows are written (in the caller's transaction): they would
    log each copied photo as a new change, mark approved guest photos awaiting approval again, or take ids from the
    counter. On PostgreSQL ``DISABLE TRIGGER USER`` (foreign keys are still checked: they are system triggers);
    SQLite has no such switch, so its triggers are dropped and made again from their own text. Both are DDL inside
    the transaction: a rollback brings the triggers back as they were."""

    def __init__(self, conn: Connection, table: str) -> None:
        self.conn = conn
        self.table = _name(table)
        self.saved: list[str] = []

    def __enter__(self) -> Triggers:
        if self.conn.dialect == "postgresql":
            self.conn.execute(f"ALTER TABLE {self.table} DISABLE TRIGGER USER")
            return self
        rows = self.conn.execute("SELECT name, sql FROM sqlite_master WHERE type = 'trigger' AND tbl_name = ? "
                                 "ORDER BY rowid", (self.table,)).fetchall()
        for row in rows:
            self.conn.execute(f"DROP TRIGGER {_name(row['name'])}")
            self.saved.append(row["sql"])
        return self

    def __exit__(self, kind: object, error: object, traceback: object) -> None:
        if kind is not None:
            return  # the transaction is rolled back, and the triggers with it
        if self.conn.dialect == "postgresql":
            self.conn.execute(f"ALTER TABLE {self.table} ENABLE TRIGGER USER")
        for sql in self.saved:
            self.conn.execute(sql)


def counter(conn: Connection, table: str, column: str) -> int:
    """The last value the engine handed out for an integer key column that never gives an id twice: PostgreSQL's
    identity sequence, SQLite's ``sqlite_sequence`` (AUTOINCREMENT); 0 when there is none or it was never used."""
    if conn.dialect == "postgresql":
        rows = conn.execute("SELECT pg_get_serial_sequence(?, ?) AS seq", (table, column)).fetchall()
        if not rows or rows[0]["seq"] is None:
            return 0
        value = conn.execute("SELECT pg_sequence_last_value(?::regclass) AS v", (rows[0]["seq"],)).fetchall()
        return int(value[0]["v"] or 0)
    has_sequence = conn.execute(
        "SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = 'sqlite_sequence'").fetchall()
    if not has_sequence:
        return 0
    rows = conn.execute("SELECT seq FROM sqlite_sequence WHERE name = ?", (table,)).fetchall()
    return int(rows[0]["seq"]) if rows else 0


def set_counter(conn: Connection, table: str, column: str, last: int) -> None:
    """Make the next id the engine hands out ``last + 1`` or more: a PostgreSQL identity sequence is set to
    ``last`` (left unused when 0); SQLite's ``sqlite_sequence`` row of an AUTOINCREMENT table is raised to it.
    An ordinary SQLite INTEGER PRIMARY KEY needs nothing: it takes max(id) + 1."""
    if conn.dialect == "postgresql":
        rows = conn.execute("SELECT pg_get_serial_sequence(?, ?) AS seq", (table, column)).fetchall()
        if rows and rows[0]["seq"] is not None:
            if last > 0:
                conn.execute("SELECT setval(?::regclass, ?, true)", (rows[0]["seq"], last))
            else:
                conn.execute("SELECT setval(?::regclass, 1, false)", (rows[0]["seq"],))
        return
    autoincrement = conn.execute(
        "SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = ? AND sql LIKE '%AUTOINCREMENT%'",
        (table,)).fetchall()
    if not autoincrement or last <= 0:
        return
    if conn.execute("SELECT 1 FROM sqlite_sequence WHERE name = ?", (table,)).fetchall():
        conn.execute("UPDATE sqlite_sequence SET seq = max(seq, ?) WHERE name = ?", (last, table))
    else:
        conn.execute("INSERT INTO sqlite_sequence (name, seq) VALUES (?, ?)", (table, last))


def mark_source(conn: Connection) -> str | None:
    """The source named by the mark of a copy in progress, or None when there is no mark."""
    if conn.dialect == "postgresql":
        found = conn.execute("SELECT to_regclass(?) IS NOT NULL AS found", (MARK_TABLE,)).fetchall()[0]["found"]
    else:
        found = bool(conn.execute("SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = ?",
                                  (MARK_TABLE,)).fetchall())
    if not found:
        return None
    rows = conn.execute(f"SELECT source FROM {MARK_TABLE}").fetchall()
    return str(rows[0]["source"]) if rows else ""


def set_mark(conn: Connection, source: str, now: float) -> None:
    conn.execute(f"CREATE TABLE {MARK_TABLE} (source TEXT NOT NULL, started_at REAL NOT NULL)")
    conn.execute(f"INSERT INTO {MARK_TABLE} (source, started_at) VALUES (?, ?)", (source, now))


def drop_mark(conn: Connection) -> None:
    conn.execute(f"DROP TABLE IF EXISTS {MARK_TABLE}")
