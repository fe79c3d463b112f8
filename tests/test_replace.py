"""Replacing a photo with a re-edited file (pipeline/replacement.py): same id, place and favourites, the new
version made by the workers while guests keep the previous one, the previous original kept until confirmed,
and revert bringing it back. The real app, real uploads, the real worker pool."""

from __future__ import annotations

import hashlib
from typing import Any

from picpeak_lite.services import Services
from picpeak_lite.store.storage import derived_name, original_name

from . import imagefactory
from .conftest import AuthActions, sql
from .factories import published, run_pool_until_idle
from .test_guest_pages import guest_csrf
from .test_upload import admin_upload, multipart


def shot(seed: int, *, date: str = "2026:06:20 14:00:00") -> bytes:
    return imagefactory.save(imagefactory.photo(320, 240, seed=seed), "jpeg",
                             exif=imagefactory.make_exif(date_original=date))


async def replace(admin: AuthActions, gallery_id: int, photo_id: int, data: bytes) -> Any:
    body, headers = multipart([("IMG_0002-edit.jpg", data)])
    return await admin.client.post(f"/api/admin/galleries/{gallery_id}/photos/{photo_id}/replace", data=body,
                                   headers={**headers, **admin.headers()})


async def step(admin: AuthActions, gallery_id: int, photo_id: int, name: str) -> Any:
    return await admin.client.post(f"/api/admin/galleries/{gallery_id}/photos/{photo_id}/replacement/{name}",
                                   headers=admin.headers())


def row(services: Services, photo_id: int) -> dict[str, Any]:
    return sql(services, "SELECT * FROM photos WHERE id = ?", photo_id)[0]


async def listing(guest: Any, slug: str) -> list[int]:
    return [p["id"] for p in (await (await guest.get(f"/api/g/{slug}/photos")).get_json())["photos"]]


async def test_replace_keeps_id_place_and_favourites_and_revert_and_confirm(
        admin: AuthActions, guest: Any, services: Services) -> None:
    gallery = await published(admin, name="Wedding")
    gid, slug = gallery["id"], gallery["slug"]
    first, second, third = shot(1, date="2026:06:20 13:00:00"), shot(2), shot(3, date="2026:06:20 15:00:00")
    sent = await admin_upload(admin, gid, [("IMG_0001.jpg", first), ("IMG_0002.jpg", second),
                                           ("IMG_0003.jpg", third)])
    ids = (await sent.get_json())["photo_ids"]
    await run_pool_until_idle(services)
    photo = ids[1]
    csrf = await guest_csrf(guest, slug)
    assert (await guest.put(f"/api/g/{slug}/favourites/{photo}", headers={"X-CSRF-Token": csrf})).status_code == 200
    before = row(services, photo)
    order = await listing(guest, slug)
    assert order == ids
    old_grid = await (await guest.get(f"/g/{slug}/photos/{photo}/grid")).get_data()

    # A re-edit whose file has lost its capture time (some exports do): it keeps its place all the same.
    edit = imagefactory.save(imagefactory.photo(240, 320, seed=22), "jpeg")
    answer = await replace(admin, gid, photo, edit)
    assert answer.status_code == 202, await answer.get_data(as_text=True)
    assert await answer.get_json() == {"id": photo, "status": "pending", "sha256": hashlib.sha256(edit).hexdigest(),
                                       "replaced": True}
    waiting = row(services, photo)
    assert waiting["status"] == "pending" and waiting["storage_key"] != before["storage_key"]
    # Meanwhile guests see the previous version, never a broken image.
    meanwhile = await guest.get(f"/g/{slug}/photos/{photo}/grid")
    assert meanwhile.status_code == 200 and await meanwhile.get_data() == old_grid

    await run_pool_until_idle(services)
    after = row(services, photo)
    assert after["status"] == "complete"
    assert after["sha256"] == hashlib.sha256(edit).hexdigest() != before["sha256"]
    assert (after["width"], after["height"]) == (240, 320)
    assert after["taken_at"] == before["taken_at"] and after["display_name"] == "IMG_0002.jpg"
    assert await listing(guest, slug) == order  # its place
    hearts = sql(services, "SELECT photo_id FROM favourites")
    assert hearts == [{"photo_id": photo}]
    new_grid = await (await guest.get(f"/g/{slug}/photos/{photo}/grid")).get_data()
    assert new_grid != old_grid
    # The change feed carried it: back to pending, claimed, then complete (which guests' pages and the wall act on).
    changes = [c["status"] for c in sql(services, "SELECT status FROM photo_changes WHERE photo_id = ? ORDER BY seq",
                                        photo)]
    assert changes[-3:] == ["pending", "processing", "complete"]
    # The previous original is kept (and the janitor's and check's idea of an orphan leaves it alone).
    storage = services.storage
    assert storage.exists(original_name(before["storage_key"]))
    assert storage.exists(derived_name(before["storage_key"], "grid"))
    from picpeak_lite.pipeline.janitor import claim_orphans

    assert await services.db.write(claim_orphans, {before["storage_key"]}, services.clock() + 3600) == set()

    # A second replacement waits for this one to be confirmed or reverted.
    assert (await replace(admin, gid, photo, shot(9))).status_code == 409

    # Revert: the previous version is back at once, the new file gone.
    reverted = await step(admin, gid, photo, "revert")
    assert reverted.status_code == 200, await reverted.get_data(as_text=True)
    back = row(services, photo)
    assert (back["status"], back["sha256"], back["storage_key"], back["replaced"]) == (
        "complete", before["sha256"], before["storage_key"], None)
    assert storage.sha256_of(original_name(back["storage_key"])) == before["sha256"]
    assert not storage.exists(original_name(after["storage_key"]))
    assert await (await guest.get(f"/g/{slug}/photos/{photo}/grid")).get_data() == old_grid
    assert (await step(admin, gid, photo, "revert")).status_code == 409  # nothing waits now
    await run_pool_until_idle(services)  # its views are refreshed (marked stale on revert)

    # Replace again, then confirm: the previous original and its images are deleted for good.
    assert (await replace(admin, gid, photo, edit)).status_code == 202
    assert (await step(admin, gid, photo, "confirm")).status_code == 409  # not made yet
    await run_pool_until_idle(services)
    confirmed = await step(admin, gid, photo, "confirm")
    assert confirmed.status_code == 200
    final = row(services, photo)
    assert final["replaced"] is None and final["sha256"] == hashlib.sha256(edit).hexdigest()
    assert not storage.exists(original_name(before["storage_key"]))
    assert not storage.exists(derived_name(before["storage_key"], "grid"))
    assert storage.sha256_of(original_name(final["storage_key"])) == final["sha256"]
    assert sql(services, "SELECT photo_id FROM favourites") == [{"photo_id": photo}]
    assert await listing(guest, slug) == order


async def test_replace_refuses_what_it_cannot_do(admin: AuthActions, services: Services) -> None:
    gallery = await published(admin, name="G")
    gid = gallery["id"]
    first, second = shot(1), shot(2)
    ids = (await (await admin_upload(admin, gid, [("a.jpg", first), ("b.jpg", second)])).get_json())["photo_ids"]
    other = await published(admin, name="Other")

    # Not processed yet.
    pending = await replace(admin, gid, ids[0], shot(5))
    assert pending.status_code == 409
    await run_pool_until_idle(services)
    assert (await replace(admin, gid, ids[0], first)).status_code == 409  # its own file
    taken = await replace(admin, gid, ids[0], second)  # another photo's file
    assert taken.status_code == 409 and f"photo {ids[1]}" in (await taken.get_json())["error"]
    assert (await replace(admin, other["id"], ids[0], shot(6))).status_code == 404  # not in that gallery
    broken = await replace(admin, gid, ids[0], b"not an image at all")
    assert broken.status_code in (400, 415)
    # Nothing was kept of the refused files: only the two originals are stored.
    assert len(list(services.storage.iter_original_keys())) == 2
    assert all(r["replaced"] is None for r in sql(services, "SELECT replaced FROM photos"))


async def test_the_gallery_page_offers_replace_and_then_confirm_or_revert(admin: AuthActions,
                                                                          services: Services) -> None:
    gallery = await published(admin, name="G")
    gid = gallery["id"]
    photo = (await (await admin_upload(admin, gid, [("a.jpg", shot(1))])).get_json())["photo_ids"][0]
    await run_pool_until_idle(services)
    page = await (await admin.client.get(f"/admin/galleries/{gid}")).get_data(as_text=True)
    assert f'id="replace-{photo}"' in page and "Replace with a new file" in page

    # The no-script form: the CSRF token is the body's first field.
    body, headers = multipart([("a-edit.jpg", shot(7))], [("csrf_token", admin.csrf or "")])
    form = await admin.client.post(f"/admin/galleries/{gid}/photos/{photo}/replace", data=body, headers=headers)
    assert form.status_code == 302, await form.get_data(as_text=True)
    forged, headers = multipart([("a-edit.jpg", shot(8))], [("csrf_token", "forged")])
    assert (await admin.client.post(f"/admin/galleries/{gid}/photos/{photo}/replace", data=forged,
                                    headers=headers)).status_code == 403
    await run_pool_until_idle(services)
    page = await (await admin.client.get(f"/admin/galleries/{gid}")).get_data(as_text=True)
    assert "Keep the new version" in page and "Revert" in page
    kept = await admin.client.post(f"/admin/galleries/{gid}/photos/{photo}/replacement/confirm",
                                   form={"csrf_token": admin.csrf or ""})
    assert kept.status_code == 302
    assert row(services, photo)["replaced"] is None
