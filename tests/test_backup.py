"""``picpeak-lite backup``: a consistent copy with a manifest; restored into a fresh data directory, it works.

The backup taken during real load is in ``test_load.py``; here the rules one by one, with the command run as
an operator runs it (a subprocess) against a data directory filled through the real pipeline.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import trio

from picpeak_lite import server
from picpeak_lite.ops import bootstrap
from picpeak_lite.services import Services
from picpeak_lite.store import db
from picpeak_lite.store.queries import claims
from picpeak_lite.store.queries import photos as photo_q

from .conftest import make_settings
from .factories import create_gallery, photo_jpeg, run_pool_until_idle, stage_photo
from .harness import cli, file_sha256, query


async def filled_data_dir(tmp_path: Path, photos: int = 3) -> tuple[Services, list[int]]:
    settings = make_settings(tmp_path)
    bootstrap.prepare(settings)
    svc = Services(settings=settings, db=db.Database(settings.database))
    gid = await svc.db.write(create_gallery)
    ids = [stage_photo(svc, gid, photo_jpeg(i), name=f"p{i}.jpg")[0] for i in range(photos)]
    await run_pool_until_idle(svc, count=1)
    return svc, ids


@pytest.mark.sqlite  # backup copies the SQLite file; with PostgreSQL it refuses (pg_dump: README)
async def test_backup_copies_everything_with_a_manifest_and_restores(tmp_path: Path) -> None:
    svc, ids = await filled_data_dir(tmp_path)
    data = svc.settings.data_path
    # One photo is mid-processing when the backup is taken: the copy hands it back to pending.
    late = stage_photo(svc, 1, photo_jpeg(9), name="late.jpg")[0]
    await svc.db.write(claims.claim_next, "t" * 32, 0.0, 3600.0)
    target = tmp_path / "backup"
    done = cli("backup", str(target), "--data-dir", str(data))
    assert done.returncode == 0, done.stderr
    assert "Backed up 4 photos" in done.stdout and "backup [" in done.stderr  # the progress bar
    manifest = json.loads((target / "manifest.json").read_text())
    assert manifest["photos"] == 4 and manifest["format"] == "picpeak-lite-backup/1"
    assert file_sha256(target / "picpeak.sqlite3") == manifest["database"]["sha256"]
    kinds = sorted(f["kind"] for f in manifest["files"])
    assert kinds == ["grid"] * 3 + ["original"] * 4 + ["view"] * 3
    for entry in manifest["files"]:
        assert file_sha256(target / entry["path"]) == entry["sha256"]
        assert (target / entry["path"]).read_bytes() == (data / entry["path"]).read_bytes()
    backed = {r["id"]: r["status"] for r in query(target, "SELECT id, status FROM photos")}
    assert backed == {**dict.fromkeys(ids, "complete"), late: "pending"}
    assert query(data, "SELECT status FROM photos WHERE id = ?", late)[0]["status"] == "processing"  # live: untouched

    # Restore as README says: copy the backup into a fresh data directory and start.
    restored = tmp_path / "restored"
    shutil.copytree(target, restored)
    settings = make_settings(tmp_path, data_dir=str(restored))
    async with trio.open_nursery() as nursery:
        running = await nursery.start(server.run, settings)
        with trio.fail_after(120):  # a hung-test stop only
            while query(restored, "SELECT count(*) AS n FROM photos WHERE status != 'complete'")[0]["n"]:
                await trio.sleep(0.05)
        running.stop()
    check = cli("check", "--data-dir", str(restored))
    assert check.returncode == 0, check.stdout + check.stderr
    assert "photos=4 " in check.stdout and "missing_original=0" in check.stdout
    svc.db.close()


@pytest.mark.sqlite  # backup copies the SQLite file; with PostgreSQL it refuses (pg_dump: README)
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
    assert {r["id"] for r in query(target, "SELECT id FROM photos")} == set(ids[1:])
    svc.db.close()


@pytest.mark.sqlite  # backup copies the SQLite file; with PostgreSQL it refuses (pg_dump: README)
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
    missing = cli("backup", str(tmp_path / "b"), "--data-dir", str(tmp_path / "nothing-here"))
    assert missing.returncode == 2 and "no database" in missing.stderr
    # A changed original is reported (and the command fails), the copy is still made.
    row = query(data, "SELECT storage_key FROM photos")[0]
    original = data / "originals" / row["storage_key"][:2] / row["storage_key"]
    original.write_bytes(original.read_bytes() + b"bitrot")
    damaged = cli("backup", str(tmp_path / "b2"), "--data-dir", str(data))
    assert damaged.returncode == 2 and "differs from its recorded sha256" in damaged.stderr
    svc.db.close()


def test_backup_and_check_have_help_on_every_option() -> None:
    for command in ("backup", "check"):
        result = cli(command, "--help")
        assert result.returncode == 0
        for line in result.stdout.splitlines():
            if line.strip().startswith("--") and not line.strip().startswith("--help"):
                assert len(line.strip().split(None, 1)) == 2 or "  " in line.strip(), line



@pytest.mark.postgresql
async def test_backup_on_postgresql_says_to_use_pg_dump(tmp_path: Path) -> None:
    svc, _ = await filled_data_dir(tmp_path, photos=1)
    done = cli("backup", str(tmp_path / "backup"), "--data-dir", str(svc.settings.data_path))
    assert done.returncode == 2 and "pg_dump" in done.stderr and done.stderr.count("\n") == 1, done.stderr
    assert not (tmp_path / "backup").exists()
