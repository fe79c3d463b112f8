"""Admin settings: typed values over config defaults, the settings page's forms with their errors, the
watermark preview and logo, webhooks added on the page (secret shown once, send test, delivery to them), and
the worker watermarking with the saved settings."""

from __future__ import annotations

import io
import json
import re
from typing import Any

import pytest
import trio
from PIL import Image, ImageChops, ImageStat
from werkzeug.datastructures import FileStorage, MultiDict

from picpeak_lite.config import WebhookEndpoint
from picpeak_lite.domain import admin_settings
from picpeak_lite.events.webhooks import WebhookSender
from picpeak_lite.store import db
from picpeak_lite.store.queries import webhooks as webhook_q

from . import imagefactory
from .conftest import AuthActions, make_settings, sql
from .factories import gallery_row, run_pool_until_idle, stage_photo
from .test_webhooks import FakeResolver, Receiver


@pytest.fixture
async def dns() -> FakeResolver:
    """The settings page resolves a webhook's host when it is saved: made-up answers, no DNS query leaves."""
    resolver = FakeResolver({"hooks.example.com": ["93.184.216.34"], "example.com": ["93.184.216.34"],
                             "internal.example.com": ["10.1.2.3"]})
    trio.socket.set_custom_hostname_resolver(resolver)
    return resolver


def load(services: Any) -> admin_settings.AdminSettings:
    conn = db.connect(services.settings.database)
    try:
        return admin_settings.load(conn, services.settings)
    finally:
        conn.close()


def mean_difference(a: Image.Image, b: Image.Image, box: tuple[int, int, int, int]) -> float:
    """Mean absolute difference of two grey images inside ``box``, 0-255."""
    return ImageStat.Stat(ImageChops.difference(a.crop(box), b.crop(box))).mean[0]


WATERMARK_FORM = {"watermark_text": "© Studio", "watermark_position": "top-left", "watermark_opacity": "1",
                  "watermark_size": "0.5"}


def test_defaults_come_from_the_config(tmp_path: Any) -> None:
    settings = make_settings(tmp_path, watermark_position="center", default_expiry_days=12, low_disk_mb=5)
    values = admin_settings.defaults(settings)
    assert values["watermark_position"] == "center" and values["default_expiry_days"] == 12
    assert values["low_disk_mb"] == 5 and values["watermark_use_logo"] is False
    assert set(values) == set(admin_settings.KEYS)


@pytest.mark.parametrize(("form", "field"), [
    ({**WATERMARK_FORM, "watermark_opacity": "2"}, "watermark_opacity"),
    ({**WATERMARK_FORM, "watermark_opacity": "nan"}, "watermark_opacity"),
    ({**WATERMARK_FORM, "watermark_size": "0"}, "watermark_size"),
    ({**WATERMARK_FORM, "watermark_position": "middle"}, "watermark_position"),
    ({**WATERMARK_FORM, "watermark_text": "x" * 101}, "watermark_text"),
])
def test_parse_rejects_bad_values_per_field(form: dict[str, str], field: str) -> None:
    _values, errors = admin_settings.parse_section("watermark", form)
    assert list(errors) == [field]


def test_parse_defaults_section() -> None:
    values, errors = admin_settings.parse_section("defaults", {"default_expiry_days": "400", "default_photo_cap": "",
                                                             "low_disk_mb": "x"})
    assert set(errors) == {"default_expiry_days", "low_disk_mb"}
    assert values["default_photo_cap"] is None and values["default_allow_downloads"] is False


async def test_unreadable_stored_value_falls_back(services: Any) -> None:
    sql(services, "INSERT INTO app_settings (key, value) VALUES ('watermark_opacity', '\"loud\"'), "
                  "('watermark_size', 'not json'), ('gone_key', '1')")
    assert load(services).watermark_opacity == services.settings.watermark_opacity


async def test_save_watermark_and_errors_keep_input(admin: AuthActions, services: Any) -> None:
    response = await admin.client.post("/admin/settings/watermark", form={"csrf_token": admin.csrf, **WATERMARK_FORM})
    assert response.status_code == 302
    saved = load(services)
    assert (saved.watermark_text, saved.watermark_position, saved.watermark_opacity, saved.watermark_size) == (
        "© Studio", "top-left", 1.0, 0.5)
    bad = {"csrf_token": admin.csrf, **WATERMARK_FORM, "watermark_text": "Kept text", "watermark_opacity": "7"}
    response = await admin.client.post("/admin/settings/watermark", form=bad)
    html = await response.get_data(as_text=True)
    assert response.status_code == 400
    assert re.search(r'id="watermark_opacity-error">From 0.05 to 1', html)
    assert 'value="Kept text"' in html
    assert load(services).watermark_text == "© Studio"  # nothing saved from the bad post
    no_csrf = await admin.client.post("/admin/settings/watermark", form=WATERMARK_FORM)
    assert no_csrf.status_code == 403


async def test_logo_upload_checked_stored_and_removed(admin: AuthActions, services: Any) -> None:
    logo = imagefactory.save(imagefactory.marked(200, 80), "png")

    async def post(data: bytes, name: str, **extra: str) -> Any:
        files = MultiDict({"logo": FileStorage(io.BytesIO(data), filename=name, content_type="image/png")})
        return await admin.client.post("/admin/settings/watermark",
                                       form={"csrf_token": admin.csrf, **WATERMARK_FORM, **extra}, files=files)

    jpeg_logo = await post(imagefactory.save(imagefactory.photo(50, 50), "jpeg"), "logo.jpg")
    assert jpeg_logo.status_code == 400 and "PNG" in await jpeg_logo.get_data(as_text=True)
    garbage = await post(b"not an image", "logo.png")
    assert garbage.status_code == 400
    ok = await post(logo, "logo.png")
    assert ok.status_code == 302
    path = admin_settings.logo_path(services.settings)
    assert path.read_bytes() == logo
    saved = load(services)
    assert saved.watermark_use_logo and saved.watermark("G").logo_path == str(path)
    removed = await admin.client.post("/admin/settings/watermark",
                                      form={"csrf_token": admin.csrf, **WATERMARK_FORM, "remove_logo": "on"})
    assert removed.status_code == 302 and not path.exists() and not load(services).watermark_use_logo
    without = await admin.client.post("/admin/settings/watermark", form={
        "csrf_token": admin.csrf, **WATERMARK_FORM, "watermark_use_logo": "on"})
    assert without.status_code == 400 and "Upload a logo first" in await without.get_data(as_text=True)


async def test_preview_renders_the_form_values(admin: AuthActions) -> None:
    url = "/admin/settings/watermark-preview.jpg"
    plain = await admin.client.get(url + "?watermark_text=&watermark_position=top-left&watermark_opacity=0.05"
                                         "&watermark_size=0.02")
    marked = await admin.client.get(url + "?watermark_text=PROOF&watermark_position=top-left&watermark_opacity=1"
                                          "&watermark_size=0.6")
    assert plain.status_code == marked.status_code == 200 and marked.content_type == "image/jpeg"
    a = Image.open(io.BytesIO(await plain.get_data())).convert("L")
    b = Image.open(io.BytesIO(await marked.get_data())).convert("L")
    assert a.size == b.size == (900, 600)
    assert mean_difference(a, b, (30, 30, 300, 120)) > 10  # where a big top-left mark sits
    bad = await admin.client.get(url + "?watermark_position=middle&watermark_opacity=1&watermark_size=0.2")
    assert bad.status_code == 400


async def test_defaults_form(admin: AuthActions, services: Any) -> None:
    bad = await admin.client.post("/admin/settings/defaults", form={"csrf_token": admin.csrf,
                                                                     "default_expiry_days": "0", "low_disk_mb": "5"})
    html = await bad.get_data(as_text=True)
    assert bad.status_code == 400 and 'id="default_expiry_days-error"' in html and 'value="0"' in html
    ok = await admin.client.post("/admin/settings/defaults", form={
        "csrf_token": admin.csrf, "default_expiry_days": "90", "default_allow_downloads": "on", "low_disk_mb": "5",
        "default_photo_cap": "100"})
    assert ok.status_code == 302
    saved = load(services)
    assert (saved.default_expiry_days, saved.default_photo_cap, saved.low_disk_mb) == (90, 100, 5)


async def test_webhook_added_secret_shown_once(admin: AuthActions, services: Any, dns: FakeResolver) -> None:
    form: Any = [("csrf_token", admin.csrf), ("url", "https://hooks.example.com/in"),
                 ("events", "photo.uploaded"), ("events", "photo.deleted")]
    response = await admin.client.post("/admin/settings/webhooks", form=form)
    html = await response.get_data(as_text=True)
    assert response.status_code == 201
    secret = re.search(r'value="([0-9a-f]{48})" id="secret-value"', html)
    row = sql(services, "SELECT * FROM webhook_endpoints")[0]
    assert secret is not None and row["secret"] == secret.group(1) and len(row["secret"]) >= 32
    assert json.loads(row["events"]) == ["photo.uploaded", "photo.deleted"]
    again = await (await admin.client.get("/admin/settings/")).get_data(as_text=True)
    assert row["secret"] not in again and "https://hooks.example.com/in" in again
    duplicate = await admin.client.post("/admin/settings/webhooks", form=form)
    assert duplicate.status_code == 400 and "already a webhook" in await duplicate.get_data(as_text=True)


@pytest.mark.parametrize(("url", "events", "field"), [
    ("ftp://example.com/x", ["photo.uploaded"], "url"),
    ("https://user:pw@example.com/", ["photo.uploaded"], "url"),
    ("", ["photo.uploaded"], "url"),
    ("https://example.com/x", [], "events"),
    ("https://example.com/x", ["photo.exploded"], "events"),
    # Refused targets are refused when saved, with the sender's reason (issue 11).
    ("http://10.0.0.1/x", ["photo.uploaded"], "url"),
    ("https://internal.example.com/x", ["photo.uploaded"], "url"),
    ("https://nowhere.example.com/x", ["photo.uploaded"], "url"),
])
async def test_webhook_bad_input_keeps_it(admin: AuthActions, services: Any, dns: FakeResolver, url: str,
                                          events: list[str], field: str) -> None:
    form: Any = [("csrf_token", admin.csrf), ("url", url), *(("events", e) for e in events)]
    response = await admin.client.post("/admin/settings/webhooks", form=form)
    html = await response.get_data(as_text=True)
    assert response.status_code == 400 and f'id="{field}-error"' in html
    if url:
        assert f'value="{url}"' in html
    assert not sql(services, "SELECT * FROM webhook_endpoints")
    if "10." in url or "internal" in url:
        assert "which is not a public address (set webhook_allow_private to allow it)." in html
    if "nowhere" in url:
        assert "could not resolve &#39;nowhere.example.com&#39;" in html


async def test_webhook_test_toggle_and_delete(admin: AuthActions, services: Any) -> None:
    sql(services, "INSERT INTO webhook_endpoints (url, secret, events, created_at) VALUES "
                  "('https://hooks.example.com/a', 'secret-secret-secret', '[\"photo.uploaded\"]', 0)")
    endpoint_id = sql(services, "SELECT id FROM webhook_endpoints")[0]["id"]
    base = f"/admin/settings/webhooks/{endpoint_id}"
    assert (await admin.client.post(f"{base}/test", form={"csrf_token": admin.csrf})).status_code == 302
    row = sql(services, "SELECT * FROM webhook_deliveries")[0]
    assert row["event_type"] == "webhook.test" and row["endpoint_url"] == "https://hooks.example.com/a"
    html = await (await admin.client.get("/admin/settings/")).get_data(as_text=True)
    assert "webhook.test" in html and 'id="delivery-log"' in html
    assert (await admin.client.post(f"{base}/test")).status_code == 403
    await admin.client.post(f"{base}/active", form={"csrf_token": admin.csrf, "active": "0"})
    assert sql(services, "SELECT active FROM webhook_endpoints")[0]["active"] == 0
    assert (await admin.client.post(f"{base}/delete", form={"csrf_token": admin.csrf})).status_code == 302
    assert not sql(services, "SELECT * FROM webhook_endpoints")
    for action in ("test", "delete", "active"):
        response = await admin.client.post(f"{base}/{action}", form={"csrf_token": admin.csrf})
        assert response.status_code == 404


async def test_stored_endpoints_get_events_and_signed_deliveries(services: Any, nursery: trio.Nursery) -> None:
    receiver = Receiver(secret="stored-secret-0123456789")
    await nursery.start(receiver.run)
    conn = db.connect(services.settings.database)
    try:
        with db.transaction(conn):
            conn.execute("INSERT INTO webhook_endpoints (url, secret, events, created_at) VALUES (?, ?, ?, 0)",
                         (receiver.url, receiver.secret, '["photo.uploaded"]'))
            conn.execute("INSERT INTO webhook_endpoints (url, secret, events, active, created_at) "
                         "VALUES ('http://127.0.0.1:9/paused', 'x' , '[\"photo.uploaded\"]', 0, 0)")
            configured = [WebhookEndpoint(url="http://127.0.0.1:9/config", secret="c" * 16)]
            webhook_q.enqueue_event(conn, configured, "photo.uploaded", "photo:1:k", {"photo_id": 1}, 1.0)
            webhook_q.enqueue_event(conn, configured, "photo.deleted", "photo:1:k", {"photo_id": 1}, 1.0)
        urls = {(r["endpoint_url"], r["event_type"]) for r in webhook_q.list_deliveries(conn)}
    finally:
        conn.close()
    # The configured endpoint gets both; the stored one only what it asked for; the paused one nothing.
    assert urls == {("http://127.0.0.1:9/config", "photo.deleted"), ("http://127.0.0.1:9/config", "photo.uploaded"),
                    (receiver.url, "photo.uploaded")}
    settings = make_settings(services.settings.data_path.parent, webhook_allow_private=True)
    sender = WebhookSender(services.db, settings)
    await sender.deliver_due()
    assert len(receiver.requests) == 1 and receiver.requests[0]["signature_ok"]


async def test_worker_watermarks_with_the_saved_settings(services: Any) -> None:
    conn = db.connect(services.settings.database)
    try:
        with db.transaction(conn):
            ids = []
            for watermark in (0, 1):
                ids.append(gallery_row(conn, "G", slug=f"g{watermark}", share_token=f"{watermark:032d}",
                                       watermark=watermark, draft=True))
            admin_settings.save(conn, {"watermark_text": "PROOF", "watermark_position": "top-left",
                                     "watermark_opacity": 1.0, "watermark_size": 0.6})
    finally:
        conn.close()
    data = imagefactory.save(imagefactory.photo(800, 600, seed=3), "jpeg")
    plain_id, _ = stage_photo(services, ids[0], data)
    marked_id, _ = stage_photo(services, ids[1], data)
    await run_pool_until_idle(services)
    views = []
    for photo_id in (plain_id, marked_id):
        key = sql(services, "SELECT storage_key FROM photos WHERE id = ?", photo_id)[0]["storage_key"]
        views.append(Image.open(services.storage.derived_path(key, "view")).convert("L"))
    assert mean_difference(*views, (20, 20, 400, 130)) > 10
    assert mean_difference(*views, (400, 450, 800, 600)) < 3  # the other corner is untouched


async def test_a_new_watermark_marks_only_watermarked_galleries_views(admin: AuthActions, services: Any) -> None:
    plain = await admin.create_gallery(name="Plain")
    marked = await admin.create_gallery(name="Marked")
    assert (await admin.client.patch(f"/api/admin/galleries/{marked['id']}", json={"watermark": True},
                                     headers=admin.headers())).status_code == 200
    data = imagefactory.save(imagefactory.photo(300, 200, seed=4), "jpeg")
    ids = [stage_photo(services, gallery["id"], data)[0] for gallery in (plain, marked)]
    await run_pool_until_idle(services)

    def stale() -> list[int]:
        return [sql(services, "SELECT views_stale FROM photos WHERE id = ?", i)[0]["views_stale"] for i in ids]

    assert stale() == [0, 0]
    same = await admin.client.post("/admin/settings/watermark", form={"csrf_token": admin.csrf, **WATERMARK_FORM})
    assert same.status_code == 302 and stale() == [0, 1]  # the marked gallery's views are made again
    again = await admin.client.post("/admin/settings/watermark", form={"csrf_token": admin.csrf, **WATERMARK_FORM})
    assert again.status_code == 302 and stale() == [0, 1]  # nothing changed: nothing more to make
