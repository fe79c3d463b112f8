"""The photographer's HTML pages: login, dashboard, gallery form and gallery page."""

from __future__ import annotations

from typing import Any

from quart import Blueprint, g, redirect, render_template, request, url_for
from werkzeug.wrappers import Response as WerkzeugResponse

from .. import galleries, security
from ..auth import admin_page, check_origin, current_admin, services
from ..errors import ValidationError
from ..gallery_input import EVENT_TYPES
from ..queries import admin as admin_q
from ..queries import galleries as gallery_q
from .common import client_ip, share_url

blueprint = Blueprint("admin", __name__, url_prefix="/admin")


@blueprint.get("/login")
async def login() -> Any:
    if await current_admin() is not None:
        return redirect(url_for("admin.dashboard"))
    return await render_template("admin/login.html", next=_safe_next(request.args.get("next")), error=None)


@blueprint.post("/login")
async def login_submit() -> Any:
    check_origin()
    svc = services()
    form = await request.form
    next_url = _safe_next(form.get("next"))
    ip = client_ip()
    svc.login_throttle.check("admin", ip)
    user = await svc.db.read(admin_q.get_user_by_name, form.get("username", "").strip())
    ok = await svc.verify_password(user["password_hash"] if user else None, form.get("password", ""))
    if not ok or user is None:
        svc.login_throttle.failed("admin", ip)
        html = await render_template(
            "admin/login.html", next=next_url, error="Wrong user name or password.",
            username=form.get("username", ""),
        )
        return html, 401
    svc.login_throttle.succeeded("admin", ip)
    token = security.new_token()
    now = svc.clock()
    max_age = svc.settings.session_days * 86400
    await svc.db.write(
        admin_q.create_session, user["id"], security.token_hash(token), security.new_token(), now, now + max_age
    )
    g.set_admin_cookie = (token, max_age)
    return redirect(next_url or url_for("admin.dashboard"))


@blueprint.post("/logout")
@admin_page
async def logout() -> WerkzeugResponse:
    svc = services()
    admin = await current_admin()
    if admin and admin.session_hash:
        await svc.db.write(admin_q.revoke_session, admin.session_hash, svc.clock())
    g.set_admin_cookie = (None, 0)
    return redirect(url_for("admin.login"))


@blueprint.get("/")
@admin_page
async def dashboard() -> str:
    rows = await services().db.read(gallery_q.list_all)
    return await render_template("admin/dashboard.html", galleries=rows, share_url=share_url)


@blueprint.get("/galleries/new")
@admin_page
async def new_gallery() -> str:
    values = {
        "expires_on": galleries.default_expiry(services()).isoformat(), "allow_downloads": True,
        "event_type": "wedding",
    }
    return await _form_page(values, {}, gallery=None)


@blueprint.post("/galleries/new")
@admin_page
async def create_gallery() -> Any:
    form = _form_values(await request.form)
    try:
        row = await galleries.create_gallery(services(), form)
    except ValidationError as error:
        return await _form_page(form, error.fields, gallery=None), 400
    return redirect(url_for("admin.gallery", gallery_id=row["id"]))


@blueprint.get("/galleries/<int:gallery_id>")
@admin_page
async def gallery(gallery_id: int) -> str:
    row = await galleries.get_gallery(services(), gallery_id)
    return await render_template("admin/gallery.html", gallery=row, share_url=share_url(row["slug"]),
                                 expires_on=galleries.expires_on(row))


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
        await galleries.update_gallery(svc, gallery_id, form, partial=False)
    except ValidationError as error:
        return await _form_page(form, error.fields, gallery=row), 400
    return redirect(url_for("admin.gallery", gallery_id=gallery_id))


@blueprint.post("/galleries/<int:gallery_id>/publish")
@admin_page
async def publish(gallery_id: int) -> WerkzeugResponse:
    await galleries.set_published(services(), gallery_id, True)
    return redirect(url_for("admin.gallery", gallery_id=gallery_id))


@blueprint.post("/galleries/<int:gallery_id>/unpublish")
@admin_page
async def unpublish(gallery_id: int) -> WerkzeugResponse:
    await galleries.set_published(services(), gallery_id, False)
    return redirect(url_for("admin.gallery", gallery_id=gallery_id))


@blueprint.post("/galleries/<int:gallery_id>/delete")
@admin_page
async def delete(gallery_id: int) -> Any:
    svc = services()
    row = await galleries.get_gallery(svc, gallery_id)
    form = await request.form
    if form.get("confirm_name", "").strip() != row["name"]:
        values = dict(row, expires_on=galleries.expires_on(row) or "")
        return await render_template(
            "admin/gallery.html", gallery=row, share_url=share_url(row["slug"]),
            expires_on=values["expires_on"], delete_error="Type the gallery's name exactly to delete it.",
        ), 400
    await galleries.delete_gallery(svc, gallery_id)
    return redirect(url_for("admin.dashboard"))


@blueprint.get("/password")
@admin_page
async def password() -> str:
    return await render_template("admin/password.html", errors={})


@blueprint.post("/password")
@admin_page
async def password_submit() -> Any:
    svc = services()
    admin = await current_admin()
    assert admin is not None
    form = await request.form
    user = await svc.db.read(admin_q.get_user_by_name, admin.username)
    errors: dict[str, str] = {}
    if not await svc.verify_password(user["password_hash"], form.get("current", "")):
        errors["current"] = "That is not your current password."
    new = form.get("new", "")
    if len(new) < security.MIN_PASSWORD_LENGTH:
        errors["new"] = f"At least {security.MIN_PASSWORD_LENGTH} characters."
    elif new != form.get("confirm", ""):
        errors["confirm"] = "The two new passwords differ."
    if errors:
        return await render_template("admin/password.html", errors=errors), 400
    new_hash = await svc.hash_password(new)
    await svc.db.write(admin_q.set_password, user["id"], new_hash, svc.clock())
    g.set_admin_cookie = (None, 0)
    return redirect(url_for("admin.login"))


async def _form_page(values: dict[str, Any], errors: dict[str, str], gallery: dict[str, Any] | None) -> str:
    return await render_template(
        "admin/gallery_form.html", values=values, errors=errors, gallery=gallery, event_types=EVENT_TYPES
    )


def _form_values(form: Any) -> dict[str, Any]:
    values: dict[str, Any] = {key: form.get(key) for key in form if key != "csrf_token"}
    values["_form"] = True
    values.setdefault("expires_on", "")
    return values


def _safe_next(value: str | None) -> str | None:
    """Only redirect to our own pages after login."""
    if value and value.startswith("/admin") and not value.startswith("//") and "\\" not in value:
        return value
    return None
