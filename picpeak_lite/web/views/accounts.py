"""The accounts page (owners: add, role, galleries granted to editors, disable), each account's own second
factor (TOTP enrolment with a QR code, recovery codes), and the audit trail's page (owners)."""

from __future__ import annotations

import datetime as dt
from typing import Any

from quart import Blueprint, Response, redirect, render_template, request, url_for

from picpeak_lite import security, totp
from picpeak_lite.domain import accounts
from picpeak_lite.errors import BadRequest, Conflict
from picpeak_lite.i18n import _
from picpeak_lite.store.queries import admin as admin_q
from picpeak_lite.store.queries import audit as audit_q
from picpeak_lite.store.queries import galleries as gallery_q
from picpeak_lite.web import qr
from picpeak_lite.web.auth import Admin, account_page, current_admin, owner_page, services
from picpeak_lite.web.views.common import current_actor

blueprint = Blueprint("accounts", __name__, url_prefix="/admin")

ISSUER = "PicPeak"


async def _me() -> Admin:
    admin = await current_admin()
    assert admin is not None  # the decorators let no one else in
    return admin


# --- the accounts page (owners) -----------------------------------------------------------------------------


async def _accounts_page(error: str | None = None, status: int = 200) -> tuple[str, int]:
    svc = services()
    rows, galleries = await svc.db.read(lambda conn: (admin_q.list_users(conn), gallery_q.list_all(conn)))
    listed = [{**row, "grant_ids": {int(i) for i in (row["grants"] or "").split(",") if i}} for row in rows]
    return await render_template("admin/accounts.html", accounts=listed, galleries=galleries, roles=accounts.ROLES,
                                 error=error), status


@blueprint.get("/accounts")
@owner_page
async def accounts_page() -> tuple[str, int]:
    return await _accounts_page()


async def _change(fn: Any, *args: Any) -> Any:
    """Run one change of ``domain/accounts`` with its audit row; a refusal is the page again with its sentence."""
    svc = services()
    try:
        await svc.db.write(fn, *args, svc.clock(), await current_actor())
    except (BadRequest, Conflict) as error:
        return await _accounts_page(error.message, error.status)
    return redirect(url_for("accounts.accounts_page"))


@blueprint.post("/accounts")
@owner_page
async def add_account() -> Any:
    form = await request.form
    password = form.get("password", "")
    if len(password) < security.MIN_PASSWORD_LENGTH:
        return await _accounts_page(_("The password needs at least %(num)d characters.")
                                    % {"num": security.MIN_PASSWORD_LENGTH}, 400)
    password_hash = await services().hash_password(password)
    return await _change(accounts.add_account, form.get("username", "").strip(), password_hash,
                         form.get("role", ""))


@blueprint.post("/accounts/<int:account_id>/role")
@owner_page
async def set_role(account_id: int) -> Any:
    return await _change(accounts.change_role, account_id, (await request.form).get("role", ""))


@blueprint.post("/accounts/<int:account_id>/galleries")
@owner_page
async def set_grants(account_id: int) -> Any:
    try:
        ids = [int(v) for v in (await request.form).getlist("gallery_ids")]
    except ValueError:
        raise BadRequest(_("The selection is not valid; reload the page and try again.")) from None
    return await _change(accounts.set_grants, account_id, ids)


@blueprint.post("/accounts/<int:account_id>/disable")
@owner_page
async def disable(account_id: int) -> Any:
    return await _change(accounts.set_disabled, account_id, True)


@blueprint.post("/accounts/<int:account_id>/enable")
@owner_page
async def enable(account_id: int) -> Any:
    return await _change(accounts.set_disabled, account_id, False)


# --- one's own second factor (any account) ------------------------------------------------------------------


async def _security_page(**extra: Any) -> str:
    me = await _me()
    svc = services()
    user, unused = await svc.db.read(lambda conn: (admin_q.get_user(conn, me.account_id),
                                                   admin_q.unused_recovery_codes(conn, me.account_id)))
    assert user is not None
    enrolling = user["totp_secret"] is not None and user["totp_enabled_at"] is None
    return await render_template("admin/security.html", user=user, enrolling=enrolling, unused=unused,
                                 secret=user["totp_secret"] if enrolling else None, **extra)


@blueprint.get("/security")
@account_page
async def security_page() -> str:
    return await _security_page()


@blueprint.post("/security/totp")
@account_page
async def totp_start() -> str:
    """A new secret, not yet in force: it counts once a code from it was given (:func:`totp_confirm`)."""
    me = await _me()
    svc = services()
    user = await svc.db.read(admin_q.get_user, me.account_id)
    assert user is not None
    if user["totp_enabled_at"] is not None:
        raise Conflict(_("A second factor is on already; turn it off first to enrol a new one."))
    await svc.db.write(admin_q.set_totp, me.account_id, totp.new_secret(), None)
    return await _security_page()


@blueprint.get("/security/totp.svg")
@account_page
async def totp_qr() -> Response:
    me = await _me()
    user = await services().db.read(admin_q.get_user, me.account_id)
    assert user is not None
    if user["totp_secret"] is None or user["totp_enabled_at"] is not None:
        raise Conflict(_("There is no enrolment under way."))
    uri = totp.provisioning_uri(user["totp_secret"], user["username"], ISSUER)
    return Response(qr.render(uri, "svg", scale=6), content_type=qr.KINDS["svg"],
                    headers={"Cache-Control": "no-store"})


@blueprint.post("/security/totp/confirm")
@account_page
async def totp_confirm() -> Any:
    """The first code proves the app holds the secret: the factor is on, and ten recovery codes are shown once."""
    me = await _me()
    svc = services()
    code = (await request.form).get("code", "")
    codes = totp.new_recovery_codes()
    actor, now = await current_actor(), svc.clock()

    def confirm(conn: Any) -> bool:
        user = admin_q.get_user(conn, me.account_id)
        assert user is not None
        if user["totp_secret"] is None or user["totp_enabled_at"] is not None:
            raise Conflict(_("There is no enrolment under way."))
        step = totp.verify(user["totp_secret"], code, now)
        if step is None or not admin_q.use_totp_step(conn, me.account_id, step):
            return False
        admin_q.set_totp(conn, me.account_id, user["totp_secret"], now)
        admin_q.replace_recovery_codes(conn, me.account_id, [totp.recovery_hash(c) for c in codes])
        actor.record(conn, now, "account.totp_enabled", detail=user["username"])
        return True

    if not await svc.db.write(confirm):
        return await _security_page(error=_("That code is not right; check the phone's clock and try again.")), 400
    return await _security_page(recovery_codes=codes)


@blueprint.post("/security/totp/off")
@account_page
async def totp_off() -> Any:
    """Turning the factor off asks for the password again (a session left open is not enough)."""
    me = await _me()
    svc = services()
    user = await svc.db.read(admin_q.get_user, me.account_id)
    assert user is not None
    if not await svc.verify_password(user["password_hash"], (await request.form).get("password", "")):
        return await _security_page(error=_("That is not your current password.")), 400
    actor, now = await current_actor(), svc.clock()

    def off(conn: Any) -> None:
        admin_q.set_totp(conn, me.account_id, None, None)
        actor.record(conn, now, "account.totp_disabled", detail=user["username"])

    await svc.db.write(off)
    return redirect(url_for("accounts.security_page"))


# --- the audit trail (owners) ---------------------------------------------------------------------------------


def _day(value: str | None, *, end: bool = False) -> float | None:
    if not value:
        return None
    try:
        day = dt.date.fromisoformat(value)
    except ValueError:
        raise BadRequest(_("Dates are written YYYY-MM-DD.")) from None
    moment = dt.datetime.combine(day + dt.timedelta(days=1 if end else 0), dt.time(), dt.UTC)
    return moment.timestamp()


@blueprint.get("/audit")
@owner_page
async def audit() -> str:
    args = request.args
    try:
        gallery_id = int(args["gallery"]) if args.get("gallery") else None
    except ValueError:
        raise BadRequest(_("Choose a gallery from the list.")) from None
    account, action, start, end = (args.get(k, "") for k in ("account", "action", "from", "to"))
    filters = {"account": account, "action": action, "gallery": gallery_id, "from": start, "to": end}
    since, until = _day(start), _day(end, end=True)

    def read(conn: Any) -> tuple[Any, ...]:
        return (audit_q.search(conn, account=account, action=action, gallery_id=gallery_id, since=since,
                               until=until),
                admin_q.list_users(conn), gallery_q.list_all(conn))

    rows, users, galleries = await services().db.read(read)
    return await render_template("admin/audit.html", rows=rows, users=users, galleries=galleries,
                                 actions=accounts.ACTIONS, filters=filters,
                                 retention=services().settings.audit_retention_days)


