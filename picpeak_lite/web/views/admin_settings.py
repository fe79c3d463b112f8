"""The settings page: watermark (with a live preview), webhooks with their delivery log, defaults for new
galleries. Each section is its own form and post, so a mistake in one never loses what was typed in another.
"""

from __future__ import annotations

import functools
import os
import secrets
from dataclasses import replace
from typing import Any

import trio
from quart import Blueprint, Response, redirect, render_template, request, url_for

from picpeak_lite.config import WEBHOOK_EVENTS
from picpeak_lite.domain import admin_settings, email
from picpeak_lite.domain import brand as brand_rules
from picpeak_lite.errors import BadRequest, NotFound
from picpeak_lite.events.webhooks import ATTEMPT_TIMEOUT, resolve_target
from picpeak_lite.i18n import _
from picpeak_lite.media import images
from picpeak_lite.resources import STATIC_DIR
from picpeak_lite.store.queries import settings as settings_q
from picpeak_lite.store.queries import webhooks as webhook_q
from picpeak_lite.store.storage import fsync_dir, fsync_file, remove_quietly
from picpeak_lite.targets import TargetRefused
from picpeak_lite.web.auth import owner_page, services
from picpeak_lite.web.views.common import current_actor

blueprint = Blueprint("admin_settings", __name__, url_prefix="/admin/settings")

SAMPLE_PHOTO = str(STATIC_DIR / "watermark-sample.jpg")
PREVIEW_SPEC = images.RenderSpec(grid_px=200, view_px=900, quality=80)
DELIVERY_LOG_ROWS = 50
# Previews render on demand while the admin drags a slider: one at a time is plenty.
_preview_limiter = trio.CapacityLimiter(1)


async def load_settings() -> admin_settings.AdminSettings:
    svc = services()
    return await svc.db.read(admin_settings.load, svc.settings)


async def settings_page(*, status: int = 200, section_errors: dict[str, dict[str, str]] | None = None,
                        values: dict[str, Any] | None = None, new_secret: dict[str, Any] | None = None,
                        webhook_form: dict[str, Any] | None = None,
                        brand_values: dict[str, Any] | None = None) -> tuple[str, int]:
    svc = services()
    current = await load_settings()
    brand = await svc.db.read(brand_rules.load, svc.settings)

    def read(conn: Any) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
        return settings_q.list_endpoints(conn), webhook_q.list_deliveries(conn, limit=DELIVERY_LOG_ROWS)

    endpoints, deliveries = await svc.db.read(read)
    email_section = await svc.db.read(email.page_data, svc.settings)
    form = current.as_form()
    form.update(values or {})
    html = await render_template(
        "admin/settings.html", values=form, errors=section_errors or {}, current=current,
        positions=admin_settings.KEYS["watermark_position"].choices, has_logo=bool(current.logo_path),
        uploaded_logo=admin_settings.logo_path(svc.settings).exists(), endpoints=endpoints,
        config_endpoints=svc.settings.webhooks, deliveries=deliveries, events=WEBHOOK_EVENTS,
        new_secret=new_secret, webhook_form=webhook_form or {"events": list(WEBHOOK_EVENTS)},
        saved=request.args.get("saved"), keys=admin_settings.KEYS, email=email_section,
        brand_form={**brand.form(), **(brand_values or {})}, brand_checks=brand_rules.contrast_checks(brand),
        fonts=brand_rules.font_labels(), themes=brand_rules.theme_labels(), layouts=brand_rules.layout_labels(),
        has_brand_logo=bool(brand.logo_version), css_max=brand_rules.CSS_MAX_BYTES,
    )
    return html, status


@blueprint.get("/")
@owner_page
async def page() -> tuple[str, int]:
    return await settings_page()


@blueprint.post("/watermark")
@owner_page
async def save_watermark() -> Any:
    svc = services()
    form = await request.form
    files = await request.files
    values, errors = admin_settings.parse_section("watermark", form)
    logo = files.get("logo")
    logo_bytes = logo.read(admin_settings.LOGO_MAX_BYTES + 1) if logo is not None and logo.filename else b""
    if logo_bytes:
        problem = await trio.to_thread.run_sync(_check_logo, logo_bytes, svc.decode_budget.total)
        if problem:
            errors["logo"] = problem
    target = admin_settings.logo_path(svc.settings)
    if values.get("watermark_use_logo") and not logo_bytes and not target.exists() and not svc.settings.watermark_logo:
        errors["watermark_use_logo"] = _("Upload a logo first.")
    if errors:
        return await settings_page(status=400, section_errors={"watermark": errors}, values=values)
    before = await svc.db.read(admin_settings.watermark_fingerprints, svc.settings)
    if logo_bytes:
        await trio.to_thread.run_sync(_store_logo, target, logo_bytes)
        values["watermark_use_logo"] = True
    elif form.get("remove_logo"):
        await trio.to_thread.run_sync(remove_quietly, target)
        values["watermark_use_logo"] = False

    actor, now = await current_actor(), svc.clock()

    def save(conn: Any) -> None:
        admin_settings.save(conn, values)
        admin_settings.mark_changed_watermarks(conn, svc.settings, before)  # their view images are made again
        actor.record(conn, now, "settings.changed", detail="watermark")

    await svc.db.write(save)
    svc.workers_bell.ring()
    return redirect(url_for("admin_settings.page", saved="watermark") + "#watermark")


@blueprint.post("/defaults")
@owner_page
async def save_defaults() -> Any:
    values, errors = admin_settings.parse_section("defaults", await request.form)
    if errors:
        return await settings_page(status=400, section_errors={"defaults": errors}, values=values)
    await _save_audited("defaults", admin_settings.save, values)
    return redirect(url_for("admin_settings.page", saved="defaults") + "#defaults")


@blueprint.post("/contact")
@owner_page
async def save_contact() -> Any:
    """The photographer's contact, shown to guests on the expired page."""
    values, errors = admin_settings.parse_section("contact", await request.form)
    if errors:
        return await settings_page(status=400, section_errors={"contact": errors}, values=values)
    await _save_audited("contact", admin_settings.save, values)
    return redirect(url_for("admin_settings.page", saved="contact") + "#contact")


@blueprint.post("/brand")
@owner_page
async def save_brand() -> Any:
    """The studio's brand: name, logo, colours, fonts, default theme and cover, white label, custom CSS."""
    svc = services()
    form = await request.form
    files = await request.files
    chosen, errors, typed = brand_rules.parse_form(form)
    upload = files.get("brand_logo")
    data = upload.read(brand_rules.LOGO_MAX_BYTES + 1) if upload is not None and upload.filename else b""
    logo: bytes | None = None
    if data:
        try:
            logo = await _studio_logo(data)
        except images.InvalidImage as error:
            errors["brand_logo"] = error.reason
    if errors:
        return await settings_page(status=400, section_errors={"brand": errors}, brand_values=typed)
    target = brand_rules.logo_path(svc.settings)
    if logo is not None:
        await trio.to_thread.run_sync(_store_logo, target, logo)
    elif form.get("remove_brand_logo"):
        await trio.to_thread.run_sync(remove_quietly, target)
    actor, now = await current_actor(), svc.clock()

    def save_and_record(conn: Any) -> None:
        brand_rules.save(conn, chosen)
        actor.record(conn, now, "settings.changed", detail="brand")

    await svc.db.write(save_and_record)
    return redirect(url_for("admin_settings.page", saved="brand") + "#brand")


async def _studio_logo(data: bytes) -> bytes:
    """The uploaded logo checked and re-encoded (``images.studio_logo``) within the decode budget, or
    InvalidImage with the sentence for the photographer. SVG is refused outright: it is a document that can
    carry script and links, and no sanitiser we would trust is small enough to keep here."""
    if len(data) > brand_rules.LOGO_MAX_BYTES:
        raise images.InvalidImage(_("The logo may be at most %(mb)d MB.")
                                  % {"mb": brand_rules.LOGO_MAX_BYTES // (1024 * 1024)})
    head = data[:512].lstrip(b"\xef\xbb\xbf \t\r\n").lower()
    if head.startswith((b"<?xml", b"<svg", b"<!doctype svg", b"<!--")) or b"<svg" in head:
        raise images.InvalidImage(_("SVG logos are not accepted (an SVG can carry script): upload a PNG, JPEG or "
                                    "WebP image."))
    budget = services().decode_budget
    max_pixels = images.logo_max_pixels(budget.total)
    header = await trio.to_thread.run_sync(functools.partial(images.sniff, data, max_pixels=max_pixels))
    async with budget.hold(header.width * header.height * images.LOGO_BYTES_PER_PIXEL):
        return await trio.to_thread.run_sync(functools.partial(
            images.studio_logo, data, max_side=brand_rules.LOGO_MAX_SIDE, max_pixels=max_pixels))


@blueprint.get("/watermark-preview.jpg")
@owner_page
async def watermark_preview() -> Response:
    """The built-in sample photo with the watermark the form currently describes (unsaved values allowed)."""
    current = await load_settings()
    values, errors = admin_settings.parse_section("watermark", request.args)
    if errors:
        raise BadRequest("; ".join(f"{k}: {v}" for k, v in errors.items()))
    chosen = admin_settings.AdminSettings(**{**current.as_form(), **values}, logo_path=current.logo_path)
    watermark = chosen.watermark("Anna & Ben")
    spec = replace(PREVIEW_SPEC, watermark=watermark)
    budget = services().decode_budget
    async with _preview_limiter:
        try:  # the preview decodes a photo and the logo: it takes its bytes from the decode budget like a worker
            cost = await trio.to_thread.run_sync(images.plan, SAMPLE_PHOTO, spec, budget.total)
            async with budget.hold(cost):
                data = await trio.to_thread.run_sync(_render_preview, watermark)
        except images.InvalidImage as error:
            raise BadRequest(error.reason) from None
    return Response(data, content_type="image/jpeg", headers={"Cache-Control": "private, no-store"})


@blueprint.post("/webhooks")
@owner_page
async def add_webhook() -> Any:
    svc = services()
    form = await request.form
    url = (form.get("url") or "").strip()
    events = [e for e in form.getlist("events")]
    errors: dict[str, str] = {}
    try:
        if len(url) > 2000:
            raise TargetRefused("at most 2000 characters")
        # The sender's own check, DNS included: a target it would refuse (a private address, unless
        # webhook_allow_private) is refused now with its sentence, not saved to be refused at every delivery.
        with trio.move_on_after(ATTEMPT_TIMEOUT) as lookup:
            await resolve_target(url, svc.settings.webhook_allow_private)
        if lookup.cancelled_caught:
            raise TargetRefused(f"its host did not resolve within {ATTEMPT_TIMEOUT:g} s")
    except TargetRefused as error:
        errors["url"] = f"Not a usable webhook URL: {error}."
    if not events:
        errors["events"] = _("Choose at least one event.")
    elif any(e not in WEBHOOK_EVENTS for e in events):
        errors["events"] = _("Unknown event.")
    secret = secrets.token_hex(24)
    actor = await current_actor()

    def create(conn: Any) -> int | None:
        if settings_q.endpoint_url_taken(conn, url):
            return None
        actor.record(conn, svc.clock(), "settings.changed", detail=f"webhook added: {url}")
        return settings_q.create_endpoint(conn, url, secret, events, svc.clock())

    if not errors:
        endpoint_id = await svc.db.write(create)
        if endpoint_id is None:
            errors["url"] = _("This URL is already a webhook.")
    if errors:
        return await settings_page(status=400, section_errors={"webhooks": errors},
                                   webhook_form={"url": url, "events": events})
    # The secret is shown on this answer only: it is not in a redirect URL and no page shows it again.
    return await settings_page(status=201, new_secret={"url": url, "secret": secret})


@blueprint.post("/webhooks/<int:endpoint_id>/delete")
@owner_page
async def delete_webhook(endpoint_id: int) -> Any:
    if not await _save_audited(f"webhook {endpoint_id} deleted", settings_q.delete_endpoint, endpoint_id):
        raise NotFound(_("There is no such webhook."))
    return redirect(url_for("admin_settings.page") + "#webhooks")


@blueprint.post("/webhooks/<int:endpoint_id>/active")
@owner_page
async def toggle_webhook(endpoint_id: int) -> Any:
    active = (await request.form).get("active") == "1"
    if not await _save_audited(f"webhook {endpoint_id} {'on' if active else 'off'}", settings_q.set_endpoint_active,
                               endpoint_id, active):
        raise NotFound(_("There is no such webhook."))
    return redirect(url_for("admin_settings.page") + "#webhooks")


@blueprint.post("/webhooks/<int:endpoint_id>/test")
@owner_page
async def test_webhook(endpoint_id: int) -> Any:
    svc = services()

    def enqueue(conn: Any) -> int | None:
        endpoint = settings_q.get_endpoint(conn, endpoint_id)
        if endpoint is None:
            return None
        return webhook_q.enqueue_test(conn, endpoint["url"], svc.clock())

    if await svc.db.write(enqueue) is None:
        raise NotFound(_("There is no such webhook."))
    svc.webhooks_bell.ring()
    return redirect(url_for("admin_settings.page", saved="test") + "#deliveries")


async def _save_audited(what: str, fn: Any, *args: Any) -> Any:
    """``fn(conn, *args)`` and its audit row in one transaction (no row when ``fn`` found nothing to change)."""
    svc = services()
    actor, now = await current_actor(), svc.clock()

    def save(conn: Any) -> Any:
        result = fn(conn, *args)
        if result is not False:
            actor.record(conn, now, "settings.changed", detail=what)
        return result

    return await svc.db.write(save)


def _render_preview(watermark: images.Watermark) -> bytes:
    picture = images.make_view(images.decode(SAMPLE_PHOTO, PREVIEW_SPEC), PREVIEW_SPEC)
    return images.encode(images.add_watermark(picture, watermark), PREVIEW_SPEC)


def _check_logo(data: bytes, decode_budget: int) -> str | None:
    if len(data) > admin_settings.LOGO_MAX_BYTES:
        return _("The logo may be at most %(num)s MB.") % {"num": admin_settings.LOGO_MAX_BYTES // (1024 * 1024)}
    try:
        # Every watermarked render decodes the logo too: it may take at most a quarter of the decode budget.
        header = images.sniff(data, max_pixels=images.logo_max_pixels(decode_budget))
    except images.InvalidImage as error:
        return error.reason
    if header.format != "png":
        return _("Upload the logo as a PNG (with transparency, ideally).")
    return None


def _store_logo(target: Any, data: bytes) -> None:
    """Atomically, like every file we keep: temp file, fsync, rename, fsync the folder."""
    target.parent.mkdir(parents=True, exist_ok=True)
    temp = target.with_name(target.name + f".{secrets.token_hex(6)}.tmp")
    try:
        temp.write_bytes(data)
        fsync_file(temp)
        os.replace(temp, target)
        fsync_dir(target.parent)
    finally:
        remove_quietly(temp)


