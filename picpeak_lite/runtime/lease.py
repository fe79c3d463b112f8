"""What one process of the service does at a time, when it runs as several processes or on several hosts.

Most background work is safe in every process: photos, webhooks and emails are claimed row by row under a
token. A few tasks are not, or would only repeat each other: watching the galleries' hot folders (two watchers
would import each file twice), the reconciler's round over the whole storage, and archiving (one gallery's
originals packed by two processes at once). Each holds a named :class:`Lease`, a row in ``leases``
(``store/queries/leases.py``), taken for ``seconds`` and renewed every third of that while held:

* :func:`run_while_held` runs a task only while its process holds the lease, and waits for it otherwise; when its
  holder dies (kill -9, a host cut off), another process takes it within one lease.
* A *turn* (:meth:`Lease.take` then :meth:`Lease.hold_until`): a round done by one process, which then keeps the
  lease until the next round is due, so that N processes do one round per period between them, not N.

A holder that cannot renew in time (the database unreachable, the process stalled) stops its task before its
lease can have run out: a lease is lost on the holder's side first. What the leased tasks write is also safe if
two of them ever overlap (guarded statements, idempotent steps); the lease keeps that rare and cheap.
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import os
import secrets
import socket
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path

import trio

from picpeak_lite.store.db import Database
from picpeak_lite.store.queries import leases as leases_q

log = logging.getLogger(__name__)

# Stop a leased task when less than this share of the lease is left unconfirmed: room for the cancellation.
SAFETY = 0.25


def _place() -> str:
    """Where a pid means one process: this kernel's boot and this pid namespace (two containers, or two machines
    that share a host name, are two places)."""
    try:
        boot = Path("/proc/sys/kernel/random/boot_id").read_text().strip()
        namespace = os.stat("/proc/self/ns/pid").st_ino
    except OSError:  # not Linux: no place is known, so no holder is ever found gone by its pid
        return secrets.token_hex(4)
    return hashlib.sha256(f"{boot}:{namespace}".encode()).hexdigest()[:8]


PLACE = _place()


def instance_id() -> str:
    """This process's name as a lease holder: the host and pid (for people reading the table), random bits (a
    pid is reused after a restart), and its place (:func:`holder_is_gone`)."""
    return f"{socket.gethostname()}/{os.getpid()}/{secrets.token_hex(4)}/{PLACE}"


def holder_is_gone(holder: str | None) -> bool:
    """Whether ``holder`` (an :func:`instance_id`) was a process in this place that no longer runs: a server
    killed and started again on the same machine need not wait for its own old leases to run out. A holder
    elsewhere, or a pid that runs (perhaps another process by now), is not known to be gone."""
    parts = (holder or "").split("/")
    if len(parts) != 4 or parts[3] != PLACE or not parts[1].isdigit():
        return False
    try:
        os.kill(int(parts[1]), 0)
    except ProcessLookupError:
        return True
    except PermissionError:  # it runs, as another user
        return False
    return False


class LeaseLost(Exception):
    """The lease ran out before it was renewed (another process may hold it now)."""


class Lease:
    """One named lease, as seen by this process (``holder``). Times come from ``clock`` (epoch seconds, agreed
    on by every process) for the rows, and trio's clock for the waits."""

    def __init__(self, db: Database, name: str, *, holder: str, seconds: float,
                 clock: Callable[[], float]) -> None:
        self.db = db
        self.name = name
        self.holder = holder
        self.seconds = seconds
        self.clock = clock
        self.token: str | None = None
        self.until = 0.0  # the end of the lease as last written by this process

    @property
    def held(self) -> bool:
        return self.token is not None and self.clock() < self.until

    async def take(self) -> bool:
        """Take the lease for ``seconds`` if nobody holds it, or its holder was a process on this machine that
        is gone (:func:`holder_is_gone`). True when this process has it now."""
        token = secrets.token_hex(16)
        now = self.clock()
        until = now + self.seconds
        taken = await self.db.write(leases_q.take, self.name, self.holder, token, now, until)
        if not taken:
            current = await self.db.read(leases_q.holder_of, self.name, now)
            if current is not None and holder_is_gone(current["holder"]):
                taken = await self.db.write(leases_q.take, self.name, self.holder, token, now, until,
                                            current["holder"])
        if taken:
            self.token, self.until = token, until
        return taken

    async def hold_until(self, until: float) -> bool:
        """Move the end of a held lease to ``until`` (a renewal, or a turn kept until the next round is due).
        False, and no longer held, when another process took it meanwhile."""
        if self.token is None:
            return False
        if await self.db.write(leases_q.renew, self.name, self.token, until):
            self.until = until
            return True
        self.token = None
        return False

    async def release(self) -> None:
        """Give it up now, so that another process takes it at once instead of after it runs out."""
        token, self.token = self.token, None
        if token is not None:
            await self.db.write(leases_q.release, self.name, token)

    @contextlib.asynccontextmanager
    async def kept(self) -> AsyncIterator[None]:
        """Renew the held lease every third of ``seconds`` while the body runs. If it cannot be renewed before
        too little of it is left (:data:`SAFETY`), the body is cancelled and :class:`LeaseLost` raised."""
        lost = False
        async with trio.open_nursery() as nursery:
            async def renew() -> None:
                nonlocal lost
                while True:
                    await trio.sleep(self.seconds / 3)
                    try:
                        if await self.hold_until(self.clock() + self.seconds):
                            continue
                        log.warning("lease %s: another process took it", self.name)
                    except Exception as error:  # the database did not answer: try again while time is left
                        left = self.until - self.clock()
                        if left > self.seconds * SAFETY:
                            log.warning("lease %s: could not renew (%s); %.0f s left", self.name, error, left)
                            continue
                        log.warning("lease %s: could not renew in time (%s); giving it up", self.name, error)
                        self.token = None
                    lost = True
                    nursery.cancel_scope.cancel()
                    return

            nursery.start_soon(renew)
            try:
                yield
            finally:
                nursery.cancel_scope.cancel()
        if lost:
            raise LeaseLost(self.name)


async def run_while_held(lease: Lease, task: Callable[..., Awaitable[None]], *, retry_seconds: float | None = None,
                         task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
    """Run ``task`` (a long-lived ``run(*, task_status)``) only while this process holds ``lease``: ready at once
    (the process serves whether or not it ever holds it), taking the lease as soon as it is free (tried every
    ``retry_seconds``, by default a third of the lease), and starting ``task`` again after a lost lease is taken
    back. On the way out the lease is given up, so that another process takes over at once."""
    retry = retry_seconds if retry_seconds is not None else lease.seconds / 3
    task_status.started()
    try:
        while True:
            try:
                taken = await lease.take()
            except Exception as error:  # the database did not answer: the lease is tried again later
                log.warning("lease %s: could not be taken (%s)", lease.name, error)
                taken = False
            if not taken:
                await trio.sleep(retry)
                continue
            log.info("lease %s: held by this process (%s)", lease.name, lease.holder)
            try:
                async with lease.kept(), trio.open_nursery() as nursery:
                    await nursery.start(task)
            except LeaseLost:
                log.warning("lease %s: lost; its task stopped until this process holds it again", lease.name)
    finally:
        await release_quietly(lease)


async def release_quietly(lease: Lease) -> None:
    """Give the lease up on the way out, even while cancelled; if the database does not answer, the lease runs
    out by itself instead (the way out is not held up, nor its first error hidden)."""
    with trio.CancelScope(shield=True), trio.move_on_after(5):
        try:
            await lease.release()
        except Exception as error:
            log.warning("lease %s: could not be given up (%s); it runs out by itself", lease.name, error)
