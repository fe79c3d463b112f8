"""One memory budget for everything in this process that decodes an image (issue 11).

A 560 KB PNG can claim 12000x12000 RGBA pixels: 1.8 GB once decoded with its working copies, and the box this
server is for has 1-2 GB. A limit per task (one thread per worker, one watermarked copy at a time) does not bound
the sum: two workers and a guest download each holding their peak at once is what the kernel kills. So every
decode, resize and watermark, in the workers and on request paths alike, first takes the bytes that
``images.plan`` / ``images.plan_watermark`` estimate from the header, and gives them back when its buffers are
gone.

Taking waits, it never fails: work that does not fit now waits until enough is given back, in arrival order, so
a big image is not starved by a stream of small ones. Only a request bigger than the whole budget cannot be
served at all; callers check :meth:`MemoryBudget.fits` first and refuse the image with a sentence
(``images.too_large_for_memory``), and :meth:`hold` raises :class:`DoesNotFit` rather than wait forever.

The budget is held in async code around the thread hops that do the work (trio's ``to_thread.run_sync``), so it
needs no lock: every change happens on the event loop. Code in a worker thread (the zip streamer) reaches it
with ``trio.from_thread.run``.
"""

from __future__ import annotations

from collections import deque
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field

import trio

MB = 1024 * 1024


class DoesNotFit(ValueError):
    """Asked for more than the whole budget: waiting would never end."""


@dataclass(eq=False)
class _Waiter:
    nbytes: int
    granted: trio.Event = field(default_factory=trio.Event)


class MemoryBudget:
    """A byte semaphore, first come first served. ``total`` bytes; ``used`` is what is held now."""

    def __init__(self, total: int) -> None:
        if total < 1:
            raise ValueError("a memory budget needs at least one byte")
        self.total = total
        self.used = 0
        self.peak = 0  # the most held at once, for figures and tests
        self._queue: deque[_Waiter] = deque()

    @classmethod
    def megabytes(cls, mb: int) -> MemoryBudget:
        return cls(mb * MB)

    @property
    def waiting(self) -> int:
        return len(self._queue)

    def fits(self, nbytes: int) -> bool:
        """Whether ``nbytes`` could ever be held (alone, with nothing else held)."""
        return nbytes <= self.total

    @asynccontextmanager
    async def hold(self, nbytes: int) -> AsyncIterator[None]:
        """Hold ``nbytes`` for the body of the ``async with``, waiting (cancellably) until they are free."""
        nbytes = max(0, nbytes)
        if not self.fits(nbytes):
            raise DoesNotFit(f"{nbytes} bytes asked of a budget of {self.total}")
        await self._acquire(nbytes)
        try:
            yield
        finally:
            self._release(nbytes)

    async def _acquire(self, nbytes: int) -> None:
        if not self._queue and self.used + nbytes <= self.total:
            await trio.lowlevel.checkpoint_if_cancelled()
            self._take(nbytes)
            await trio.lowlevel.cancel_shielded_checkpoint()
            return
        waiter = _Waiter(nbytes)
        self._queue.append(waiter)
        try:
            await waiter.granted.wait()
        except BaseException:
            if waiter.granted.is_set():  # granted and cancelled in the same step: give it back
                self._release(nbytes)
            else:
                self._queue.remove(waiter)
                self._grant()  # it may have been the head that held the others back
            raise

    def _take(self, nbytes: int) -> None:
        self.used += nbytes
        self.peak = max(self.peak, self.used)

    def _release(self, nbytes: int) -> None:
        self.used -= nbytes
        self._grant()

    def _grant(self) -> None:
        """Wake waiters from the head of the queue for as long as the next one fits."""
        while self._queue and self.used + self._queue[0].nbytes <= self.total:
            waiter = self._queue.popleft()
            self._take(waiter.nbytes)
            waiter.granted.set()
