"""Accounts and roles: who may do what (issue 33), and the audit trail's writer.

Three roles, each a superset of the next:

* **owner**: everything, including the accounts, the settings (watermark, defaults, webhooks, brand) and the
  audit trail. The first start makes one; the last enabled owner cannot be disabled or demoted.
* **admin**: every gallery (create, edit, publish, delete, upload, review, curate), no accounts, no settings.
* **editor**: only the galleries granted to them: open, upload, review (approve or hide) and curate (cover,
  hide, show). An editor deletes nothing: not photos, not galleries (a hidden photo is one an admin can still
  restore or delete; "no deletion of others' work" is kept without tracking who uploaded what). No settings,
  no new galleries, no wall links.

The checks are in ``web/auth.py``, one decorator per category of route; this module is the rule they apply.
"""

from __future__ import annotations

from dataclasses import dataclass

from picpeak_lite.errors import BadRequest, Conflict, NotFound
from picpeak_lite.i18n import _
from picpeak_lite.store.db import Connection, Row
from picpeak_lite.store.queries import admin as admin_q
from picpeak_lite.store.queries import audit as audit_q

ROLES = ("owner", "admin", "editor")
# Account names: what the login form's user name field takes.
MAX_NAME = 64


def may_manage_accounts(role: str) -> bool:
    return role == "owner"


def may_change_settings(role: str) -> bool:
    return role == "owner"


def sees_all_galleries(role: str) -> bool:
    return role in ("owner", "admin")


def may_delete(role: str) -> bool:
    """Deleting photos or galleries: not for editors (module docstring)."""
    return role in ("owner", "admin")


def check_name(name: str) -> str | None:
    """Why ``name`` cannot be an account name (one sentence), or None."""
    if not name or len(name) > MAX_NAME:
        return _("An account name has between 1 and %(num)d characters.") % {"num": MAX_NAME}
    if name != name.strip() or any(c.isspace() or not c.isprintable() for c in name):
        return _("An account name has no spaces or control characters.")
    return None


@dataclass(frozen=True)
class Actor:
    """Who is acting, for the audit trail: an account (or None for the command line) and the client's address."""

    account_id: int | None
    name: str
    ip: str = ""

    def record(self, conn: Connection, now: float, action: str, *, gallery_id: int | None = None,
               detail: str = "") -> None:
        """Write the audit row inside the caller's transaction (``audit_q.record``)."""
        audit_q.record(conn, now, self.account_id, self.name, action, gallery_id=gallery_id, ip=self.ip,
                       detail=detail)


CLI = Actor(None, "(command line)")

# The actions the trail records (the filter's choices on the audit page).
ACTIONS = (
    "login", "login.failed", "login.second_factor_failed", "logout", "password.changed",
    "gallery.created", "gallery.updated", "gallery.published", "gallery.unpublished", "gallery.deleted",
    "photos.deleted", "settings.changed", "account.created", "account.role_changed", "account.disabled",
    "account.enabled", "account.grants_changed", "account.totp_enabled", "account.totp_disabled",
    "account.recovery_code_used", "token.created", "token.revoked",
    "gallery.archive_requested", "gallery.restore_requested", "comments.approved", "comments.rejected",
    "comments.deleted", "photo.replaced", "photo.replacement_confirmed", "photo.replacement_reverted",
    "email.test_sent",
)


# --- changes to accounts: sync units of work ``fn(conn, ...)``, each with its audit row, shared by the accounts
# page and the command line.


def _account(conn: Connection, account_id: int) -> Row:
    row = admin_q.get_user(conn, account_id)
    if row is None:
        raise NotFound(_("There is no such account."))
    return row


def _check_role(role: str) -> None:
    if role not in ROLES:
        raise BadRequest(_("The role must be owner, admin or editor."))


def add_account(conn: Connection, name: str, password_hash: str, role: str, now: float, actor: Actor) -> int:
    _check_role(role)
    problem = check_name(name)
    if problem is not None:
        raise BadRequest(problem)
    if admin_q.get_user_by_name(conn, name) is not None:
        raise Conflict(_("An account named %(name)s exists already.") % {"name": name})
    account_id = admin_q.create_user(conn, name, password_hash, now, role)
    actor.record(conn, now, "account.created", detail=f"{name} ({role})")
    return account_id


def _keep_an_owner(conn: Connection, row: Row) -> None:
    """Refuse a change that would leave no enabled owner: nobody could manage the accounts any more."""
    if row["role"] == "owner" and row["disabled_at"] is None and admin_q.active_owners(conn) <= 1:
        raise Conflict(_("This is the last enabled owner; make another owner first."))


def change_role(conn: Connection, account_id: int, role: str, now: float, actor: Actor) -> None:
    _check_role(role)
    row = _account(conn, account_id)
    if row["role"] == role:
        return
    if role != "owner":
        _keep_an_owner(conn, row)
    admin_q.set_role(conn, account_id, role)
    actor.record(conn, now, "account.role_changed", detail=f"{row['username']}: {row['role']} -> {role}")


def set_disabled(conn: Connection, account_id: int, disabled: bool, now: float, actor: Actor) -> None:
    """Disable (its sessions revoked now, its tokens refused from the next request) or enable an account."""
    row = _account(conn, account_id)
    if disabled == (row["disabled_at"] is not None):
        return
    if disabled:
        _keep_an_owner(conn, row)
    admin_q.set_disabled(conn, account_id, now if disabled else None)
    actor.record(conn, now, "account.disabled" if disabled else "account.enabled", detail=row["username"])


def set_grants(conn: Connection, account_id: int, gallery_ids: list[int], now: float, actor: Actor) -> None:
    row = _account(conn, account_id)
    admin_q.set_grants(conn, account_id, gallery_ids, now)
    granted = admin_q.granted_galleries(conn, account_id)
    actor.record(conn, now, "account.grants_changed",
                 detail=f"{row['username']}: " + (", ".join(map(str, granted)) or "none"))


def set_password(conn: Connection, account_id: int, password_hash: str, now: float, actor: Actor) -> None:
    """New password; every session of the account ends."""
    row = _account(conn, account_id)
    admin_q.set_password(conn, account_id, password_hash, now)
    actor.record(conn, now, "password.changed", detail=row["username"])
