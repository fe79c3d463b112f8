from __future__ import annotations

from pathlib import Path

import apsw
import pytest

from picpeak_lite.errors import ConfigError, InsufficientStorage
from picpeak_lite.store import db, schema
from picpeak_lite.store.queries import photos as photo_q


def _tables(conn: apsw.Connection) -> set[str]:
    rows = conn.execute("SELECT name FROM sqlite_schema WHERE type = 'table'").fetchall()
    return {r["name"] for r in rows}


def _version(conn: apsw.Connection) -> int:
    return conn.execute("PRAGMA user_version").fetchall()[0]["user_version"]


def test_connection_setup(tmp_path: Path) -> None:
    conn = db.connect(tmp_path / "x.sqlite3")
    pragma = lambda name: next(iter(conn.execute(f"PRAGMA {name}").fetchall()[0].values()))  # noqa: E731
    assert pragma("journal_mode") == "wal"
    assert pragma("synchronous") == 2  # FULL
    assert pragma("foreign_keys") == 1
    assert pragma("busy_timeout") >= 5000
    # Double-quoted strings are identifiers only: a typo'd column is an error, not a string.
    conn.execute("CREATE TABLE t (a)")
    with pytest.raises(apsw.SQLError, match="no such column"):
        conn.execute('SELECT "nope" FROM t').fetchall()


@pytest.mark.parametrize("start", range(len(schema.MIGRATIONS)))
def test_every_migration_from_its_previous_version(tmp_path: Path, start: int) -> None:
    conn = db.connect(tmp_path / "x.sqlite3")
    schema.migrate(conn, target=start)
    assert _version(conn) == start
    if start:
        # Leave a row behind so that the later steps run against data, not an empty file.
        conn.execute(
            "INSERT INTO galleries (slug, share_token, name, created_at, updated_at) VALUES ('a-1', 't', 'A', 0, 0)"
        )
    assert schema.migrate(conn) == start
    assert _version(conn) == schema.SCHEMA_VERSION
    assert {"galleries", "admin_users", "photos", "webhook_deliveries"} <= _tables(conn)
    assert conn.execute("PRAGMA application_id").fetchall()[0]["application_id"] == schema.APPLICATION_ID
    assert conn.execute("PRAGMA foreign_key_check").fetchall() == []
    assert conn.execute("PRAGMA integrity_check").fetchall() == [{"integrity_check": "ok"}]


def test_photo_ids_continue_past_deleted_ones_after_migration_5(tmp_path: Path) -> None:
    upload = "0" * 32
    conn = db.connect(tmp_path / "x.sqlite3")
    schema.migrate(conn, target=4)
    conn.execute("INSERT INTO galleries (slug, share_token, name, created_at, updated_at) VALUES ('a', 't', 'A', 0, 0)")
    conn.execute("INSERT INTO uploads (id, gallery_id, uploaded_by, created_at) VALUES (?, 1, 'admin', 0)", (upload,))
    for n in (1, 2, 3):
        conn.execute(
            "INSERT INTO photos (gallery_id, upload_id, storage_key, sha256, display_name, size, format, "
            "uploaded_by, width, height, created_at) VALUES (1, ?, ?, ?, 'p.jpg', 1, 'jpeg', 'admin', 1, 1, 0)",
            (upload, f"{n:032x}", f"{n:064x}"),
        )
    conn.execute("DELETE FROM photos WHERE id = 3")  # only the change log remembers id 3 now
    schema.migrate(conn)
    with db.transaction(conn):
        new_id = photo_q.insert_photo(conn, gallery_id=1, upload_id=upload, storage_key=f"{4:032x}", sha256=f"{4:064x}",
                                      display_name="p.jpg", size=1, format="jpeg", uploaded_by="admin",
                                      guest_name=None, width=1, height=1, now=0)
    assert new_id == 4


def test_migrating_twice_is_a_no_op(tmp_path: Path) -> None:
    conn = db.connect(tmp_path / "x.sqlite3")
    schema.migrate(conn)
    assert schema.migrate(conn) == schema.SCHEMA_VERSION


def test_newer_database_is_refused(tmp_path: Path) -> None:
    conn = db.connect(tmp_path / "x.sqlite3")
    schema.migrate(conn)
    conn.execute(f"PRAGMA user_version = {schema.SCHEMA_VERSION + 1}")
    with pytest.raises(ConfigError, match="newer than this picpeak-lite"):
        schema.migrate(conn)


def test_foreign_database_is_refused(tmp_path: Path) -> None:
    conn = db.connect(tmp_path / "x.sqlite3")
    conn.execute("PRAGMA application_id = 1234")
    with pytest.raises(ConfigError, match="not a picpeak-lite database"):
        schema.migrate(conn)


def test_failed_migration_leaves_nothing_behind(tmp_path: Path) -> None:
    """A real migration fails: a table of that name is already there (made by hand, say), so a late migration's
    CREATE TABLE fails after the earlier ones ran; all of them roll back together."""
    conn = db.connect(tmp_path / "x.sqlite3")
    conn.execute("CREATE TABLE photo_id_counter (left_by_hand TEXT)")
    with pytest.raises(apsw.SQLError, match="already exists"):
        schema.migrate(conn)
    assert _version(conn) == 0
    assert "galleries" not in _tables(conn)


def test_disk_full_surfaces_the_real_cause(tmp_path: Path) -> None:
    """SQLite rolls back by itself on SQLITE_FULL; we report the full disk, not 'cannot rollback'."""
    conn = db.connect(tmp_path / "x.sqlite3")
    schema.migrate(conn)
    conn.execute("CREATE TABLE big (b BLOB)")
    page_count = conn.execute("PRAGMA page_count").fetchall()[0]["page_count"]
    conn.execute(f"PRAGMA max_page_count = {page_count + 2}")
    with pytest.raises(InsufficientStorage), db.transaction(conn):
        conn.execute("INSERT INTO big VALUES (zeroblob(1000000))")
    assert not conn.in_transaction


def test_photos_of_watermarked_galleries_are_made_again_once_their_grids_get_the_mark(tmp_path: Path) -> None:
    """Issue 35: grids made before were never watermarked; the step marks exactly those galleries' photos."""
    upload = "0" * 32
    conn = db.connect(tmp_path / "x.sqlite3")
    # The step before issue 35's (found by its text: later steps are appended after it).
    step = next(i for i, sql in enumerate(schema.MIGRATIONS) if "SET views_stale = views_stale + 1" in sql)
    schema.migrate(conn, target=step)
    for gallery_id, watermark in ((1, 0), (2, 1)):
        conn.execute("INSERT INTO galleries (slug, share_token, name, created_at, updated_at, watermark) "
                     "VALUES (?, ?, 'A', 0, 0, ?)", (f"g{gallery_id}", f"t{gallery_id}", watermark))
    conn.execute("INSERT INTO uploads (id, gallery_id, uploaded_by, created_at) VALUES (?, 1, 'admin', 0)", (upload,))
    for n, (gallery_id, status) in enumerate(((1, "complete"), (2, "complete"), (2, "failed")), start=1):
        conn.execute(
            "INSERT INTO photos (gallery_id, upload_id, storage_key, sha256, display_name, size, format, "
            "uploaded_by, width, height, created_at, status) VALUES (?, ?, ?, ?, 'p.jpg', 1, 'jpeg', 'admin', 1, 1, "
            "0, ?)", (gallery_id, upload, f"{n:032x}", f"{n:064x}", status))
    schema.migrate(conn)
    stale = [row["views_stale"] for row in conn.execute("SELECT views_stale FROM photos ORDER BY id").fetchall()]
    assert stale == [0, 1, 0]
