"""The change feed: reads the change log after every commit and publishes each change to the broker.

Why a durable change log (a table filled by triggers) rather than SQLite's ``data_version``: the log carries a
sequence number that a reconnecting client can resume from (``?since=``), it records changes made by any
process (``picpeak-lite worker``, ``picpeak-lite import``) in the same transaction as the change itself, and
no write path can forget it. ``data_version`` only says *that* something changed.

Commits in this process poke the feed at once (``Database`` commit listeners); commits by other processes are
found by a 20 ms poll (one cheap indexed query), well within the 250 ms promise.
"""

from __future__ import annotations

import logging

import trio

from picpeak_lite.runtime.bell import Bell
from picpeak_lite.runtime.broker import Broker, Change
from picpeak_lite.services import Services
from picpeak_lite.store.queries import changes as change_q
from picpeak_lite.store.queries.photos import PhotoStatus

log = logging.getLogger(__name__)

POLL_SECONDS = 0.02
RETENTION_SECONDS = 24 * 3600
PRUNE_EVERY_SECONDS = 3600


class ChangeFeed:
    def __init__(self, svc: Services, broker: Broker, *, poll_seconds: float = POLL_SECONDS) -> None:
        self.svc = svc
        self.broker = broker
        self.poll_seconds = poll_seconds
        # Rung after every commit in this process: look for new changes now.
        self._commits = Bell()
        self.last_seq = 0

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        self.last_seq = await self.svc.db.read(change_q.latest_seq)
        self.broker.last_seq = self.last_seq
        self.svc.db.commit_listeners.append(self._commits.ring)
        try:
            task_status.started()
            last_prune = trio.current_time()
            while True:
                committed = self._commits.listen()
                await self.publish_new()
                if trio.current_time() - last_prune > PRUNE_EVERY_SECONDS:
                    await self.svc.db.write(change_q.prune, self.svc.clock() - RETENTION_SECONDS)
                    last_prune = trio.current_time()
                with trio.move_on_after(self.poll_seconds):
                    await committed.wait()
        finally:
            self.svc.db.commit_listeners.remove(self._commits.ring)

    async def publish_new(self) -> int:
        """Publish every change after the last one seen. Returns how many."""
        published = 0
        while True:
            rows = await self.svc.db.read(change_q.after, self.last_seq)
            if not rows:
                return published
            wake_workers = False
            for row in rows:
                change = Change.from_row(row)
                self.broker.publish(change)
                self.last_seq = change.seq
                if change.feedback:  # a guest's like, rating or comment: no photo moved
                    continue
                self.svc.backlog.saw(change)
                wake_workers |= change.status == PhotoStatus.PENDING
            published += len(rows)
            if wake_workers:
                # New work from another process (an import, a retry in the worker process): start at once.
                self.svc.workers_bell.ring()
