"""Password attempts that no one can use to lock others out: device cookies (OWASP, "Slow Down Online Guessing
Attacks with Device Cookies") over per-target throttles.

Counting failures per IP alone locked a whole IP out (issue 27): one guest on a venue's Wi-Fi, behind one
address, shut every guest there out of the gallery for the window; anyone on the photographer's network shut
the photographer out of the admin. So an attempt is counted by who makes it:

* A **trusted device** is a browser that once gave this target's right password: it then holds a signed device
  cookie for the target. Its failures are counted for that device alone (``login_attempts`` per window, then
  429 for that device only): nobody else's guesses can lock it out, and it cannot guess without limit.
* Every other attempt is from an **untrusted client**. Its failures are counted per target and IP, and past
  ``login_attempts`` that IP's untrusted clients wait ``login_backoff_seconds`` after the last failure, twice as
  long after each further one (at most the window): slowed, never shut for the window. All untrusted clients of
  one target together get :data:`UNTRUSTED_FACTOR` times as many failures before the same backoff, so that
  guessing from many addresses is bounded too.

A device cookie names a random device id and, for each target it proved, an HMAC of the id and the target keyed
with the target's password hash: nothing to store, it cannot be made without the password hash, and it stops
counting the moment the password changes (the device has then proved nothing about the new one). The cookie
holds at most :data:`MAX_TARGETS` targets, the latest kept.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import secrets
from collections.abc import Callable
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass

from picpeak_lite.store.db import Database
from picpeak_lite.web.throttle import Attempt, Attempts, Throttle

DEVICE_COOKIE = "pp_device"
DEVICE_COOKIE_DAYS = 400  # what browsers keep a cookie at most
MAX_TARGETS = 16
UNTRUSTED_FACTOR = 20
_MAC_CHARS = 22  # 128 bits, base64url


@dataclass(frozen=True)
class Device:
    """A device cookie as it came: its id and the (target, mac) pairs it carries."""

    device_id: str
    proofs: tuple[tuple[str, str], ...] = ()

    @classmethod
    def parse(cls, value: str | None) -> Device | None:
        """The cookie's contents, or None for a missing or malformed one (treated as no cookie)."""
        if not value or len(value) > 2048:
            return None
        device_id, *pairs = value.split("~")
        if len(device_id) != 22 or len(pairs) > MAX_TARGETS:
            return None
        proofs = []
        for pair in pairs:
            target, _, mac = pair.partition(".")
            if not target or len(mac) != _MAC_CHARS:
                return None
            proofs.append((target, mac))
        return cls(device_id, tuple(proofs))

    @classmethod
    def new(cls) -> Device:
        return cls(secrets.token_urlsafe(16))

    def proved(self, target: str, password_hash: str) -> bool:
        """Whether this device once gave the password whose hash is ``password_hash`` for ``target``."""
        expected = device_mac(password_hash, self.device_id, target)
        return any(t == target and hmac.compare_digest(mac, expected) for t, mac in self.proofs)

    def with_proof(self, target: str, password_hash: str) -> Device:
        """This device, now also trusted for ``target`` (its older proof of the target replaced)."""
        kept = tuple(p for p in self.proofs if p[0] != target)[-(MAX_TARGETS - 1):]
        return Device(self.device_id, (*kept, (target, device_mac(password_hash, self.device_id, target))))

    def value(self) -> str:
        return "~".join([self.device_id, *(f"{target}.{mac}" for target, mac in self.proofs)])


def device_mac(password_hash: str, device_id: str, target: str) -> str:
    key = hashlib.sha256(b"picpeak-lite device cookie\0" + password_hash.encode()).digest()
    digest = hmac.new(key, f"{device_id}|{target}".encode(), hashlib.sha256).digest()
    return base64.urlsafe_b64encode(digest).decode()[:_MAC_CHARS]


class PasswordThrottle:
    """The throttles of the module docstring, for every password target (``admin``, ``gallery:<id>``), kept in the
    database ``db`` for the whole service (web/throttle.py)."""

    def __init__(self, limit: int, window: float, backoff: float, *, db: Database,
                 clock: Callable[[], float]) -> None:
        self.devices = Throttle("device", limit, window)
        self.untrusted = Throttle("untrusted", limit, window, backoff=backoff)
        self.untrusted_total = Throttle("total", limit * UNTRUSTED_FACTOR, window, backoff=backoff,
                                        forgiving=False)  # the target's total is not forgiven by one success
        self.attempts = Attempts(db, clock)

    def guard(self, target: str, ip: str, device: str | None) -> AbstractAsyncContextManager[Attempt]:
        """Raise TooManyRequests (before any hashing) when this client may not try now; otherwise hold its
        reservation while the password is checked. ``device``: the id of a device cookie that proved ``target``'s
        current password, or None for an untrusted client."""
        if device is not None:
            return self.attempts.guard([(self.devices, target, device)])
        return self.attempts.guard([(self.untrusted, target, ip), (self.untrusted_total, target, "*")])
