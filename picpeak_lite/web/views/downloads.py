"""Guest downloads: one photo, the whole gallery as a zip, and the guest's favourites as a zip, each in two sizes:
the original (``?size=original``, the default) and the web size (``?size=web``: ~2048 px on the long edge,
``media/images.web_copy``, watermarked when the gallery is). Copies we make keep the photographer's Artist,
Copyright, dc:creator and dc:rights and nothing else of the original's metadata (no GPS).

All of them go through ``access.guest_gallery`` and list only ``queries.photos.GUEST_VISIBLE_PHOTO`` photos,
and all respect the gallery's ``allow_downloads``. A gallery that watermarks downloads gets watermarked full-size JPEGs,
in single downloads and in zips alike; the others get the original bytes. Zips are streamed as they are built
(``zipstream``).

A watermarked copy decodes the whole original (up to ``max_pixels``, hundreds of MB of pixels), so it is made
once per photo and watermark, one at a time (``WebLimits.watermark_limiter``), and kept on disk next to the
derivatives (``storage.watermarked_name``; in the bucket with S3 storage); every later download of it, single or
zipped, streams that file. The tag in its name is a hash of the watermark's parameters, so a changed watermark
makes new copies (and ``Storage.write_watermarked`` removes the old ones).

Making a copy takes its estimated bytes from the process's decode budget first (``runtime/budget.py``), as the
workers do: a guest's download waits for memory instead of adding a full decode on top of theirs. A JPEG too big
to copy at full size within the budget is copied at the largest 1/2, 1/4 or 1/8 scale that fits; any other image
that cannot fit is answered 422 with its size (upload refuses those, so only a lowered setting gets there).
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Iterator
from functools import partial
from pathlib import Path
from typing import Any
from urllib.parse import quote

import trio
from quart import Blueprint, Response, request

from picpeak_lite.domain import access, admin_settings
from picpeak_lite.errors import BadRequest, Forbidden, InsufficientStorage, NotFound, Unprocessable
from picpeak_lite.i18n import N_, _
from picpeak_lite.media import images
from picpeak_lite.services import Services
from picpeak_lite.store.queries import listing
from picpeak_lite.store.queries import photos as photo_q
from picpeak_lite.store.storage import WATERMARK_TAG_CHARS, original_name, watermarked_name
from picpeak_lite.web import zipstream
from picpeak_lite.web.auth import current_guest, limits, services
from picpeak_lite.web.files import attachment_header, send_original, send_stored
from picpeak_lite.web.views.common import load_gallery

blueprint = Blueprint("downloads", __name__)

NO_DOWNLOADS = N_("The photographer has turned off downloads for this gallery.")
SANDBOX_CSP = "default-src 'none'; sandbox"
WATERMARK_QUALITY = 92  # JPEG quality of watermarked downloads; part of the cached copy's tag
WEB_QUALITY = 88
# Bumped when what a watermarked copy carries changes (2: the photographer's rights metadata), so copies cached
# before are made again rather than served.
COPY_VERSION = 2
SIZES = ("original", "web")


def size_arg() -> str:
    size = request.args.get("size", "original")
    if size not in SIZES:
        raise BadRequest(_("size must be 'original' or 'web'."))
    return size


async def watermark_for(gallery: dict[str, Any]) -> images.Watermark | None:
    """The same watermark as the gallery's view images (settings page over config defaults)."""
    svc = services()
    return await svc.db.read(admin_settings.gallery_watermark, svc.settings, gallery)


def watermark_tag(watermark: images.Watermark) -> str:
    """A short hash of what a watermarked copy depends on besides the original: the watermark (its parameters
    and logo file, ``admin_settings.watermark_fingerprint``) and the JPEG quality."""
    text = json.dumps([admin_settings.watermark_fingerprint(watermark), WATERMARK_QUALITY, COPY_VERSION])
    return hashlib.sha256(text.encode()).hexdigest()[:WATERMARK_TAG_CHARS]


async def watermarked_copy(svc: Services, key: str, watermark: images.Watermark, tag: str,
                           limiter: trio.CapacityLimiter) -> str | bytes:
    """The cached watermarked copy of a photo (its storage name), made first if need be (at most ``limiter``
    at once: the app's ``WebLimits.watermark_limiter``). Raises FileNotFoundError without an original.

    Returns the bytes instead of a name only when the disk is too full to keep the copy.
    """
    storage = svc.storage
    cached = watermarked_name(key, tag)
    if await trio.to_thread.run_sync(storage.exists, cached, limiter=limiter):
        return cached
    budget = svc.decode_budget
    # The original as a local file for the decoder: itself, or a temp copy of the bucket's object.
    with await trio.to_thread.run_sync(storage.local_copy, original_name(key), limiter=limiter) as original:
        plan = partial(images.plan_watermark, original.path, watermark,
                       max_pixels=svc.settings.max_pixels, max_bytes=budget.total)
        try:
            cost = await trio.to_thread.run_sync(plan, limiter=limiter)
        except images.InvalidImage as error:
            raise Unprocessable(_("This photo cannot be downloaded with its watermark. %(reason)s")
                                % {"reason": error.reason}) from None
        async with budget.hold(cost):
            return await trio.to_thread.run_sync(_make_watermarked, svc, original.path, key, watermark, tag,
                                                 limiter=limiter)


async def web_copy(svc: Services, key: str, watermark: images.Watermark | None,
                   limiter: trio.CapacityLimiter) -> bytes:
    """The web size of a photo, made for this download (a ~2048 px JPEG is quick to make and not kept), holding
    its decode's bytes from the budget as a watermarked copy does. Raises FileNotFoundError without an original."""
    budget = svc.decode_budget
    # The original as a local file for the decoder: itself, or a temp copy of the bucket's object.
    with await trio.to_thread.run_sync(svc.storage.local_copy, original_name(key), limiter=limiter) as original:
        plan = partial(images.plan_web, original.path, watermark, max_pixels=svc.settings.max_pixels,
                       max_bytes=budget.total)
        try:
            cost = await trio.to_thread.run_sync(plan, limiter=limiter)
        except images.InvalidImage as error:
            raise Unprocessable(_("This photo cannot be downloaded in the web size. %(reason)s")
                                % {"reason": error.reason}) from None
        async with budget.hold(cost):
            make = partial(images.web_copy, original.path, watermark, quality=WEB_QUALITY,
                           max_pixels=svc.settings.max_pixels)
            return await trio.to_thread.run_sync(make, limiter=limiter)


def _make_watermarked(svc: Services, original: Path, key: str, watermark: images.Watermark, tag: str
                      ) -> str | bytes:
    storage = svc.storage
    cached = watermarked_name(key, tag)
    if storage.exists(cached):  # made by another download while this one waited for its turn
        return cached
    data = images.apply_watermark(original, watermark, quality=WATERMARK_QUALITY,
                                  max_pixels=svc.settings.max_pixels, max_bytes=svc.decode_budget.total)
    try:
        return storage.write_watermarked(key, tag, data)
    except InsufficientStorage:
        return data


async def _downloadable_gallery(slug: str) -> dict[str, Any]:
    gallery = await load_gallery(slug)
    if not gallery["allow_downloads"]:
        raise Forbidden(_(NO_DOWNLOADS))
    return gallery


@blueprint.get("/g/<slug>/photos/<int:photo_id>/download")
async def photo(slug: str, photo_id: int) -> Response:
    svc = services()
    gallery = await _downloadable_gallery(slug)
    size = size_arg()
    row = await svc.db.read(access.visible_photo, gallery, photo_id)
    svc.activity.count(gallery["id"], "downloads_single")
    watermark = await watermark_for(gallery)
    video = row.get("media_type") == "video"  # a video goes as its original: no web size, no watermark
    if size == "web" and not video:
        try:
            data = await web_copy(svc, row["storage_key"], watermark, limits().watermark_limiter)
        except FileNotFoundError:
            raise NotFound(_(photo_q.ORIGINAL_MISSING)) from None
        response = Response(data, mimetype="image/jpeg")
        response.headers["Content-Disposition"] = attachment_header(_web_name(row["display_name"]), "jpeg")
        response.headers["Content-Security-Policy"] = SANDBOX_CSP
        response.headers["Cache-Control"] = "private, no-cache"
    elif watermark is None or video:
        response = await send_original(row)
    else:
        try:
            made = await watermarked_copy(svc, row["storage_key"], watermark, watermark_tag(watermark),
                                          limits().watermark_limiter)
        except FileNotFoundError:
            raise NotFound(_(photo_q.ORIGINAL_MISSING)) from None
        disposition = attachment_header(_as_jpeg_name(row["display_name"]), "jpeg")
        if isinstance(made, str):
            response = await send_stored(made, "image/jpeg", disposition=disposition)
        else:
            response = Response(made, mimetype="image/jpeg")
        if response.status_code == 302:
            return response
        response.headers["Content-Disposition"] = disposition
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
    web = size_arg() == "web"
    guest = await current_guest(create=False)
    if favourites_only and guest is None:
        raise NotFound(_("You have not marked any favourites in this gallery yet."))
    rows = await svc.db.read(lambda conn: listing.all_visible(
        conn, gallery["id"], guest_session_id=guest.id if guest else None, favourites_only=favourites_only))
    if not rows:
        raise NotFound(_("You have not marked any favourites in this gallery yet.") if favourites_only
                       else _("There are no photos in this gallery yet."))
    svc.activity.count(gallery["id"], "downloads_zip")
    watermark = await watermark_for(gallery)
    converted = bool(watermark or web)  # photos become JPEGs; videos always go as their originals
    if converted and any(r.get("media_type") == "video" for r in rows):
        names = zipstream.entry_names([(r["display_name"], r["format"] if r.get("media_type") == "video" else "jpeg")
                                       for r in rows])
    else:
        names = zipstream.entry_names([(r["display_name"], r["format"]) for r in rows],
                                      force_extension=".jpg" if converted else None)
    if web:
        entries = _web_entries(svc, rows, names, watermark, limits().watermark_limiter)
    else:
        entries = _zip_entries(svc, rows, names, watermark, limits().watermark_limiter)
    filename = _zip_name(gallery["name"], favourites_only, web=web)
    response = Response(zipstream.stream_zip(entries, limiter=limits().download_limiter),
                        mimetype="application/zip")
    response.headers["Content-Disposition"] = (
        f"attachment; filename=\"{_ascii(filename)}\"; filename*=UTF-8''{quote(filename, safe='')}")
    response.headers["Content-Security-Policy"] = SANDBOX_CSP
    response.headers["X-Content-Type-Options"] = "nosniff"
    response.headers["Cache-Control"] = "private, no-store"
    response.timeout = None  # streams for as long as the client reads
    return response


def _zip_entries(svc: Services, rows: list[dict[str, Any]], names: list[str], watermark: images.Watermark | None,
                 limiter: trio.CapacityLimiter) -> Iterator[zipstream.Entry]:
    """Made as the zip reaches each photo: a watermarked copy that is cached by then is streamed from disk."""
    storage = svc.storage
    tag = watermark_tag(watermark) if watermark is not None else ""
    for row, name in zip(rows, names, strict=True):
        key = row["storage_key"]
        date_time = zipstream.zip_date(row["taken_at"], svc.clock())
        if watermark is None or row.get("media_type") == "video":
            yield zipstream.Entry(name=name, open=partial(storage.open, original_name(key)), date_time=date_time)
        elif (cached := storage.local_path(watermarked_name(key, tag))) is not None and cached.exists():
            yield zipstream.Entry(name=name, open=partial(storage.open, watermarked_name(key, tag)),
                                  date_time=date_time)
        else:  # not made yet, or in a bucket (where asking would block here): the renderer reads the cache
            yield zipstream.Entry(name=name, open=partial(storage.open, original_name(key)), date_time=date_time,
                                  render=_cached_renderer(svc, key, watermark, tag, limiter))


def _web_entries(svc: Services, rows: list[dict[str, Any]], names: list[str], watermark: images.Watermark | None,
                 limiter: trio.CapacityLimiter) -> Iterator[zipstream.Entry]:
    """The web size of each photo, made as the zip reaches it (in the zip's thread, through the event loop, so
    the limiter and the decode budget are the single download's)."""
    for row, name in zip(rows, names, strict=True):
        key = row["storage_key"]
        if row.get("media_type") == "video":
            yield zipstream.Entry(name=name, open=partial(svc.storage.open, original_name(key)),
                                  date_time=zipstream.zip_date(row["taken_at"], svc.clock()))
            continue

        def render(key: str = key) -> bytes:
            try:
                return trio.from_thread.run(web_copy, svc, key, watermark, limiter)
            except Unprocessable as error:
                raise FileNotFoundError(error.message) from None  # left out, as a photo whose file is gone

        yield zipstream.Entry(name=name, open=partial(svc.storage.open, original_name(key)),
                              date_time=zipstream.zip_date(row["taken_at"], svc.clock()), render=render)


def _cached_renderer(svc: Services, key: str, watermark: images.Watermark, tag: str,
                     limiter: trio.CapacityLimiter) -> Any:
    """Runs in the zip's worker thread: has the event loop make the copy the way a single download does (same
    limiter, same cache), then reads it."""
    def render() -> bytes:
        try:
            made = trio.from_thread.run(watermarked_copy, svc, key, watermark, tag, limiter)
        except Unprocessable as error:
            # Too big to watermark within the decode budget: the zip leaves it out, as it does a photo whose
            # file is gone (zipstream skips on FileNotFoundError), rather than break off half-way.
            raise FileNotFoundError(error.message) from None
        return svc.storage.read_bytes(made) if isinstance(made, str) else made

    return render


def _as_jpeg_name(display_name: str) -> str:
    return zipstream.safe_name(display_name, "jpeg", force_extension=".jpg")


def _web_name(display_name: str) -> str:
    base = _as_jpeg_name(display_name)[: -len(".jpg")]
    return f"{base} (web).jpg"


def _zip_name(gallery_name: str, favourites_only: bool, *, web: bool = False) -> str:
    base = zipstream.safe_name(gallery_name, "jpeg", force_extension=".zip")[: -len(".zip")]
    base += " - favourites" if favourites_only else ""
    return f"{base} (web size).zip" if web else f"{base}.zip"


def _ascii(name: str) -> str:
    return re.sub(r"[^A-Za-z0-9._ -]", "_", name)
