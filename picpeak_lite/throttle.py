"""Password-attempt throttling per (target, client IP).

Every password check costs a memory-hard hash, so an attempt is counted *before* hashing (:meth:`attempt`), and
refused without hashing once a key has used up its attempts in the window: at most ``limit`` hash checks per key
per window, the rest answered 429 with ``Retry-After``. Counting first, with no await between the check and the
count, is what makes concurrent guesses count too (checking first and counting after the hash let 40 parallel
guesses all through). A right password clears the key. Keys are per target and IP, never global, so one
attacker cannot lock real guests out. The table is bounded; when full, the stalest keys are dropped.
"""

from __future__ import annotations

import math
import time
from collections import OrderedDict, deque
from collections.abc import Callable

from .errors import TooManyRequests

MAX_KEYS = 50_000


class Throttle:
    def __init__(self, limit: int, window: float, *, clock: Callable[[], float] = time.monotonic) -> None:
        self.limit = limit
        self.window = window
        self.clock = clock
        self._attempts: OrderedDict[tuple[str, str], deque[float]] = OrderedDict()

    def attempt(self, target: str, ip: str) -> None:
        """Count one attempt for (target, IP), or raise TooManyRequests if it has none left in the window."""
        key = (target, ip)
        attempts = self._recent(key)
        if len(attempts) >= self.limit:
            retry_after = attempts[0] + self.window - self.clock()
            raise TooManyRequests(math.ceil(retry_after))
        attempts.append(self.clock())
        self._attempts[key] = attempts
        self._attempts.move_to_end(key)
        while len(self._attempts) > MAX_KEYS:
            self._attempts.popitem(last=False)

    def succeeded(self, target: str, ip: str) -> None:
        self._attempts.pop((target, ip), None)

    def _recent(self, key: tuple[str, str]) -> deque[float]:
        attempts = self._attempts.get(key, deque())
        cutoff = self.clock() - self.window
        while attempts and attempts[0] <= cutoff:
            attempts.popleft()
        if not attempts:
            self._attempts.pop(key, None)
        return attempts
