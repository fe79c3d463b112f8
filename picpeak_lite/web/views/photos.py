"""Photos after upload: upload status, retry, delete, and the image routes for admins and guests.

An image of a photo that is still waiting or processing answers 503 with ``Retry-After``; of a failed photo,
422 with the reason. Guests only ever reach complete, visible photos: their routes go through
``access.guest_gallery`` and ``access.visible_photo``.
"""

from __future__ import annotations

import re
from typing import Any
from urllib.parse import quote

import trio
from quart import Blueprint, Response, send_file, url_for

from picpeak_lite.domain import access
from picpeak_lite.errors import Conflict, NotFound, NotReady, Unprocessable
from picpeak_lite.pipeline import transitions
from picpeak_lite.store.queries import photos as photo_q
from picpeak_lite.web.auth import admin_api, current_guest, services
from picpeak_lite.web.views.guest import load_gallery

blueprint = Blueprint("photos", __name__)

UPLOAD_ID = re.compile(r"^[0-9a-f]{32}$")
MIME = {"jpeg": "image/jpeg", "png": "image/png", "webp": "image/webp", "heif": "image/heif"}
EXTENSION = {"jpeg": ".jpg", "png": ".png", "webp": ".webp", "heif": ".heic"}
# How long a browser keeps an image without asking again (then a 304 when unchanged). Grid images never change.
# View images are made again when their gallery's watermark changes (worker.refresh_stale_views): an hour
# bounds how long a guest's browser shows the old one.
CACHE_SECONDS = {"grid": 7 * 86400, "view": 3600}
# quart-trio reads files in 8 KiB steps with two thread hops each; 256 KiB steps cut the hops 32-fold.
FILE_CHUNK_BYTES = 256 * 1024


async def send_path(path: Any, mimetype: str) -> Response:
    """``send_file`` with ETag/conditional support and large read steps."""
    response = await send_file(path, mimetype=mimetype, conditional=True)
    if hasattr(response.response, "buffer_size"):
        response.response.buffer_size = FILE_CHUNK_BYTES
    return response


def admin_image_url(photo_id: int, kind: str) -> str:
    return url_for("photos.admin_image", photo_id=photo_id, kind=kind)


def guest_image_url(slug: str, photo_id: int, kind: str) -> str:
    return url_for("photos.guest_image", slug=slug, photo_id=photo_id, kind=kind)


def upload_status(upload: dict[str, Any], counts: dict[str, Any], photos: list[dict[str, Any]],
                  image_url: Any) -> dict[str, Any]:
    """The status shape shared by the admin and guest endpoints (and the WebSocket snapshot)."""
    return {
        "upload_id": upload["id"],
        "gallery_id": upload["gallery_id"],
        **{k: counts[k] for k in ("total", "pending", "processing", "complete", "failed")},
        "done": upload["completed_at"] is not None,
        "photos": [photo_status(p, image_url) for p in photos],
    }


def photo_status(photo: dict[str, Any], image_url: Any) -> dict[str, Any]:
    complete = photo["status"] == "complete"
    return {
        "id": photo["id"],
        "filename": photo["display_name"],
        "status": photo["status"],
        "error": photo["error"],
        "width": photo["width"],
        "height": photo["height"],
        "thumb_url": image_url(photo["id"], "grid") if complete else None,
        "view_url": image_url(photo["id"], "view") if complete else None,
    }


async def read_upload(upload_id: str) -> tuple[dict[str, Any], dict[str, Any], list[dict[str, Any]]] | None:
    """The upload group, its counts and photos; None for an unknown or malformed id."""
    if not UPLOAD_ID.match(upload_id):
        return None
    return await services().db.read(_load_upload, upload_id)


def _load_upload(conn: Any, upload_id: str) -> tuple[dict[str, Any], dict[str, Any], list[dict[str, Any]]] | None:
    upload = photo_q.get_upload(conn, upload_id)
    if upload is None:
        return None
    return upload, photo_q.upload_counts(conn, upload_id), photo_q.upload_photos(conn, upload_id)


@blueprint.get("/api/admin/uploads/<upload_id>")
@admin_api
async def admin_upload_status(upload_id: str) -> dict[str, Any]:
    found = await read_upload(upload_id)
    if found is None:
        raise NotFound("There is no upload with this id.")
    return upload_status(*found, admin_image_url)


@blueprint.get("/api/g/<slug>/uploads/<upload_id>")
async def guest_upload_status(slug: str, upload_id: str) -> dict[str, Any]:
    gallery = await load_gallery(slug)
    guest = await current_guest(create=False)
    found = await read_upload(upload_id)
    # Only the uploads this browser made, in this gallery; anything else is indistinguishable from unknown.
    if (found is None or guest is None or found[0]["guest_session_id"] != guest.id
            or found[0]["gallery_id"] != gallery["id"]):
        raise NotFound("There is no upload with this id.")
    return upload_status(*found, lambda pid, kind: guest_image_url(slug, pid, kind))


@blueprint.post("/api/admin/photos/<int:photo_id>/retry")
@admin_api
async def retry(photo_id: int) -> dict[str, Any]:
    svc = services()

    def do_retry(conn: Any) -> bool | None:
        if photo_q.get(conn, photo_id) is None:
            return None
        return photo_q.retry(conn, photo_id)

    result = await svc.db.write(do_retry)
    if result is None:
        raise NotFound("There is no such photo.")
    if not result:
        raise Conflict("Only a failed photo can be retried.")
    svc.wake_workers()
    return {"id": photo_id, "status": "pending"}


@blueprint.delete("/api/admin/photos/<int:photo_id>")
@admin_api
async def delete(photo_id: int) -> tuple[str, int]:
    await delete_photo(photo_id)
    return "", 204


async def delete_photo(photo_id: int) -> None:
    """Delete the row (with its webhook) first, then the files: a crash in between leaves orphan files for the
    reconciler, never a row without its file."""
    svc = services()
    row = await svc.db.write(transitions.delete_photo, svc.settings.webhooks, photo_id, svc.clock())
    if row is None:
        raise NotFound("There is no such photo.")
    await trio.to_thread.run_sync(svc.storage.remove_photo_files, row["storage_key"])
    svc.wake_webhooks()


@blueprint.get("/api/admin/photos/<int:photo_id>/<any(grid, view, original):kind>")
@admin_api
async def admin_image(photo_id: int, kind: str) -> Response:
    photo = await services().db.read(photo_q.get, photo_id)
    if photo is None:
        raise NotFound("There is no such photo.")
    if kind == "original":
        return await send_original(photo)
    return await send_derivative(photo, kind)


@blueprint.get("/g/<slug>/photos/<int:photo_id>/<any(grid, view):kind>")
async def guest_image(slug: str, photo_id: int, kind: str) -> Response:
    gallery = await load_gallery(slug)
    photo = await services().db.read(access.visible_photo, gallery, photo_id)
    return await send_derivative(photo, kind)


async def send_derivative(photo: dict[str, Any], kind: str) -> Response:
    if photo["status"] in ("pending", "processing"):
        raise NotReady("This photo is still being processed.", retry_after=5)
    if photo["status"] == "failed":
        raise Unprocessable(photo["error"] or "This photo could not be processed.")
    path = services().storage.derived_path(photo["storage_key"], kind)
    if not path.exists():
        raise NotFound("The image file is missing; the photo can be reprocessed with `picpeak-lite check --repair`.")
    response = await send_path(path, "image/jpeg")
    response.headers["Cache-Control"] = f"private, max-age={CACHE_SECONDS[kind]}"
    return response


async def send_original(photo: dict[str, Any]) -> Response:
    """The original bytes, always as an attachment, with the type we detected (never the client's)."""
    path = services().storage.original_path(photo["storage_key"])
    if not path.exists():
        raise NotFound(photo_q.ORIGINAL_MISSING)
    response = await send_path(path, MIME[photo["format"]])
    response.headers["Content-Disposition"] = attachment_header(photo["display_name"], photo["format"])
    response.headers["Content-Security-Policy"] = "default-src 'none'; sandbox"
    response.headers["Cache-Control"] = "private, no-cache"
    return response


def attachment_header(display_name: str, fmt: str) -> str:
    """``attachment`` with an ASCII fallback and the UTF-8 name (RFC 6266 / 5987)."""
    name = display_name
    if not name.lower().endswith((EXTENSION[fmt], ".jpeg" if fmt == "jpeg" else EXTENSION[fmt], ".heif")):
        name += EXTENSION[fmt]
    fallback = re.sub(r"[^A-Za-z0-9._ -]", "_", name) or "photo" + EXTENSION[fmt]
    return f"attachment; filename=\"{fallback}\"; filename*=UTF-8''{quote(name, safe='')}"
