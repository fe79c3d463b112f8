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
    conn = db.connect(settings.database_path)
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
    conn = db.connect(settings.database_path)
    try:
        with db.transaction(conn):
            # The first start makes one owner; once any account exists (it may have been renamed), nothing.
            if admin_q.get_user_by_name(conn, settings.admin_username) is not None or admin_q.list_users(conn):
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



def create_api_token(conn: db.Connection, name: str, now: float, account: str | None = None, *,
                     owner_name: str = "admin") -> str:
    """Store a new API token under ``name`` for ``account`` (default: the first owner) and return its value, the
    only time it exists in clear: only its hash is kept. The token acts with the account's role and stops
    working while the account is disabled. Raises ``db.ConstraintError`` when a token of that name exists,
    ``ConfigError`` when there is no such account.

    Before any account exists (a token made before the first start), the owner the first start would make is
    made here, named ``owner_name``, with a random password nobody has seen: ``admin set-password`` sets one (the
    command line prints it instead when it makes the owner itself)."""
    user = admin_q.first_owner(conn) if account is None else admin_q.get_user_by_name(conn, account)
    if user is None and account is None and not admin_q.list_users(conn):
        admin_q.create_user(conn, owner_name, security.hash_password(security.generate_password()), now)
        user = admin_q.first_owner(conn)
    if user is None:
        raise ConfigError(f"there is no account named {account!r}" if account else "there is no owner account")
    value = security.new_token("ppk_")
    admin_q.create_token(conn, name, security.token_hash(value), now, user["id"])
    return value
