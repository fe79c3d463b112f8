"""``picpeak-lite check``: read everything back and say what is wrong.

* every photo row's original exists (unless the row is ``failed`` because it was missing) and matches the
  sha256 recorded at upload;
* every ``complete`` photo has its grid and view images;
* no original or derivative lies in storage without a row (older than the grace period: a file younger than
  that may belong to an upload that is committing right now, the reconciler's rule);
* the database's own structures are sound (``db.integrity_check``: SQLite's ``PRAGMA integrity_check``; on
  PostgreSQL the schema is readable and no index is left invalid).

Safe while the server runs: rows are read first, then the files; a problem found for a row is confirmed
against a fresh read before it is reported, so a photo deleted during the scan is not a false alarm.

``--repair`` fixes what can be fixed without the original being different: a complete photo with a missing
derivative is queued again (``pending``, fresh attempts; its webhooks keep their ids, so nothing is delivered
twice), a row whose original is gone is failed with that reason (as the reconciler does), and orphan files
older than the grace period are removed. A changed original cannot be repaired: restore it from a backup.

Sync on purpose, like the rest of the command line; the SQL is in ``queries.photos``.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path, PurePath

from picpeak_lite.config import Settings
from picpeak_lite.errors import ConfigError
from picpeak_lite.pipeline import transitions
from picpeak_lite.pipeline.janitor import claim_orphans
from picpeak_lite.store import db
from picpeak_lite.store.queries import photos as photo_q
from picpeak_lite.store.queries import replacement as replacement_q
from picpeak_lite.store.queries import reservations as reservations_q
from picpeak_lite.store.queries.photos import PhotoStatus
from picpeak_lite.store.storage import DERIVATIVES, Storage, open_storage, original_name

Progress = Callable[[int, int, str], None]
DEFAULT_GRACE_SECONDS = 600.0


@dataclass
class Report:
    photos: int = 0
    originals_checked: int = 0
    missing_original: list[int] = field(default_factory=list)
    sha_mismatch: list[int] = field(default_factory=list)
    missing_derivatives: list[int] = field(default_factory=list)
    orphans: list[PurePath] = field(default_factory=list)  # files, or objects in the bucket
    young_orphans: int = 0  # within the grace period: not a problem yet
    failed_missing: int = 0  # rows already failed because their original is gone: known, not new
    archived: int = 0  # photos of archived galleries: their originals are in the gallery's archive object
    # Originals referenced in place (a hot folder's, Storage.link_original) whose file left its folder: (photo, path).
    vanished: list[tuple[int, Path]] = field(default_factory=list)
    temp_files: int = 0
    integrity: str = "ok"
    requeued: int = 0
    failed_now: int = 0
    orphans_removed: int = 0

    @property
    def problems(self) -> int:
        return (len(self.missing_original) + len(self.sha_mismatch) + len(self.missing_derivatives)
                + len(self.orphans) + (self.integrity != "ok"))

    @property
    def unrepaired(self) -> int:
        """Problems left after ``--repair``."""
        return (len(self.missing_original) - self.failed_now + len(self.sha_mismatch)
                + len(self.missing_derivatives) - self.requeued + len(self.orphans) - self.orphans_removed
                + (self.integrity != "ok"))

    def summary(self) -> str:
        return (f"photos={self.photos} originals_checked={self.originals_checked} "
                f"missing_original={len(self.missing_original)} sha_mismatch={len(self.sha_mismatch)} "
                f"missing_derivatives={len(self.missing_derivatives)} orphans={len(self.orphans)} "
                f"young_orphans={self.young_orphans} temp_files={self.temp_files} integrity={self.integrity}"
                + (f" archived={self.archived}" if self.archived else "")
                + (f" vanished_in_place={len(self.vanished)}" if self.vanished else ""))



def check_data_dir(settings: Settings, *, grace: float = DEFAULT_GRACE_SECONDS, repair: bool = False,
          progress: Progress | None = None, now: float | None = None) -> Report:
    if not settings.database_url and not settings.database_path.exists():
        raise ConfigError(f"no database in {str(settings.data_path)!r}; is --data-dir right?")
    now = time.time() if now is None else now
    storage = open_storage(settings)
    storage.check_access()
    report = Report()
    conn = db.connect(settings.database)
    try:
        report.integrity = db.integrity_check(conn)
        with db.transaction(conn, immediate=False):
            rows = photo_q.rows_for_check(conn)
            kept = replacement_q.previous_keys(conn)  # previous versions waiting for confirmation
        report.photos = len(rows)
        suspects: dict[str, list[int]] = {"missing": [], "sha": [], "derived": []}
        for done, row in enumerate(rows, 1):
            if progress is not None:
                progress(done, len(rows), row["display_name"])
            if row["archived"]:
                report.archived += 1  # packed away on purpose; `gallery restore` checks them against the manifest
                continue
            name = original_name(row["storage_key"])
            if not storage.exists(name):
                source = storage.referenced_source(row["storage_key"])
                if source is not None:
                    report.vanished.append((row["id"], source))
                if row["status"] == PhotoStatus.FAILED:
                    report.failed_missing += 1
                else:
                    suspects["missing"].append(row["id"])
                continue
            report.originals_checked += 1
            if storage.sha256_of(name) != row["sha256"]:
                suspects["sha"].append(row["id"])
            if row["status"] == PhotoStatus.COMPLETE and not all(
                    storage.has_derivative(row["storage_key"], kind) for kind in DERIVATIVES):
                suspects["derived"].append(row["id"])
        # Files are listed after the rows were read: a file whose row commits after that is young.
        keys = {r["storage_key"] for r in rows} | kept
        # Listed (a bucket page by page), not looked up one by one.
        candidates = [(key, storage.location(original_name(key)), mtime) for key, mtime in storage.iter_original_keys()]
        candidates += list(storage.iter_derived())
        orphan_keys: dict[str, list[PurePath]] = {}
        for key, path, mtime in candidates:
            if key in keys:
                continue
            if now - mtime > grace:
                orphan_keys.setdefault(key, []).append(path)
            else:
                report.young_orphans += 1
        if storage.tmp_dir.exists():
            report.temp_files = sum(1 for _ in os.scandir(storage.tmp_dir))
        # Confirm each suspect against the database as it is now (the server may have moved on).
        with db.transaction(conn, immediate=False):
            current = {r["id"]: r for r in photo_q.rows_for_check(conn)}
            live_keys = {r["storage_key"] for r in current.values()} | replacement_q.previous_keys(conn)
            # An upload still writing or committing its file (a reservation within the grace period).
            live_keys |= {key for key, at in reservations_q.reserved(conn).items() if now - at <= grace}
        for photo_id in suspects["missing"]:
            found = current.get(photo_id)
            if found is not None and found["status"] != PhotoStatus.FAILED and not storage.has_original(
                    found["storage_key"]):
                report.missing_original.append(photo_id)
        report.sha_mismatch = [i for i in suspects["sha"] if i in current]
        for photo_id in suspects["derived"]:
            found = current.get(photo_id)
            if found is not None and found["status"] == PhotoStatus.COMPLETE and not all(
                    storage.has_derivative(found["storage_key"], kind) for kind in DERIVATIVES):
                report.missing_derivatives.append(photo_id)
        report.orphans = sorted(p for key, paths in orphan_keys.items() if key not in live_keys for p in paths)
        if repair:
            _repair(conn, settings, storage, report, now, grace)
    finally:
        conn.close()
    return report


def _repair(conn: db.Connection, settings: Settings, storage: Storage, report: Report, now: float,
            grace: float) -> None:
    for photo_id in report.missing_derivatives:
        with db.transaction(conn):
            report.requeued += photo_q.requeue_for_derivatives(conn, photo_id)
    for photo_id in report.missing_original:
        with db.transaction(conn):
            report.failed_now += transitions.fail_missing_original(conn, settings.webhooks, photo_id, now) is not None
    if report.orphans:
        # Claimed in a write transaction from rows alone, as the reconciler does (never a key that has a row or a
        # live reservation by now); the files go after it committed.
        with db.transaction(conn):
            removed = claim_orphans(conn, {path.name.split(".", 1)[0] for path in report.orphans}, now - grace)
        storage.remove_files_of(sorted(removed))
        report.orphans_removed += sum(path.name.split(".", 1)[0] in removed for path in report.orphans)
