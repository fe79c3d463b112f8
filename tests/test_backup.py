"""``picpeak-lite backup`` and ``restore``: a consistent copy with a manifest; restored into a fresh data directory
(and on PostgreSQL a fresh database), it works. On both engines.

The backup taken during real load is in ``test_load.py``; here the rules one by one, with the command run as
an operator runs it (a subprocess) against a data directory filled through the real pipeline.
"""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import httpx
import pytest
import trio

from picpeak_lite import server
from picpeak_lite.errors import ConfigError
from picpeak_lite.ops import bootstrap
from picpeak_lite.ops.backup import backup
from picpeak_lite.services import Services
from picpeak_lite.store import db, pgdump
from picpeak_lite.store.queries import claims
from picpeak_lite.store.queries import photos as photo_q

from . import pgserver
from .conftest import make_settings
from .factories import create_gallery, photo_jpeg, run_pool_until_idle, stage_photo
from .harness import cli, file_sha256, query, sha256


async def filled_data_dir(tmp_path: Path, photos: int = 3) -> tuple[Services, list[int]]:
    settings = make_settings(tmp_path)
    bootstrap.prepare(settings)
    svc = Services(settings=settings, db=db.Database(settings.database))
    gid = await svc.db.write(create_gallery)
    ids = [stage_photo(svc, gid, photo_jpeg(i), name=f"p{i}.jpg")[0] for i in range(photos)]
    await run_pool_until_idle(svc, count=1)
    return svc, ids


def restore_into(tmp_path: Path, backup_dir: Path, name: str = "restored") -> Path:
    """``picpeak-lite restore`` into a new data directory (and on PostgreSQL a new, empty database), as README says."""
    restored = tmp_path / name
    pgserver.empty_database_for(restored)
    done = cli("restore", str(backup_dir), "--data-dir", str(restored))
    assert done.returncode == 0, done.stdout + done.stderr
    assert not (restored / ".restoring").exists()
    return restored


async def test_backup_copies_everything_with_a_manifest_and_restores(tmp_path: Path) -> None:
    svc, ids = await filled_data_dir(tmp_path)
    data = svc.settings.data_path
    # One photo is mid-processing when the backup is taken: the restored library has it pending again.
    late = stage_photo(svc, 1, photo_jpeg(9), name="late.jpg")[0]
    await svc.db.write(claims.claim_next, "t" * 32, 0.0, 3600.0)
    target = tmp_path / "backup"
    done = cli("backup", str(target), "--data-dir", str(data))
    assert done.returncode == 0, done.stderr
    assert "Backed up 4 photos" in done.stdout and "backup [" in done.stderr  # the progress bar
    manifest = json.loads((target / "manifest.json").read_text())
    assert manifest["photos"] == 4 and manifest["format"] == "picpeak-lite-backup/1"
    engine = manifest["database"]["engine"]
    assert engine == pgserver.engine
    assert manifest["database"]["path"] == {"sqlite": "picpeak.sqlite3", "postgresql": "picpeak.pgdump"}[engine]
    assert file_sha256(target / manifest["database"]["path"]) == manifest["database"]["sha256"]
    assert sorted(p.name for p in target.iterdir()) == sorted(["derived", "manifest.json", "originals",
                                                               manifest["database"]["path"]])
    kinds = sorted(f["kind"] for f in manifest["files"])
    assert kinds == ["grid"] * 3 + ["original"] * 4 + ["view"] * 3
    for entry in manifest["files"]:
        assert file_sha256(target / entry["path"]) == entry["sha256"]
        assert (target / entry["path"]).read_bytes() == (data / entry["path"]).read_bytes()
    assert query(data, "SELECT status FROM photos WHERE id = ?", late)[0]["status"] == "processing"  # live: untouched

    restored = restore_into(tmp_path, target)
    rows = {r["id"]: r for r in query(restored, "SELECT id, status, sha256, storage_key FROM photos")}
    assert {i: r["status"] for i, r in rows.items()} == {**dict.fromkeys(ids, "complete"), late: "pending"}
    settings = make_settings(tmp_path, data_dir=str(restored))
    slug = query(restored, "SELECT slug FROM galleries WHERE id = 1")[0]["slug"]
    async with trio.open_nursery() as nursery:
        running = await nursery.start(server.run, settings)
        with trio.fail_after(120):  # a hung-test stop only
            while query(restored, "SELECT count(*) AS n FROM photos WHERE status != 'complete'")[0]["n"]:
                await trio.sleep(0.05)
        async with httpx.AsyncClient(base_url=running.url, timeout=60) as http:
            for photo_id, row in rows.items():
                served = await http.get(f"/g/{slug}/photos/{photo_id}/download")
                assert served.status_code == 200 and sha256(served.content) == row["sha256"], photo_id
        running.stop()
    check = cli("check", "--data-dir", str(restored))
    assert check.returncode == 0, check.stdout + check.stderr
    assert "photos=4 " in check.stdout and "missing_original=0" in check.stdout
    svc.db.close()


@pytest.mark.sqlite  # the SQLite backup is a data directory as it is: copying it is a restore too
async def test_a_copy_of_an_sqlite_backup_is_a_data_directory(tmp_path: Path) -> None:
    svc, ids = await filled_data_dir(tmp_path, photos=2)
    late = stage_photo(svc, 1, photo_jpeg(9), name="late.jpg")[0]
    await svc.db.write(claims.claim_next, "t" * 32, 0.0, 3600.0)
    target = tmp_path / "backup"
    assert cli("backup", str(target), "--data-dir", str(svc.settings.data_path)).returncode == 0
    backed = {r["id"]: r["status"] for r in query(target, "SELECT id, status FROM photos")}
    assert backed == {**dict.fromkeys(ids, "complete"), late: "pending"}
    restored = tmp_path / "restored"
    shutil.copytree(target, restored)
    check = cli("check", "--data-dir", str(restored))
    assert check.returncode == 0 and "photos=3 " in check.stdout, check.stdout + check.stderr
    svc.db.close()


async def test_backup_again_is_incremental_and_follows_deletes(tmp_path: Path) -> None:
    svc, ids = await filled_data_dir(tmp_path)
    data, target = svc.settings.data_path, tmp_path / "backup"
    assert cli("backup", str(target), "--data-dir", str(data)).returncode == 0
    gone = await svc.db.write(photo_q.delete, ids[0])
    svc.storage.remove_photo_files(gone["storage_key"])
    again = cli("backup", str(target), "--data-dir", str(data))
    assert again.returncode == 0, again.stderr
    assert "0 files copied" in again.stdout and "6 unchanged, 3 removed" in again.stdout, again.stdout
    assert not (target / "originals" / gone["storage_key"][:2] / gone["storage_key"]).exists()
    restored = restore_into(tmp_path, target)
    assert {r["id"] for r in query(restored, "SELECT id FROM photos")} == set(ids[1:])
    svc.db.close()


async def test_a_photo_deleted_while_the_files_are_copied_is_gone_from_the_restore(tmp_path: Path) -> None:
    """The database is copied first, the files after: a photo deleted in between is in the snapshot but its files
    are gone. Its row goes too (SQLite: in the copy; PostgreSQL: by restore, from the manifest)."""
    svc, ids = await filled_data_dir(tmp_path)
    victim = ids[-1]

    def delete_during_the_copy(done: int, total: int, name: str) -> None:
        if done == 1:  # another connection, as the server's would be
            conn = db.connect(svc.settings.database)
            try:
                with db.transaction(conn):
                    row = photo_q.delete(conn, victim)
            finally:
                conn.close()
            assert row is not None
            svc.storage.remove_photo_files(row["storage_key"])

    target = tmp_path / "backup"
    summary = await trio.to_thread.run_sync(backup, svc.settings, target, delete_during_the_copy)
    assert (summary.photos, summary.deleted_meanwhile, summary.problems) == (3, 1, 0)
    manifest = json.loads((target / "manifest.json").read_text())
    assert manifest["photos"] == 2 and manifest["drop_on_restore"] == [victim]
    assert len(manifest["files"]) == 2 * 3
    restored = restore_into(tmp_path, target)
    assert {r["id"] for r in query(restored, "SELECT id FROM photos")} == set(ids[:-1])
    check = cli("check", "--data-dir", str(restored))
    assert check.returncode == 0 and "photos=2 " in check.stdout, check.stdout + check.stderr
    svc.db.close()


async def test_backup_refuses_what_would_be_a_mistake(tmp_path: Path) -> None:
    svc, _ = await filled_data_dir(tmp_path, photos=1)
    data = svc.settings.data_path
    busy = tmp_path / "busy"
    busy.mkdir()
    (busy / "thesis.docx").write_text("precious")
    for target, message in ((busy, "is not empty"), (data / "inside", "outside the data directory")):
        done = cli("backup", str(target), "--data-dir", str(data))
        assert done.returncode == 2 and message in done.stderr, done.stderr
        assert len(done.stderr.strip().splitlines()) == 1
    # A changed original is reported (and the command fails), the copy is still made.
    row = query(data, "SELECT storage_key FROM photos")[0]
    original = data / "originals" / row["storage_key"][:2] / row["storage_key"]
    original.write_bytes(original.read_bytes() + b"bitrot")
    damaged = cli("backup", str(tmp_path / "b2"), "--data-dir", str(data))
    assert damaged.returncode == 2 and "differs from its recorded sha256" in damaged.stderr
    assert (tmp_path / "b2" / "manifest.json").exists()
    svc.db.close()


@pytest.mark.sqlite  # on PostgreSQL the database is the URL's, not a file in the data directory
def test_backup_of_a_data_directory_without_a_database_is_refused(tmp_path: Path) -> None:
    missing = cli("backup", str(tmp_path / "b"), "--data-dir", str(tmp_path / "nothing-here"))
    assert missing.returncode == 2 and "no database" in missing.stderr
    assert len(missing.stderr.strip().splitlines()) == 1 and not (tmp_path / "b").exists()


async def test_restore_refuses_what_would_be_a_mistake(tmp_path: Path) -> None:
    svc, _ = await filled_data_dir(tmp_path, photos=1)
    target = tmp_path / "backup"
    assert cli("backup", str(target), "--data-dir", str(svc.settings.data_path)).returncode == 0

    def refused(done: subprocess.CompletedProcess[str], message: str, status: int = 2) -> None:
        assert done.returncode == status and message in done.stderr, done.stderr
        assert len(done.stderr.strip().splitlines()) == 1, done.stderr

    busy = tmp_path / "busy"
    busy.mkdir()
    (busy / "thesis.docx").write_text("precious")
    pgserver.empty_database_for(busy)
    refused(cli("restore", str(target), "--data-dir", str(busy)), "is not empty")
    assert sorted(p.name for p in busy.iterdir()) == ["thesis.docx"]
    refused(cli("restore", str(tmp_path), "--data-dir", str(tmp_path / "x")), "holds no manifest.json")
    # The other engine's settings: a PostgreSQL URL for an SQLite backup, SQLite for a PostgreSQL one.
    other = {"sqlite": "postgresql://picpeak@127.0.0.1:1/none", "postgresql": ""}[pgserver.engine]
    refused(cli("restore", str(target), "--data-dir", str(tmp_path / "y"), env={"PICPEAK_DATABASE_URL": other}),
            "restore it onto the engine it was taken from")
    assert not (tmp_path / "y").exists()
    if pgserver.engine == "postgresql":  # a database a server has started on holds the schema already
        refused(cli("restore", str(target), "--data-dir", str(tmp_path / "z")), "is not empty")
        assert not (tmp_path / "z").exists()
    # A damaged file in the backup stops the restore (exit 1); fixed, the same command goes on from there.
    entry = next(f for f in json.loads((target / "manifest.json").read_text())["files"] if f["kind"] == "original")
    good = (target / entry["path"]).read_bytes()
    (target / entry["path"]).write_bytes(good[:-4] + b"rot!")
    pgserver.empty_database_for(tmp_path / "r")
    refused(cli("restore", str(target), "--data-dir", str(tmp_path / "r")), "is damaged", status=1)
    (target / entry["path"]).write_bytes(good)
    again = cli("restore", str(target), "--data-dir", str(tmp_path / "r"))
    assert again.returncode == 0 and "Restored 1 photo " in again.stdout, again.stdout + again.stderr
    assert cli("check", "--data-dir", str(tmp_path / "r")).returncode == 0
    svc.db.close()


def test_pg_dump_older_than_the_server_is_refused_in_one_sentence() -> None:
    old, same, newer = Path("/usr/lib/postgresql/13/bin/pg_dump"), Path("/opt/pg15/pg_dump"), Path("/usr/bin/pg_dump")
    with pytest.raises(ConfigError) as refused:
        pgdump.choose("pg_dump", {old: (13, 4)}, (15, 2))
    assert str(refused.value).startswith("pg_dump 13.4 (/usr/lib/postgresql/13/bin/pg_dump) is older than the "
                                         "database server (15.2)")
    assert str(refused.value).count(".") <= 4 and "\n" not in str(refused.value)
    with pytest.raises(ConfigError, match="not installed"):
        pgdump.choose("pg_restore", {}, (15, 2))
    assert pgdump.choose("pg_dump", {old: (13, 4), same: (15, 1), newer: (16, 0)}, (15, 2)) == same
    assert pgdump.choose("pg_dump", {old: (13, 4), newer: (16, 0)}, (15, 2)) == newer


def test_backup_and_check_have_help_on_every_option() -> None:
    for command in ("backup", "check", "restore"):
        result = cli(command, "--help")
        assert result.returncode == 0
        for line in result.stdout.splitlines():
            if line.strip().startswith("--") and not line.strip().startswith("--help"):
                assert len(line.strip().split(None, 1)) == 2 or "  " in line.strip(), line
