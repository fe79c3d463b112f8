"""The admin's review queue (moderation): guests' photos that wait for approval, approved, hidden or deleted
one by one or many at once.

As with the photo grid, each action exists as JSON under ``/api/admin`` (for the page's script, ``review.js``,
and for tools) and as a plain form post under ``/admin`` that redirects back, so the queue works without script.
The actions are ``pipeline/photos.py`` ``review`` (the units of work and their webhooks: ``pipeline/moderation.py``);
the queue updates itself live over the admin's gallery feed, whose ``photo`` messages carry ``awaiting_approval``.
"""

from __future__ import annotations

from typing import Any

from quart import Blueprint, redirect, request, url_for

from picpeak_lite.domain import galleries
from picpeak_lite.errors import BadRequest
from picpeak_lite.i18n import _
from picpeak_lite.pipeline import moderation, photos
from picpeak_lite.store.db import fits_integer
from picpeak_lite.store.queries import moderation as moderation_q
from picpeak_lite.web.auth import current_admin, gallery_api, gallery_page, require_delete, services
from picpeak_lite.web.views.common import action_and_ids, admin_image_url, current_actor, photo_status

blueprint = Blueprint("review", __name__)


def queue_json(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [{**photo_status(row, admin_image_url), "awaiting_approval": True, "guest_name": row["guest_name"]}
            for row in rows]


@blueprint.get("/api/admin/galleries/<int:gallery_id>/review")
@gallery_api
async def queue_api(gallery_id: int) -> dict[str, Any]:
    gallery = await galleries.get_gallery(services(), gallery_id)
    rows = await services().db.read(moderation_q.queue, gallery_id)
    return {"gallery_id": gallery_id, "enabled": bool(gallery["guest_photos_need_approval"]),
            "photos": queue_json(rows)}


@blueprint.post("/api/admin/galleries/<int:gallery_id>/review")
@gallery_api
async def review_api(gallery_id: int) -> dict[str, Any]:
    action, ids = await action_and_ids('"approve"')
    done = await apply_review(gallery_id, action, ids)
    return {"action": action, "changed": done, "ids": done}


@blueprint.post("/admin/galleries/<int:gallery_id>/review")
@gallery_page
async def review_form(gallery_id: int) -> Any:
    form = await request.form
    raw = [request.args["only"]] if "only" in request.args else form.getlist("ids")
    try:
        ids = [int(v) for v in raw]
        if not all(fits_integer(i) for i in ids):
            raise ValueError
    except ValueError:
        raise BadRequest(_("The selection is not valid; reload the page and try again.")) from None
    await apply_review(gallery_id, form.get("action"), ids)
    return redirect(url_for("admin.gallery", gallery_id=gallery_id) + "#review")


async def apply_review(gallery_id: int, action: Any, ids: list[int]) -> list[int]:
    """Approve, hide or delete those of ``ids`` that still wait in this gallery; returns their ids."""
    photos.check_selection(action, moderation.ACTIONS, ids)
    if action == "delete":
        require_delete(await current_admin())
    return await photos.review(services(), gallery_id, action, ids, await current_actor())
