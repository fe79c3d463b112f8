"""Password-attempt throttling per (target, client), where the client is a device or an IP (web/passwords.py).

Every password check costs a memory-hard hash, so the check is refused *before* hashing once a key has used up its
failures in the window: at most ``limit`` hash checks per key per window, the rest answered 429 with
``Retry-After``. With ``backoff``, a key past its ``limit`` is not shut for the window but waits ``backoff``
seconds after its last failure, twice as long after each further one (at most the window), and its failures are
forgotten only after twice the window without one: that is how clients nobody can tell apart (a venue's Wi-Fi
behind one address) are slowed without being locked out for the window by one of them, while a guesser that keeps
going gets one guess per window (the old lockout gave it ``limit``). Attempts on one key run one at a time
(:meth:`guard`), so that guesses sent in parallel cannot all pass the check before the first failure is counted,
while right passwords never count: a family on one wifi opening the gallery together is not locked out. The table
is bounded; when full, the stalest keys are dropped.
"""

from __future__ import annotations

import math
import time
from collections import OrderedDict, deque
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager

import trio

from picpeak_lite.errors import TooManyRequests

MAX_KEYS = 50_000
MAX_BACKOFF_STEPS = 32  # failures kept past the limit: the wait has reached the window long before


class Throttle:
    def __init__(self, limit: int, window: float, *, backoff: float | None = None,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.limit = limit
        self.window = window
        self.backoff = backoff
        self.clock = clock
        self._failures: OrderedDict[tuple[str, str], deque[float]] = OrderedDict()
        self._locks: dict[tuple[str, str], trio.Lock] = {}

    @asynccontextmanager
    async def guard(self, target: str, ip: str) -> AsyncIterator[None]:
        """Hold the key's turn while checking a password: raise TooManyRequests (before any hashing) when it
        has no attempts left; inside, call :meth:`failed` or :meth:`succeeded`."""
        key = (target, ip)
        lock = self._locks.get(key)
        if lock is None:
            lock = self._locks[key] = trio.Lock()
        try:
            async with lock:
                self.check(target, ip)
                yield
        finally:
            if not lock.locked() and lock.statistics().tasks_waiting == 0:
                self._locks.pop(key, None)

    def check(self, target: str, ip: str) -> None:
        """Raise TooManyRequests if this (target, IP) has no attempts left in the window."""
        attempts = self._recent((target, ip))
        if len(attempts) < self.limit:
            return
        if self.backoff is None:
            retry_after = attempts[0] + self.window - self.clock()
        else:
            wait = min(self.backoff * 2 ** (len(attempts) - self.limit), self.window)
            retry_after = attempts[-1] + wait - self.clock()
            if retry_after <= 0:
                return
        raise TooManyRequests(math.ceil(retry_after))

    def failed(self, target: str, ip: str) -> None:
        key = (target, ip)
        attempts = self._recent(key)
        attempts.append(self.clock())
        if len(attempts) > self.limit + MAX_BACKOFF_STEPS:
            attempts.popleft()
        self._failures[key] = attempts
        self._failures.move_to_end(key)
        while len(self._failures) > MAX_KEYS:
            self._failures.popitem(last=False)

    def succeeded(self, target: str, ip: str) -> None:
        self._failures.pop((target, ip), None)

    def _recent(self, key: tuple[str, str]) -> deque[float]:
        attempts = self._failures.get(key, deque())
        if self.backoff is not None:
            if attempts and attempts[-1] <= self.clock() - 2 * self.window:
                attempts.clear()
        else:
            cutoff = self.clock() - self.window
            while attempts and attempts[0] <= cutoff:
                attempts.popleft()
        if not attempts:
            self._failures.pop(key, None)
        return attempts
