"""``picpeak-lite db migrate --to URL``: move a library's database from the engine in force to the other one.

SQLite -> PostgreSQL (``--to postgresql://...``) and back (``--to sqlite``, ``sqlite:///path`` or a path, which
must be the data directory's own database file: picpeak-lite reads SQLite nowhere else). The photos stay where
they are (``storage migrate`` moves those).

How:

* Both sides at the current schema version. The source must already be (the server upgrades it when it starts;
  the source is only read, and is left exactly as it was). The target is an empty database (or a file that does
  not exist yet): it gets the schema from the target engine's own code (``store/schema.py`` / ``schema_pg.py``).
  A target at another version, or holding tables that are not ours, is refused.
* What is copied: every table of the schema, the change log, the outboxes, sessions and the other short-lived
  tables included. A library is its whole database: a webhook or an email still queued is delivered from the new
  engine, a guest's session and favourites survive, and the change log's sequence numbers (which the browsers'
  live feeds resume from) go on from where they were. Leaving any of them out would change what the server does
  after the move, and they are small next to the photos.
* Table by table in foreign-key order (the one cycle, a gallery's cover photo, is copied empty and filled in once
  the photos are there), in batches, each batch its own transaction, with the table's triggers held off meanwhile
  (``queries.dbcopy.Triggers``): the rows are copied as they are, with their ids, and the triggers must not log
  them as new changes or mark them again.
* Resumable: an interrupted run (Ctrl-C, a lost connection) is simply started again. A table with an integer
  key (an id, the change log's seq) goes on after the highest key the target has; a table with another key
  (uploads, favourites, settings...) is copied whole in one transaction, so it is either all there (kept) or not
  at all; the counter table (no key) is replaced whole. The target carries a mark naming its source while a copy
  is under way (``queries.dbcopy.MARK_TABLE``), so a run goes on only with its own copy: a target that holds rows
  without the mark (another library, or the copy an earlier move left behind) is refused and never written to.
* The counters that give the next ids are set past the copied ones: PostgreSQL's identity sequences (from the
  highest id, or the source's own counter where that is higher), SQLite's ``sqlite_sequence`` of the change log;
  the photos' id counter (``photo_id_counter``, used by ``queries.photos.insert_photo`` on SQLite and by the
  ``photos_take_id`` trigger on PostgreSQL) is copied as a row.
* Verified: per table the row count and a checksum over every row's values, computed in Python from the rows as
  each engine's ``db.Connection`` returns them (each value normalised by its column's declared type, so an
  integer-valued REAL reads the same on both; a row's digest is independent of the order rows come in, as
  text sorts differently on the two engines), must match; else the command fails naming the tables that differ.
* Only then is the mark removed and ``database_url`` switched in the config file (as ``storage migrate`` switches
  ``storage``).

The server (and any ``picpeak-lite worker``) must be stopped meanwhile, and the command refuses to start while
the server answers on its address: whatever it wrote during the copy would be missing from the new database.
"""

from __future__ import annotations

import hashlib
import json
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from picpeak_lite.config import Settings
from picpeak_lite.errors import AppError, CommandFailed, ConfigError
from picpeak_lite.ops.migrate import refuse_if_serving, set_setting
from picpeak_lite.store import db, schema
from picpeak_lite.store.queries import dbcopy
from picpeak_lite.store.queries.dbcopy import Table

Progress = Callable[[int, int, str], None]
#: Rows per batch; fewer for wide tables, so that rows x columns stays under SQLite's 32,766 parameters.
BATCH_ROWS = 1000
MAX_PARAMETERS = 30_000
SERVER_RUNNING = ("the server is answering at {address}: stop it (and any `picpeak-lite worker`) first. Whatever it "
                  "wrote during the copy would be missing from the new database.")


@dataclass
class MoveSummary:
    source: str = ""
    target: str = ""
    tables: int = 0
    rows: int = 0  # rows in the library (all verified)
    copied: int = 0  # rows this run wrote (fewer than rows when it went on from an interrupted run)
    seconds: float = 0.0
    switched: str | None = None  # the config file whose database_url was set
    digests: dict[str, tuple[int, str]] = field(default_factory=dict)


def move(settings: Settings, to: str, config_file: Path | None, progress: Progress | None = None,
         *, check_server: bool = True, batch_rows: int = BATCH_ROWS) -> MoveSummary:
    """Copy the library's database to ``to``, verify it, and switch ``database_url`` (see the module's text)."""
    started = time.monotonic()
    source_engine = "postgresql" if settings.database_url else "sqlite"
    target, target_engine, setting = _target(settings, to)
    if target_engine == source_engine:
        raise ConfigError(f"the library is already on {_engine_name(source_engine)}; --to must name the other "
                          "engine (postgresql://... or sqlite)")
    if source_engine == "sqlite" and not settings.database_path.exists():
        raise ConfigError(f"no database in {str(settings.data_path)!r}; is --data-dir right?")
    if config_file is None:
        raise ConfigError(f"there is no config file to switch: run the command with --config (the file that will "
                          f"say database_url = {setting})")
    if check_server:
        refuse_if_serving(settings, SERVER_RUNNING)
    tables, deferred = plan()
    summary = MoveSummary(source=_describe(settings.database), target=_describe(target), tables=len(tables))
    try:
        source = db.connect(settings.database)
        try:
            conn = db.connect(target)
        except BaseException:
            source.close()
            raise
    except AppError as error:
        raise CommandFailed(error.message) from None
    try:
        _check_source(source, summary.source)
        _prepare_target(conn, tables, summary)
        for table in tables:
            _check_columns(source, conn, table, summary)
        with db.transaction(source, immediate=False):  # one read: the server is stopped, nothing changes
            total = sum(dbcopy.count(source, t.name) for t in tables)
            done = _copy(source, conn, tables, deferred, total, progress, batch_rows)
        summary.rows = total
        summary.copied = done.copied
        _set_counters(source, conn, tables)
        _verify(source, conn, tables, summary, progress, total, batch_rows)
        with db.transaction(conn):
            dbcopy.drop_mark(conn)
    except AppError as error:
        raise CommandFailed(f"{error.message}; the database_url setting was not changed: run the command again to "
                            "go on from there") from None
    except db.ConstraintError as error:  # a row written into the target by something else between two runs
        reason = str(error).strip().splitlines()[0]
        raise CommandFailed(f"{summary.target} refused a copied row ({reason}); the database_url setting was not "
                            "changed: empty the target and run the command again") from None
    finally:
        conn.close()
        source.close()
    summary.switched = set_setting(config_file, "database_url", setting)
    summary.seconds = time.monotonic() - started
    return summary


def plan() -> tuple[list[Table], dict[str, set[str]]]:
    """The schema's tables in an order that copies every referenced row before the rows that refer to it (read
    from a scratch SQLite database made by ``schema.migrate``: the one description both engines' schemas follow,
    column by column, tests/test_schema_pg.py). A cycle of references is broken at a column that may be NULL;
    that column is copied as NULL and filled in after every table is copied (the second value: table -> columns)."""
    scratch = db.connect(":memory:")
    try:
        schema.migrate(scratch)
        tables = {t.name: t for t in dbcopy.describe(scratch)}
    finally:
        scratch.close()
    needs = {name: {(col, ref, not_null) for col, ref, not_null in t.references if ref != name}
             for name, t in tables.items()}
    ordered: list[Table] = []
    deferred: dict[str, set[str]] = {}
    while needs:
        placed = {t.name for t in ordered}
        ready = sorted(n for n, refs in needs.items() if all(ref in placed for _, ref, _ in refs))
        if not ready:
            # A cycle: leave out the first reference that may be NULL, and fill that column in later.
            name, col, ref = min((n, c, r) for n, refs in needs.items() for c, r, nn in refs
                                 if not nn and c not in tables[n].key and _reaches(needs, r, n))
            needs[name] = {e for e in needs[name] if e[:2] != (col, ref)}
            deferred.setdefault(name, set()).add(col)
            continue
        for name in ready:
            ordered.append(tables[name])
            del needs[name]
    return ordered, deferred


def _reaches(needs: dict[str, set[tuple[str, str, bool]]], start: str, goal: str) -> bool:
    """Whether ``start`` refers to ``goal``, directly or through other tables still to be placed."""
    seen, todo = set(), [start]
    while todo:
        name = todo.pop()
        if name == goal:
            return True
        if name not in seen:
            seen.add(name)
            todo.extend(ref for _, ref, _ in needs.get(name, ()))
    return False


def _rows(n: int) -> str:
    return f"{n} row" if n == 1 else f"{n} rows"


def _engine_name(engine: str) -> str:
    return "PostgreSQL" if engine == "postgresql" else "SQLite"


def _target(settings: Settings, to: str) -> tuple[str, str, str]:
    """(what to connect to, its engine, the database_url setting in TOML) for ``--to``."""
    if to.startswith(("postgresql://", "postgres://")):
        return to, "postgresql", json.dumps(to)
    path = settings.database_path if to == "sqlite" else db.sqlite_path(to)
    assert path is not None
    if path.expanduser().resolve() != settings.database_path.resolve():
        raise ConfigError(f"picpeak-lite reads its SQLite database only at {settings.database_path} (in data_dir); "
                          "give --to sqlite or that path")
    return str(settings.database_path), "sqlite", '""'


def _describe(target: str) -> str:
    """The database for messages: a file's path, or a URL without its password."""
    if db.sqlite_path(target) is not None:
        return target
    from picpeak_lite.store import pg

    return pg.redact(target)


def _check_source(conn: db.Connection, name: str) -> None:
    version = dbcopy.schema_version(conn)
    if version is None or version == 0:
        raise ConfigError(f"{name} holds no picpeak-lite library")
    if version > schema.SCHEMA_VERSION:
        raise ConfigError(f"the database {name} has schema version {version}, newer than this picpeak-lite "
                          f"understands ({schema.SCHEMA_VERSION}); upgrade picpeak-lite first")
    if version < schema.SCHEMA_VERSION:
        raise ConfigError(f"the database {name} has schema version {version}, older than this picpeak-lite's "
                          f"({schema.SCHEMA_VERSION}): start the server once on it (it upgrades the schema), stop "
                          "it, then run this again")


def _prepare_target(conn: db.Connection, tables: list[Table], summary: MoveSummary) -> None:
    """Give an empty target the schema and the mark; go on with a copy from this source; refuse anything else."""
    version = dbcopy.schema_version(conn)
    if version is None:
        raise ConfigError(f"{summary.target} holds tables that are not picpeak-lite's; give an empty database")
    if version == 0:
        schema.migrate(conn)
    elif version != schema.SCHEMA_VERSION:
        raise ConfigError(f"{summary.target} holds a picpeak-lite database of schema version {version}, not "
                          f"{schema.SCHEMA_VERSION}; give an empty database")
    mark = dbcopy.mark_source(conn)
    if mark == summary.source:
        return
    if mark is not None:
        raise ConfigError(f"{summary.target} holds an unfinished copy of another database ({mark}); give an empty "
                          "database")
    for table in tables:
        if table.key and (rows := dbcopy.count(conn, table.name)):
            raise ConfigError(f"{summary.target} already holds a library ({_rows(rows)} in {table.name}); it is not "
                              "written over: give an empty database (or move the file aside: it may be the copy "
                              "an earlier move left behind)")
    with db.transaction(conn):
        dbcopy.set_mark(conn, summary.source, time.time())


def _check_columns(source: db.Connection, target: db.Connection, table: Table, summary: MoveSummary) -> None:
    expected = {c.name for c in table.columns}
    for conn, name in ((source, summary.source), (target, summary.target)):
        found = dbcopy.column_names(conn, table.name)
        if found != expected:
            raise ConfigError(f"{name}'s table {table.name} does not have the columns this picpeak-lite's schema "
                              f"gives it ({', '.join(sorted(found ^ expected))} differ)")


@dataclass
class _Done:
    rows: int = 0  # rows of the library passed (copied now or before)
    copied: int = 0


def _copy(source: db.Connection, target: db.Connection, tables: list[Table], deferred: dict[str, set[str]],
          total: int, progress: Progress | None, batch_rows: int) -> _Done:
    done = _Done()

    def tick(table: Table, rows: int, copied: bool) -> None:
        done.rows += rows
        done.copied += rows if copied else 0
        if progress is not None:
            progress(done.rows, 2 * total, table.name)

    for table in tables:
        columns = [c.name for c in table.columns]
        nulled = {columns.index(c) for c in deferred.get(table.name, set())}
        limit = max(1, min(batch_rows, MAX_PARAMETERS // len(columns)))

        def values(rows: list[db.Row], columns: list[str] = columns, nulled: set[int] = nulled) -> list[list[Any]]:
            return [[None if i in nulled else row[c] for i, c in enumerate(columns)] for row in rows]

        key = table.integer_key
        if key is not None:
            top = dbcopy.max_key(target, table.name, key)
            if top:
                tick(table, dbcopy.count(target, table.name), False)
            for rows in dbcopy.each_batch(source, table, columns, limit, (top,) if top else None):
                with db.transaction(target), dbcopy.Triggers(target, table.name):
                    dbcopy.insert_rows(target, table.name, columns, values(rows))
                tick(table, len(rows), True)
        elif table.key and dbcopy.count(target, table.name):
            tick(table, dbcopy.count(target, table.name), False)  # copied whole by an earlier run
        else:
            with db.transaction(target), dbcopy.Triggers(target, table.name):
                if not table.key:
                    dbcopy.delete_all(target, table.name)  # the counter row the new schema started with
                for rows in dbcopy.each_batch(source, table, columns, limit):
                    dbcopy.insert_rows(target, table.name, columns, values(rows))
                    tick(table, len(rows), True)
        if progress is not None:  # once per table, an empty one too
            progress(done.rows, 2 * total, table.name)
    for name, cols in sorted(deferred.items()):
        table = next(t for t in tables if t.name == name)
        key = table.key[0]
        for col in sorted(cols):
            pairs = dbcopy.not_null_values(source, name, key, col)
            for start in range(0, len(pairs), batch_rows):
                with db.transaction(target), dbcopy.Triggers(target, name):
                    dbcopy.set_column(target, name, key, col, pairs[start:start + batch_rows])
    return done


def _set_counters(source: db.Connection, target: db.Connection, tables: list[Table]) -> None:
    with db.transaction(target):
        for table in tables:
            key = table.integer_key
            if key is None:
                continue
            last = max(dbcopy.counter(source, table.name, key), dbcopy.max_key(target, table.name, key))
            dbcopy.set_counter(target, table.name, key, last)


def _verify(source: db.Connection, target: db.Connection, tables: list[Table], summary: MoveSummary,
            progress: Progress | None, total: int, batch_rows: int) -> None:
    checked = 0
    differ = []
    for table in tables:
        ours = table_digest(source, table, batch_rows)
        theirs = table_digest(target, table, batch_rows)
        summary.digests[table.name] = ours
        if ours != theirs:
            differ.append(f"{table.name} ({_rows(ours[0])} in the source, {theirs[0]} in the copy"
                          f"{'' if ours[0] != theirs[0] else ', values differ'})")
        checked += ours[0]
        if progress is not None and ours[0]:
            progress(total + checked, 2 * total, table.name)
    if differ:
        raise CommandFailed(f"the copy in {summary.target} differs from {summary.source} in "
                            f"{'; '.join(differ)}; the database_url setting was not changed (was a server started "
                            "on either database meanwhile? Empty the target and run the command again)")


def table_digests(conn: db.Connection, batch_rows: int = BATCH_ROWS) -> dict[str, tuple[int, str]]:
    """Every table's (row count, checksum), as the verification computes them: equal on two databases when they
    hold the same rows, whichever engine each is on."""
    with db.transaction(conn, immediate=False):
        return {t.name: table_digest(conn, t, batch_rows) for t in plan()[0]}


def table_digest(conn: db.Connection, table: Table, batch_rows: int = BATCH_ROWS) -> tuple[int, str]:
    """(rows, checksum): the sum, modulo 2**256, of each row's SHA-256 over its normalised values, so the order
    the rows come in does not matter."""
    columns = sorted(c.name for c in table.columns)
    normal = [_NORMAL.get(table.column(c).kind, _text) for c in columns]
    rows = 0
    total = 0
    for batch in dbcopy.each_batch(conn, table, columns, max(1, min(batch_rows, MAX_PARAMETERS // len(columns)))):
        for row in batch:
            values = tuple(None if row[c] is None else f(row[c]) for c, f in zip(columns, normal, strict=True))
            digest = hashlib.sha256(repr(values).encode("utf-8", "surrogatepass")).digest()
            total = (total + int.from_bytes(digest, "big")) % 2**256
            rows += 1
    return rows, f"{total:064x}"


def _text(value: Any) -> str:
    return str(value)


# Each value normalised by its column's declared type before its row is hashed: an integer (a bool as 0 or 1), a
# REAL as the exact float (an integer-valued one reads the same as that float), text as itself, a blob as its
# bytes. A column's values are all of one kind, so the repr of the row's tuple is unambiguous.
_NORMAL: dict[str, Callable[[Any], Any]] = {
    "INTEGER": int,
    "REAL": lambda value: float(value).hex(),
    "BLOB": bytes,
    "TEXT": _text,
}
