"""The image threads: results and errors come back as from trio.to_thread, a cancel waits for the job, the
threads run below the loop's priority, never more than asked, and end when idle."""

from __future__ import annotations

import os
import sys
import threading
import time
from collections.abc import Awaitable, Callable

import pytest
import trio
import trio.lowlevel

from picpeak_lite.pipeline.imagethreads import ImageThreads


def own_nice() -> int:
    return os.getpriority(os.PRIO_PROCESS, threading.get_native_id())


async def test_a_result_and_an_error_come_back_to_the_caller() -> None:
    threads = ImageThreads(2)
    assert await threads.run_sync(lambda a, b: a + b, 2, 3) == 5
    with pytest.raises(ZeroDivisionError):
        await threads.run_sync(lambda: 1 / 0)
    assert await threads.run_sync(threading.current_thread) is not threading.current_thread()


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="per-thread nice values are Linux's")
async def test_the_threads_run_at_a_lower_priority_and_the_loop_does_not() -> None:
    before = own_nice()
    threads = ImageThreads(1, nice=7)
    assert await threads.run_sync(own_nice) == min(19, before + 7)
    assert own_nice() == before  # the process and its event loop keep theirs


class Gate:
    """A job that starts, then waits for the test to let it go: what a cancelled caller waits for."""

    def __init__(self) -> None:
        self.started, self.release = threading.Event(), threading.Event()

    def hold(self) -> None:
        self.started.set()
        self.release.wait(timeout=60)

    async def cancel_while_held(self, call: Callable[[], Awaitable[None]], seen: list[str]) -> trio.CancelScope:
        """Run ``call`` in a scope, cancel it while the job is held, check that the caller waited (``seen``
        still empty), then let the job go. The scope, once ``call`` has ended."""
        scope = trio.CancelScope()

        async def scoped() -> None:
            with scope:
                await call()

        async with trio.open_nursery() as nursery:
            nursery.start_soon(scoped)
            while not self.started.is_set():
                await trio.sleep(0.01)
            scope.cancel()
            await trio.sleep(0.05)
            assert seen == []  # cancelled, but the job holds its memory until it ends
            self.release.set()
        return scope


async def test_a_cancelled_caller_waits_for_its_job_then_sees_the_cancel() -> None:
    threads, gate = ImageThreads(1), Gate()
    finished: list[str] = []

    def job() -> str:
        gate.hold()
        finished.append("job")
        return "done"

    async def call() -> None:
        await threads.run_sync(job)
        finished.append("returned")
        await trio.lowlevel.checkpoint()  # the cancel lands here, at the first checkpoint after the job
        finished.append("not reached")

    scope = await gate.cancel_while_held(call, finished)
    assert scope.cancelled_caught and finished == ["job", "returned"]


async def test_a_cancel_stops_a_job_of_steps_at_its_next_checkpoint() -> None:
    """The step running when the caller is cancelled ends; the next one never starts; the caller sees the cancel,
    not the job's Stopped."""
    threads, gate = ImageThreads(1), Gate()
    ran: list[str] = []

    def steps(checkpoint: Callable[[], None]) -> str:
        gate.hold()
        ran.append("first")
        checkpoint()
        ran.append("second")
        return "done"

    async def call() -> None:
        await threads.run_steps(steps)
        ran.append("returned")

    scope = await gate.cancel_while_held(call, ran)
    assert scope.cancelled_caught and ran == ["first"]
    assert await threads.run_steps(lambda checkpoint: checkpoint() or "again") == "again"  # the thread lives on


async def test_never_more_threads_than_asked_and_they_end_when_idle() -> None:
    threads = ImageThreads(2, idle_seconds=0.05)
    seen: set[int] = set()
    gate = threading.Barrier(2, timeout=30)

    def job() -> None:
        seen.add(threading.get_ident())
        gate.wait()  # two at once must be able to meet: two threads exist

    async with trio.open_nursery() as nursery:
        for _ in range(2):
            nursery.start_soon(threads.run_sync, job)
    async with trio.open_nursery() as nursery:
        for _ in range(6):
            nursery.start_soon(threads.run_sync, seen.add, 0)
    assert threads.alive <= 2 and len(seen - {0}) == 2
    deadline = time.monotonic() + 30  # a generous wait for a condition, not a bound on how fast it is
    while threads.alive and time.monotonic() < deadline:
        await trio.sleep(0.02)
    assert threads.alive == 0
    assert await threads.run_sync(lambda: 42) == 42  # and come back when work does
