"""The janitor: recovery and housekeeping on a timer.

* Photos whose lease expired (their worker crashed or hung) go back to ``pending``, or are failed once they have
  used ``max_attempts``. It runs every quarter lease, so a crash is recovered within about one lease.
* Temp files older than ``temp_max_age_seconds`` are removed (uploads cut off by a crash).
* The reconciler removes stored files that have no row (a crash between the rename and the commit), after a
  grace period so that an upload in the middle of committing is never touched, and fails rows whose original
  is missing.

The first pass runs before ``started()``: when the server says it is ready, recovery has been done.
"""

from __future__ import annotations

import logging
import os
from typing import Any

import trio

from ..db import Connection
from ..queries import photos as photo_q
from ..services import Services
from ..storage import Storage, remove_quietly
from . import queue

log = logging.getLogger(__name__)

ORPHAN_GRACE_SECONDS = 600.0
RECONCILE_EVERY_SECONDS = 600.0


class Janitor:
    def __init__(self, svc: Services, storage: Storage, *, orphan_grace: float = ORPHAN_GRACE_SECONDS,
                 reconcile_every: float = RECONCILE_EVERY_SECONDS) -> None:
        self.svc = svc
        self.storage = storage
        self.orphan_grace = orphan_grace
        self.reconcile_every = reconcile_every
        self.interval = max(1.0, svc.settings.lease_seconds / 4)

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        await self.requeue_expired()
        await self.reconcile()
        task_status.started()
        last_reconcile = trio.current_time()
        while True:
            await trio.sleep(self.interval)
            await self.requeue_expired()
            if trio.current_time() - last_reconcile >= self.reconcile_every:
                await self.reconcile()
                last_reconcile = trio.current_time()

    async def requeue_expired(self) -> tuple[list[int], list[int]]:
        svc = self.svc
        requeued, failed = await svc.db.write(
            queue.requeue_expired, svc.settings.webhooks, svc.clock(), svc.settings.max_attempts
        )
        if requeued:
            log.warning("requeued photos whose worker stopped answering: %s", requeued)
            svc.wake_workers()
        if failed:
            log.error("gave up on photos after %d attempts: %s", svc.settings.max_attempts, failed)
            svc.wake_webhooks()
        return requeued, failed

    async def reconcile(self) -> dict[str, int]:
        """Sweep temp files, remove orphan files, fail rows without an original. Returns counts."""
        svc = self.svc
        now = svc.clock()
        swept = await trio.to_thread.run_sync(self.storage.sweep_temp, svc.settings.temp_max_age_seconds, now)
        rows = await svc.db.read(photo_q.rows_with_keys)
        known = {r["storage_key"] for r in rows}
        orphans = await trio.to_thread.run_sync(self._remove_orphans, known, now)
        missing = await trio.to_thread.run_sync(self._rows_missing_original, rows)
        failed = 0
        for photo_id in missing:
            if await svc.db.write(_fail_if_still_missing, self.storage, svc.settings.webhooks, photo_id, now):
                failed += 1
        if failed:
            svc.wake_webhooks()
        counts = {"temp_swept": swept, "orphans_removed": orphans, "missing_failed": failed}
        if swept or orphans or failed:
            log.warning("reconciler: %s", counts)
        return counts

    def _remove_orphans(self, known: set[str], now: float) -> int:
        removed = 0
        for key, mtime in list(self.storage.iter_original_keys()):
            if key not in known and now - mtime > self.orphan_grace:
                remove_quietly(self.storage.original_path(key))
                removed += 1
        for key, path, mtime in list(self.storage.iter_derived()):
            if key not in known and now - mtime > self.orphan_grace:
                remove_quietly(path)
                removed += 1
        return removed

    def _rows_missing_original(self, rows: list[dict[str, Any]]) -> list[int]:
        return [r["id"] for r in rows
                if r["status"] != "failed" and not os.path.exists(self.storage.original_path(r["storage_key"]))]


def _fail_if_still_missing(conn: Connection, storage: Storage, endpoints: Any, photo_id: int, now: float) -> bool:
    """Checked again inside the write transaction: a delete may have raced the scan."""
    row = photo_q.get(conn, photo_id)
    if row is None or storage.original_path(row["storage_key"]).exists():
        return False
    return queue.fail_missing_original(conn, endpoints, photo_id, now) is not None
