"""The long-lived objects a request or task needs, passed explicitly rather than found in globals."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field

import trio

from picpeak_lite import security
from picpeak_lite.config import Settings
from picpeak_lite.events.broker import Broker
from picpeak_lite.pipeline.memory import MemoryTrimmer
from picpeak_lite.store.db import Database
from picpeak_lite.store.storage import Storage
from picpeak_lite.web.ratelimit import GuestUploadLimits, RateLimit
from picpeak_lite.web.throttle import Throttle


@dataclass
class Services:
    settings: Settings
    db: Database
    # Wall-clock time for rows (epoch seconds). Tests may pass another clock.
    clock: Callable[[], float] = time.time
    # Monotonic clock for throttling windows; tests pass trio.current_time to use autojump_clock.
    monotonic: Callable[[], float] = time.monotonic
    # argon2 uses 64 MiB and ~50 ms of CPU per check: bound how many run at once.
    hash_limiter: trio.CapacityLimiter = field(default_factory=lambda: trio.CapacityLimiter(2))
    # A watermarked download decodes the full-size original (up to max_pixels): one at a time, then cached on disk.
    watermark_limiter: trio.CapacityLimiter = field(default_factory=lambda: trio.CapacityLimiter(1))
    # Disk reads for zips: bounded, so that a few zips cannot starve page views (watermarking has its own).
    download_limiter: trio.CapacityLimiter = field(default_factory=lambda: trio.CapacityLimiter(4))
    # Set by server.run once the worker pool and the webhook sender run; no-ops until then (and in tests that
    # do not start them). Both are sync, non-blocking, and safe to call after a commit.
    wake_workers: Callable[[], None] = lambda: None
    wake_webhooks: Callable[[], None] = lambda: None
    broker: Broker = field(default_factory=Broker)
    # The URL the server listens on: from the settings until server.run binds (port 0 resolved), then the real
    # one. Share links fall back to it when a request's Host is not trusted (web/views/common.py).
    bind_url: str = ""
    # Started by server.run; code that has just let go of a lot (an upload, a processed photo) calls freed().
    trimmer: MemoryTrimmer = field(default_factory=MemoryTrimmer)
    login_throttle: Throttle = field(init=False)
    gallery_throttle: Throttle = field(init=False)
    # Guest state changes (hearts, names), per guest session: 60 changes at once, then 2 a second.
    guest_rate_limit: RateLimit = field(init=False)
    # Guest upload budgets per session and per IP (ratelimit.GUEST_*), read when Services is made.
    guest_upload_limits: GuestUploadLimits = field(init=False)

    def __post_init__(self) -> None:
        s = self.settings
        if not self.bind_url:
            host = f"[{s.host}]" if ":" in s.host else s.host
            self.bind_url = f"http://{host}:{s.port}"
        self.login_throttle = Throttle(s.login_attempts, s.login_window_seconds, clock=self.monotonic)
        self.gallery_throttle = Throttle(s.login_attempts, s.login_window_seconds, clock=self.monotonic)
        self.guest_rate_limit = RateLimit(60, 2, clock=self.monotonic)
        self.guest_upload_limits = GuestUploadLimits(self.monotonic)

    @property
    def storage(self) -> Storage:
        return Storage(self.settings.data_path)

    async def hash_password(self, password: str) -> str:
        return await trio.to_thread.run_sync(security.hash_password, password, limiter=self.hash_limiter)

    async def verify_password(self, password_hash: str | None, password: str) -> bool:
        return await trio.to_thread.run_sync(
            security.verify_password, password_hash, password, limiter=self.hash_limiter
        )
