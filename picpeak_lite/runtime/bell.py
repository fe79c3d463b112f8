"""A wake-up call for tasks that sleep until there is new work: the workers, the webhook sender, the feed.

``ring()`` is sync and never blocks, so any code may call it right after its commit, before or after the
sleeping task exists (a bell is made before the app and the tasks, and lives as long as they do). Rings that
come while nobody sleeps are not lost: a sleeper takes ``listen()`` *before* it looks for work and waits on
that after finding none, so a ring in between wakes it at once. Rings that pile up count as one.
"""

from __future__ import annotations

import trio


class Bell:
    def __init__(self) -> None:
        self._next = trio.Event()

    def ring(self) -> None:
        """Wake every task waiting for this bell. Sync and non-blocking."""
        self._next.set()
        self._next = trio.Event()

    def listen(self) -> trio.Event:
        """The event the next ring sets: take it before looking for work, wait on it after finding none."""
        return self._next

    async def wait(self) -> None:
        """Sleep until the next ring."""
        await self._next.wait()
