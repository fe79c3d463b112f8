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
from dataclasses import dataclass, field
from typing import Any

from picpeak_lite.errors import TooManyRequests
from picpeak_lite.i18n import N_, _

MAX_KEYS = 50_000
SLOW_DOWN = N_("Slow down a little, please: too many changes at once.")


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
            raise TooManyRequests(math.ceil((1 - tokens) / self.per_second), _(self.message))
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


# Guest upload budgets, as token buckets: (burst, refill per second). The upload page sends one file per request,
# three at a time, so a guest sharing 200 photos makes 200 requests: 60 at once and then one a second is more than
# a phone on venue Wi-Fi manages, while a script gets nowhere fast. Bytes are what fill the disk: 1 GiB per hour
# per session is some 200 phone photos. A whole venue may share one IP (NAT), so its budgets are 5x a session's.
# The page waits out a 429 and carries on by itself.
GiB = 1024**3
GUEST_UPLOADS_PER_SESSION = (60, 1.0)
GUEST_UPLOADS_PER_IP = (300, 5.0)
GUEST_BYTES_PER_SESSION = (1 * GiB, 1 * GiB / 3600)
GUEST_BYTES_PER_IP = (5 * GiB, 5 * GiB / 3600)
UPLOAD_SLOW_DOWN = N_("You are sending photos faster than this server accepts. Please wait a little and retry.")


@dataclass
class GuestUploadLimits:
    """The four budgets above, one set per app (``Services.guest_upload_limits``)."""

    clock: Callable[[], float]
    per_session: RateLimit = field(init=False)
    per_ip: RateLimit = field(init=False)
    bytes_per_session: RateLimit = field(init=False)
    bytes_per_ip: RateLimit = field(init=False)

    def __post_init__(self) -> None:
        def bucket(burst_and_rate: tuple[float, float]) -> RateLimit:
            return RateLimit(*burst_and_rate, clock=self.clock, message=UPLOAD_SLOW_DOWN)

        self.per_session, self.per_ip = bucket(GUEST_UPLOADS_PER_SESSION), bucket(GUEST_UPLOADS_PER_IP)
        self.bytes_per_session = bucket(GUEST_BYTES_PER_SESSION)
        self.bytes_per_ip = bucket(GUEST_BYTES_PER_IP)

    def take(self, session_id: int, ip: str) -> None:
        """Count one request, or raise TooManyRequests if any budget is spent (then nothing is counted)."""
        for limit, key in ((self.per_session, session_id), (self.per_ip, ip),
                           (self.bytes_per_session, session_id), (self.bytes_per_ip, ip)):
            limit.take(key, 0)
        self.per_session.take(session_id)
        self.per_ip.take(ip)

    def charge_bytes(self, session_id: int, ip: str, size: int) -> None:
        self.bytes_per_session.charge(session_id, size)
        self.bytes_per_ip.charge(ip, size)
