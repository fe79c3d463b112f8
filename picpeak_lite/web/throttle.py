"""Password-attempt throttling per (target, client), where the client is a device or an IP (web/passwords.py).

Every password check costs a memory-hard hash, so the check is refused *before* hashing once a key has used up its
failures in the window: at most ``limit`` hash checks per key per window, the rest answered 429 with
``Retry-After``. With ``backoff``, a key past its ``limit`` is not shut for the window but waits ``backoff``
seconds after its last failure, twice as long after each further one (at most the window), and its failures are
forgotten only after twice the window without one: that is how clients nobody can tell apart (a venue's Wi-Fi
behind one address) are slowed without being locked out for the window by one of them, while a guesser that keeps
going gets one guess per window (the old lockout gave it ``limit``).

The failures live in the database (``password_attempts``, ``store/queries/limits.py``), so the limit holds for the
whole service: 5 guesses are 5 across every process and host, not 5 each. Guesses sent in parallel (to one
process or to several) cannot all pass the check before the first failure is counted: an attempt is *reserved*
before its hash, in the same transaction as the check (under ``locks.PASSWORD_ATTEMPTS`` on PostgreSQL), and a
reservation counts as a failure until its answer is known: kept as a failure on a wrong password, removed on a
right one. An attempt refused only because of others still in flight waits for them (a family on one Wi-Fi
opening the gallery together is not refused; right passwords never count), at most :data:`MAX_WAIT_SECONDS`. A
reservation expires after :data:`RESERVATION_SECONDS`, so a process that crashed in the middle of a check does
not hold its key for ever. Times are epoch seconds from ``clock``, which every process must agree on
(``limits.wall_clock``). The table is bounded: each key keeps its latest ``limit + MAX_BACKOFF_STEPS`` failures,
forgotten keys are removed on the key's next attempt and by the janitor (``limits_q.prune``), which also drops
the stalest keys past ``limits_q.MAX_KEYS``.
"""

from __future__ import annotations

import math
from collections.abc import AsyncIterator, Callable, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass

import trio

from picpeak_lite.errors import TooManyRequests
from picpeak_lite.store import locks
from picpeak_lite.store.db import Connection, Database
from picpeak_lite.store.queries import limits as limits_q

MAX_BACKOFF_STEPS = 32  # failures kept past the limit: the wait has reached the window long before
# A check normally holds its reservation for one hash (~50 ms) plus its turn for the hash limiter; a minute is
# far past that, and short enough that a crashed process's reservation frees its key soon.
RESERVATION_SECONDS = 60.0
# How long an attempt waits for others of its key still in flight before it is answered 429 (a busy machine may
# take seconds over a few hashes; a stuck one holds its key at most RESERVATION_SECONDS); and how often a
# waiting attempt looks again (an attempt answered in this process wakes it at once).
MAX_WAIT_SECONDS = 20.0
POLL_SECONDS = 0.05
_NEVER = -1e18


class Throttle:
    """One kind of key (``name`` in the table) with its limit and window. ``forgiving``: a right password
    forgets the key's failures (the per-target total of untrusted clients is not forgiven by one success)."""

    def __init__(self, name: str, limit: int, window: float, *, backoff: float | None = None,
                 forgiving: bool = True) -> None:
        self.name = name
        self.limit = limit
        self.window = window
        self.backoff = backoff
        self.forgiving = forgiving

    def decide(self, conn: Connection, target: str, client: str, now: float) -> float | None:
        """In the reservation's transaction: raise TooManyRequests if this key has no attempts left; return None
        if it may try now, or the time the first of its attempts in flight expires if only they stand in the way
        (then the caller waits for them)."""
        if self.backoff is None:
            limits_q.forget_before(conn, self.name, target, client, now - self.window, now)
        else:
            limits_q.forget_before(conn, self.name, target, client, _NEVER, now)
        row = limits_q.attempts_of(conn, self.name, target, client, now)
        if self.backoff is not None and row["latest"] is not None and row["latest"] <= now - 2 * self.window:
            limits_q.forget_before(conn, self.name, target, client, now - 2 * self.window, now)
            return None
        if self._retry_after(row["failures"] + row["pending"], row["oldest"], row["latest"], now) is None:
            return None
        retry_after = self._retry_after(row["failures"], row["oldest_failure"], row["latest_failure"], now)
        if retry_after is None:
            return float(row["pending_ends"])
        raise TooManyRequests(math.ceil(retry_after))

    def _retry_after(self, count: int, oldest: float | None, latest: float | None, now: float) -> float | None:
        if count < self.limit:
            return None
        assert oldest is not None and latest is not None
        if self.backoff is None:
            return oldest + self.window - now
        wait = min(self.backoff * 2 ** (count - self.limit), self.window)
        retry_after = latest + wait - now
        return retry_after if retry_after > 0 else None

    def failed(self, conn: Connection, target: str, client: str, now: float) -> None:
        forget_at = now + (self.window if self.backoff is None else 2 * self.window)
        limits_q.add_failure(conn, self.name, target, client, now, forget_at, self.limit + MAX_BACKOFF_STEPS)

    def succeeded(self, conn: Connection, target: str, client: str) -> None:
        if self.forgiving:
            limits_q.forget_key(conn, self.name, target, client)


Key = tuple[Throttle, str, str]  # a throttle, a target, a client


@dataclass
class Reservation:
    keys: Sequence[Key]
    ids: list[int]


class Attempt:
    """One password check inside a guard: tell it how the check went. Neither (an error, a cancelled request)
    counts as nothing: the reservation is released."""

    def __init__(self) -> None:
        self.outcome: str | None = None

    def failed(self) -> None:
        self.outcome = "failed"

    def succeeded(self) -> None:
        self.outcome = "succeeded"


class Attempts:
    """Reservations and outcomes for the throttles of one app, in the database ``db``. ``clock`` is read in
    async code (a test's trio clock cannot be read from a thread) and its time passed to the transaction."""

    def __init__(self, db: Database, clock: Callable[[], float]) -> None:
        self.db = db
        self.clock = clock
        self._answered = trio.Event()  # set (and replaced) whenever an attempt of this process is answered

    @asynccontextmanager
    async def guard(self, keys: Sequence[Key]) -> AsyncIterator[Attempt]:
        """Raise TooManyRequests (before any hashing) when any key has no attempts left; otherwise hold a
        reservation on every key while the password is checked, and record the outcome told to the attempt."""
        reservation = await self._reserve(keys)
        attempt = Attempt()
        try:
            yield attempt
        finally:
            with trio.CancelScope(shield=True):  # the reservation must not outlive its check here
                await self.db.write(self._finish, reservation, attempt.outcome, self.clock())
                self._answered.set()
                self._answered = trio.Event()

    async def _reserve(self, keys: Sequence[Key]) -> Reservation:
        began: float | None = None
        while True:
            outcome = await self.db.write(self._try_reserve, keys, self.clock())
            if isinstance(outcome, Reservation):
                return outcome
            now = self.clock()
            began = now if began is None else began
            if now - began >= MAX_WAIT_SECONDS:
                raise TooManyRequests(max(1, math.ceil(outcome - now)))
            with trio.move_on_after(POLL_SECONDS):
                await self._answered.wait()

    def _try_reserve(self, conn: Connection, keys: Sequence[Key], now: float) -> Reservation | float:
        locks.hold(conn, locks.PASSWORD_ATTEMPTS)
        pending_ends: float | None = None
        for throttle, target, client in keys:
            ends = throttle.decide(conn, target, client, now)
            if ends is not None:
                pending_ends = ends if pending_ends is None else min(pending_ends, ends)
        if pending_ends is not None:
            return pending_ends
        until = now + RESERVATION_SECONDS
        return Reservation(keys, [limits_q.reserve(conn, t.name, target, client, now, until)
                                  for t, target, client in keys])

    def _finish(self, conn: Connection, reservation: Reservation, outcome: str | None, now: float) -> None:
        limits_q.release(conn, reservation.ids)
        for throttle, target, client in reservation.keys:
            if outcome == "failed":
                throttle.failed(conn, target, client, now)
            elif outcome == "succeeded":
                throttle.succeeded(conn, target, client)
