"""Photos after upload: upload status, retry, delete, and the image routes for admins and guests.

An image of a photo that is still waiting or processing answers 503 with ``Retry-After``; of a failed photo,
422 with the reason. Guests only ever reach complete, visible photos: their routes go through
``access.guest_gallery`` and ``access.visible_photo``.
"""

from __future__ import annotations

from typing import Any

from quart import Blueprint, Response

from picpeak_lite.domain import access
from picpeak_lite.errors import NotFound, NotReady, Unprocessable
from picpeak_lite.i18n import _
from picpeak_lite.pipeline import photos
from picpeak_lite.store.db import Connection, Row
from picpeak_lite.store.queries import photos as photo_q
from picpeak_lite.store.queries.photos import PhotoStatus
from picpeak_lite.store.storage import derived_name
from picpeak_lite.web.auth import admin_api, current_guest, gallery_api, services
from picpeak_lite.web.files import send_original, send_stored
from picpeak_lite.web.views.common import (
    admin_image_url,
    current_actor,
    guest_image_url,
    load_gallery,
    load_gallery_with,
    read_upload,
    upload_status,
)

blueprint = Blueprint("photos", __name__)

# How long a browser keeps an image without asking again (then a 304 when unchanged). Both sizes are made again
# when their gallery's watermark changes (worker.refresh_stale_views; the grid carries the mark since issue 35):
# an hour bounds how long a guest's browser shows the old one.
CACHE_SECONDS = {"grid": 3600, "view": 3600}
















@blueprint.get("/api/admin/uploads/<upload_id>")
@gallery_api
async def admin_upload_status(upload_id: str) -> dict[str, Any]:
    found = await read_upload(upload_id)
    if found is None:
        raise NotFound(_("There is no upload with this id."))
    return upload_status(found, admin_image_url)


@blueprint.get("/api/g/<slug>/uploads/<upload_id>")
async def guest_upload_status(slug: str, upload_id: str) -> dict[str, Any]:
    gallery = await load_gallery(slug)
    guest = await current_guest(create=False)
    found = await read_upload(upload_id)
    # Only the uploads this browser made, in this gallery; anything else is indistinguishable from unknown.
    if (found is None or guest is None or found.upload["guest_session_id"] != guest.id
            or found.upload["gallery_id"] != gallery["id"]):
        raise NotFound(_("There is no upload with this id."))
    return upload_status(found, lambda pid, kind: guest_image_url(slug, pid, kind))


@blueprint.post("/api/admin/photos/<int:photo_id>/retry")
@gallery_api
async def retry(photo_id: int) -> dict[str, Any]:
    await photos.retry_photo(services(), photo_id)
    return {"id": photo_id, "status": PhotoStatus.PENDING}


@blueprint.delete("/api/admin/photos/<int:photo_id>")
@admin_api
async def delete(photo_id: int) -> tuple[str, int]:
    await photos.delete_photo(services(), photo_id, await current_actor())
    return "", 204


@blueprint.get("/api/admin/photos/<int:photo_id>/<any(grid, view, original):kind>")
@gallery_api
async def admin_image(photo_id: int, kind: str) -> Response:
    photo = await services().db.read(photo_q.get, photo_id)
    if photo is None:
        raise NotFound(_("There is no such photo."))
    if kind == "original":
        return await send_original(photo)
    return await send_derivative(photo, kind)


@blueprint.get("/g/<slug>/photos/<int:photo_id>/<any(grid, view):kind>")
async def guest_image(slug: str, photo_id: int, kind: str) -> Response:
    # The guest, the gallery and the photo in one read (load_gallery_with says why).
    gallery, photo = await load_gallery_with(slug, lambda conn, row, guest: _visible(conn, row, photo_id))
    if photo is None:
        # Its uploader still sees a photo that waits for the admin's approval.
        guest = await current_guest(create=False)
        photo = await services().db.read(access.own_awaiting_photo, gallery, photo_id, guest.id if guest else None)
    return await send_derivative(photo, kind)


def _visible(conn: Connection, gallery: Row, photo_id: int) -> Row | None:
    """The photo if every guest of the gallery sees it, else None (it may still be this guest's own)."""
    try:
        return access.visible_photo(conn, gallery, photo_id)
    except NotFound:
        return None


async def send_derivative(photo: dict[str, Any], kind: str) -> Response:
    if photo["status"] in (PhotoStatus.PENDING, PhotoStatus.PROCESSING):
        raise NotReady(_("This photo is still being processed."), retry_after=5)
    if photo["status"] == PhotoStatus.FAILED:
        raise Unprocessable(photo["error"] or _("This photo could not be processed."))
    try:
        response = await send_stored(derived_name(photo["storage_key"], kind), "image/jpeg")
    except FileNotFoundError:
        raise NotFound(_("The image file is missing; the photo can be reprocessed with `picpeak-lite check --repair`.")
                       ) from None
    if response.status_code != 302:  # a redirect to a signed URL is never cached (it expires)
        response.headers["Cache-Control"] = f"private, max-age={CACHE_SECONDS[kind]}"
    return response




