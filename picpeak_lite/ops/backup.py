"""``picpeak-lite backup <dir>``: a consistent copy of a data directory, taken while the server runs.

The backup directory has the layout of a data directory plus ``manifest.json``; ``picpeak-lite restore``
(``ops/restore.py``) makes a working library of it again (with SQLite, copying it into a fresh data directory
does too):

1. The database is copied as one snapshot while the server goes on writing. SQLite: the online backup API
   (``db.backup_to``) under one read transaction (WAL), into ``picpeak.sqlite3``. PostgreSQL: ``pg_dump`` in its
   custom format into ``picpeak.pgdump`` (``store/pgdump.py``), in a snapshot our own connection exported with
   ``pg_export_snapshot()`` and read the photo rows in, so that the files copied are exactly those of the rows in
   the dump (pg_dump's own snapshot would be a moment later than any rows we read).
2. Claims of photos that were ``processing`` are released to ``pending``, so that a restored server reprocesses
   them at once instead of waiting for their lease, never in the live database. SQLite: in the copy, at once.
   PostgreSQL: a dump cannot be edited (and loading it into a scratch database to edit and dump it again would
   double the work and need a second database), so ``restore`` does it on the restored database, in the
   transaction after pg_restore; a server must not be started on the dump's database before that, and
   ``restore`` is the documented way in.
3. The originals of every row in the snapshot are copied, each hashed on the way and compared with the
   sha256 recorded at upload (an archived gallery's originals as its one archive object, ``store/packing.py``);
   the grid and view images of complete photos are copied too (they could be
   regenerated, but copying is faster than decoding). A row whose photo was deleted after the snapshot is
   dropped from the copy, since the live data dropped it as well (PostgreSQL: listed in the manifest's
   ``drop_on_restore``, and dropped by ``restore`` with the claims).
4. ``manifest.json`` lists every file with its size and sha256, and the database's; it is written last, so a
   directory without it is an unfinished backup.

Running it again into the same directory is incremental: originals never change under their key, so a file
the previous manifest lists with the same size is kept; files of photos deleted since are removed. The database
is copied whole each time.

With S3 storage the files are copied from the bucket, object by object, into the same layout: a backup restores
into local storage (and ``storage migrate --to s3`` moves it back).
"""

from __future__ import annotations

import datetime as dt
import hashlib
import json
import os
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from picpeak_lite.config import Settings
from picpeak_lite.errors import ConfigError
from picpeak_lite.store import db, pgdump
from picpeak_lite.store.queries import claims
from picpeak_lite.store.queries import photos as photo_q
from picpeak_lite.store.queries.photos import PhotoStatus
from picpeak_lite.store.storage import (
    DERIVATIVES,
    Storage,
    derived_name,
    file_sha256,
    fsync_dir,
    fsync_file,
    open_storage,
    original_name,
    remove_quietly,
)

Progress = Callable[[int, int, str], None]
MANIFEST = "manifest.json"
SQLITE_FILE = "picpeak.sqlite3"
PG_DUMP = "picpeak.pgdump"
FORMAT = "picpeak-lite-backup/1"
COPY_CHUNK = 1024 * 1024


@dataclass
class BackupSummary:
    photos: int = 0
    copied: int = 0
    kept: int = 0  # already in the backup from an earlier run
    removed: int = 0  # files of photos deleted since the earlier run
    bytes_copied: int = 0
    released: int = 0  # photos that were processing, pending again in the copy
    deleted_meanwhile: int = 0
    missing_derivatives: int = 0
    missing_originals: list[int] = field(default_factory=list)
    sha_mismatch: list[int] = field(default_factory=list)
    files: list[dict[str, Any]] = field(default_factory=list)  # what the manifest lists

    @property
    def problems(self) -> int:
        return len(self.missing_originals) + len(self.sha_mismatch)


def backup(settings: Settings, target: str | os.PathLike[str], progress: Progress | None = None) -> BackupSummary:
    postgres = bool(settings.database_url)
    if not postgres and not settings.database_path.exists():
        raise ConfigError(f"no database in {str(settings.data_path)!r}; is --data-dir right?")
    dest = Path(target)
    data = settings.data_path.resolve()
    if dest.resolve() == data or data in dest.resolve().parents:
        raise ConfigError("the backup directory must be outside the data directory")
    live = db.connect(settings.database)
    try:
        tools = server = None
        if postgres:  # the tools first: a refusal (pg_dump older than the server) leaves nothing behind
            server = pgdump.server_version(live)
            tools = pgdump.Tools.find(server)
        previous = _prepare_target(dest)
        summary = BackupSummary()
        if tools is not None:
            database, dropped = _backup_postgresql(settings, live, tools, dest, previous, summary, progress)
        else:
            database, dropped = _backup_sqlite(settings, live, dest, previous, summary, progress)
    finally:
        live.close()
    fsync_dir(dest)
    manifest = {
        "format": FORMAT,
        "created_at": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
        "source": str(data),
        "database": {"path": database.name, "engine": "postgresql" if postgres else "sqlite",
                     "size": database.stat().st_size, "sha256": file_sha256(database),
                     **({"server_version": f"{server[0]}.{server[1]}"} if server else {})},
        "photos": summary.photos - summary.deleted_meanwhile,
        # Rows in the database copy whose photo was deleted after the snapshot: a restore removes them.
        "drop_on_restore": dropped,
        "files": [{k: v for k, v in f.items() if k != "photo_id"} for f in summary.files],
    }
    temp = dest / (MANIFEST + ".partial")
    temp.write_text(json.dumps(manifest, indent=1))
    fsync_file(temp)
    os.replace(temp, dest / MANIFEST)
    fsync_dir(dest)
    return summary


def _backup_sqlite(settings: Settings, live: db.Connection, dest: Path, previous: dict[str, dict[str, Any]],
                   summary: BackupSummary, progress: Progress | None) -> tuple[Path, list[int]]:
    """The SQLite file copied with the online backup API, its claims released and its late-deleted rows dropped
    in the copy; returns the database file in ``dest`` and those rows (listed in the manifest as on PostgreSQL;
    dropping them again at restore changes nothing)."""
    partial = dest / (SQLITE_FILE + ".partial")
    _remove_database(partial)
    db.backup_to(live, partial)
    copy = db.connect(partial)
    try:
        with db.transaction(copy):
            summary.released = claims.release_all_claims(copy)
            rows = photo_q.rows_for_check(copy)
        dropped = _copy_all(settings, live, dest, rows, previous, summary, progress)
        with db.transaction(copy):
            for photo_id in dropped:
                photo_q.delete(copy, photo_id)
        integrity = db.integrity_check(copy)
        if integrity != "ok":
            raise ConfigError(f"the database copy failed its integrity check: {integrity}")
    finally:
        copy.close()
    database = dest / SQLITE_FILE
    fsync_file(partial)
    os.replace(partial, database)
    remove_quietly(dest / PG_DUMP)  # from an earlier backup of this library on PostgreSQL
    return database, dropped


def _backup_postgresql(settings: Settings, live: db.Connection, tools: pgdump.Tools, dest: Path,
                       previous: dict[str, dict[str, Any]], summary: BackupSummary, progress: Progress | None
                       ) -> tuple[Path, list[int]]:
    """pg_dump in the snapshot the photo rows were read in; returns the dump in ``dest`` and the photos the
    restore drops (deleted after the snapshot). Claims are released at restore (see the module's docstring)."""
    partial = dest / (PG_DUMP + ".partial")
    remove_quietly(partial)
    with pgdump.snapshot(live) as snapshot_id:
        rows = photo_q.rows_for_check(live)
        pgdump.dump(tools, settings.database, partial, snapshot_id=snapshot_id)
    # The transaction ends before the files are copied: it would hold back the server's vacuum meanwhile.
    summary.released = sum(row["status"] == PhotoStatus.PROCESSING for row in rows)
    dropped = _copy_all(settings, live, dest, rows, previous, summary, progress)
    pgdump.verify(tools, partial)
    database = dest / PG_DUMP
    fsync_file(partial)
    os.replace(partial, database)
    _remove_database(dest / SQLITE_FILE)  # from an earlier backup of this library on SQLite
    return database, dropped


def _copy_all(settings: Settings, live: db.Connection, dest: Path, rows: list[dict[str, Any]],
              previous: dict[str, dict[str, Any]], summary: BackupSummary, progress: Progress | None) -> list[int]:
    """Copy the files of ``rows`` (the snapshot's photos) and remove what the backup holds of photos no longer
    in it; returns the photos deleted live after the snapshot, whose rows the copy must lose too. The list of
    files is kept on ``summary`` for the manifest."""
    summary.photos = len(rows)
    storage = open_storage(settings)
    storage.check_access()
    files, gone = _copy_files(storage, dest, rows, previous, summary, progress)
    dropped: list[int] = []
    if gone:
        # Gone since the snapshot: confirm against the live database; a row still there is a missing original.
        with db.transaction(live, immediate=False):
            still_there = set(photo_q.existing_ids(live, gone))
        summary.missing_originals += [photo_id for photo_id in gone if photo_id in still_there]
        dropped = [photo_id for photo_id in gone if photo_id not in still_there]
        files = [f for f in files if f.get("photo_id") not in set(dropped)]
    summary.deleted_meanwhile = len(dropped)
    summary.files = files
    summary.removed = _remove_stale(dest, {f["path"] for f in files})
    return dropped


def _prepare_target(dest: Path) -> dict[str, dict[str, Any]]:
    """Create ``dest`` or accept an earlier backup there; returns the earlier manifest's files by path."""
    if dest.exists() and not dest.is_dir():
        raise ConfigError(f"{str(dest)!r} is not a directory")
    dest.mkdir(parents=True, exist_ok=True)
    manifest = dest / MANIFEST
    if manifest.exists():
        try:
            earlier = json.loads(manifest.read_text())
            if earlier.get("format") != FORMAT:
                raise ValueError("unknown format")
            return {f["path"]: f for f in earlier["files"]}
        except (ValueError, KeyError, TypeError) as error:
            raise ConfigError(f"{str(manifest)!r} is not a picpeak-lite backup manifest ({error})") from None
    if any(not p.name.startswith((SQLITE_FILE + ".partial", PG_DUMP + ".partial")) for p in dest.iterdir()):
        raise ConfigError(f"{str(dest)!r} is not empty and holds no earlier backup; choose an empty directory")
    return {}


def _copy_files(storage: Storage, dest: Path, rows: list[dict[str, Any]], previous: dict[str, dict[str, Any]],
                summary: BackupSummary, progress: Progress | None) -> tuple[list[dict[str, Any]], list[int]]:
    # From here until the new manifest is written, the directory is not a finished backup.
    remove_quietly(dest / MANIFEST)
    files: list[dict[str, Any]] = []
    gone: list[int] = []
    archives: dict[str, list[int]] = {}  # an archived gallery's archive object -> the photos packed in it
    for done, row in enumerate(rows, 1):
        if progress is not None:
            progress(done, len(rows), row["display_name"])
        key = row["storage_key"]
        entry = _copy_one(storage, original_name(key), dest, previous, summary)
        if entry is None and row["archived"] and row["archive_object"] is not None:
            archives.setdefault(row["archive_object"], []).append(row["id"])  # packed (pipeline/archive.py)
            continue
        if entry is None:
            gone.append(row["id"])
            continue
        if entry["sha256"] != row["sha256"]:
            summary.sha_mismatch.append(row["id"])
        files.append({**entry, "kind": "original", "key": key, "photo_id": row["id"]})
        if row["status"] != PhotoStatus.COMPLETE:
            continue
        for kind in DERIVATIVES:
            derived = _copy_one(storage, derived_name(key, kind), dest, previous, summary)
            if derived is None:
                summary.missing_derivatives += 1
            else:
                files.append({**derived, "kind": kind, "key": key, "photo_id": row["id"]})
    for name, photo_ids in sorted(archives.items()):
        packed = _copy_one(storage, name, dest, previous, summary)
        if packed is None:  # restored meanwhile: confirmed against the live database like any other gone file
            gone.extend(photo_ids)
        else:
            files.append({**packed, "kind": "archive"})
    return files, gone


def _copy_one(storage: Storage, relative: str, dest: Path, previous: dict[str, dict[str, Any]],
              summary: BackupSummary) -> dict[str, Any] | None:
    """Copy one stored file (hashing it on the way) unless the earlier backup has it; None if it is gone."""
    target = dest / relative
    earlier = previous.get(relative)
    try:
        size = storage.stat(relative).size
    except FileNotFoundError:
        return None
    if earlier is not None and earlier.get("size") == size and target.exists() and target.stat().st_size == size:
        summary.kept += 1
        return {"path": relative, "size": size, "sha256": earlier["sha256"]}
    target.parent.mkdir(parents=True, exist_ok=True)
    temp = target.with_name(target.name + ".partial")
    digest = hashlib.sha256()
    try:
        with storage.open(relative) as src, open(temp, "wb") as out:
            while chunk := src.read(COPY_CHUNK):
                digest.update(chunk)
                out.write(chunk)
            out.flush()
            os.fsync(out.fileno())
    except FileNotFoundError:
        remove_quietly(temp)
        return None
    os.replace(temp, target)
    summary.copied += 1
    summary.bytes_copied += size
    return {"path": relative, "size": size, "sha256": digest.hexdigest()}


def _remove_stale(dest: Path, keep: set[str]) -> int:
    """Files an earlier run copied for photos that are gone now (and leftovers of an interrupted run)."""
    removed = 0
    for sub in ("originals", "derived", "archives"):
        base = dest / sub
        if not base.exists():
            continue
        for path in base.rglob("*"):
            if path.is_file() and path.relative_to(dest).as_posix() not in keep:
                path.unlink()
                removed += 1
    for shard in [p for sub in ("originals", "derived") if (dest / sub).exists() for p in (dest / sub).iterdir()]:
        if shard.is_dir() and not any(shard.iterdir()):
            shard.rmdir()
    return removed


def _remove_database(path: Path) -> None:
    for suffix in ("", "-wal", "-shm", "-journal"):
        remove_quietly(Path(str(path) + suffix))
