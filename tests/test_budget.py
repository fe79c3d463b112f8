"""runtime/budget.py: one byte budget; taking waits (in arrival order), never fails, and gives back on exit."""

from __future__ import annotations

import pytest
import trio
import trio.testing

from picpeak_lite.runtime.budget import MB, DoesNotFit, MemoryBudget


async def test_what_fits_is_held_at_once_and_given_back() -> None:
    budget = MemoryBudget(100)
    async with budget.hold(60):
        assert budget.used == 60
        async with budget.hold(40):
            assert budget.used == 100
    assert budget.used == 0 and budget.peak == 100


async def test_work_that_does_not_fit_waits_for_its_turn_instead_of_failing(
        autojump_clock: trio.testing.MockClock) -> None:
    budget = MemoryBudget(100)
    log: list[tuple[str, float]] = []

    async def job(name: str, nbytes: int, seconds: float) -> None:
        async with budget.hold(nbytes):
            log.append((name, trio.current_time()))
            assert budget.used <= budget.total
            await trio.sleep(seconds)

    async with trio.open_nursery() as nursery:
        nursery.start_soon(job, "a", 70, 10)
        await trio.testing.wait_all_tasks_blocked()
        nursery.start_soon(job, "b", 70, 10)  # waits for a
        await trio.testing.wait_all_tasks_blocked()
        assert budget.waiting == 1
        nursery.start_soon(job, "c", 10, 1)  # would fit now, but b came first: no overtaking
        await trio.testing.wait_all_tasks_blocked()
        assert budget.waiting == 2
    start = dict(log)
    assert start["a"] == 0 and start["b"] == 10 and start["c"] == 10  # c fits beside b once a is done
    assert budget.used == 0 and budget.peak == 80


async def test_a_cancelled_waiter_leaves_the_queue_and_lets_the_next_one_in(
        autojump_clock: trio.testing.MockClock) -> None:
    budget = MemoryBudget(100)
    entered: list[str] = []

    async def job(name: str, nbytes: int, seconds: float) -> None:
        async with budget.hold(nbytes):
            entered.append(name)
            await trio.sleep(seconds)

    async with trio.open_nursery() as nursery:
        nursery.start_soon(job, "holder", 50, 10)
        await trio.testing.wait_all_tasks_blocked()
        with trio.CancelScope() as big_waiter:
            async with trio.open_nursery() as inner:
                inner.start_soon(job, "big", 100, 1)
                await trio.testing.wait_all_tasks_blocked()
                nursery.start_soon(job, "small", 10, 1)  # queued behind "big"
                await trio.testing.wait_all_tasks_blocked()
                assert entered == ["holder"] and budget.waiting == 2
                big_waiter.cancel()
        await trio.testing.wait_all_tasks_blocked()
        assert entered == ["holder", "small"]  # let in as soon as the head of the queue gave up
    assert budget.used == 0 and budget.waiting == 0


async def test_an_exception_inside_gives_the_bytes_back() -> None:
    budget = MemoryBudget(100)
    with pytest.raises(RuntimeError):
        async with budget.hold(100):
            raise RuntimeError("decoder crashed")
    assert budget.used == 0
    async with budget.hold(100):
        pass


async def test_more_than_the_whole_budget_is_refused_at_once_not_waited_for() -> None:
    budget = MemoryBudget.megabytes(256)
    assert budget.fits(256 * MB) and not budget.fits(256 * MB + 1)
    with pytest.raises(DoesNotFit):
        async with budget.hold(256 * MB + 1):
            pass
    assert budget.used == 0


async def test_a_thread_reaches_the_budget_through_the_event_loop(autojump_clock: trio.testing.MockClock) -> None:
    """The zip streamer makes watermarked copies from a worker thread: trio.from_thread.run takes the budget."""
    budget = MemoryBudget(100)

    async def take_and_work() -> int:
        async with budget.hold(80):
            await trio.sleep(1)
            return budget.used

    def in_thread() -> int:
        return trio.from_thread.run(take_and_work)

    async with trio.open_nursery() as nursery:
        results: list[int] = []

        async def run_thread() -> None:
            results.append(await trio.to_thread.run_sync(in_thread))

        nursery.start_soon(run_thread)
        nursery.start_soon(run_thread)
    assert results == [80, 80] and budget.peak == 80  # the second waited for the first
