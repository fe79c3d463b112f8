"""What guests see: the gallery page and the password form. Every route asks ``access.guest_gallery``."""

from __future__ import annotations

from typing import Any

from quart import Blueprint, redirect, render_template, request, url_for

from .. import access
from ..auth import check_guest_state_change, current_guest, services
from ..queries import guests as guest_q
from .common import client_ip

blueprint = Blueprint("guest", __name__)


async def load_gallery(slug: str) -> dict[str, Any]:
    """The gallery if this guest may see it (raises NotFound, Gone or PasswordRequired otherwise)."""
    svc = services()
    guest = await current_guest(create=False)
    return await svc.db.read(access.guest_gallery, slug, guest.id if guest else None, svc.clock())


@blueprint.get("/g/<slug>")
async def gallery(slug: str) -> str:
    row = await load_gallery(slug)
    return await render_template("guest/gallery.html", gallery=row)


async def password_page(gallery: dict[str, Any], *, status: int, error: str | None = None) -> Any:
    # The form needs a guest session for its CSRF token.
    await current_guest(create=True)
    html = await render_template("guest/password.html", gallery=gallery, error=error)
    return html, status


@blueprint.post("/g/<slug>/password")
async def password_submit(slug: str) -> Any:
    svc = services()
    guest = await current_guest(create=False)
    await check_guest_state_change(guest)
    assert guest is not None
    row = await svc.db.read(access.gallery_for_password_form, slug, svc.clock())
    if row["password_hash"] is None:
        return redirect(url_for("guest.gallery", slug=slug))
    ip = client_ip()
    target = f"gallery:{row['id']}"
    svc.gallery_throttle.check(target, ip)
    form = await request.form
    if not await svc.verify_password(row["password_hash"], form.get("password", "")):
        svc.gallery_throttle.failed(target, ip)
        return await password_page(row, status=401, error="That password is not right. Please try again.")
    svc.gallery_throttle.succeeded(target, ip)
    await svc.db.write(guest_q.grant_access, guest.id, row["id"], row["password_version"], svc.clock())
    return redirect(url_for("guest.gallery", slug=slug))
