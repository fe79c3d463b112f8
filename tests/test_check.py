"""``picpeak-lite check``: every kind of damage is found, counted, and (where it can be) repaired.

The data directory is filled through the real pipeline, damaged by hand, and the command is run as an
operator runs it (a subprocess).
"""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

from picpeak_lite.store import db
from picpeak_lite.store.storage import new_key

from .factories import run_pool_until_idle
from .harness import cli, query
from .test_backup import filled_data_dir


def counts(stdout: str) -> dict[str, str]:
    line = next(line for line in stdout.splitlines() if line.startswith("check: "))
    return dict(part.split("=", 1) for part in line.removeprefix("check: ").split())


async def test_a_healthy_data_directory_passes(tmp_path: Path) -> None:
    svc, _ = await filled_data_dir(tmp_path)
    done = cli("check", "--data-dir", str(svc.settings.data_path))
    assert done.returncode == 0, done.stdout + done.stderr
    assert counts(done.stdout) == {
        "photos": "3", "originals_checked": "3", "missing_original": "0", "sha_mismatch": "0",
        "missing_derivatives": "0", "orphans": "0", "young_orphans": "0", "temp_files": "0", "integrity": "ok"}
    svc.db.close()


async def test_damage_is_found_and_repaired(tmp_path: Path) -> None:
    svc, ids = await filled_data_dir(tmp_path, photos=4)
    data = svc.settings.data_path
    keys = {r["id"]: r["storage_key"] for r in query(data, "SELECT id, storage_key FROM photos")}
    storage = svc.storage
    storage.derived_path(keys[ids[0]], "grid").unlink()  # a thumbnail lost
    storage.original_path(keys[ids[1]]).unlink()  # an original lost
    rotten = storage.original_path(keys[ids[2]])
    rotten.write_bytes(rotten.read_bytes()[:-10] + b"0123456789")  # an original changed
    old_orphan = storage.original_path(new_key())
    old_orphan.parent.mkdir(exist_ok=True)
    old_orphan.write_bytes(b"left by a crash between rename and commit")
    os.utime(old_orphan, (time.time() - 3600, time.time() - 3600))
    young_orphan = storage.original_path(new_key())
    young_orphan.parent.mkdir(exist_ok=True)
    young_orphan.write_bytes(b"an upload committing right now")

    found = cli("check", "--data-dir", str(data))
    assert found.returncode == 1
    assert counts(found.stdout) == {
        "photos": "4", "originals_checked": "3", "missing_original": "1", "sha_mismatch": "1",
        "missing_derivatives": "1", "orphans": "1", "young_orphans": "1", "temp_files": "0", "integrity": "ok"}
    for expected in (f"photo {ids[0]}: thumbnails missing", f"photo {ids[1]}: original missing",
                     f"photo {ids[2]}: sha256 differs", f"orphan file: {old_orphan}"):
        assert expected in found.stderr, found.stderr

    repaired = cli("check", "--repair", "--data-dir", str(data))
    assert "repair: requeued=1 failed=1 orphans_removed=1" in repaired.stdout, repaired.stdout
    assert repaired.returncode == 1  # the changed original cannot be repaired
    assert "1 problem left" in repaired.stderr
    assert not old_orphan.exists() and young_orphan.exists()
    rows = {r["id"]: r for r in query(data, "SELECT id, status, attempts, error FROM photos")}
    assert (rows[ids[0]]["status"], rows[ids[0]]["attempts"]) == ("pending", 0)
    assert rows[ids[1]]["status"] == "failed" and "missing" in rows[ids[1]]["error"]

    await run_pool_until_idle(svc, count=1)  # what the running server does with the requeued photo
    assert storage.derived_path(keys[ids[0]], "grid").exists()
    rotten.unlink()
    young_orphan.unlink()
    with_db = cli("check", "--repair", "--data-dir", str(data))
    assert "repair: requeued=0 failed=1" in with_db.stdout
    assert cli("check", "--data-dir", str(data), "--grace", "0").returncode == 0
    svc.db.close()


@pytest.mark.sqlite  # no SQLite file in the data directory; a PostgreSQL database is there or refuses to connect
def test_check_without_a_database_is_one_line() -> None:
    done = cli("check", "--data-dir", "/nonexistent/picpeak")
    assert done.returncode == 2 and len(done.stderr.strip().splitlines()) == 1, done.stderr
    assert "no database" in done.stderr


@pytest.mark.postgresql  # SQLite has no index that can be left invalid; its integrity_check reads every page
async def test_an_invalid_index_on_postgresql_is_reported(tmp_path: Path) -> None:
    svc, _ = await filled_data_dir(tmp_path, photos=2)
    data = svc.settings.data_path
    # A unique index built concurrently over duplicate values fails and stays behind, invalid.
    with pytest.raises(db.ConstraintError):
        query(data, "CREATE UNIQUE INDEX CONCURRENTLY one_photo_per_gallery ON photos (gallery_id)")
    done = cli("check", "--data-dir", str(data))
    assert done.returncode == 1, done.stdout + done.stderr
    assert "integrity=invalid index one_photo_per_gallery (drop it, or REINDEX it)" in done.stdout, done.stdout
    query(data, "DROP INDEX one_photo_per_gallery")
    assert cli("check", "--data-dir", str(data)).returncode == 0
    svc.db.close()


def test_check_and_backup_with_an_unreachable_database_say_so_in_one_line(tmp_path: Path) -> None:
    nobody = {"PICPEAK_DATABASE_URL": "postgresql://picpeak@127.0.0.1:1/picpeak"}  # port 1: refused at once
    for args in (("check",), ("backup", str(tmp_path / "b")), ("restore", str(tmp_path))):
        done = cli(*args, "--data-dir", str(tmp_path / "d"), env=nobody)
        assert done.returncode in (1, 2) and len(done.stderr.strip().splitlines()) == 1, done.stderr
        assert "Traceback" not in done.stderr
    assert "cannot connect to the database at postgresql://picpeak@127.0.0.1:1/picpeak" in cli(
        "check", "--data-dir", str(tmp_path / "d"), env=nobody).stderr
    assert not (tmp_path / "b").exists()
