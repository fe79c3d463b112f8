"""Guest downloads: one photo, the whole gallery as a zip, and the guest's favourites as a zip.

All of them go through ``access.guest_gallery`` and list only ``access.GUEST_VISIBLE_PHOTO`` photos, and all
respect the gallery's ``allow_downloads``. A gallery that watermarks downloads gets watermarked full-size JPEGs
(made in a worker thread from the original, which is only read), in single downloads and in zips alike; the
others get the original bytes. Zips are streamed as they are built (``zipstream``).
"""

from __future__ import annotations

import re
from typing import Any
from urllib.parse import quote

import trio
from quart import Blueprint, Response, current_app

from .. import access, app_settings, images, zipstream
from ..auth import current_guest, services
from ..errors import Forbidden, NotFound
from ..queries import listing
from .guest import load_gallery
from .photos import attachment_header, send_original

blueprint = Blueprint("downloads", __name__)

NO_DOWNLOADS = "The photographer has turned off downloads for this gallery."
SANDBOX_CSP = "default-src 'none'; sandbox"


def _limiter() -> trio.CapacityLimiter:
    """Disk reads and watermarking for downloads: bounded, so that a few zips cannot starve page views."""
    limiter = current_app.extensions.get("download_limiter")
    if limiter is None:
        limiter = current_app.extensions["download_limiter"] = trio.CapacityLimiter(4)
    return limiter


async def watermark_for(gallery: dict[str, Any]) -> images.Watermark | None:
    """The same watermark as the gallery's view images (settings page over config defaults)."""
    svc = services()
    return await svc.db.read(app_settings.gallery_watermark, svc.settings, gallery)


async def _downloadable_gallery(slug: str) -> dict[str, Any]:
    gallery = await load_gallery(slug)
    if not gallery["allow_downloads"]:
        raise Forbidden(NO_DOWNLOADS)
    return gallery


@blueprint.get("/g/<slug>/photos/<int:photo_id>/download")
async def photo(slug: str, photo_id: int) -> Response:
    svc = services()
    gallery = await _downloadable_gallery(slug)
    row = await svc.db.read(access.visible_photo, gallery, photo_id)
    watermark = await watermark_for(gallery)
    if watermark is None:
        response = await send_original(row)
    else:
        path = svc.storage.original_path(row["storage_key"])
        if not path.exists():
            raise NotFound("The original file is missing from storage.")
        data = await trio.to_thread.run_sync(
            lambda: images.apply_watermark(path, watermark, max_pixels=svc.settings.max_pixels),
            limiter=_limiter())
        response = Response(data, mimetype="image/jpeg")
        response.headers["Content-Disposition"] = attachment_header(_as_jpeg_name(row["display_name"]), "jpeg")
        response.headers["Content-Security-Policy"] = SANDBOX_CSP
        response.headers["Cache-Control"] = "private, no-cache"
    response.headers["X-Content-Type-Options"] = "nosniff"
    response.timeout = None  # a large original on a slow phone connection takes longer than Quart's 60 s
    return response


@blueprint.get("/g/<slug>/download")
async def gallery_zip(slug: str) -> Response:
    gallery = await _downloadable_gallery(slug)
    return await _zip_response(gallery, favourites_only=False)


@blueprint.get("/g/<slug>/favourites/download")
async def favourites_zip(slug: str) -> Response:
    gallery = await _downloadable_gallery(slug)
    return await _zip_response(gallery, favourites_only=True)


async def _zip_response(gallery: dict[str, Any], *, favourites_only: bool) -> Response:
    svc = services()
    guest = await current_guest(create=False)
    if favourites_only and guest is None:
        raise NotFound("You have not marked any favourites in this gallery yet.")
    rows = await svc.db.read(lambda conn: listing.all_visible(
        conn, gallery["id"], guest_session_id=guest.id if guest else None, favourites_only=favourites_only))
    if not rows:
        raise NotFound("You have not marked any favourites in this gallery yet." if favourites_only
                       else "There are no photos in this gallery yet.")
    watermark = await watermark_for(gallery)
    names = zipstream.entry_names([(r["display_name"], r["format"]) for r in rows],
                                  force_extension=".jpg" if watermark else None)
    storage = svc.storage
    entries = []
    for row, name in zip(rows, names, strict=True):
        path = storage.original_path(row["storage_key"])
        render = None
        if watermark is not None:
            render = _watermark_renderer(path, watermark, svc.settings.max_pixels)
        entries.append(zipstream.Entry(name=name, path=path, render=render,
                                       date_time=zipstream.zip_date(row["taken_at"], svc.clock())))
    filename = _zip_name(gallery["name"], favourites_only)
    response = Response(zipstream.stream_zip(entries, limiter=_limiter()), mimetype="application/zip")
    response.headers["Content-Disposition"] = (
        f"attachment; filename=\"{_ascii(filename)}\"; filename*=UTF-8''{quote(filename, safe='')}")
    response.headers["Content-Security-Policy"] = SANDBOX_CSP
    response.headers["X-Content-Type-Options"] = "nosniff"
    response.headers["Cache-Control"] = "private, no-store"
    response.timeout = None  # streams for as long as the client reads
    return response


def _watermark_renderer(path: Any, watermark: images.Watermark, max_pixels: int) -> Any:
    def render() -> bytes:
        return images.apply_watermark(path, watermark, max_pixels=max_pixels)

    return render


def _as_jpeg_name(display_name: str) -> str:
    return zipstream.safe_name(display_name, "jpeg", force_extension=".jpg")


def _zip_name(gallery_name: str, favourites_only: bool) -> str:
    base = zipstream.safe_name(gallery_name, "jpeg", force_extension=".zip")[: -len(".zip")]
    return f"{base} - favourites.zip" if favourites_only else f"{base}.zip"


def _ascii(name: str) -> str:
    return re.sub(r"[^A-Za-z0-9._ -]", "_", name)
