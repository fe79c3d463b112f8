"""Named leases (runtime/lease.py): what one process of the service does at a time, with several processes or
hosts on one database. Each "process" here is a Services of its own (its own instance id and connections) on
the same database; times are the rows' epoch seconds, decided by the database, so no outcome depends on speed."""

from __future__ import annotations

import contextlib
import functools
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from typing import Any

import trio

from picpeak_lite.config import Settings
from picpeak_lite.pipeline.archive import Archiver
from picpeak_lite.pipeline.janitor import Janitor
from picpeak_lite.runtime.lease import PLACE, Lease, holder_is_gone, run_while_held
from picpeak_lite.services import Services
from picpeak_lite.store.db import Database
from picpeak_lite.store.queries import leases as leases_q


@contextlib.contextmanager
def another_process(settings: Settings, **fields: Any) -> Iterator[Services]:
    svc = Services(settings=settings, db=Database(settings.database), **fields)
    try:
        yield svc
    finally:
        svc.db.close()


class ManualClock:
    def __init__(self) -> None:
        self.now = 1_800_000_000.0

    def __call__(self) -> float:
        return self.now


async def test_a_lease_has_one_holder_until_it_runs_out_and_a_late_holder_is_fenced(services: Services) -> None:
    clock = ManualClock()
    a = Lease(services.db, "reconciler", holder="host-a", seconds=60, clock=clock)
    b = Lease(services.db, "reconciler", holder="host-b", seconds=60, clock=clock)
    assert await a.take()
    assert not await b.take()
    assert not await a.take()  # a held lease is not taken again, not even by its holder (a turn stays a turn)
    clock.now += 30
    assert await a.hold_until(clock.now + 60)  # renewed: 90 s from the start now
    clock.now += 59
    assert not await b.take()
    clock.now += 2  # a stalled: its lease ran out
    assert await b.take()
    assert not await a.hold_until(clock.now + 60)  # the late renewal is refused: its token is not b's
    assert not a.held and b.held
    row = await services.db.read(leases_q.holder_of, "reconciler", clock.now)
    assert row is not None and row["holder"] == "host-b"
    await a.release()  # a release without the lease changes nothing
    assert (await services.db.read(leases_q.holder_of, "reconciler", clock.now))["holder"] == "host-b"
    await b.release()
    assert await services.db.read(leases_q.holder_of, "reconciler", clock.now) is None
    assert await a.take()


async def test_racing_takers_get_one_lease(services: Services, settings: Settings) -> None:
    with another_process(settings) as other:
        leases = [Lease(svc.db, "hot_folders", holder=f"p{i}", seconds=60, clock=time.time)
                  for i, svc in enumerate([services, other] * 8)]
        results: list[bool] = []

        async def take(lease: Lease) -> None:
            results.append(await lease.take())

        async with trio.open_nursery() as nursery:
            for lease in leases:
                nursery.start_soon(take, lease)
    assert sorted(results) == [False] * 15 + [True]


class Task:
    """A long-lived task that records when it runs and when it is stopped."""

    def __init__(self) -> None:
        self.starts: list[float] = []
        self.stops = 0
        self._changed = trio.Event()

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        self.starts.append(time.time())
        self._tell()
        task_status.started()
        try:
            await trio.sleep_forever()
        finally:
            self.stops += 1
            self._tell()

    def _tell(self) -> None:
        self._changed.set()
        self._changed = trio.Event()

    async def until(self, predicate: Any) -> None:
        while not predicate(self):
            await self._changed.wait()


async def test_a_leased_task_runs_in_one_process_and_moves_when_its_holder_stops(
        services: Services, settings: Settings) -> None:
    with another_process(settings) as other:
        first, second = Task(), Task()
        lease_a = services.lease("hot_folders")
        lease_b = other.lease("hot_folders")
        async with trio.open_nursery() as nursery:
            scope_a = trio.CancelScope()

            async def process_a() -> None:
                with scope_a:
                    await run_while_held(lease_a, first.run, retry_seconds=0.02)

            nursery.start_soon(process_a)
            await first.until(lambda t: t.starts)
            nursery.start_soon(functools.partial(run_while_held, lease_b, second.run, retry_seconds=0.02))
            # b tries every 20 ms; a holds for lease_seconds (60 s) and renews every 20 s
            for _ in range(10):
                await trio.sleep(0.02)
            assert not second.starts
            holder = await services.db.read(leases_q.holder_of, "hot_folders", time.time())
            assert holder["holder"] == services.instance
            scope_a.cancel()  # a stops cleanly: it gives the lease up, b takes it at its next try
            await second.until(lambda t: t.starts)
            assert first.stops == 1
            holder = await services.db.read(leases_q.holder_of, "hot_folders", time.time())
            assert holder["holder"] == other.instance
            nursery.cancel_scope.cancel()


async def test_a_dead_holders_lease_is_taken_once_it_runs_out(services: Services) -> None:
    # A process killed with -9 leaves its row; nobody renews it.
    ends = time.time() + 0.3
    assert await services.db.write(leases_q.take, "archiver", "dead-host/1/x", "t0ken", time.time(), ends)
    task = Task()
    async with trio.open_nursery() as nursery:
        nursery.start_soon(functools.partial(run_while_held, services.lease("archiver"), task.run,
                                             retry_seconds=0.02))
        await task.until(lambda t: t.starts)
        nursery.cancel_scope.cancel()
    assert task.starts[0] >= ends


async def test_a_holder_that_loses_its_lease_stops_its_task_and_takes_it_back_later(
        settings: Settings, services: Services) -> None:
    clock_lease = Lease(services.db, "hot_folders", holder=services.instance, seconds=0.3, clock=time.time)
    task = Task()
    async with trio.open_nursery() as nursery:
        nursery.start_soon(functools.partial(run_while_held, clock_lease, task.run, retry_seconds=0.02))
        await task.until(lambda t: t.starts)
        # Another process took it (as it would after this one stalled past its lease).
        await services.db.write(_steal, "hot_folders", time.time() + 0.3)
        await task.until(lambda t: t.stops == 1)
        # The thief's lease ran out (nobody renewed it): this process takes it back and starts its task again.
        await task.until(lambda t: len(t.starts) == 2)
        nursery.cancel_scope.cancel()


def _steal(conn: Any, name: str, until: float) -> None:
    conn.execute("UPDATE leases SET holder = 'thief', token = 'stolen', expires_at = ? WHERE name = ?",
                 (until, name))


async def test_the_reconcilers_round_is_one_processs_turn_per_period(services: Services, settings: Settings) -> None:
    with another_process(settings) as other:
        a, b = Janitor(services), Janitor(other)
        assert await a.reconcile_if_due()
        assert not await b.reconcile_if_due()  # a did the round: nobody does it again for reconcile_every
        assert not await a.reconcile_if_due()
        soon_a, soon_b = Janitor(services, reconcile_every=0), Janitor(other, reconcile_every=0)
        await a.turn.release()
        assert await soon_b.reconcile_if_due()  # done "until now": the next turn is anyone's
        assert await soon_a.reconcile_if_due()


async def test_one_process_archives_while_the_other_defers(services: Services, settings: Settings) -> None:
    with another_process(settings) as other:
        holding = other.lease("archiver")
        assert await holding.take()
        archiver = Archiver(services)
        assert await archiver.pass_once() == [] and archiver.deferred
        await holding.release()
        assert await archiver.pass_once() == [] and not archiver.deferred  # its turn (nothing to archive)
        row = await services.db.read(leases_q.holder_of, "archiver", time.time())
        assert row is None  # given back after the pass


async def test_a_lease_of_a_process_gone_from_this_machine_is_taken_at_once(services: Services) -> None:
    """A server killed and started again here need not wait a lease for its own old leases."""
    finished = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True,
                              text=True, check=True)
    dead = f"{socket.gethostname()}/{finished.stdout.strip()}/0000/{PLACE}"
    elsewhere = f"{socket.gethostname()}/{finished.stdout.strip()}/0000/another-place"
    now = time.time()
    assert holder_is_gone(dead) and not holder_is_gone(elsewhere) and not holder_is_gone(services.instance)
    await services.db.write(leases_q.take, "hot_folders", elsewhere, "t1", now, now + 600)
    assert not await services.lease("hot_folders").take()  # another machine's pid says nothing here
    await services.db.write(_steal, "hot_folders", now + 600)
    await services.db.write(lambda conn: conn.execute("UPDATE leases SET holder = ? WHERE name = 'hot_folders'",
                                                      (dead,)))
    lease = services.lease("hot_folders")
    assert await lease.take()
    assert (await services.db.read(leases_q.holder_of, "hot_folders", time.time()))["holder"] == services.instance
