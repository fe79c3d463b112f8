"""Token buckets for guest actions that always cost something: hearts, name changes, uploads.

Chosen over ``throttle.Throttle`` because that one counts failed password attempts in a window, while this limits
every action: a guest tapping hearts through 300 photos should not be stopped, a script toggling one 50 times a
second should.
"""

from __future__ import annotations

import math
import time
from collections import OrderedDict
from collections.abc import Callable
from typing import Any

from .errors import TooManyRequests

MAX_KEYS = 50_000
SLOW_DOWN = "Slow down a little, please: too many changes at once."


class RateLimit:
    """A token bucket per key: ``burst`` tokens at once, refilled at ``per_second``. Bounded: when the table is
    full the stalest keys go (they would have refilled by then anyway).

    A bucket may go into debt (:meth:`charge`): an upload's size is only known once it has been read, so it is
    charged afterwards, and the next request waits until the debt is paid off.
    """

    def __init__(self, burst: float, per_second: float, *, clock: Callable[[], float] = time.monotonic,
                 message: str = SLOW_DOWN) -> None:
        self.burst = burst
        self.per_second = per_second
        self.clock = clock
        self.message = message
        self._buckets: OrderedDict[Any, tuple[float, float]] = OrderedDict()

    def take(self, key: Any, amount: float = 1) -> None:
        """Spend ``amount`` tokens, or raise TooManyRequests (with the seconds until the bucket holds one token
        again) while it holds less than one. ``take(key, 0)`` only checks."""
        tokens, now = self._tokens(key)
        if tokens < 1:
            raise TooManyRequests(math.ceil((1 - tokens) / self.per_second), self.message)
        self._store(key, tokens - amount, now)

    def charge(self, key: Any, amount: float) -> None:
        """Spend ``amount`` tokens after the fact, going into debt if need be; never raises."""
        tokens, now = self._tokens(key)
        self._store(key, tokens - amount, now)

    def _tokens(self, key: Any) -> tuple[float, float]:
        now = self.clock()
        tokens, last = self._buckets.get(key, (self.burst, now))
        return min(self.burst, tokens + (now - last) * self.per_second), now

    def _store(self, key: Any, tokens: float, now: float) -> None:
        self._buckets[key] = (tokens, now)
        self._buckets.move_to_end(key)
        while len(self._buckets) > MAX_KEYS:
            self._buckets.popitem(last=False)
