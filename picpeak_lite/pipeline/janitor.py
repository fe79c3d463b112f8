"""The janitor: recovery and housekeeping on a timer.

* Photos whose lease expired (their worker's process died) go back to ``pending`` without spending an attempt,
  or are failed once that happened ``transitions.MAX_INTERRUPTIONS`` times. An attempt this process is still
  running keeps its photo past the lease: its renewal came late because the machine is loaded, and a slow
  machine must not cost a photo an attempt. It runs every quarter lease, so a crash is recovered within about
  one lease.
* Uploads whose request is still arriving (schema 7) have their lease renewed here, for the requests this
  process receives; an upload whose lease ran out (its process died mid-request) has its provisional photos
  taken back (``transitions.abandon_expired_uploads``), as the request itself would have on its way out.
* Temp files older than ``temp_max_age_seconds`` are removed (uploads cut off by a crash); unfinished tus
  uploads past their expiry lose their bytes (``resumable.expire``, in the process that serves HTTP only).
* Audit trail rows older than ``audit_retention_days`` are removed (with the reconciler's round), and so are the
  limits' rows that say nothing any more (full token buckets, forgotten password failures, expired
  reservations), the stalest past ``limits_q.MAX_KEYS`` too (``limits_q.prune``).
* The reconciler removes stored files that have no row (a crash between the rename and the commit), after a
  grace period so that an upload in the middle of committing is never touched, and fails rows whose original
  is missing.

The first pass runs before ``started()``: when the server says it is ready, recovery has been done.
"""

from __future__ import annotations

import logging
from typing import Any

import trio

from picpeak_lite.errors import StorageUnavailable
from picpeak_lite.pipeline import attempts, intake, resumable, transitions
from picpeak_lite.services import Services
from picpeak_lite.store import locks
from picpeak_lite.store.db import Connection
from picpeak_lite.store.queries import archive as archive_q
from picpeak_lite.store.queries import audit as audit_q
from picpeak_lite.store.queries import guests as guest_q
from picpeak_lite.store.queries import limits as limits_q
from picpeak_lite.store.queries import photos as photo_q
from picpeak_lite.store.queries import replacement as replacement_q
from picpeak_lite.store.queries.photos import PhotoStatus
from picpeak_lite.store.storage import Storage

log = logging.getLogger(__name__)

ORPHAN_GRACE_SECONDS = 600.0
RECONCILE_EVERY_SECONDS = 600.0
# A guest session that never entered a password, picked a favourite or uploaded is forgotten after a day.
IDLE_GUEST_SESSION_SECONDS = 86400.0


class Janitor:
    def __init__(self, svc: Services, *, orphan_grace: float = ORPHAN_GRACE_SECONDS,
                 reconcile_every: float = RECONCILE_EVERY_SECONDS, expire_tus: bool = True) -> None:
        self.svc = svc
        self.expire_tus = expire_tus  # only where the tus writers are (server.start_background_tasks)
        self.storage = svc.storage
        self.orphan_grace = orphan_grace
        self.reconcile_every = reconcile_every
        self.interval = max(1.0, svc.settings.lease_seconds / 4)

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        await self.requeue_expired()
        await self._reconcile()
        task_status.started()
        last_reconcile = trio.current_time()
        while True:
            await trio.sleep(self.interval)
            await self.requeue_expired()
            if trio.current_time() - last_reconcile >= self.reconcile_every:
                await self._reconcile()
                last_reconcile = trio.current_time()

    async def _reconcile(self) -> None:
        try:
            await self.reconcile()
        except StorageUnavailable:  # the bucket is down: nothing was changed half; tried again next round
            log.warning("reconciler: the photo storage did not answer; trying again later")

    async def renew_and_abandon_uploads(self) -> int:
        """Renew the leases of this process's requests still arriving; take back those nobody renews. Returns
        how many photos were taken back."""
        svc = self.svc
        lease = svc.settings.lease_seconds
        active = sorted(intake.receiving_uploads())
        if active:
            await svc.db.write(photo_q.renew_receiving, active, svc.clock() + lease)
        rows = await svc.db.write(transitions.abandon_expired_uploads, svc.settings.webhooks, svc.clock())
        if rows:
            log.warning("took back %d photos of uploads whose request never ended (a crash?)", len(rows))
            await trio.to_thread.run_sync(_remove_files, self.storage, [r["storage_key"] for r in rows])
            svc.webhooks_bell.ring()
        return len(rows)

    async def requeue_expired(self) -> tuple[list[int], list[int]]:
        await self.renew_and_abandon_uploads()
        svc = self.svc
        # This process's attempts still running keep their claims even past the lease (a slow machine, not a
        # dead worker): an attempt is over (its row written) before its token leaves the registry.
        alive = frozenset(attempts.running())
        requeued, failed = await svc.db.write(
            transitions.requeue_expired, svc.settings.webhooks, svc.clock(), alive
        )
        if requeued:
            log.warning("requeued photos whose worker stopped answering: %s", requeued)
            svc.workers_bell.ring()
        if failed:
            log.error("gave up on photos interrupted %d times: %s", transitions.MAX_INTERRUPTIONS, failed)
            svc.webhooks_bell.ring()
        return requeued, failed

    async def reconcile(self) -> dict[str, int]:
        """Take back dead requests' rows, sweep temp files, remove orphan files, fail rows without an original.
        Returns counts."""
        svc = self.svc
        abandoned = await self.renew_and_abandon_uploads()
        now = svc.clock()
        swept = await trio.to_thread.run_sync(self.storage.sweep_temp, svc.settings.temp_max_age_seconds, now)
        if self.expire_tus:
            await resumable.expire(svc)
        await svc.db.write(audit_q.prune, now - svc.settings.audit_retention_days * 86400)
        await svc.db.write(limits_q.prune, now, limits_q.MAX_KEYS)
        rows = await svc.db.read(photo_q.rows_with_keys)
        known = {r["storage_key"] for r in rows} | await svc.db.read(replacement_q.previous_keys)
        candidates = await trio.to_thread.run_sync(self._orphan_candidates, known, now)
        # Decided again under the write lock, which an upload's commit also holds when it checks that its files
        # are still there: either the row wins or the upload reports the file lost; never a row without a file.
        orphans = len(await svc.db.write(remove_orphans, self.storage, candidates)) if candidates else 0
        missing = await trio.to_thread.run_sync(self._rows_missing_original, rows)
        failed = 0
        for photo_id in missing:
            if await svc.db.write(_fail_if_still_missing, self.storage, svc.settings.webhooks, photo_id, now):
                failed += 1
        if failed:
            svc.webhooks_bell.ring()
        pruned = await svc.db.write(guest_q.prune_idle_sessions, now - IDLE_GUEST_SESSION_SECONDS)
        counts = {"temp_swept": swept, "orphans_removed": orphans, "missing_failed": failed}
        if swept or orphans or failed or pruned or abandoned:
            log.warning("reconciler: %s, idle guest sessions pruned: %d, photos of dead requests taken back: %d",
                        counts, pruned, abandoned)
        return counts

    def _orphan_candidates(self, known: set[str], now: float) -> set[str]:
        """Storage keys with files older than the grace period and no row (as of the read above)."""
        candidates = {key for key, mtime in self.storage.iter_original_keys()
                      if key not in known and now - mtime > self.orphan_grace}
        candidates |= {key for key, _, mtime in self.storage.iter_derived()
                       if key not in known and now - mtime > self.orphan_grace}
        return candidates

    def _rows_missing_original(self, rows: list[dict[str, Any]]) -> list[int]:
        stored = {key for key, _ in self.storage.iter_original_keys()}  # one listing, not a look-up per row
        # An archived gallery's originals are packed away on purpose (pipeline/archive.py).
        return [r["id"] for r in rows
                if r["status"] != PhotoStatus.FAILED and not r["archived"] and r["storage_key"] not in stored]


def remove_orphans(conn: Connection, storage: Storage, keys: set[str]) -> set[str]:
    """Remove the files of every key that still has no row; returns those keys. Run it in a write transaction:
    an upload checks its files under the same lock before it inserts their rows."""
    locks.hold(conn, locks.PHOTO_ROWS)
    removed = set()
    for key in sorted(keys):
        if not photo_q.key_in_use(conn, key):
            storage.remove_photo_files(key)
            removed.add(key)
    return removed


def _fail_if_still_missing(conn: Connection, storage: Storage, endpoints: Any, photo_id: int, now: float) -> bool:
    """Checked again inside the write transaction: a delete may have raced the scan."""
    row = photo_q.get(conn, photo_id)
    if row is None or archive_q.photo_archived(conn, photo_id) or storage.has_original(row["storage_key"]):
        return False
    return transitions.fail_missing_original(conn, endpoints, photo_id, now) is not None


def _remove_files(storage: Storage, keys: list[str]) -> None:
    for key in keys:
        storage.remove_photo_files(key)
