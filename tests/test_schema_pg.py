"""The schema on PostgreSQL (store/schema_pg.py), on a real server: the same tables and columns as SQLite's steps
make, migrations that refuse what they must, two processes starting on one empty database, and the change log's
order under writers that commit out of order. Run with ``--engine postgresql`` (left out of a SQLite run)."""

from __future__ import annotations

import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from picpeak_lite.errors import ConfigError
from picpeak_lite.store import db, schema, schema_pg

from . import pgserver

pytestmark = pytest.mark.postgresql


def _empty() -> str:
    return pgserver.server().new_database(empty=True)


def _columns_sqlite(path: Path) -> dict[str, set[str]]:
    conn = db.connect(path)
    try:
        schema.migrate(conn)
        tables = [r["name"] for r in conn.execute(
            "SELECT name FROM sqlite_schema WHERE type = 'table' AND name NOT LIKE 'sqlite%'").fetchall()]
        return {t: {r["name"] for r in conn.execute(f"PRAGMA table_info({t})").fetchall()} for t in tables}
    finally:
        conn.close()


def _columns_pg(url: str) -> dict[str, set[str]]:
    conn = db.connect(url)
    try:
        found: dict[str, set[str]] = {}
        for r in conn.execute("SELECT table_name, column_name FROM information_schema.columns "
                              "WHERE table_schema = current_schema() AND table_name != 'picpeak_schema'").fetchall():
            found.setdefault(r["table_name"], set()).add(r["column_name"])
        return found
    finally:
        conn.close()


def test_every_step_has_a_postgresql_form_with_the_same_tables_and_columns(tmp_path: Path) -> None:
    assert set(schema_pg.STEPS) == set(range(schema_pg.BASE_VERSION + 1, len(schema.MIGRATIONS) + 1))
    url = _empty()
    conn = db.connect(url)
    try:
        assert schema.migrate(conn) == 0
        assert schema.migrate(conn) == len(schema.MIGRATIONS)  # the second start finds it done
    finally:
        conn.close()
    assert _columns_pg(url) == _columns_sqlite(tmp_path / "same.sqlite3")


def test_a_newer_schema_and_a_foreign_database_are_refused() -> None:
    url = _empty()
    conn = db.connect(url)
    try:
        schema.migrate(conn)
        conn.execute("UPDATE picpeak_schema SET version = version + 1")
        with pytest.raises(ConfigError, match="newer than this picpeak-lite"):
            schema.migrate(conn)
    finally:
        conn.close()
    other = _empty()
    conn = db.connect(other)
    try:
        conn.execute("CREATE TABLE invoices (id BIGINT PRIMARY KEY)")
        with pytest.raises(ConfigError, match="other tables"):
            schema.migrate(conn)
        assert conn.execute("SELECT count(*) AS n FROM information_schema.tables "
                            "WHERE table_schema = current_schema() AND table_name = 'photos'").fetchall()[0]["n"] == 0
    finally:
        conn.close()


MIGRATE = """
import sys
from picpeak_lite.store import db, schema
conn = db.connect(sys.argv[1])
print(schema.migrate(conn))
"""


def test_two_processes_starting_on_one_empty_database_do_not_race() -> None:
    url = _empty()
    procs = [subprocess.Popen([sys.executable, "-c", MIGRATE, url], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                              text=True) for _ in range(4)]
    results = [p.communicate(timeout=120) for p in procs]
    assert all(p.returncode == 0 for p in procs), results
    started_at = sorted(int(out.strip()) for out, _ in results)
    assert started_at == [0, *[len(schema.MIGRATIONS)] * 3]  # one made it; the others found it made


def _photo(conn: Any, gallery_id: int, n: int) -> int:
    conn.execute("INSERT INTO uploads (id, gallery_id, uploaded_by, created_at) VALUES (?, ?, 'admin', 0) "
                 "ON CONFLICT DO NOTHING", ("u" * 32, gallery_id))
    return int(conn.execute(
        "INSERT INTO photos (gallery_id, upload_id, storage_key, sha256, display_name, size, format, uploaded_by, "
        "created_at) VALUES (?, ?, ?, ?, 'p.jpg', 1, 'jpeg', 'admin', 0) RETURNING id",
        (gallery_id, "u" * 32, f"{n:032x}", f"{n:064x}")).fetchall()[0]["id"])


def test_changes_become_visible_in_their_sequence_order() -> None:
    """Two writers: the first takes a sequence number and commits late, the second commits first. Without the
    change-log lock a feed reading ``seq > last`` between the two commits would see the second and step over the
    first for good; with it the second waits for the first, so the log only ever grows at its end."""
    url = pgserver.server().new_database()
    setup = db.connect(url)
    gid = int(setup.execute("INSERT INTO galleries (slug, share_token, name, created_at, updated_at) "
                            "VALUES ('g', 't', 'G', 0, 0) RETURNING id").fetchall()[0]["id"])
    first, second = _photo(setup, gid, 1), _photo(setup, gid, 2)
    last = setup.execute("SELECT max(seq) AS s FROM photo_changes").fetchall()[0]["s"]
    a, b = db.connect(url), db.connect(url)
    a.execute("BEGIN")
    a.execute("UPDATE photos SET status = 'failed' WHERE id = ?", (first,))  # takes its seq, holds the lock
    committed_b = threading.Event()

    def write_b() -> None:
        with db.transaction(b):
            b.execute("UPDATE photos SET status = 'failed' WHERE id = ?", (second,))
        committed_b.set()

    writer = threading.Thread(target=write_b)
    writer.start()
    time.sleep(0.5)  # not a bound: only a chance for b to commit early, which the lock must prevent
    seen_early = setup.execute("SELECT photo_id FROM photo_changes WHERE seq > ? ORDER BY seq", (last,)).fetchall()
    assert seen_early == [] and not committed_b.is_set()
    a.execute("COMMIT")
    writer.join(timeout=60)
    assert committed_b.is_set()
    seen = setup.execute("SELECT photo_id FROM photo_changes WHERE seq > ? ORDER BY seq", (last,)).fetchall()
    assert [r["photo_id"] for r in seen] == [first, second]
    for conn in (a, b, setup):
        conn.close()
