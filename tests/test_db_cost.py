"""What the database server is spared per photo (issue 30: the database under 5 % of a photo's CPU). On PostgreSQL
a read runs without BEGIN/COMMIT (under READ COMMITTED each statement has its own snapshot anyway), and the
statements run for every photo (``db.Prepared``) are planned once per connection, their values bound by the server.
Both engines unless marked; ``bench/bench_pg_statements.py`` prints the statements per photo of a real upload."""

from __future__ import annotations

from pathlib import Path

import pytest

from picpeak_lite.ops import bootstrap
from picpeak_lite.services import Services
from picpeak_lite.store import db
from picpeak_lite.store.queries import photos as photo_q

from .conftest import make_settings
from .factories import create_gallery, jpeg, stage_photo


async def test_a_read_is_a_transaction_on_sqlite_only(services: Services) -> None:
    inside = await services.db.read(lambda conn: conn.in_transaction)
    assert inside == (services.db.dialect == "sqlite")


async def test_a_read_of_several_statements_sees_each_commit(services: Services) -> None:
    """Without a transaction around it a read's statements each see what is committed when they run: what READ
    COMMITTED gave them inside one too. The read still answers what it asks (here: rows and their count)."""
    gid = await services.db.write(create_gallery)
    stage_photo(services, gid, jpeg(4))

    def both(conn: db.Connection) -> tuple[int, int]:
        return photo_q.count_in_gallery(conn, gid), len(conn.execute("SELECT id FROM photos").fetchall())

    assert await services.db.read(both) == (1, 1)


def test_a_prepared_statement_binds_numbers_past_every_small_type(tmp_path: Path) -> None:
    """psycopg would send 5 as a smallint; times a billion that overflows PostgreSQL's integer. Sent as a bigint,
    it is what SQLite answers."""
    settings = make_settings(tmp_path)
    bootstrap.prepare(settings)
    conn = db.connect(settings.database)
    try:
        row = conn.execute(db.Prepared("SELECT ? * 1000000000 AS n"), (5,)).fetchone()
        assert row is not None and row["n"] == 5_000_000_000
        row = conn.execute(db.Prepared("SELECT count(*) AS n FROM photos WHERE gallery_id = ?"), (2**40,)).fetchone()
        assert row is not None and row["n"] == 0
    finally:
        conn.close()


@pytest.mark.postgresql
def test_a_prepared_statement_is_planned_once_per_connection(tmp_path: Path) -> None:
    conn = db.connect(make_settings(tmp_path).database)
    try:
        for gallery_id in (1, 2, 3):
            photo_q.count_in_gallery(conn, gallery_id)
        conn.execute("SELECT count(*) AS n FROM galleries WHERE id = ?", (1,)).fetchall()  # not marked
        prepared = [r["statement"] for r in conn.execute("SELECT statement FROM pg_prepared_statements")]
    finally:
        conn.close()
    assert len(prepared) == 1, prepared
    assert "FROM photos WHERE gallery_id = $1" in prepared[0]
