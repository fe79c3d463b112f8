"""First-start work, done synchronously before anything serves: the data directory, the schema, the admin.

Sync on purpose: ``server.first_start`` runs it once, in a thread, after the socket is bound; the commands that
work on a data directory without a server (import, backup, check, admin) run it before they start.
"""

from __future__ import annotations

import os
import time
from collections.abc import Mapping

from picpeak_lite import security
from picpeak_lite.config import Settings
from picpeak_lite.errors import ConfigError
from picpeak_lite.store import db, schema
from picpeak_lite.store.queries import admin as admin_q


def prepare(settings: Settings) -> None:
    """Create the data directory and bring the schema up to date."""
    data = settings.data_path
    try:
        data.mkdir(parents=True, exist_ok=True)
        probe = data / ".write-test"
        probe.write_bytes(b"")
        probe.unlink()
    except OSError as error:
        raise ConfigError(f"cannot use data directory {str(data)!r}: {error.strerror or error}") from None
    conn = db.connect(settings.database)
    try:
        schema.migrate(conn)
    finally:
        conn.close()


def ensure_admin(settings: Settings, environ: Mapping[str, str] | None = None) -> str | None:
    """Create the admin account on the very first start.

    Returns the generated password (to be printed once) or None when the account already existed or the
    password came from ``PICPEAK_ADMIN_PASSWORD``.
    """
    environ = os.environ if environ is None else environ
    conn = db.connect(settings.database)
    try:
        with db.transaction(conn):
            if admin_q.get_user_by_name(conn, settings.admin_username) is not None:
                return None
            given = environ.get("PICPEAK_ADMIN_PASSWORD")
            if given is not None and len(given) < security.MIN_PASSWORD_LENGTH:
                raise ConfigError(
                    f"PICPEAK_ADMIN_PASSWORD must have at least {security.MIN_PASSWORD_LENGTH} characters"
                )
            password = given or security.generate_password()
            admin_q.create_user(conn, settings.admin_username, security.hash_password(password), time.time())
            return None if given else password
    finally:
        conn.close()



def create_api_token(conn: db.Connection, name: str, now: float) -> str:
    """Store a new API token under ``name`` and return its value, the only time it exists in clear: only its
    hash is kept. Raises ``db.ConstraintError`` when a token of that name exists."""
    value = security.new_token("ppk_")
    admin_q.create_token(conn, name, security.token_hash(value), now)
    return value
