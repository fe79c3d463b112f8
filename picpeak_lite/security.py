"""Passwords, random tokens and their hashes.

Passwords are hashed with argon2id (memory-hard). Session cookies and API tokens are long random strings; only
their SHA-256 is stored, so a copy of the database does not let anyone log in.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets

from argon2 import PasswordHasher
from argon2.exceptions import InvalidHashError, VerificationError

# argon2id with 32 MiB and 3 passes: above OWASP's minimum (19 MiB, 2 passes) and about 40 ms here. Each check
# holds its memory while it runs and Services allows two at once, so a burst of guests entering a gallery's
# password costs this small server 64 MiB, not more. Stored hashes carry their parameters, so changing these
# later still verifies old hashes.
_hasher = PasswordHasher(time_cost=3, memory_cost=32768, parallelism=2)

# Verified against when the user name is unknown, so that a wrong name costs as long as a wrong password.
_DUMMY_HASH = _hasher.hash(secrets.token_urlsafe(16))

MIN_PASSWORD_LENGTH = 8
MIN_GALLERY_PASSWORD_LENGTH = 4


def hash_password(password: str) -> str:
    return _hasher.hash(password)


def verify_password(password_hash: str | None, password: str) -> bool:
    """Constant work whether or not there is a hash to check against."""
    try:
        return _hasher.verify(password_hash or _DUMMY_HASH, password) and password_hash is not None
    except (VerificationError, InvalidHashError):
        return False


def new_token(prefix: str = "") -> str:
    return prefix + secrets.token_urlsafe(32)


def token_hash(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


def tokens_equal(a: str, b: str) -> bool:
    return hmac.compare_digest(a.encode(), b.encode())


def generate_password() -> str:
    return secrets.token_urlsafe(15)
