"""New galleries take the settings page's defaults: through the JSON API for every field left out, while an
explicit value wins; the admin form, prefilled with them, sends every field (an unchecked box means off)."""

from __future__ import annotations

import datetime as dt

from picpeak_lite.services import Services

from .conftest import AuthActions


async def save_defaults(admin: AuthActions, **form: str) -> None:
    response = await admin.client.post("/admin/settings/defaults", form={
        "csrf_token": admin.csrf, "low_disk_mb": "5", **form})
    assert response.status_code == 302, await response.get_data(as_text=True)


def in_days(services: Services, days: int) -> str:
    return (dt.datetime.fromtimestamp(services.clock(), dt.UTC).date() + dt.timedelta(days=days)).isoformat()


async def test_json_api_applies_the_settings_page_defaults(admin: AuthActions, services: Services) -> None:
    await save_defaults(admin, default_expiry_days="30", default_allow_guest_uploads="on",
                        default_watermark="on", default_photo_cap="250")  # downloads unchecked: off
    gallery = await admin.create_gallery(name="Defaults")
    chosen = {k: gallery[k] for k in ("expires_on", "allow_downloads", "allow_guest_uploads", "watermark",
                                      "photo_cap")}
    assert chosen == {"expires_on": in_days(services, 30), "allow_downloads": False, "allow_guest_uploads": True,
                      "watermark": True, "photo_cap": 250}


async def test_explicit_json_values_win_over_the_defaults(admin: AuthActions, services: Services) -> None:
    await save_defaults(admin, default_expiry_days="30", default_allow_guest_uploads="on",
                        default_watermark="on", default_photo_cap="250")
    gallery = await admin.create_gallery(name="Explicit", expires_on=in_days(services, 5), allow_downloads=True,
                                         allow_guest_uploads=False, watermark=False, photo_cap=None)
    chosen = {k: gallery[k] for k in ("expires_on", "allow_downloads", "allow_guest_uploads", "watermark",
                                      "photo_cap")}
    assert chosen == {"expires_on": in_days(services, 5), "allow_downloads": True, "allow_guest_uploads": False,
                      "watermark": False, "photo_cap": None}
    never = await admin.create_gallery(name="Never", expires_on=None)
    assert never["expires_on"] is None


async def test_the_admin_form_sends_every_field(admin: AuthActions, services: Services) -> None:
    await save_defaults(admin, default_expiry_days="30", default_allow_downloads="on", default_watermark="on",
                        default_photo_cap="250")
    response = await admin.client.post("/admin/galleries/new", form={
        "csrf_token": admin.csrf, "name": "Form", "event_type": "party", "expires_on": in_days(services, 7),
        "photo_cap": ""})  # every box unchecked, no cap
    assert response.status_code == 302, await response.get_data(as_text=True)
    listed = await (await admin.client.get("/api/admin/galleries")).get_json()
    [gallery] = [g for g in listed["galleries"] if g["name"] == "Form"]
    assert (gallery["allow_downloads"], gallery["allow_guest_uploads"], gallery["watermark"]) == (False,) * 3
    assert gallery["photo_cap"] is None and gallery["expires_on"] == in_days(services, 7)
