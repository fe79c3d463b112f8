"""The core that every request and task is given: settings, database, storage, clocks, broker, and the bells
that wake the background tasks.

It is complete when it is made: the storage is built once here, and the bells exist before the app and the
tasks, so code that commits new work can ring them whether or not a worker pool or webhook sender runs in this
process (``picpeak-lite worker`` runs them in another; the change feed then wakes the workers). What only the
web app needs (throttles, rate limits, the download limiters) is made with the app: ``web/limits.py``.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field

import trio

from picpeak_lite import security
from picpeak_lite.config import Settings
from picpeak_lite.runtime.activity import Activity
from picpeak_lite.runtime.backlog import Backlog
from picpeak_lite.runtime.bell import Bell
from picpeak_lite.runtime.broker import Broker
from picpeak_lite.runtime.budget import MemoryBudget
from picpeak_lite.runtime.lease import Lease, instance_id
from picpeak_lite.runtime.memory import MemoryTrimmer
from picpeak_lite.store.db import Database
from picpeak_lite.store.storage import Storage, open_storage


@dataclass
class Services:
    settings: Settings
    db: Database
    # Wall-clock time for rows (epoch seconds). Tests may pass another clock.
    clock: Callable[[], float] = time.time
    # Monotonic clock for throttling windows; tests pass trio.current_time to use autojump_clock.
    monotonic: Callable[[], float] = time.monotonic
    # argon2 uses 64 MiB and ~50 ms of CPU per check: bound how many run at once.
    hash_limiter: trio.CapacityLimiter = field(default_factory=lambda: trio.CapacityLimiter(2))
    # Rung after a commit that makes work for the worker pool, or for the webhook sender. Sync, non-blocking.
    workers_bell: Bell = field(default_factory=Bell)
    webhooks_bell: Bell = field(default_factory=Bell)
    email_bell: Bell = field(default_factory=Bell)  # a message was queued in the email outbox
    finisher_bell: Bell = field(default_factory=Bell)  # complete tus uploads whose photo is not made yet
    archive_bell: Bell = field(default_factory=Bell)  # a gallery was set to archiving or restoring
    faces_bell: Bell = field(default_factory=Bell)  # "Find me" was switched on for a gallery (pipeline/faces.py)
    # Rung after every commit in this process (Database commit listeners) and, on PostgreSQL, when another
    # process committed a change (events/listener.py): the change feed reads the change log now.
    changes_bell: Bell = field(default_factory=Bell)
    broker: Broker = field(default_factory=Broker)
    # This process among the service's processes and hosts: the holder named in the leases it takes (named
    # leases, runtime/lease.py; a tus upload's writer, pipeline/resumable.py). Random bits in it make a lease left
    # by a process that died nobody's, so it runs out.
    instance: str = field(default_factory=instance_id)
    # The URL the server listens on: from the settings until server.run binds (port 0 resolved), then the real
    # one. Share links fall back to it when a request's Host is not trusted (web/views/common.py).
    bind_url: str = ""
    # Started by server.run; code that has just let go of a lot (an upload, a processed photo) calls freed().
    trimmer: MemoryTrimmer = field(default_factory=MemoryTrimmer)
    # The one budget of decode memory (settings.decode_memory_mb) that workers, watermarked downloads and the
    # settings preview all take their estimated bytes from before they decode (runtime/budget.py).
    decode_budget: MemoryBudget = field(init=False)
    storage: Storage = field(init=False)
    # How far uploads may run ahead of the workers (settings.upload_lead); the change feed tells it of claims.
    backlog: Backlog = field(init=False)
    # Views, downloads and favourites counted in memory, stored in batches by its task (runtime/activity.py).
    activity: Activity = field(init=False)

    def __post_init__(self) -> None:
        s = self.settings
        if not self.bind_url:
            self.bind_url = f"http://{s.listen_address}"
        self.storage = open_storage(s)
        self.decode_budget = MemoryBudget.megabytes(s.decode_memory_mb)
        self.backlog = Backlog(self.db, s.upload_lead)
        self.activity = Activity(self.db, lambda: self.clock())

    def lease(self, name: str) -> Lease:
        """A named lease of this process (``runtime/lease.py``), as long as a photo's claim: a dead holder's work
        is taken over as soon as its photos are."""
        return Lease(self.db, name, holder=self.instance, seconds=self.settings.lease_seconds, clock=self.clock)

    async def hash_password(self, password: str) -> str:
        return await trio.to_thread.run_sync(security.hash_password, password, limiter=self.hash_limiter)

    async def verify_password(self, password_hash: str | None, password: str) -> bool:
        return await trio.to_thread.run_sync(
            security.verify_password, password_hash, password, limiter=self.hash_limiter
        )
