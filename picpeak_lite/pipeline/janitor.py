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
  uploads past their expiry lose their bytes (``resumable.expire``: any process, a live writer lease spares one).
  Every process does this for its own host (:meth:`Janitor.sweep_local`).
* Audit trail rows older than ``audit_retention_days`` are removed (with the reconciler's round), and so are the
  limits' rows that say nothing any more (full token buckets, forgotten password failures, expired
  reservations), the stalest past ``limits_q.MAX_KEYS`` too (``limits_q.prune``).
* The reconciler's round is shared by the whole service, so one process does it at a time: the one that takes
  the ``reconciler`` lease as its turn (``runtime/lease.py``), every ``reconcile_every`` between them all.
* The reconciler removes stored files that have no row (a crash between the rename and the commit), and fails
  rows whose original is missing. It never asks the storage anything inside a write transaction (with S3 each
  question is a network call, and the write would hold every other writer meanwhile): uploads and the
  reconciler agree through key reservations (schema 28, ``store/queries/reservations.py``), rows in the database.

  The order that keeps every file that a row or a 202 points at, whatever crashes where:

  1. An upload reserves its new key (a committed row) before it writes the file; it takes the reservation in
     the transaction that inserts the photo's row, and says "lost" instead of 202 when the reservation is gone.
  2. The reconciler, in one transaction (:func:`claim_orphans`), gives up a key only if it has no row and either
     no reservation (nothing can ever give it a row: rows come only from reservations) or an expired one, which
     it deletes there. It removes the files only after that transaction committed.

  A crash after 1's reservation leaves a reservation (expired after the grace period: step 2 removes whatever
  was written); a crash between 2's commit and the removal leaves files with neither row nor reservation, which
  the next round removes once they are older than the grace period. Never a row without its file.

The first pass runs before ``started()``: when the server says it is ready, recovery has been done.
"""

from __future__ import annotations

import logging
import math
from typing import Any

import trio

from picpeak_lite.errors import StorageUnavailable
from picpeak_lite.pipeline import attempts, intake, resumable, transitions
from picpeak_lite.runtime.lease import LeaseLost
from picpeak_lite.services import Services
from picpeak_lite.store.db import Connection
from picpeak_lite.store.queries import archive as archive_q
from picpeak_lite.store.queries import audit as audit_q
from picpeak_lite.store.queries import guests as guest_q
from picpeak_lite.store.queries import leases as leases_q
from picpeak_lite.store.queries import limits as limits_q
from picpeak_lite.store.queries import photos as photo_q
from picpeak_lite.store.queries import replacement as replacement_q
from picpeak_lite.store.queries import reservations as reservations_q
from picpeak_lite.store.queries.photos import PhotoStatus
from picpeak_lite.store.storage import Storage

log = logging.getLogger(__name__)

ORPHAN_GRACE_SECONDS = 600.0
RECONCILE_EVERY_SECONDS = 600.0
# A guest session that never entered a password, picked a favourite or uploaded is forgotten after a day.
IDLE_GUEST_SESSION_SECONDS = 86400.0


class Janitor:
    def __init__(self, svc: Services, *, orphan_grace: float = ORPHAN_GRACE_SECONDS,
                 reconcile_every: float = RECONCILE_EVERY_SECONDS) -> None:
        self.svc = svc
        self.storage = svc.storage
        self.orphan_grace = orphan_grace
        self.reconcile_every = reconcile_every
        self.interval = max(1.0, svc.settings.lease_seconds / 4)
        self.turn = svc.lease("reconciler")  # whose turn the round is (runtime/lease.py)

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        await self.requeue_expired()
        await self._sweep_local()
        await self.reconcile_if_due()
        task_status.started()
        last_sweep = trio.current_time()
        while True:
            await trio.sleep(self.interval)
            await self.requeue_expired()
            if trio.current_time() - last_sweep >= self.reconcile_every:
                await self._sweep_local()
                last_sweep = trio.current_time()
            await self.reconcile_if_due()

    async def _sweep_local(self) -> None:
        try:
            await self.sweep_local()
        except StorageUnavailable:
            log.warning("janitor: the photo storage did not answer; trying again later")

    async def reconcile_if_due(self) -> bool:
        """The reconciler's round, when it is this process's turn: one process of the service takes the
        ``reconciler`` lease, does the round and keeps the lease until the next round is due, so that N processes
        (or hosts) do one round per ``reconcile_every`` between them. A process that dies mid-round lets its
        lease run out; another one does the round then."""
        turn = self.turn
        try:
            if not await turn.take():
                return False
        except Exception as error:  # the database did not answer: the next tick tries again
            log.warning("reconciler: could not take its turn (%s)", error)
            return False
        try:
            async with turn.kept():
                await self.reconcile_storage()
        except LeaseLost:
            return False
        except StorageUnavailable:  # the bucket is down: nothing was changed half; another try after a lease
            log.warning("reconciler: the photo storage did not answer; trying again later")
            return False
        await turn.hold_until(self.svc.clock() + self.reconcile_every)
        return True

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
        """The whole round at once, whoever's turn it is: :meth:`sweep_local`, then :meth:`reconcile_storage`.
        Returns the counts of both."""
        swept = await self.sweep_local()
        return {"temp_swept": swept, **await self.reconcile_storage()}

    async def sweep_local(self) -> int:
        """This host's own files: temp files left by cut-off requests, expired tus uploads. Every process does
        it (hosts do not share their temp directories). Returns how many temp files went."""
        svc = self.svc
        swept = await trio.to_thread.run_sync(self.storage.sweep_temp, svc.settings.temp_max_age_seconds,
                                              svc.clock())
        await resumable.expire(svc)
        if swept:
            log.warning("janitor: %d temp files of cut-off requests removed", swept)
        return swept

    async def reconcile_storage(self) -> dict[str, int]:
        """What is shared by the whole service, one process at a time (:meth:`reconcile_if_due`): take back dead
        requests' rows, remove orphan files, fail rows without an original, prune the audit trail, the limits'
        rows and idle guest sessions. Returns counts."""
        svc = self.svc
        abandoned = await self.renew_and_abandon_uploads()
        now = svc.clock()
        await svc.db.write(audit_q.prune, now - svc.settings.audit_retention_days * 86400)
        await svc.db.write(limits_q.prune, now, limits_q.MAX_KEYS)
        await svc.db.write(leases_q.prune, now - IDLE_GUEST_SESSION_SECONDS)  # a day past their end
        rows, known, reserved = await svc.db.read(_keys_in_use)
        reserved_before = now - self.orphan_grace
        listed, candidates = await trio.to_thread.run_sync(self._orphan_candidates, known, reserved, now)
        # Decided again in a transaction (claim_orphans), from rows alone; the files go after it committed.
        claimed = await svc.db.write(claim_orphans, candidates, reserved_before) if candidates else set()
        if claimed:
            await trio.to_thread.run_sync(_remove_files, self.storage, sorted(claimed))
        orphans = len(claimed & listed)  # an expired reservation whose file was never written is no orphan file
        missing = await trio.to_thread.run_sync(self._rows_missing_original, rows)
        failed = 0
        for photo_id in missing:
            if await self._fail_if_still_missing(photo_id, now):
                failed += 1
        if failed:
            svc.webhooks_bell.ring()
        pruned = await svc.db.write(guest_q.prune_idle_sessions, now - IDLE_GUEST_SESSION_SECONDS)
        counts = {"orphans_removed": orphans, "missing_failed": failed}
        if orphans or failed or pruned or abandoned:
            log.warning("reconciler: %s, idle guest sessions pruned: %d, photos of dead requests taken back: %d",
                        counts, pruned, abandoned)
        return counts

    def _orphan_candidates(self, known: set[str], reserved: dict[str, float], now: float) -> tuple[set[str], set[str]]:
        """(keys with files and no row, the keys to claim): of the listed keys without a row (as of the read
        above), those whose files are older than the grace period and that are not reserved or were reserved
        before it began; and every expired reservation without a file (its upload died before writing it).
        Candidates only: :func:`claim_orphans` decides."""
        reserved_before = now - self.orphan_grace
        listed: dict[str, float] = {}
        for key, mtime in self.storage.iter_original_keys():
            listed[key] = max(mtime, listed.get(key, mtime))
        for key, _, mtime in self.storage.iter_derived():
            listed[key] = max(mtime, listed.get(key, mtime))
        unknown = {key: mtime for key, mtime in listed.items() if key not in known}
        candidates = {key for key, mtime in unknown.items()
                      if now - mtime > self.orphan_grace and reserved.get(key, -math.inf) < reserved_before}
        candidates |= {key for key, at in reserved.items() if at < reserved_before and key not in listed}
        return set(unknown), candidates

    async def _fail_if_still_missing(self, photo_id: int, now: float) -> bool:
        """A photo the listing found without its original: read its guard, ask the storage once more (outside any
        transaction), and fail it only if the guard is unchanged (:func:`_fail_unchanged`): a delete, a
        replacement or an archive may have raced the listing."""
        svc = self.svc
        seen = await svc.db.read(photo_q.original_guard, photo_id)
        if seen is None or seen["status"] == PhotoStatus.FAILED or seen["archive_state"] != archive_q.ACTIVE:
            return False
        if await trio.to_thread.run_sync(self.storage.has_original, seen["storage_key"]):
            return False
        return await svc.db.write(_fail_unchanged, svc.settings.webhooks, seen, now)

    def _rows_missing_original(self, rows: list[dict[str, Any]]) -> list[int]:
        stored = {key for key, _ in self.storage.iter_original_keys()}  # one listing, not a look-up per row
        # An archived gallery's originals are packed away on purpose (pipeline/archive.py).
        return [r["id"] for r in rows
                if r["status"] != PhotoStatus.FAILED and not r["archived"] and r["storage_key"] not in stored]


def _keys_in_use(conn: Connection) -> tuple[list[dict[str, Any]], set[str], dict[str, float]]:
    """One snapshot: every photo's row (for the missing-original check), the keys rows point at (previous versions
    of replaced photos too), and the reserved keys with their times."""
    rows = photo_q.rows_with_keys(conn)
    known = {r["storage_key"] for r in rows} | replacement_q.previous_keys(conn)
    return rows, known, reservations_q.reserved(conn)


def claim_orphans(conn: Connection, keys: set[str], reserved_before: float) -> set[str]:
    """The keys of ``keys`` whose files may go: no row, and no reservation or one made before
    ``reserved_before`` (deleted here). Run it in a write transaction and remove the returned keys' files only
    after it committed; no storage call happens in here.

    The reservation is deleted first and the row looked for last: on PostgreSQL an upload's commit that took the
    same reservation concurrently makes this delete wait and then find nothing, and the row it inserted is then
    visible to the statements that follow (read committed), so the key is kept. A key never reserved (or whose
    reservation was taken) and without a row can never get one: rows are inserted only by taking a reservation.
    """
    claimed = set()
    for key in sorted(keys):
        released = reservations_q.release_expired(conn, key, reserved_before)
        if not released and reservations_q.is_reserved(conn, key):
            continue  # an upload still writing or committing it
        if photo_q.key_in_use(conn, key):
            continue
        claimed.add(key)
    return claimed


def _fail_unchanged(conn: Connection, endpoints: Any, seen: dict[str, Any], now: float) -> bool:
    """Fail the photo if it is still exactly as it was when its original was found missing (``seen``, read before
    that storage call): the same key and status, its gallery active and not archived again since (``archived_at``).
    Then nothing can have brought the file back meanwhile: a restore needs an archive in between, a replacement
    or a revert changes the key, a delete removes the row."""
    if photo_q.original_guard(conn, seen["id"]) != seen:
        return False
    return transitions.fail_missing_original(conn, endpoints, seen["id"], now) is not None


def _remove_files(storage: Storage, keys: list[str]) -> None:
    for key in keys:
        storage.remove_photo_files(key)
