"""The photographer's photo grid: list with filters, hide/show, delete several, set the cover, retry.

Each action exists twice over one core function (in ``pipeline/photos.py``): as JSON under ``/api/admin`` (for
the page's script and for tools) and as a plain form post under ``/admin`` that redirects back, so the grid works
without script too.
A form delete without ``confirm=yes`` answers with a confirmation page instead of deleting.
"""

from __future__ import annotations

from typing import Any

from quart import Blueprint, redirect, render_template, request, url_for

from picpeak_lite.domain import galleries
from picpeak_lite.errors import BadRequest
from picpeak_lite.i18n import _
from picpeak_lite.pipeline import photos, replacement
from picpeak_lite.store.db import fits_integer
from picpeak_lite.store.queries import admin_photos as q
from picpeak_lite.web.auth import current_admin, gallery_api, gallery_page, require_delete, services
from picpeak_lite.web.views.common import (
    action_and_ids,
    admin_image_url,
    current_actor,
    filter_query,
    load_grid,
    photo_status,
    read_filters,
)

blueprint = Blueprint("admin_photos", __name__)


def photo_json(row: dict[str, Any], favourited_by: list[str], cover_id: int | None) -> dict[str, Any]:
    """The status endpoint's shape of a photo, plus what the admin grid shows about it."""
    return {
        **photo_status(row, admin_image_url),
        "size": row["size"],
        "hidden": bool(row["hidden"]),
        "uploaded_by": row["uploaded_by"],
        "guest_name": row["guest_name"],
        "favourite_count": row["favourite_count"],
        "favourited_by": favourited_by,
        "is_cover": row["id"] == cover_id,
    }








@blueprint.get("/api/admin/galleries/<int:gallery_id>/photos")
@gallery_api
async def list_photos(gallery_id: int) -> dict[str, Any]:
    gallery = await galleries.get_gallery(services(), gallery_id)
    rows, favs = await load_grid(gallery_id, read_filters(request.args))
    return {"photos": [photo_json(r, favs.get(r["id"], []), gallery["cover_photo_id"]) for r in rows]}


@blueprint.post("/api/admin/galleries/<int:gallery_id>/photos/bulk")
@gallery_api
async def bulk_api(gallery_id: int) -> dict[str, Any]:
    action, ids = await action_and_ids("...")
    changed = await apply_action(gallery_id, action, ids)
    return {"action": action, "changed": changed}


@blueprint.put("/api/admin/galleries/<int:gallery_id>/cover")
@gallery_api
async def cover_api(gallery_id: int) -> dict[str, Any]:
    data = await request.get_json(force=True, silent=True)
    photo_id = data.get("photo_id") if isinstance(data, dict) else "missing"
    if photo_id is not None and (not isinstance(photo_id, int) or isinstance(photo_id, bool)
                                 or not fits_integer(photo_id)):
        raise BadRequest(_("Send {\"photo_id\": <id>} (or null for the first photo)."))
    await photos.set_cover(services(), gallery_id, photo_id)
    return {"gallery_id": gallery_id, "cover_photo_id": photo_id}


@blueprint.post("/admin/galleries/<int:gallery_id>/photos")
@gallery_page
async def bulk_form(gallery_id: int) -> Any:
    form = await request.form
    action = form.get("action")
    try:
        ids = [int(v) for v in form.getlist("ids")]
        if not all(fits_integer(i) for i in ids):
            raise ValueError
    except ValueError:
        raise BadRequest(_("The selection is not valid; reload the page and try again.")) from None
    back = url_for("admin.gallery", gallery_id=gallery_id, **filter_query(read_filters(request.args)))  # type: ignore[arg-type]
    if action == "delete":
        require_delete(await current_admin())
    if action == "delete" and form.get("confirm") != "yes":
        gallery = await galleries.get_gallery(services(), gallery_id)
        ids = await services().db.read(q.ids_in_gallery, gallery_id, ids)
        if not ids:
            raise BadRequest(_("Select the photos to delete first."))
        return await render_template("admin/confirm_delete.html", gallery=gallery, ids=ids, back=back), 200
    await apply_action(gallery_id, action, ids)
    return redirect(back + "#photos")


@blueprint.post("/admin/photos/<int:photo_id>/retry")
@gallery_page
async def retry_form(photo_id: int) -> Any:
    photo = await photos.retry_photo(services(), photo_id)
    return redirect(url_for("admin.gallery", gallery_id=photo["gallery_id"]) + "#photos")


@blueprint.post("/api/admin/galleries/<int:gallery_id>/photos/<int:photo_id>/replacement/<any(confirm, revert):step>")
@gallery_api
async def replacement_api(gallery_id: int, photo_id: int, step: str) -> dict[str, Any]:
    """Keep the new version of a replaced photo (its previous original is deleted), or go back to the previous."""
    svc = services()
    await (replacement.confirm if step == "confirm" else replacement.revert)(svc, gallery_id, photo_id,
                                                                            await current_actor())
    row = await replacement.photo_of(svc, gallery_id, photo_id)
    return {"id": photo_id, "status": row["status"], "sha256": row["sha256"], "replaced": False}


@blueprint.post("/admin/galleries/<int:gallery_id>/photos/<int:photo_id>/replacement/<any(confirm, revert):step>")
@gallery_page
async def replacement_form(gallery_id: int, photo_id: int, step: str) -> Any:
    await (replacement.confirm if step == "confirm" else replacement.revert)(services(), gallery_id, photo_id,
                                                                            await current_actor())
    return redirect(url_for("admin.gallery", gallery_id=gallery_id) + "#photos")


async def apply_action(gallery_id: int, action: Any, ids: list[int]) -> int:
    """Run one grid action on the photos of ``ids`` that belong to this gallery; returns how many changed."""
    svc = services()
    photos.check_selection(action, photos.GRID_ACTIONS, ids)
    await galleries.get_gallery(svc, gallery_id)
    if action == "cover":
        if len(ids) != 1:
            raise BadRequest(_("Select exactly one photo to make it the cover."))
        await photos.set_cover(svc, gallery_id, ids[0])
        return 1
    if action in ("hide", "show"):
        return await photos.set_hidden(svc, gallery_id, ids, action == "hide")
    require_delete(await current_admin())
    return await photos.delete_photos(svc, gallery_id, ids, await current_actor())
