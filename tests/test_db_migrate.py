"""``picpeak-lite db migrate``: a library made through the app moved to the other engine (SQLite -> PostgreSQL in
the SQLite pass, PostgreSQL -> SQLite in the PostgreSQL pass: tests/pgserver.py starts a server for either),
interrupted and resumed, verified table by table, served from there with the same answers and a new upload, and
moved back with the same checksums. Refusals: a server answering, a target holding another library or another
schema version, a source on a newer schema."""

from __future__ import annotations

import socket
import time
from pathlib import Path
from typing import Any

import pytest

from picpeak_lite.config import Settings, WebhookEndpoint, load_settings
from picpeak_lite.errors import CommandFailed, ConfigError
from picpeak_lite.ops import bootstrap
from picpeak_lite.ops.dbmove import move, plan, table_digests
from picpeak_lite.services import Services
from picpeak_lite.store import db
from picpeak_lite.store.db import Database
from picpeak_lite.store.queries import dbcopy
from picpeak_lite.store.queries import webhooks as webhook_q
from picpeak_lite.web.app import create_app

from . import pgserver
from .conftest import AuthActions, add_account, sql
from .factories import jpeg, published, run_pool_until_idle
from .harness import cli, figures, write_config
from .test_feedback import photo_url, send
from .test_guest_pages import guest_csrf
from .test_upload import admin_upload


def other_engine(settings: Settings) -> str:
    """Where the library is moved to: a new, empty PostgreSQL database from SQLite, the data directory's file
    from PostgreSQL (moved aside first if an earlier move left one there)."""
    if not settings.database_url:
        return pgserver.server().new_database(empty=True)
    path = settings.database_path
    for suffix in ("", "-wal", "-shm"):
        old = Path(str(path) + suffix)
        if old.exists():
            old.rename(Path(str(path) + ".before" + suffix))
    return "sqlite"


def config_for(tmp_path: Path, settings: Settings, **values: Any) -> Path:
    database = {"database_url": settings.database_url} if settings.database_url else {}
    return write_config(tmp_path / "picpeak.toml", data_dir=str(settings.data_path), port=0, **database, **values)


def digests(target: str) -> dict[str, tuple[int, str]]:
    conn = db.connect(target)
    try:
        return table_digests(conn)
    finally:
        conn.close()


class Stop(KeyboardInterrupt):
    pass


def stop_at(table: str) -> Any:
    """A progress callback that stops the run (as Ctrl-C does) when it reaches ``table``."""
    def progress(done: int, total: int, name: str) -> None:
        if name == table:
            raise Stop(name)
    return progress


async def make_library(admin: AuthActions, guest: Any, services: Services) -> dict[str, Any]:
    """Galleries, processed photos, a cover, favourites, likes, ratings, comments, an editor with a grant, webhook
    outbox rows, and the change log and audit trail all that wrote."""
    gallery = await published(admin, name="Moving day")
    await published(admin, name="Second")
    sent = await admin_upload(admin, gallery["id"], [(f"{i}.jpg", jpeg(30 + i)) for i in range(4)])
    assert sent.status_code == 202, await sent.get_data(as_text=True)
    await run_pool_until_idle(services)
    photos = [r["id"] for r in sql(services, "SELECT id FROM photos WHERE status = 'complete' ORDER BY id")]
    assert len(photos) == 4
    sql(services, "UPDATE galleries SET cover_photo_id = ? WHERE id = ?", photos[2], gallery["id"])
    slug = gallery["slug"]
    csrf = await guest_csrf(guest, slug)
    assert (await guest.put(f"/api/g/{slug}/favourites/{photos[0]}", headers={"X-CSRF-Token": csrf})).status_code \
        == 200
    assert (await send(guest, "PUT", photo_url(slug, photos[1], "like"), csrf))[0] == 200
    assert (await send(guest, "PUT", photo_url(slug, photos[1], "rating"), csrf, {"stars": 4}))[0] == 200
    status, body = await send(guest, "POST", photo_url(slug, photos[1], "comments"), csrf,
                              {"text": "Lovely — ünïcode too", "name": "Aunt Mary"})
    assert status == 201, body
    await add_account(services, "assistant", "editor", grants=(gallery["id"],))
    endpoint = WebhookEndpoint("http://hooks.invalid/x", "s" * 32, ("photo.uploaded",))

    def hooks(conn: db.Connection) -> None:
        for photo_id in photos:
            webhook_q.enqueue_event(conn, (endpoint,), "photo.uploaded", f"photo:{photo_id}", {"id": photo_id},
                                    time.time())

    await services.db.write(hooks)
    counts = {t: sql(services, f"SELECT count(*) AS n FROM {t}")[0]["n"]
              for t in ("photo_changes", "audit_log", "webhook_deliveries", "favourites", "photo_comments")}
    assert all(counts.values()), counts
    return {"gallery": gallery, "photos": photos}


async def answers(client: Any, admin_client: Any, gallery: dict[str, Any]) -> dict[str, Any]:
    """What the guest and the photographer are told about the gallery, as JSON."""
    found = {}
    for who, http, url in (("guest", client, f"/api/g/{gallery['slug']}/photos"),
                           ("favourites", client, f"/api/g/{gallery['slug']}/photos?favourites=1"),
                           ("admin", admin_client, f"/api/admin/galleries/{gallery['id']}/photos"),
                           ("comments", admin_client, f"/api/admin/galleries/{gallery['id']}/comments")):
        response = await http.get(url)
        assert response.status_code == 200, (url, await response.get_data(as_text=True))
        found[who] = await response.get_json()
    return found


async def test_a_library_moves_to_the_other_engine_and_back(admin: AuthActions, guest: Any, services: Services,
                                                            tmp_path: Path) -> None:
    library = await make_library(admin, guest, services)
    gallery = library["gallery"]
    before = await answers(guest, admin.client, gallery)
    source = services.settings
    source_digests = digests(source.database)
    last_change = sql(services, "SELECT max(seq) AS top FROM photo_changes")[0]["top"]
    config = config_for(tmp_path, source)
    settings = load_settings(config, environ={})
    target = other_engine(source)

    with pytest.raises(Stop):
        move(settings, target, config, stop_at("photos"))
    assert load_settings(config, environ={}).database == source.database, "switched only once verified"
    summary = move(settings, target, config)
    assert summary.switched == str(config)
    assert 0 < summary.copied < summary.rows, "the second run went on from the first one's tables"
    assert summary.tables == len(plan()[0])
    moved = load_settings(config, environ={})
    assert bool(moved.database_url) != bool(source.database_url)
    assert digests(moved.database) == source_digests == summary.digests
    assert digests(source.database) == source_digests, "the source is left as it was"

    # The server on the new database: the same answers to the same browsers (their sessions moved too).
    svc = Services(settings=moved, db=Database(moved.database))
    try:
        app = create_app(svc)
        guest_there, admin_there = app.test_client(), app.test_client()
        guest_there.cookie_jar = guest.cookie_jar
        admin_there.cookie_jar = admin.client.cookie_jar
        assert await answers(guest_there, admin_there, gallery) == before
        page = await guest_there.get(f"/g/{gallery['slug']}")
        assert page.status_code == 200
        # And it takes a new upload: the photo gets an id past every copied one (the counters were moved).
        there = AuthActions(admin_there)
        there.csrf = admin.csrf  # the photographer's session moved with its CSRF token
        sent = await admin_upload(there, gallery["id"], [("new.jpg", jpeg(99))])
        assert sent.status_code == 202, await sent.get_data(as_text=True)
        await run_pool_until_idle(svc)
        rows = sql(svc, "SELECT id, status FROM photos ORDER BY id")
        assert rows[-1]["id"] > max(library["photos"]) and rows[-1]["status"] == "complete"
        assert sql(svc, "SELECT min(seq) AS first FROM photo_changes WHERE photo_id = ?",
                   rows[-1]["id"])[0]["first"] > last_change
    finally:
        svc.db.close()
    moved_digests = digests(moved.database)

    # And back: the same checksums, the new photo included.
    back_target = other_engine(moved)
    back = move(moved, back_target, config)
    home = load_settings(config, environ={})
    assert bool(home.database_url) == bool(source.database_url)
    assert back.digests == moved_digests == digests(home.database)
    assert back.copied == back.rows
    # The triggers held off while copying are in force again: hiding a photo logs a change.
    conn = db.connect(home.database)
    try:
        with db.transaction(conn):
            logged = conn.execute("SELECT count(*) AS n FROM photo_changes").fetchall()[0]["n"]
            conn.execute("UPDATE photos SET hidden = 1 WHERE id = ?", (library["photos"][0],))
            assert conn.execute("SELECT count(*) AS n FROM photo_changes").fetchall()[0]["n"] == logged + 1
    finally:
        conn.close()


async def test_a_copy_that_differs_is_not_switched_to(admin: AuthActions, services: Services,
                                                       tmp_path: Path) -> None:
    """Rows changed in the target between an interrupted run and the next are found by the verification, which
    names the table; the setting stays."""
    gallery = await published(admin, name="Original name")
    settings = load_settings(config_for(tmp_path, services.settings), environ={})
    config = tmp_path / "picpeak.toml"
    target = other_engine(settings)
    with pytest.raises(Stop):
        move(settings, target, config, stop_at("photos"))
    conn = db.connect(settings.database_path if target == "sqlite" else target)
    try:
        conn.execute("UPDATE galleries SET name = 'Changed meanwhile' WHERE id = ?", (gallery["id"],))
    finally:
        conn.close()
    with pytest.raises(CommandFailed, match=r"differs from .* in galleries \(1 row in the source, 1 in the copy, "
                                            r"values differ\); the database_url setting was not changed"):
        move(settings, target, config)
    assert load_settings(config, environ={}).database == settings.database


async def test_a_row_written_into_the_target_between_runs_stops_the_copy(admin: AuthActions, services: Services,
                                                                        tmp_path: Path) -> None:
    gallery = await published(admin, name="Ours")
    settings = load_settings(config_for(tmp_path, services.settings), environ={})
    config = tmp_path / "picpeak.toml"
    target = other_engine(settings)
    with pytest.raises(Stop):
        move(settings, target, config, stop_at("admin_users"))
    conn = db.connect(settings.database_path if target == "sqlite" else target)
    try:
        conn.execute("INSERT INTO galleries (id, slug, share_token, name, created_at, updated_at) "
                     "VALUES (0, ?, 'another', 'Intruder', 0, 0)", (gallery["slug"],))
    finally:
        conn.close()
    with pytest.raises(CommandFailed, match=r"refused a copied row .*; the database_url setting was not changed: "
                                            r"empty the target and run the command again"):
        move(settings, target, config)
    assert load_settings(config, environ={}).database == settings.database


async def test_many_rows_in_small_batches(services: Services, tmp_path: Path, capsys: Any) -> None:
    """Thousands of rows in tables of both kinds (an integer id: the audit trail and guest sessions; a composite
    key copied whole: favourites), in batches of 100: every row arrives once. The figures line times it."""
    gallery = sql(services, "INSERT INTO galleries (slug, share_token, name, created_at, updated_at) "
                            "VALUES ('big', 'tok', 'Big', 0, 0) RETURNING id")[0]["id"]
    sql(services, "INSERT INTO uploads (id, gallery_id, uploaded_by, created_at) VALUES (?, ?, 'admin', 0)",
        "u" * 32, gallery)
    conn = db.connect(services.settings.database)
    try:
        with db.transaction(conn):
            for n in range(1, 201):
                conn.execute("INSERT INTO photos (gallery_id, upload_id, storage_key, sha256, display_name, size, "
                             "format, uploaded_by, status, created_at, id) VALUES (?, ?, ?, ?, ?, 1, 'jpeg', "
                             "'admin', 'complete', ?, ?)", (gallery, "u" * 32, f"k{n}", f"{n:064x}", f"{n}.jpg",
                                                            n + 0.25, n))
            for n in range(1, 2001):
                conn.execute("INSERT INTO guest_sessions (token_hash, csrf_token, guest_name, created_at, "
                             "last_seen_at) VALUES (?, ?, ?, ?, ?)", (f"t{n}", "c", f"G\u00fcst {n}", n / 3, n))
            for n in range(1, 8001):
                conn.execute("INSERT INTO favourites (guest_session_id, photo_id, created_at) VALUES (?, ?, ?)",
                             (n % 2000 + 1, (n - 1) // 40 + 1, n * 0.1))
                conn.execute("INSERT INTO audit_log (at, account_name, action, detail) VALUES (?, 'a', 'x', ?)",
                             (n / 7, f"{n}"))
    finally:
        conn.close()
    config = config_for(tmp_path, services.settings)
    settings = load_settings(config, environ={})
    target = other_engine(settings)
    started = time.monotonic()
    summary = move(settings, target, config, batch_rows=100)
    seconds = time.monotonic() - started
    assert summary.rows == summary.copied > 18_000
    moved = load_settings(config, environ={})
    assert digests(moved.database) == summary.digests
    assert summary.digests["favourites"][0] == 8000 and summary.digests["audit_log"][0] >= 8000
    figures(capsys, f"db_migrate: tables={summary.tables} rows={summary.rows} seconds={seconds:.2f} "
                    f"rows_per_s={summary.rows / max(seconds, 1e-9):.0f}")


async def test_refusals(admin: AuthActions, services: Services, tmp_path: Path) -> None:
    await published(admin, name="Mine")
    source = services.settings
    config = config_for(tmp_path, source)
    settings = load_settings(config, environ={})

    # A target that holds another library (a server was started on it: its own owner account).
    taken = another_library(tmp_path / "other", settings)
    with pytest.raises(ConfigError, match=r"already holds a library \(1 row in admin_users\)"):
        move(settings, taken, config)
    assert load_settings(config, environ={}).database == source.database

    # A target on another schema version.
    if not source.database_url:
        older = pgserver.server().new_database()
        conn = db.connect(older)
        try:
            conn.execute("UPDATE picpeak_schema SET version = version - 1")
        finally:
            conn.close()
        with pytest.raises(ConfigError, match="holds a picpeak-lite database of schema version"):
            move(settings, older, config)

    # A source on a newer schema than this picpeak-lite.
    conn = db.connect(source.database)
    try:
        if source.database_url:
            conn.execute("UPDATE picpeak_schema SET version = version + 1")
        else:
            conn.execute("PRAGMA user_version = 999")
        fresh = other_engine(source) if not source.database_url else "sqlite"
        with pytest.raises(ConfigError, match="newer than this picpeak-lite understands"):
            move(settings, fresh, config)
    finally:
        if source.database_url:
            conn.execute("UPDATE picpeak_schema SET version = version - 1")
        else:
            from picpeak_lite.store import schema

            conn.execute(f"PRAGMA user_version = {schema.SCHEMA_VERSION}")
        conn.close()


def another_library(data_dir: Path, settings: Settings) -> str:
    """A library of its own in the other engine, where ``settings``' library would be moved to."""
    other = load_settings(environ={}, overrides={"data_dir": str(data_dir), "port": 0})
    if settings.database_url:  # made in another data directory, then put where the move writes
        bootstrap.prepare(other)
        bootstrap.ensure_admin(other, {"PICPEAK_ADMIN_PASSWORD": "x" * 12})
        other.database_path.rename(settings.database_path)
        return "sqlite"
    url = pgserver.server().new_database()
    other = load_settings(environ={}, overrides={"data_dir": str(data_dir), "port": 0, "database_url": url})
    bootstrap.prepare(other)
    bootstrap.ensure_admin(other, {"PICPEAK_ADMIN_PASSWORD": "x" * 12})
    return url


def test_the_command_refuses_while_the_server_answers(tmp_path: Path) -> None:
    data_dir = tmp_path / "data"
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen()
        port = listener.getsockname()[1]
        url = pgserver.database_for(data_dir)
        config = write_config(tmp_path / "picpeak.toml", data_dir=str(data_dir), port=port,
                              **({"database_url": url} if url else {}))
        bootstrap.prepare(load_settings(config, environ={}))
        result = cli("db", "migrate", "--to", "postgresql://nobody@127.0.0.1:1/none" if url is None else "sqlite",
                     "--config", str(config))
    assert result.returncode == 2, result.stderr
    assert "the server is answering at 127.0.0.1:" in result.stderr and "Traceback" not in result.stderr
    assert "database_url" not in config.read_text() or url is not None


def test_the_command_end_to_end(tmp_path: Path) -> None:
    """As an operator runs it: the warning, the bar, the summary, the setting switched; a second run is told the
    library is there already. Then back."""
    data_dir = tmp_path / "data"
    url = pgserver.database_for(data_dir)
    config = write_config(tmp_path / "picpeak.toml", data_dir=str(data_dir), port=0,
                          **({"database_url": url} if url else {}))
    settings = load_settings(config, environ={})
    bootstrap.prepare(settings)
    bootstrap.ensure_admin(settings, {"PICPEAK_ADMIN_PASSWORD": "x" * 12})
    target = other_engine(settings)
    result = cli("db", "migrate", "--to", target, "--config", str(config))
    assert result.returncode == 0, result.stderr
    assert "Stop the server" in result.stderr and "db migrate [" in result.stderr
    assert "every table's rows verified" in result.stdout and "database_url is set in" in result.stdout
    moved = load_settings(config, environ={})
    assert moved.database != settings.database
    conn = db.connect(moved.database)
    try:
        assert dbcopy.mark_source(conn) is None, "the mark of a copy in progress is gone once verified"
        assert conn.execute("SELECT count(*) AS n FROM admin_users").fetchall()[0]["n"] == 1
    finally:
        conn.close()
