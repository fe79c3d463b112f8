"""What the web app bounds per client or per kind of work, made with the app by ``create_app``.

None of this matters to the background tasks, so it lives here and not in ``Services``.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import trio

from picpeak_lite.config import Settings
from picpeak_lite.web.passwords import PasswordThrottle
from picpeak_lite.web.ratelimit import GuestUploadLimits, RateLimit


@dataclass
class WebLimits:
    # Failed passwords at the admin login and at galleries, per device or IP (web/passwords.py).
    password_throttle: PasswordThrottle
    # Guest state changes (hearts, names), per guest session: 60 changes at once, then 2 a second.
    guest_rate_limit: RateLimit
    # Guest upload budgets per session and per IP (ratelimit.GUEST_*), read when this is made.
    guest_upload_limits: GuestUploadLimits
    # A watermarked download decodes the full-size original (up to max_pixels): one at a time, then cached on disk.
    watermark_limiter: trio.CapacityLimiter
    # Disk reads for zips: bounded, so that a few zips cannot starve page views (watermarking has its own).
    download_limiter: trio.CapacityLimiter
    # Open WebSockets (max_websockets): each holds ~50 KB that the process keeps once it has had it.
    websockets: trio.CapacityLimiter

    @classmethod
    def for_settings(cls, settings: Settings, monotonic: Callable[[], float]) -> WebLimits:
        return cls(
            password_throttle=PasswordThrottle(settings.login_attempts, settings.login_window_seconds,
                                               settings.login_backoff_seconds, clock=monotonic),
            guest_rate_limit=RateLimit(60, 2, clock=monotonic),
            guest_upload_limits=GuestUploadLimits(monotonic),
            watermark_limiter=trio.CapacityLimiter(1),
            download_limiter=trio.CapacityLimiter(4),
            websockets=trio.CapacityLimiter(settings.max_websockets or math.inf),
        )
