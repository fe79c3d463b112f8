"""The photographer's HTML pages: login, dashboard, gallery form, gallery page (with the photo grid and the
bulk uploader), QR codes for sharing."""

from __future__ import annotations

import datetime as dt
import functools
import math
import re
from typing import Any

import trio
from quart import Blueprint, Response, g, redirect, render_template, request, url_for
from werkzeug.wrappers import Response as WerkzeugResponse

from picpeak_lite import i18n, security, totp
from picpeak_lite.domain import accounts, admin_settings, galleries
from picpeak_lite.domain.accounts import Actor
from picpeak_lite.domain.gallery_fields import EVENT_TYPES
from picpeak_lite.errors import Conflict, NotFound, Unauthorized, ValidationError
from picpeak_lite.i18n import _, ngettext
from picpeak_lite.pipeline import archive, faces
from picpeak_lite.runtime import activity
from picpeak_lite.store.queries import admin as admin_q
from picpeak_lite.store.queries import admin_photos as admin_photo_q
from picpeak_lite.store.queries import feedback as feedback_q
from picpeak_lite.store.queries import galleries as gallery_q
from picpeak_lite.store.queries import moderation as moderation_q
from picpeak_lite.store.queries import proofing as proofing_q
from picpeak_lite.web import qr
from picpeak_lite.web.auth import (
    ADMIN_COOKIE,
    account_page,
    admin_page,
    check_origin,
    current_admin,
    gallery_page,
    limits,
    services,
)
from picpeak_lite.web.views.common import (
    admin_image_url,
    client_ip,
    current_actor,
    load_grid,
    prove_device,
    read_filters,
    share_url,
    trusted_device,
)

EXPIRY_WARNING_DAYS = 7
# Where a login may send the admin on: a path on this site under /admin, in the characters a URL path and query
# may hold unencoded (RFC 3986), and nothing else: no scheme, no host, no "//" or "\\" a browser would read as
# another host, no whitespace or control characters (CR/LF would break the Location header), no fragment.
SAFE_NEXT = re.compile(r"/admin(?:/[A-Za-z0-9\-._~!$&'()*+,;=:@%/]*)?(?:\?[A-Za-z0-9\-._~!$&'()*+,;=:@%/?]*)?")
MAX_NEXT_LENGTH = 2048
QR_TARGETS = ("gallery", "upload")
SECOND_FACTOR_SECONDS = 300  # how long the code step waits after the right password

blueprint = Blueprint("admin", __name__, url_prefix="/admin")


@blueprint.get("/login")
async def login() -> Any:
    if await current_admin() is not None:
        return redirect(url_for("admin.dashboard"))
    return await render_template("admin/login.html", next=_safe_next(request.args.get("next")), error=None)


@blueprint.post("/login")
async def login_submit() -> Any:
    """The password step. An account with a second factor gets a pending session (good for nothing but the
    code step, :func:`login_code`) and the code form; any other gets its session."""
    check_origin()
    svc = services()
    form = await request.form
    next_url = _safe_next(form.get("next"))
    name = form.get("username", "").strip()
    user = await svc.db.read(admin_q.get_user_by_name, name)
    if user is not None and user["disabled_at"] is not None:
        user = None  # a disabled account answers as a wrong password: nothing to tell a guesser
    proof = f"a{user['id']}" if user else ""
    device = trusted_device(proof, user["password_hash"] if user else None)
    # Counted per account (web/passwords.py): guessing at one account slows nobody else's login, and the
    # owner's own browser (its device cookie) is never slowed by a stranger's guesses.
    target = f"account:{user['id']}" if user else "account:?"
    async with limits().password_throttle.guard(target, client_ip(), device) as attempt:
        ok = await svc.verify_password(user["password_hash"] if user else None, form.get("password", ""))
        if not ok or user is None:
            attempt.failed()
        else:
            attempt.succeeded()
    now = svc.clock()
    if not ok or user is None:
        actor = Actor(user["id"] if user else None, name[:accounts.MAX_NAME], client_ip())
        await svc.db.write(actor.record, now, "login.failed")
        html = await render_template(
            "admin/login.html", next=next_url, error=_("Wrong user name or password."), username=name,
        )
        return html, 401
    prove_device(proof, user["password_hash"])
    token = security.new_token()
    if user["totp_enabled_at"] is not None:
        pending = functools.partial(admin_q.create_session, pending_totp=True)
        await svc.db.write(pending, user["id"], security.token_hash(token), security.new_token(), now,
                           now + SECOND_FACTOR_SECONDS)
        g.set_admin_cookie = (token, SECOND_FACTOR_SECONDS)
        return await render_template("admin/login_code.html", next=next_url, error=None)
    await _start_session(user["id"], Actor(user["id"], user["username"], client_ip()), token)
    return redirect(next_url or url_for("admin.dashboard"))


@blueprint.post("/login/code")
async def login_code() -> Any:
    """The second step: a TOTP code (or an unused recovery code) for the pending session of the password step.
    Wrong codes are throttled per account and client as passwords are (a trusted device alone for itself)."""
    check_origin()
    svc = services()
    form = await request.form
    next_url = _safe_next(form.get("next"))
    cookie = request.cookies.get(ADMIN_COOKIE)
    find = functools.partial(admin_q.get_session, pending=True)
    pending = await svc.db.read(find, security.token_hash(cookie), svc.clock()) if cookie else None
    if pending is None:
        raise Unauthorized(_("The login has expired. Please enter your password again."))
    user = await svc.db.read(admin_q.get_user, pending["user_id"])
    assert user is not None and user["totp_secret"] is not None
    code = form.get("code", "")
    device = trusted_device(f"a{user['id']}", user["password_hash"])
    actor = Actor(user["id"], user["username"], client_ip())
    async with limits().password_throttle.guard(f"totp:{user['id']}", client_ip(), device) as attempt:
        now = svc.clock()

        def check(conn: Any) -> str | None:
            step = totp.verify(user["totp_secret"], code, now)
            if step is not None:
                return "totp" if admin_q.use_totp_step(conn, user["id"], step) else None
            if totp.looks_like_recovery_code(code) and admin_q.use_recovery_code(
                    conn, user["id"], totp.recovery_hash(code), now):
                actor.record(conn, now, "account.recovery_code_used",
                             detail=f"{admin_q.unused_recovery_codes(conn, user['id'])} left")
                return "recovery"
            actor.record(conn, now, "login.second_factor_failed")
            return None

        how = await svc.db.write(check)
        if how is None:
            attempt.failed()
        else:
            attempt.succeeded()
    if how is None:
        html = await render_template("admin/login_code.html", next=next_url,
                                     error=_("That code is not right, or it was used already."))
        return html, 401
    token = security.new_token()
    await svc.db.write(admin_q.revoke_session, security.token_hash(cookie or ""), svc.clock())
    await _start_session(user["id"], actor, token, detail="with " + how)
    return redirect(next_url or url_for("admin.dashboard"))


async def _start_session(user_id: int, actor: Actor, token: str, detail: str = "") -> None:
    svc = services()
    now = svc.clock()
    max_age = svc.settings.session_days * 86400

    def start(conn: Any) -> None:
        admin_q.create_session(conn, user_id, security.token_hash(token), security.new_token(), now, now + max_age)
        actor.record(conn, now, "login", detail=detail)

    await svc.db.write(start)
    g.set_admin_cookie = (token, max_age)


@blueprint.post("/logout")
@account_page
async def logout() -> WerkzeugResponse:
    svc = services()
    admin = await current_admin()
    if admin and admin.session_hash:
        actor, now, session = await current_actor(), svc.clock(), admin.session_hash

        def end(conn: Any) -> None:
            admin_q.revoke_session(conn, session, now)
            actor.record(conn, now, "logout")

        await svc.db.write(end)
    g.set_admin_cookie = (None, 0)
    return redirect(url_for("admin.login"))


@blueprint.get("/")
@account_page
async def dashboard() -> str:
    svc = services()

    today = dt.datetime.fromtimestamp(svc.clock(), dt.UTC).date()

    def read(conn: Any) -> tuple[list[dict[str, Any]], dict[int, dict[str, Any]], int, Any, dict[int, Any]]:
        return (gallery_q.list_all(conn), admin_photo_q.gallery_extras(conn),
                admin_photo_q.total_original_bytes(conn), admin_settings.load(conn, svc.settings),
                activity.summary(conn, svc.activity.pending(), today))

    rows, extras, original_bytes, chosen, activities = await svc.db.read(read)
    admin = await current_admin()
    assert admin is not None
    rows = [row for row in rows if admin.may_open(row["id"])]  # an editor sees the galleries granted to them
    storage = svc.storage
    derived_bytes, usage = await trio.to_thread.run_sync(lambda: (storage.used_bytes("derived/"),
                                                                  storage.disk_usage()))
    now = svc.clock()
    cards = []
    for row in rows:
        extra = extras.get(row["id"], {})
        cover_id = extra.get("cover_id")
        cards.append({
            **row, "favourite_count": extra.get("favourite_count", 0),
            "cover_url": admin_image_url(cover_id, "grid") if cover_id else None,
            "expiry": _expiry(row["expires_at"], now), "activity": activities.get(row["id"]),
        })
    low_disk_bytes = chosen.low_disk_mb * 1024 * 1024
    disk = {"used": original_bytes + derived_bytes, "free": usage.free, "total": usage.total,
            "low": usage.free < low_disk_bytes, "threshold_mb": chosen.low_disk_mb}
    return await render_template("admin/dashboard.html", galleries=cards, share_url=share_url, disk=disk,
                                 size=human_size)


@blueprint.get("/galleries/new")
@admin_page
async def new_gallery() -> str:
    svc = services()
    chosen = await svc.db.read(admin_settings.load, svc.settings)
    today = dt.datetime.fromtimestamp(svc.clock(), dt.UTC).date()
    values = {
        "expires_on": (today + dt.timedelta(days=chosen.default_expiry_days)).isoformat(),
        "allow_downloads": chosen.default_allow_downloads, "allow_guest_uploads": chosen.default_allow_guest_uploads,
        "watermark": chosen.default_watermark, "photo_cap": chosen.default_photo_cap or "", "event_type": "wedding",
    }
    return await _form_page(values, {}, gallery=None)


@blueprint.post("/galleries/new")
@admin_page
async def create_gallery() -> Any:
    form = _form_values(await request.form)
    try:
        row = await galleries.create_gallery(services(), form, await current_actor())
    except ValidationError as error:
        return await _form_page(form, error.fields, gallery=None), 400
    return redirect(url_for("admin.gallery", gallery_id=row["id"]))


@blueprint.get("/galleries/<int:gallery_id>")
@gallery_page
async def gallery(gallery_id: int) -> str:
    return await render_gallery_page(gallery_id)


async def render_gallery_page(gallery_id: int, **extra: Any) -> str:
    svc = services()
    row = await galleries.get_gallery(svc, gallery_id)
    filters = read_filters(request.args)
    photos, favourites = await load_grid(gallery_id, filters)
    review, choosers, comments, feedback_photos = await svc.db.read(lambda conn: (
        moderation_q.queue(conn, gallery_id), proofing_q.guests(conn, gallery_id),
        feedback_q.gallery_comments(conn, gallery_id, limit=200), feedback_q.per_photo(conn, gallery_id)))
    link = share_url(row["slug"])
    findme = await faces.progress(svc, gallery_id)
    return await render_template(
        "admin/gallery.html", findme=findme, findme_how_to=faces.how_to_enable(),
        gallery=row, share_url=link, upload_url=link + "/upload",
        expires_on=galleries.expires_on(row), photos=photos, favourites=favourites, filters=filters,
        image_url=admin_image_url, expiry=_expiry(row["expires_at"], svc.clock()), review=review,
        choosers=choosers, upload_chunk_mb=svc.settings.upload_chunk_mb, size=human_size, comments=comments,
        feedback_photos=feedback_photos, held_count=sum(1 for c in comments if c["status"] == "held"), **extra,
    )


@blueprint.get("/galleries/<int:gallery_id>/qr")
@gallery_page
async def qr_sheet(gallery_id: int) -> str:
    """A printable page with both codes, for a table card."""
    row = await galleries.get_gallery(services(), gallery_id)
    link = share_url(row["slug"])
    return await render_template("admin/qr.html", gallery=row, share_url=link, upload_url=link + "/upload")


@blueprint.get("/galleries/<int:gallery_id>/qr/<any(gallery, upload):target>.<any(png, svg):kind>")
@gallery_page
async def qr_image(gallery_id: int, target: str, kind: str) -> Response:
    row = await galleries.get_gallery(services(), gallery_id)
    if target == "upload" and not row["allow_guest_uploads"]:
        raise NotFound(_("Guest uploads are off for this gallery."))
    payload = share_url(row["slug"]) + ("/upload" if target == "upload" else "")
    try:
        scale = int(request.args.get("scale", "10"))
    except ValueError:
        scale = 10
    data = qr.render(payload, kind, scale=scale)
    response = Response(data, content_type=qr.KINDS[kind], headers={"Cache-Control": "private, no-cache"})
    if request.args.get("download"):
        response.headers["Content-Disposition"] = f'attachment; filename="{row["slug"]}-{target}-qr.{kind}"'
    return response


@blueprint.get("/galleries/<int:gallery_id>/edit")
@admin_page
async def edit_gallery(gallery_id: int) -> str:
    row = await galleries.get_gallery(services(), gallery_id)
    values = dict(row, expires_on=galleries.expires_on(row) or "")
    return await _form_page(values, {}, gallery=row)


@blueprint.post("/galleries/<int:gallery_id>/edit")
@admin_page
async def update_gallery(gallery_id: int) -> Any:
    svc = services()
    row = await galleries.get_gallery(svc, gallery_id)
    form = _form_values(await request.form)
    try:
        await galleries.update_gallery(svc, gallery_id, form, partial=False, actor=await current_actor())
    except ValidationError as error:
        return await _form_page(form, error.fields, gallery=row), 400
    return redirect(url_for("admin.gallery", gallery_id=gallery_id))


@blueprint.post("/galleries/<int:gallery_id>/publish")
@admin_page
async def publish(gallery_id: int) -> WerkzeugResponse:
    await galleries.set_published(services(), gallery_id, True, await current_actor())
    return redirect(url_for("admin.gallery", gallery_id=gallery_id))


@blueprint.post("/galleries/<int:gallery_id>/unpublish")
@admin_page
async def unpublish(gallery_id: int) -> WerkzeugResponse:
    await galleries.set_published(services(), gallery_id, False, await current_actor())
    return redirect(url_for("admin.gallery", gallery_id=gallery_id))


@blueprint.post("/galleries/<int:gallery_id>/delete")
@admin_page
async def delete(gallery_id: int) -> Any:
    svc = services()
    row = await galleries.get_gallery(svc, gallery_id)
    form = await request.form
    if form.get("confirm_name", "").strip() != row["name"]:
        refusal = _("Type the gallery's name exactly to delete it.")
        return await render_gallery_page(gallery_id, delete_error=refusal), 400
    await galleries.delete_gallery(svc, gallery_id, await current_actor())
    return redirect(url_for("admin.dashboard"))


@blueprint.post("/galleries/<int:gallery_id>/archive")
@admin_page
async def archive_gallery(gallery_id: int) -> Any:
    """Ask for the gallery to be archived; the archiver task does the work (pipeline/archive.py)."""
    try:
        await archive.start_archive(services(), gallery_id, await current_actor())
    except Conflict as error:
        return await render_gallery_page(gallery_id, archive_error=error.message), 409
    return redirect(url_for("admin.gallery", gallery_id=gallery_id) + "#archive")


@blueprint.post("/galleries/<int:gallery_id>/restore")
@admin_page
async def restore_gallery(gallery_id: int) -> Any:
    try:
        await archive.start_restore(services(), gallery_id, await current_actor())
    except Conflict as error:
        return await render_gallery_page(gallery_id, archive_error=error.message), 409
    return redirect(url_for("admin.gallery", gallery_id=gallery_id) + "#archive")


@blueprint.get("/password")
@account_page
async def password() -> str:
    return await render_template("admin/password.html", errors={})


@blueprint.post("/password")
@account_page
async def password_submit() -> Any:
    svc = services()
    admin = await current_admin()
    assert admin is not None
    form = await request.form
    user = await svc.db.read(admin_q.get_user_by_name, admin.username)
    assert user is not None  # current_admin found this user's session
    errors: dict[str, str] = {}
    if not await svc.verify_password(user["password_hash"], form.get("current", "")):
        errors["current"] = _("That is not your current password.")
    new = form.get("new", "")
    if len(new) < security.MIN_PASSWORD_LENGTH:
        errors["new"] = ngettext("At least %(num)d character.", "At least %(num)d characters.",
                                 security.MIN_PASSWORD_LENGTH) % {"num": security.MIN_PASSWORD_LENGTH}
    elif new != form.get("confirm", ""):
        errors["confirm"] = _("The two new passwords differ.")
    if errors:
        return await render_template("admin/password.html", errors=errors), 400
    new_hash = await svc.hash_password(new)
    await svc.db.write(accounts.set_password, user["id"], new_hash, svc.clock(), await current_actor())
    g.set_admin_cookie = (None, 0)
    return redirect(url_for("admin.login"))


async def _form_page(values: dict[str, Any], errors: dict[str, str], gallery: dict[str, Any] | None) -> str:
    return await render_template(
        "admin/gallery_form.html", values=values, errors=errors, gallery=gallery, event_types=EVENT_TYPES,
        default_on_expiry=services().settings.archive_on_expiry,
    )


def _form_values(form: Any) -> dict[str, Any]:
    values: dict[str, Any] = {key: form.get(key) for key in form if key != "csrf_token"}
    values["_form"] = True
    values.setdefault("expires_on", "")
    return values


def _safe_next(value: str | None) -> str | None:
    """Only redirect to our own admin pages after login; anything else (None) sends the admin to ``/admin/``.

    An allow-list, not a list of tricks: a crafted link (``next=/admin\\r\\nX: y`` broke the redirect with a
    500 after the password was accepted; ``//evil``, ``/\\evil`` and ``https://...`` would leave the site) only
    loses its destination, never the login.
    """
    if value and len(value) <= MAX_NEXT_LENGTH and SAFE_NEXT.fullmatch(value):
        return value
    return None


def _expiry(expires_at: float | None, now: float) -> dict[str, Any] | None:
    """Days left (rounded up), and whether to warn: within a week, or already expired."""
    if expires_at is None:
        return None
    days = math.ceil((expires_at - now) / 86400)
    return {"days": days, "expired": expires_at <= now, "warn": expires_at <= now or days <= EXPIRY_WARNING_DAYS,
            "on": dt.datetime.fromtimestamp(expires_at, dt.UTC).date().isoformat()}


def human_size(n: float) -> str:
    return i18n.format_size(n)
