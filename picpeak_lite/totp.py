"""Time-based one-time passwords (RFC 6238 over RFC 4226's HOTP) and recovery codes for the second factor.

Written with hmac and hashlib rather than taken from pyotp: the algorithm is twenty lines, the standard's own
test vectors check it (tests/test_totp.py), and a dependency would add nothing but a second home for it.
Authenticator apps use SHA-1, 6 digits and a 30 s step; that is what enrolment offers (``provisioning_uri``).
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import secrets
import struct
from urllib.parse import quote, urlencode

STEP = 30
DIGITS = 6
# A code is accepted one step early or late: phones' clocks drift, and a code typed at the end of its 30 s
# arrives in the next step.
DRIFT_STEPS = 1
RECOVERY_CODES = 10
_RECOVERY_ALPHABET = "abcdefghjkmnpqrstuvwxyz23456789"  # no 0/o, 1/l/i to misread


def new_secret() -> str:
    """160 random bits in base32, as RFC 4226 recommends for SHA-1."""
    return base64.b32encode(secrets.token_bytes(20)).decode().rstrip("=")


def _key(secret: str) -> bytes:
    padded = secret.upper() + "=" * (-len(secret) % 8)
    return base64.b32decode(padded)


def hotp(key: bytes, counter: int, *, digits: int = DIGITS, digest: str = "sha1") -> str:
    """RFC 4226 section 5.3: HMAC of the 8-byte counter, dynamically truncated to ``digits`` decimal digits."""
    mac = hmac.new(key, struct.pack(">Q", counter), digest).digest()
    offset = mac[-1] & 0x0F
    binary = struct.unpack(">I", mac[offset:offset + 4])[0] & 0x7FFFFFFF
    return str(binary % 10**digits).zfill(digits)


def totp(key: bytes, at: float, *, digits: int = DIGITS, digest: str = "sha1", step: int = STEP) -> str:
    """RFC 6238: HOTP with the counter ``floor(unix time / step)``."""
    return hotp(key, int(at // step), digits=digits, digest=digest)


def verify(secret: str, code: str, at: float) -> int | None:
    """The time step ``code`` belongs to (within :data:`DRIFT_STEPS`), or None. The caller keeps the last step
    used, so that a code seen over someone's shoulder cannot be used again in its 90 s."""
    code = code.strip().replace(" ", "")
    if len(code) != DIGITS or not code.isdigit():
        return None
    key = _key(secret)
    now_step = int(at // STEP)
    for step in range(now_step - DRIFT_STEPS, now_step + DRIFT_STEPS + 1):
        if hmac.compare_digest(hotp(key, step), code):
            return step
    return None


def provisioning_uri(secret: str, account: str, issuer: str) -> str:
    """The ``otpauth://`` address an authenticator app reads from the enrolment QR code."""
    label = quote(f"{issuer}:{account}")
    query = urlencode({"secret": secret, "issuer": issuer, "algorithm": "SHA1", "digits": DIGITS, "period": STEP})
    return f"otpauth://totp/{label}?{query}"


def new_recovery_codes() -> list[str]:
    """Ten codes of 12 characters (about 59 random bits each), shown once as ``xxxx-xxxx-xxxx``."""
    codes = []
    for _ in range(RECOVERY_CODES):
        raw = "".join(secrets.choice(_RECOVERY_ALPHABET) for _ in range(12))
        codes.append(f"{raw[:4]}-{raw[4:8]}-{raw[8:]}")
    return codes


def recovery_hash(code: str) -> str:
    """Only this is stored. A random code of ~59 bits needs no slow hash (as API tokens, unlike passwords);
    dashes, spaces and case are not part of the code."""
    normal = code.strip().lower().replace("-", "").replace(" ", "")
    return hashlib.sha256(b"picpeak-lite recovery\0" + normal.encode()).hexdigest()


def looks_like_recovery_code(code: str) -> bool:
    return len(code.strip().replace("-", "").replace(" ", "")) == 12
