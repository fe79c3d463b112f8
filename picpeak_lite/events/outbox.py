"""The loop every outbox sender runs (webhooks, email): a pass over what is due, then sleep until the next row
falls due, the bell rings (a commit queued something) or the poll comes round, whichever is first.

The rows, their claims and their retry schedule are ``store/queries/outbox.py``; what one attempt is (an HTTP
POST, an SMTP transaction) is the sender's.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import NoReturn

import trio

from picpeak_lite.runtime.bell import Bell


async def serve(
    bell: Bell,
    deliver_due: Callable[[], Awaitable[int]],
    next_due_at: Callable[[], Awaitable[float | None]],
    clock: Callable[[], float],
    *,
    poll_seconds: float,
    batch: int,
) -> NoReturn:
    """Forever: ``deliver_due()`` (returns how many rows it claimed, at most ``batch``); a full batch means
    there may be more due at once, else sleep until ``next_due_at()`` (a wall-clock time from ``clock``), the
    next ring or ``poll_seconds``. The poll is the safety net for rows queued without a ring (another process,
    a ring before the commit)."""
    while True:
        rung = bell.listen()
        claimed = await deliver_due()
        if claimed >= batch:
            continue
        due = await next_due_at()
        delay = poll_seconds
        if due is not None:
            delay = min(delay, max(0.0, due - clock()))
        with trio.move_on_after(delay):
            await rung.wait()
