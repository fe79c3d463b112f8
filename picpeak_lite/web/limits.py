"""What the web app bounds per client or per kind of work, made with the app by ``create_app``.

None of this matters to the background tasks, so it lives here and not in ``Services``. The throttles and rate
limits keep their state in the database, so that they hold for the whole service however many processes serve
it; the limiters below bound this process's own work.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field

import trio

from picpeak_lite.config import Settings
from picpeak_lite.store.db import Database
from picpeak_lite.web.passwords import PasswordThrottle
from picpeak_lite.web.ratelimit import GuestUploadLimits, RateLimit

GOING_AWAY = 1001  # RFC 6455: "going away", a server restarting; the pages' live.js reconnects later


class LiveFeeds:
    """The open WebSocket feeds, so that a stopping server ends them first, each with a close frame of code
    1001 (``GOING_AWAY``), instead of leaving them open until the shutdown grace period runs out (issue 35 #19):
    a live page never ends by itself, so every stop with one open took the whole ``shutdown_grace_seconds``.
    The pages' ``live.js`` reads 1001 as "the server is restarting" and reconnects with its backoff."""

    def __init__(self) -> None:
        self.going_away = trio.Event()
        self.open = 0
        self._none_open = trio.Event()
        self._none_open.set()

    def opened(self) -> None:
        self.open += 1
        self._none_open = trio.Event() if self.open == 1 else self._none_open

    def closed(self) -> None:
        self.open -= 1
        if self.open == 0:
            self._none_open.set()

    async def close_all(self, patience: float) -> tuple[int, int]:
        """Tell every feed to close with 1001 and wait (at most ``patience`` seconds) until they have; returns
        how many were open and how many are still open."""
        before = self.open
        self.going_away.set()
        with trio.move_on_after(patience):
            await self._none_open.wait()
        return before, self.open


def wall_clock(clock: Callable[[], float], monotonic: Callable[[], float]) -> Callable[[], float]:
    """The limits' clock: epoch seconds (``clock``, as at the first call) advanced by ``monotonic`` since then.

    Limits stored in the database are compared across processes, so they need a time every process agrees on:
    epoch seconds, not a monotonic clock (each process's starts anywhere). Advancing it by the monotonic clock
    keeps it from stepping back when the system clock is set back while the process runs, and lets tests drive it
    with trio's ``autojump_clock`` (``Services.monotonic``)."""
    start: list[float] = []

    def now() -> float:
        if not start:
            start.extend((clock(), monotonic()))
        return start[0] + (monotonic() - start[1])

    return now


@dataclass
class WebLimits:
    # Failed passwords at the admin login and at galleries, per device or IP (web/passwords.py).
    password_throttle: PasswordThrottle
    # Guest state changes (hearts, names), per guest session: 60 changes at once, then 2 a second.
    guest_rate_limit: RateLimit
    # Guests' comments, per guest session, on top of guest_rate_limit: 10 at once, then one each 10 s.
    comment_rate_limit: RateLimit
    # Guest upload budgets per session and per IP (ratelimit.GUEST_*), read when this is made.
    guest_upload_limits: GuestUploadLimits
    # A watermarked download decodes the full-size original (up to max_pixels): one at a time, then cached on disk.
    watermark_limiter: trio.CapacityLimiter
    # Disk reads for zips: bounded, so that a few zips cannot starve page views (watermarking has its own).
    download_limiter: trio.CapacityLimiter
    # Open WebSockets (max_websockets): each holds ~50 KB that the process keeps once it has had it.
    websockets: trio.CapacityLimiter
    # The open feeds, closed first (1001) when the server stops.
    feeds: LiveFeeds
    # "Find me" searches, per guest session: 5 at once, then one each 10 s (each costs a face detection, ~0.2 s
    # of a core in an image child); at most two selfies looked at at once in the whole server, and two
    # comparisons with a gallery's faces (threads: a matrix product over at most a few MB).
    findme_rate_limit: RateLimit
    findme_limiter: trio.CapacityLimiter = field(default_factory=lambda: trio.CapacityLimiter(2))
    findme_compare: trio.CapacityLimiter = field(default_factory=lambda: trio.CapacityLimiter(2))

    @classmethod
    def for_settings(cls, settings: Settings, db: Database, clock: Callable[[], float]) -> WebLimits:
        """``clock``: epoch seconds that every process agrees on (:func:`wall_clock`)."""
        return cls(
            password_throttle=PasswordThrottle(settings.login_attempts, settings.login_window_seconds,
                                               settings.login_backoff_seconds, db=db, clock=clock),
            guest_rate_limit=RateLimit("guest", 60, 2, db=db, clock=clock),
            comment_rate_limit=RateLimit("comment", 10, 0.1, db=db, clock=clock),
            guest_upload_limits=GuestUploadLimits(db, clock),
            watermark_limiter=trio.CapacityLimiter(1),
            download_limiter=trio.CapacityLimiter(4),
            websockets=trio.CapacityLimiter(settings.max_websockets or math.inf),
            feeds=LiveFeeds(),
            findme_rate_limit=RateLimit("findme", 5, 0.1, db=db, clock=clock),
            findme_limiter=trio.CapacityLimiter(2),
            findme_compare=trio.CapacityLimiter(2),
        )
