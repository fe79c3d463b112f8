"""A background task whose database stops answering under it (PostgreSQL restarted, the network to it cut) is run
again once it answers, instead of ending the serving process (``server.outlasting_the_database``; issue 31: "every
host reconnects by itself"). The whole of it, on real hosts and a real PostgreSQL stopped and started again, is
``tests/test_multihost.py``'s restart; here the rule itself, on trio's autojump clock: reported ready once, run
again after each DatabaseUnavailable (alone or in a nursery's group), and any other error still ends it."""

from __future__ import annotations

from typing import Any

import pytest
import trio

from picpeak_lite import server
from picpeak_lite.errors import DatabaseUnavailable


class Flaky:
    """A long-lived task that meets an unanswering database ``failures`` times (after reporting ready), then ends."""

    def __init__(self, failures: int, *, in_group: bool = False) -> None:
        self.failures = failures
        self.in_group = in_group
        self.runs: list[float] = []

    async def run(self, *, task_status: Any = trio.TASK_STATUS_IGNORED) -> None:
        self.runs.append(trio.current_time())
        task_status.started(len(self.runs))
        if len(self.runs) <= self.failures:
            if self.in_group:
                async with trio.open_nursery() as nursery:  # as a task with children of its own raises it
                    nursery.start_soon(trio.sleep_forever)
                    raise DatabaseUnavailable("connection refused")
            raise DatabaseUnavailable("connection refused")


@pytest.mark.parametrize("in_group", [False, True])
async def test_a_task_is_run_again_until_the_database_answers_and_reported_ready_once(
        autojump_clock: trio.abc.Clock, in_group: bool) -> None:
    task = Flaky(3, in_group=in_group)
    async with trio.open_nursery() as nursery:
        assert await nursery.start(server.outlasting_the_database, task.run) == 1  # the first run's report only
    assert len(task.runs) == 4
    waits = [later - earlier for earlier, later in zip(task.runs, task.runs[1:], strict=False)]
    assert waits == [server.DATABASE_RETRY_SECONDS] * 3


async def test_any_other_error_still_ends_the_task(autojump_clock: trio.abc.Clock) -> None:
    async def broken(*, task_status: Any = trio.TASK_STATUS_IGNORED) -> None:
        task_status.started()
        raise ValueError("a bug")

    with pytest.raises(ValueError, match="a bug"):
        await server.outlasting_the_database(broken)
