"""``picpeak-lite restore <backup>``: a backup (``ops/backup.py``) made a working library again, on its engine.

The target is what the settings name, and must be new: an empty (or absent) data directory, and with
``database_url`` an empty PostgreSQL database (``CREATE DATABASE``; a server started on it first would have made
the schema, so it would not be empty). Nothing is written before every refusal has been checked.

1. Every file of the manifest is copied into the data directory, hashed on the way and compared with the
   manifest; a file that differs stops the restore (``CommandFailed``), since a restore that hides damage is
   worse than none. A marker file (``.restoring``) says the directory is a restore in progress: run again, it is
   accepted and the files already there and intact are kept.
2. The database last: SQLite's file is copied (verified the same way) into place; PostgreSQL's dump is loaded
   with ``pg_restore`` in one transaction (``store/pgdump.py``).
3. Then, in one transaction on the restored database, what a backup of PostgreSQL cannot do in its dump (see
   ``ops/backup.py``): photos that were ``processing`` go back to ``pending`` (``claims.release_all_claims``;
   no worker holds those claims any more), and the rows of photos deleted after the snapshot
   (``drop_on_restore``) are removed. On an SQLite backup both were done in the copy already, and doing them
   again changes nothing.

Photos go into local storage only, as the backup holds them; ``storage migrate --to s3`` moves them afterwards.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Any

from picpeak_lite.config import Settings
from picpeak_lite.errors import CommandFailed, ConfigError
from picpeak_lite.ops.backup import COPY_CHUNK, FORMAT, MANIFEST, SQLITE_FILE
from picpeak_lite.store import db, pgdump
from picpeak_lite.store.queries import claims
from picpeak_lite.store.queries import photos as photo_q
from picpeak_lite.store.storage import fsync_dir, remove_quietly

Progress = Callable[[int, int, str], None]
RESTORING = ".restoring"
ENGINES = {"sqlite": "SQLite", "postgresql": "PostgreSQL"}


@dataclass
class RestoreSummary:
    engine: str = ""
    photos: int = 0
    copied: int = 0
    kept: int = 0  # already there and intact, from an interrupted run
    bytes_copied: int = 0
    released: int = 0  # photos that were processing when the backup was taken, pending now
    dropped: int = 0  # rows of photos deleted after the backup's snapshot


def restore(settings: Settings, source: str | os.PathLike[str], progress: Progress | None = None) -> RestoreSummary:
    src = Path(source)
    manifest = read_manifest(src)
    database: dict[str, Any] = manifest["database"]
    engine = database.get("engine", "sqlite")
    postgres = bool(settings.database_url)
    if engine != ("postgresql" if postgres else "sqlite"):
        raise ConfigError(f"this backup holds a {ENGINES.get(engine, engine)} database and database_url "
                          f"{'names a PostgreSQL one' if postgres else 'is empty (SQLite)'}; restore it onto the "
                          "engine it was taken from (moving a library between engines is not supported yet)")
    if settings.storage != "local":
        raise ConfigError('restore writes the photos into the data directory: run it with storage = "local", then '
                          "move them with `picpeak-lite storage migrate --to s3`")
    data = settings.data_path
    inside = {data.resolve(), *data.resolve().parents}
    if src.resolve() in inside or data.resolve() in src.resolve().parents:
        raise ConfigError("restore into a data directory apart from the backup directory")
    marker = data / RESTORING
    if data.exists() and any(data.iterdir()) and not marker.exists():
        raise ConfigError(f"{str(data)!r} is not empty; restore into a new data directory")
    dump = src / _relative(database["path"])
    summary = RestoreSummary(engine=engine, photos=int(manifest["photos"]))
    tools = None
    if postgres:
        conn = db.connect(settings.database)
        try:
            tools = pgdump.Tools.find(pgdump.server_version(conn))
            if not pgdump.is_empty(conn):
                raise ConfigError(f"the database {conn.filename} is not empty; restore into a new, empty database "
                                  "(CREATE DATABASE), never one a server has started on")
        finally:
            conn.close()

    data.mkdir(parents=True, exist_ok=True)
    marker.touch()
    fsync_dir(data)
    files: list[dict[str, Any]] = manifest["files"]
    for done, entry in enumerate(files, 1):
        if progress is not None:
            progress(done, len(files), entry["path"])
        _copy_verified(src / _relative(entry["path"]), data / _relative(entry["path"]), entry, summary)
    dropped = [int(photo_id) for photo_id in manifest.get("drop_on_restore", [])]
    if tools is not None:
        _check_file(dump, database)
        pgdump.restore(tools, settings.database, dump)
        _after_load(settings.database, dropped, summary)
    else:
        partial = data / (SQLITE_FILE + ".partial")
        _copy_verified(dump, partial, database, summary, count=False)
        _after_load(str(partial), dropped, summary)
        os.replace(partial, settings.database_path)
    marker.unlink()
    fsync_dir(data)
    return summary


def read_manifest(src: Path) -> dict[str, Any]:
    path = src / MANIFEST
    if not path.exists():
        raise ConfigError(f"{str(src)!r} holds no {MANIFEST}: not a backup, or an unfinished one")
    try:
        manifest = json.loads(path.read_text())
        if manifest.get("format") != FORMAT:
            raise ValueError(f"unknown format {manifest.get('format')!r}")
        if not isinstance(manifest["files"], list) or not {"path", "sha256"} <= set(manifest["database"]):
            raise ValueError("no database or file list")
        int(manifest["photos"])
    except (ValueError, KeyError, TypeError) as error:
        raise ConfigError(f"{str(path)!r} is not a picpeak-lite backup manifest ({error})") from None
    return dict(manifest)


def _relative(path: str) -> Path:
    """A manifest's path, refused unless it stays inside its directory (a backup is data, not instructions)."""
    pure = PurePosixPath(path)
    if pure.is_absolute() or ".." in pure.parts or not pure.parts:
        raise ConfigError(f"the manifest names a path outside the backup: {path!r}")
    return Path(*pure.parts)


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(COPY_CHUNK):
            digest.update(chunk)
    return digest.hexdigest()


def _check_file(path: Path, entry: dict[str, Any]) -> None:
    if not path.exists():
        raise CommandFailed(f"{path} is missing from the backup")
    if path.stat().st_size != entry.get("size", path.stat().st_size) or _sha256(path) != entry["sha256"]:
        raise CommandFailed(f"{path} differs from the sha256 the backup's manifest recorded; it is damaged")


def _copy_verified(source: Path, target: Path, entry: dict[str, Any], summary: RestoreSummary, *,
                   count: bool = True) -> None:
    """Copy one file, hashing it on the way; kept if an interrupted run left it there intact."""
    if target.exists() and target.stat().st_size == entry.get("size") and _sha256(target) == entry["sha256"]:
        summary.kept += count
        return
    if not source.exists():
        raise CommandFailed(f"{source} is missing from the backup")
    target.parent.mkdir(parents=True, exist_ok=True)
    temp = target.with_name(target.name + ".partial")
    digest = hashlib.sha256()
    try:
        with open(source, "rb") as src, open(temp, "wb") as out:
            while chunk := src.read(COPY_CHUNK):
                digest.update(chunk)
                out.write(chunk)
            out.flush()
            os.fsync(out.fileno())
        if digest.hexdigest() != entry["sha256"]:
            raise CommandFailed(f"{source} differs from the sha256 the backup's manifest recorded; it is damaged")
    except BaseException:
        remove_quietly(temp)
        raise
    os.replace(temp, target)
    if count:
        summary.copied += 1
        summary.bytes_copied += target.stat().st_size


def _after_load(target: str, dropped: list[int], summary: RestoreSummary) -> None:
    """Release the snapshot's claims and drop the rows of photos deleted after it, in one transaction."""
    conn = db.connect(target)
    try:
        with db.transaction(conn):
            summary.released = claims.release_all_claims(conn)
            for photo_id in dropped:
                summary.dropped += photo_q.delete(conn, photo_id) is not None
    finally:
        conn.close()
