"""Token buckets for guest actions that always cost something: hearts, name changes, uploads.

Chosen over ``throttle.Throttle`` because that one counts failed password attempts in a window, while this limits
every action: a guest tapping hearts through 300 photos should not be stopped, a script toggling one 50 times a
second should.

The buckets live in the database (``rate_buckets``, ``store/queries/limits.py``), so that a limit holds for the
whole service: two server processes behind one proxy give a guest 60 hearts at once, not 60 each. Each decision
is one upsert statement in one short write transaction (on PostgreSQL committed without waiting for its WAL
flush: ``limits_q.cheap_commit``).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from picpeak_lite.errors import TooManyRequests
from picpeak_lite.i18n import N_, _
from picpeak_lite.store.db import Connection, Database
from picpeak_lite.store.queries import limits as limits_q

SLOW_DOWN = N_("Slow down a little, please: too many changes at once.")


class RateLimit:
    """A token bucket per key: ``burst`` tokens at once, refilled at ``per_second``. ``name`` is the bucket's
    name in the table (one per limit). ``clock``: epoch seconds, the same in every process (``limits.wall_clock``).

    A bucket may go into debt (:meth:`charge`): an upload's size is only known once it has been read, so it is
    charged afterwards, and the next request waits until the debt is paid off.
    """

    def __init__(self, name: str, burst: float, per_second: float, *, db: Database, clock: Callable[[], float],
                 message: str = SLOW_DOWN) -> None:
        self.name = name
        self.burst = burst
        self.per_second = per_second
        self.db = db
        self.clock = clock
        self.message = message

    async def take(self, key: Any, amount: float = 1) -> None:
        """Spend ``amount`` tokens, or raise TooManyRequests (with the seconds until the bucket holds one token
        again) while it holds less than one. ``take(key, 0)`` only checks."""
        await self.db.write(self._take_alone, key, amount, self.clock())

    async def charge(self, key: Any, amount: float) -> None:
        """Spend ``amount`` tokens after the fact, going into debt if need be; never raises TooManyRequests."""
        await self.db.write(self._charge_alone, key, amount, self.clock())

    def take_in(self, conn: Connection, key: Any, amount: float, now: float) -> None:
        """:meth:`take` inside the caller's transaction (a refusal raised there rolls back all of it), at ``now``
        (this bucket's ``clock``, read by the caller in async code: a test's trio clock cannot be read in a
        thread)."""
        row = limits_q.take_tokens(conn, self.name, str(key), now, self.burst, self.per_second, amount)
        if not row["granted"]:
            raise TooManyRequests(math.ceil((1 - row["tokens"]) / self.per_second), _(self.message))

    def charge_in(self, conn: Connection, key: Any, amount: float, now: float) -> None:
        limits_q.take_tokens(conn, self.name, str(key), now, self.burst, self.per_second, amount, force=True)

    def _take_alone(self, conn: Connection, key: Any, amount: float, now: float) -> None:
        limits_q.cheap_commit(conn)
        self.take_in(conn, key, amount, now)

    def _charge_alone(self, conn: Connection, key: Any, amount: float, now: float) -> None:
        limits_q.cheap_commit(conn)
        self.charge_in(conn, key, amount, now)


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
    """The four budgets above, one set per app (``WebLimits.guest_upload_limits``), kept in the database."""

    db: Database
    clock: Callable[[], float]
    per_session: RateLimit = field(init=False)
    per_ip: RateLimit = field(init=False)
    bytes_per_session: RateLimit = field(init=False)
    bytes_per_ip: RateLimit = field(init=False)

    def __post_init__(self) -> None:
        def bucket(name: str, burst_and_rate: tuple[float, float]) -> RateLimit:
            return RateLimit(name, *burst_and_rate, db=self.db, clock=self.clock, message=UPLOAD_SLOW_DOWN)

        self.per_session = bucket("uploads/session", GUEST_UPLOADS_PER_SESSION)
        self.per_ip = bucket("uploads/ip", GUEST_UPLOADS_PER_IP)
        self.bytes_per_session = bucket("upload-bytes/session", GUEST_BYTES_PER_SESSION)
        self.bytes_per_ip = bucket("upload-bytes/ip", GUEST_BYTES_PER_IP)

    async def take(self, session_id: int, ip: str) -> None:
        """Count one request, or raise TooManyRequests if any budget is spent (then nothing is counted: the
        refusal rolls the transaction back). Each bucket reads its own clock (tests give some another)."""
        await self.db.write(self._take, session_id, ip, self._times())

    async def charge_bytes(self, session_id: int, ip: str, size: int) -> None:
        await self.db.write(self._charge_bytes, session_id, ip, size, self._times())

    def _times(self) -> list[float]:
        return [b.clock() for b in (self.per_session, self.per_ip, self.bytes_per_session, self.bytes_per_ip)]

    def _take(self, conn: Connection, session_id: int, ip: str, times: list[float]) -> None:
        limits_q.cheap_commit(conn)
        for (limit, key, amount), now in zip(((self.per_session, session_id, 1), (self.per_ip, ip, 1),
                                              (self.bytes_per_session, session_id, 0),
                                              (self.bytes_per_ip, ip, 0)), times, strict=True):
            limit.take_in(conn, key, amount, now)

    def _charge_bytes(self, conn: Connection, session_id: int, ip: str, size: int, times: list[float]) -> None:
        limits_q.cheap_commit(conn)
        self.bytes_per_session.charge_in(conn, session_id, size, times[2])
        self.bytes_per_ip.charge_in(conn, ip, size, times[3])
