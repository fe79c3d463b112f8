"""Email from the pages: the gallery page's "email to client" button, the settings page's test message and
template editor (with a preview), and the guest's "send my selection to the photographer".

What is sent, to whom and in which language is ``domain/email.py``; this module only reads forms, renders the
QR code (``web/qr.py``) and rings the sender's bell after the commit.
"""

from __future__ import annotations

from typing import Any

from quart import Blueprint, redirect, render_template, request, url_for

from picpeak_lite import i18n
from picpeak_lite.domain import brand, email, galleries
from picpeak_lite.errors import BadRequest, NotFound
from picpeak_lite.store.db import Connection
from picpeak_lite.web import qr
from picpeak_lite.web.auth import admin_page, check_guest_state_change, current_guest, limits, owner_page, services
from picpeak_lite.web.views.common import base_url, current_actor, load_gallery

blueprint = Blueprint("email", __name__)
# The upload QR code in the share message: big enough to scan from a phone screen or a print.
QR_SCALE = 6


@blueprint.post("/admin/galleries/<int:gallery_id>/email-client")
@admin_page
async def email_client(gallery_id: int) -> Any:
    """Queue the "your gallery is ready" message to the gallery's client (its customer_email, nothing else)."""
    svc = services()
    row = await galleries.get_gallery(svc, gallery_id)
    link = base_url()  # read here, in the request: the write below runs in a thread
    png = qr.render(f"{link}/g/{row['slug']}/upload", "png", scale=QR_SCALE) if row["allow_guest_uploads"] else None
    await svc.db.write(lambda conn: email.queue_share(conn, svc.settings, row, base_url=link, now=svc.clock(),
                                                      upload_qr_png=png))
    svc.email_bell.ring()
    return redirect(url_for("admin.gallery", gallery_id=gallery_id, emailed=1))


@blueprint.post("/admin/settings/email/test")
@owner_page
async def send_test() -> Any:
    """The "send a test" button: one message to the address typed (the photographer's own), through the outbox,
    so its outcome shows in the log below the button."""
    svc = services()
    address = ((await request.form).get("address") or "").strip()
    actor, now = await current_actor(), svc.clock()

    def queue_and_record(conn: Connection) -> None:
        email.queue_test(conn, svc.settings, address, now=now)
        actor.record(conn, now, "email.test_sent", detail=address)

    await svc.db.write(queue_and_record)
    svc.email_bell.ring()
    return redirect(url_for("admin_settings.page", saved="email-test") + "#email")


def _kind(kind: str) -> str:
    if kind not in email.KINDS:
        raise NotFound(i18n._("There is no such email."))
    return kind


async def _editor(kind: str, sources: dict[str, str], *, errors: dict[str, str] | None = None,
                  preview: email.Rendered | None = None, language: str = "", status: int = 200) -> tuple[str, int]:
    stored = await services().db.read(email.stored_templates)
    html = await render_template(
        "admin/email_template.html", kind=kind, title=email.kind_title(kind), sources=sources, errors=errors or {},
        preview=preview, language=language, customised=any((kind, part) in stored for part in email.PARTS),
        saved=request.args.get("saved"),
    )
    return html, status


@blueprint.get("/admin/settings/email/templates/<kind>")
@owner_page
async def edit_template(kind: str) -> tuple[str, int]:
    """A message's three templates (subject, text, HTML), as stored or by default, with a preview."""
    svc = services()
    sources = await svc.db.read(email.templates_for, _kind(kind))
    language = request.args.get("language") or i18n.current_locale()
    look = await svc.db.read(brand.load, svc.settings)
    preview = email.preview(sources, kind, svc.settings, base_url(), language, look)
    return await _editor(kind, sources, preview=preview, language=language)


@blueprint.post("/admin/settings/email/templates/<kind>")
@owner_page
async def save_template(kind: str) -> Any:
    """Save (or, with ``preview``, only show) a message's templates. A template that does not compile or render
    with the sample values is refused with its reason and nothing is stored."""
    svc = services()
    form = await request.form
    sources = {part: (form.get(part) or "").replace("\r\n", "\n") for part in email.PARTS}
    errors = {part: problem for part in email.PARTS if (problem := email.check_template(part, sources[part]))}
    language = form.get("language") or i18n.current_locale()
    preview = None
    if not errors:
        templates = {part: sources[part] or email.default_template(_kind(kind), part) for part in email.PARTS}
        try:
            look = await svc.db.read(brand.load, svc.settings)
            preview = email.preview(templates, kind, svc.settings, base_url(), language, look)
        except BadRequest as error:
            errors["html"] = error.message
    if errors or form.get("preview"):
        return await _editor(_kind(kind), sources, errors=errors, preview=preview, language=language,
                             status=400 if errors else 200)
    kind, actor, now = _kind(kind), await current_actor(), svc.clock()

    def save_and_record(conn: Connection) -> None:
        email.save_templates(conn, kind, sources)
        actor.record(conn, now, "settings.changed", detail=f"email template {kind} saved")

    await svc.db.write(save_and_record)
    return redirect(url_for("email.edit_template", kind=kind, saved=1))


@blueprint.post("/admin/settings/email/templates/<kind>/reset")
@owner_page
async def reset_template(kind: str) -> Any:
    svc, kind = services(), _kind(kind)
    actor, now = await current_actor(), svc.clock()

    def reset_and_record(conn: Connection) -> None:
        email.reset_templates(conn, kind)
        actor.record(conn, now, "settings.changed", detail=f"email template {kind} reset")

    await svc.db.write(reset_and_record)
    return redirect(url_for("email.edit_template", kind=kind, saved=1))


@blueprint.post("/api/g/<slug>/favourites/send")
async def send_favourites(slug: str) -> dict[str, Any]:
    """A guest sends their favourites to the photographer: always and only to the photographer's own address.
    Nothing in the request chooses a recipient; the same selection sent twice is one message."""
    svc = services()
    gallery = await load_gallery(slug)
    guest = await current_guest(create=False)
    await check_guest_state_change(guest)
    assert guest is not None
    await limits().guest_rate_limit.take(guest.id)
    link = base_url()
    queued = await svc.db.write(lambda conn: email.queue_favourites(conn, svc.settings, gallery, guest.id,
                                                                    base_url=link, now=svc.clock()))
    if queued:
        svc.email_bell.ring()
    return {"sent": True, "new": queued}
