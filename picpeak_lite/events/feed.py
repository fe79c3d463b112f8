"""The change feed: reads the change log after every commit and publishes each change to the broker.

Why a durable change log (a table filled by triggers) rather than SQLite's ``data_version``: the log carries a
sequence number that a reconnecting client can resume from (``?since=``), it records changes made by any
process (``picpeak-lite worker``, ``picpeak-lite import``) in the same transaction as the change itself, and
no write path can forget it. ``data_version`` only says *that* something changed.

Commits in this process poke the feed at once (``Database`` commit listeners ring ``Services.changes_bell``).
Commits by other processes (``picpeak-lite worker``, a second server) are found differently per engine, so the
fallback poll's interval is per dialect (:data:`POLL_SECONDS`):

* SQLite has no notifications: a 20 ms poll (one cheap indexed query) finds them, well within the 250 ms promise.
* PostgreSQL pushes them: the change log's trigger NOTIFYs at commit and ``events/listener.py`` rings the same bell
  within milliseconds, for this process's commits as for any other's (the server's feed then skips the poke
  after each commit: ``notified``). The poll is then only the safety net for a notification lost while the listener was
  reconnecting (it rings once more when it is back, too), so it runs once a second and spares the database a
  query every 20 ms per process.
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

#: The fallback poll's interval per ``Database.dialect`` (see the module's docstring).
POLL_SECONDS = {"sqlite": 0.02, "postgresql": 1.0}
RETENTION_SECONDS = 24 * 3600
PRUNE_EVERY_SECONDS = 3600
#: Changes read per query; a shorter page ends the round.
PAGE = 1000


class ChangeFeed:
    def __init__(self, svc: Services, broker: Broker, *, poll_seconds: float | None = None,
                 notified: bool = False) -> None:
        self.svc = svc
        self.broker = broker
        self.poll_seconds = POLL_SECONDS[svc.db.dialect] if poll_seconds is None else poll_seconds
        # Rung after every commit in this process, and by the listener for other processes': look now.
        self._commits: Bell = svc.changes_bell
        # ``notified``: a listener (events/listener.py) runs in this process and rings the bell for every commit
        # that logged a change, this process's own included. The bell is then not rung after every commit too:
        # most commits log no change (a webhook's claim and delivery, a lease renewal, a key reservation), and
        # each ring costs a read of the log, the most frequent query on PostgreSQL.
        self._on_commit = not notified
        self.last_seq = 0

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        self.last_seq = await self.svc.db.read(change_q.latest_seq)
        self.broker.last_seq = self.last_seq
        if self._on_commit:
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
            if self._on_commit:
                self.svc.db.commit_listeners.remove(self._commits.ring)

    async def publish_new(self) -> int:
        """Publish every change after the last one seen. Returns how many."""
        published = 0
        while True:
            rows = await self.svc.db.read(change_q.after, self.last_seq, PAGE)
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
            if len(rows) < PAGE:
                # A short page was everything committed when it was read: asking again at once would cost a
                # query (the most frequent one on PostgreSQL) to learn nothing. A change committed since rang
                # the bell, which ``run`` waits on next.
                return published
