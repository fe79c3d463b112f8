"""What guests see: the gallery page, its JSON listing, the guest upload page and the password form.

Every route asks ``access.guest_gallery`` (through :func:`load_gallery`); photos come from
``queries.listing``, which only lists what ``queries.photos.GUEST_VISIBLE_PHOTO`` allows.
"""

from __future__ import annotations

import datetime as dt
import operator
from collections import OrderedDict
from typing import Any

from quart import Blueprint, current_app, g, redirect, render_template, request, url_for
from quart.blueprints import BlueprintSetupState
from quart.json.provider import DefaultJSONProvider

from picpeak_lite import i18n
from picpeak_lite.domain import access, admin_settings, email
from picpeak_lite.errors import BadRequest, Forbidden
from picpeak_lite.i18n import _
from picpeak_lite.media import images
from picpeak_lite.store.db import Connection
from picpeak_lite.store.queries import favourites as favourite_q
from picpeak_lite.store.queries import guests as guest_q
from picpeak_lite.store.queries import listing
from picpeak_lite.store.queries import moderation as moderation_q
from picpeak_lite.web.auth import Guest, admin_from_cookie, check_guest_state_change, current_guest, limits, services
from picpeak_lite.web.playback import duration_label, video_fields
from picpeak_lite.web.views.common import (
    base_url,
    client_ip,
    load_gallery,
    load_gallery_with,
    prove_device,
    trusted_device,
)

blueprint = Blueprint("guest", __name__)




def _sort_arg() -> str:
    sort = request.args.get("sort", "taken")
    if sort not in listing.SORTS:
        raise BadRequest(_("sort must be one of %(choices)s.") % {"choices": ', '.join(listing.SORTS)})
    return sort


def camera_line(photo: dict[str, Any]) -> str:
    """'Canon EOS R5 · 35 mm · f/1.8 · 1/200 s · ISO 400', leaving out what is unknown."""
    make, model = (photo.get("camera_make") or "").strip(), (photo.get("camera_model") or "").strip()
    body = model if model.lower().startswith(make.lower()) else f"{make} {model}".strip()
    parts = [body] if body else []
    if photo.get("focal_length"):
        parts.append(f"{photo['focal_length']:g} mm")
    if photo.get("aperture"):
        parts.append(f"f/{photo['aperture']:g}")
    if photo.get("exposure"):
        exposure = str(photo["exposure"])
        parts.append(exposure if exposure.endswith("s") else f"{exposure} s")
    if photo.get("iso"):
        parts.append(f"ISO {photo['iso']}")
    return " · ".join(parts)


def taken_label(taken_at: str | None) -> str:
    """'2024-06-20T14:03:00' -> '20 June 2024, 14:03' (camera local time, as the camera wrote it), written as the
    page's language writes a date."""
    if not taken_at:
        return ""
    try:
        moment = dt.datetime.fromisoformat(taken_at)
    except ValueError:
        return ""
    return i18n.format_local_moment(moment)


# The justified grid (guest.css): each tile's flex-grow and basis are its aspect ratio, given as a class because
# the CSP allows no style attributes. Ratios are in steps of 1/20 from 1/4 to 4: at most 2.5 % is cropped.
RATIO_STEPS = 20
RATIO_MIN, RATIO_MAX = 5, 80


def ratio_class(width: int | None, height: int | None) -> str:
    """'r30' for a 3:2 photo (1.5 = 30/20); unknown sizes count as square."""
    ratio = (width or 1) / (height or 1)
    return f"r{min(RATIO_MAX, max(RATIO_MIN, round(ratio * RATIO_STEPS)))}"


def size_label(size: float) -> str:
    """'48 MB', '3.6 MB', '1.2 GB', '1 kB' (in decimal units, written as the page's language writes them): what
    "Download all" says it will send before it starts."""
    return i18n.format_size(max(1000.0, size), base=1000)


class PhotoUrls:
    """The per-photo URLs of one gallery, built once per page instead of five ``url_for`` calls per photo.

    ``url_for`` costs about 15 us (werkzeug builds the rule, quotes the slug, encodes the query): at 200 photos
    that was 85 % of making the photos' dicts, and most of the listing's server time. Each endpoint is built
    once with a sentinel photo id and split around it; a photo's URL is then the two halves around its id, the
    same string ``url_for`` gives (an ``int`` converter writes ``str(id)``). Were the sentinel to appear twice
    (a slug holding it), the endpoint falls back to ``url_for`` per photo.
    """

    SENTINEL = 9_007_199_254_740_991  # 2**53 - 1: a photo id no gallery reaches

    def __init__(self, slug: str) -> None:
        self.slug = slug
        self._grid = self._split("photos.guest_image", kind="grid")
        self._view = self._split("photos.guest_image", kind="view")
        self._download = self._split("downloads.photo")
        self._web_download = self._split("downloads.photo", size="web")
        self._play = self._split("video.guest_play")
        settings = services().settings
        self.grid_px, self.view_px = settings.grid_px, settings.view_px
        # What the URLs are made of, for FragmentCache's key (None: that endpoint is built per photo).
        self.key = (slug, self._grid, self._view, self._download, self._web_download, self._play, self.grid_px,
                    self.view_px)

    def _split(self, endpoint: str, **values: Any) -> tuple[str, str] | None:
        built = url_for(endpoint, slug=self.slug, photo_id=self.SENTINEL, **values)
        parts = built.split(str(self.SENTINEL))
        return (parts[0], parts[1]) if len(parts) == 2 else None

    def _url(self, halves: tuple[str, str] | None, endpoint: str, photo_id: int, **values: Any) -> str:
        if halves is None:
            return url_for(endpoint, slug=self.slug, photo_id=photo_id, **values)
        return f"{halves[0]}{photo_id}{halves[1]}"

    def grid(self, photo_id: int) -> str:
        return self._url(self._grid, "photos.guest_image", photo_id, kind="grid")

    def view(self, photo_id: int) -> str:
        return self._url(self._view, "photos.guest_image", photo_id, kind="view")

    def srcset(self, photo_id: int, width: int, height: int) -> str:
        """The grid and the view image with their real widths, so that a browser picks the one that fills a tile
        (or the lightbox) at the screen's pixel ratio: a portrait grid image is 267 px wide, not 400."""
        def across(long_edge: int) -> int:
            return max(1, round(width * min(1.0, long_edge / max(width, height))))
        return f"{self.grid(photo_id)} {across(self.grid_px)}w, {self.view(photo_id)} {across(self.view_px)}w"

    def download(self, photo_id: int) -> str:
        return self._url(self._download, "downloads.photo", photo_id)

    def web_download(self, photo_id: int) -> str:
        return self._url(self._web_download, "downloads.photo", photo_id, size="web")

    def play(self, photo_id: int) -> str:
        return self._url(self._play, "video.guest_play", photo_id)


def photo_json(gallery: dict[str, Any], photo: dict[str, Any], position: int | None = None,
               urls: PhotoUrls | None = None) -> dict[str, Any]:
    """What the page and the JSON listing know of one photo. ``urls``: the gallery's, when a page lists many."""
    pid = photo["id"]
    urls = urls or PhotoUrls(gallery["slug"])
    taken = taken_label(photo.get("taken_at"))
    video = photo.get("media_type") == "video"
    if taken:
        alt = _("Video taken %(date)s") if video else _("Photo taken %(date)s")
        alt = alt % {"date": taken}
    elif position:
        alt = (_("Video %(num)s") if video else _("Photo %(num)s")) % {"num": position}
    else:
        alt = _("Video") if video else _("Photo")
    return {
        "id": pid,
        "width": photo["width"] or 1,
        "height": photo["height"] or 1,
        "ratio_class": ratio_class(photo["width"], photo["height"]),
        "grid_url": urls.grid(pid),
        "view_url": urls.view(pid),
        "srcset": urls.srcset(pid, photo["width"] or 1, photo["height"] or 1),
        "download_url": urls.download(pid) if gallery["allow_downloads"] else None,
        "web_download_url": (urls.web_download(pid)
                             if gallery["allow_downloads"] and photo.get("media_type") != "video" else None),
        "favourite": bool(photo.get("favourite")),
        "taken": taken,
        "camera": camera_line(photo),
        "alt": alt,
        **video_fields(photo, urls.play(pid), originals=bool(gallery["allow_downloads"])),
    }


def _page_rows(conn: Connection, gallery_id: int, guest: Guest | None, *, sort: str, cursor: Any,
               favourites_only: bool, limit: int) -> tuple[list[dict[str, Any]], str | None]:
    """One page of listing rows and the ``next`` cursor (None on the last page); ``cursor`` is the decoded
    ``after`` (:func:`_cursor`)."""
    rows, more = listing.list_photos(conn, gallery_id, sort=sort, after=cursor, limit=limit,
                                     guest_session_id=guest.id if guest else None, favourites_only=favourites_only)
    return rows, listing.encode_cursor(sort, rows[-1]) if more and rows else None


async def _page(gallery: dict[str, Any], guest: Guest | None, *, sort: str, after: str | None,
                favourites_only: bool, limit: int = listing.PAGE_SIZE) -> dict[str, Any]:
    cursor = _cursor(sort, after)
    rows, next_cursor = await services().db.read(
        lambda conn: _page_rows(conn, gallery["id"], guest, sort=sort, cursor=cursor,
                                favourites_only=favourites_only, limit=limit))
    urls = PhotoUrls(gallery["slug"])
    return {"photos": [photo_json(gallery, row, urls=urls) for row in rows], "next": next_cursor}


class FragmentCache:
    """Each listed photo's JSON text, split around its ``favourite`` value, keyed by everything it is made of.

    At 200 photos, making the dicts (labels, URLs) and encoding them (sorted keys) was most of the listing's
    server time; both are the same for every guest until the photo or the gallery changes. The key is the
    whole input of :func:`photo_json`: the gallery's URL halves and downloads setting, and every column the
    listing selects (``listing.COLUMN_NAMES``). So a changed photo or setting is a new key, never a stale hit,
    and nothing has to be told of writes: what may be listed (hidden, pending, deleted, expired, password) is
    still decided by the query and ``load_gallery`` on every request. The guest's own heart is not in the
    text; it is put between the halves per request. Least recently used entries go past ``size`` entries
    (about 1.5 KB each: bounded memory whatever the galleries hold). Used only from the event loop's thread.
    """

    SIZE = 8192

    def __init__(self, size: int = SIZE) -> None:
        self.size = size
        self._entries: OrderedDict[tuple[Any, ...], tuple[str, str]] = OrderedDict()

    def get(self, key: tuple[Any, ...]) -> tuple[str, str] | None:
        found = self._entries.get(key)
        if found is not None:
            self._entries.move_to_end(key)
        return found

    def put(self, key: tuple[Any, ...], halves: tuple[str, str]) -> None:
        self._entries[key] = halves
        if len(self._entries) > self.size:
            self._entries.popitem(last=False)

    def __len__(self) -> int:
        return len(self._entries)


_row_key = operator.itemgetter(*listing.COLUMN_NAMES)
_FAVOURITE_FALSE = '"favourite":false'


@blueprint.record_once
def _add_fragment_cache(state: BlueprintSetupState) -> None:
    state.app.extensions["picpeak_listing_fragments"] = FragmentCache()


def _compact_json() -> DefaultJSONProvider | None:
    """The app's JSON provider if it writes what the fragments are (compact, sorted keys), else None."""
    provider = current_app.json
    if not isinstance(provider, DefaultJSONProvider) or not provider.sort_keys:
        return None
    compact = provider.compact if provider.compact is not None else not current_app.debug
    return provider if compact else None


def _listing_body(gallery: dict[str, Any], rows: list[dict[str, Any]], next_cursor: str | None,
                  provider: DefaultJSONProvider) -> str:
    """``{"next":...,"photos":[...]}`` as ``provider.response`` writes it, byte for byte, from cached fragments."""
    cache: FragmentCache = current_app.extensions["picpeak_listing_fragments"]
    urls = PhotoUrls(gallery["slug"])
    downloads = bool(gallery["allow_downloads"])
    gallery_key = (urls.key, downloads, i18n.current_locale())  # the labels are in the page's language
    texts = []
    for row in rows:
        key = (gallery_key, _row_key(row))
        halves = cache.get(key)
        if halves is None:
            text = provider.dumps(photo_json(gallery, {**row, "favourite": False}, urls=urls), separators=(",", ":"))
            before, after = text.split(_FAVOURITE_FALSE)  # a key is the only place `"favourite":` can be
            halves = (before + '"favourite":', after)
            cache.put(key, halves)
        texts.append(f"{halves[0]}{'true' if row['favourite'] else 'false'}{halves[1]}")
    next_json = provider.dumps(next_cursor)
    return f'{{"next":{next_json},"photos":[{",".join(texts)}]}}\n'


@blueprint.get("/g/<slug>")
async def gallery(slug: str) -> Any:
    svc = services()
    row = await load_gallery(slug)
    # A session from the first visit: the hearts and their CSRF token need one.
    guest = await current_guest(create=True)
    sort = request.args.get("sort", "taken")
    if sort not in listing.SORTS:
        sort = "taken"
    favourites_only = request.args.get("favourites") == "1"
    page = await _page(row, guest, sort=sort, after=None, favourites_only=favourites_only)

    def counts(conn: Any) -> tuple[int, int, dict[str, Any] | None, dict[str, Any], list[dict[str, Any]]]:
        return (listing.count_visible(conn, row["id"]),
                favourite_q.count_for_guest(conn, guest.id, row["id"]) if guest else 0,
                listing.cover_photo(conn, row), listing.download_totals(
                    conn, row["id"], images.WEB_PX, (images.WEB_SCALED_BASE, images.WEB_SCALED_SLOPE),
                    images.WEB_UNSCALED),
                moderation_q.own_waiting(conn, row["id"], guest.id) if guest else [])

    total, favourite_count, cover, totals, own_waiting = await svc.db.read(counts)
    # The photographer looking at the page (preview, or the "Open" link) is not a guest's visit.
    if not g.get("admin_preview") and await admin_from_cookie() is None:
        svc.activity.count(row["id"], "views")
    cover_url = (url_for("photos.guest_image", slug=slug, photo_id=cover["id"], kind="view") if cover else None)
    # The cover is cropped to the hero's shape: it keeps the watermark's corner in the frame (guest.css).
    mark = (await svc.db.read(admin_settings.gallery_watermark, svc.settings, row)
            if cover and row["watermark"] else None)
    return await render_template(
        "guest/gallery.html", gallery=row, page=page, total=total, sort=sort, favourites_only=favourites_only,
        favourite_count=favourite_count, cover=cover, cover_url=cover_url, guest=guest,
        download_sizes={"original": size_label(totals["bytes"]), "web": size_label(totals["web_bytes"])},
        og_image=f"{base_url()}{cover_url}" if cover_url and row["password_hash"] is None else None,
        og_url=f"{base_url()}/g/{slug}", own_waiting=own_waiting, cover_mark=mark.position if mark else "",
        can_send_selection=email.enabled(svc.settings),
    )


@blueprint.get("/api/g/<slug>/photos")
async def photos_page(slug: str) -> Any:
    """``{"photos": [...], "next": cursor-or-null}``; ``after`` is the ``next`` of the previous page."""
    try:
        sort, cursor, limit = _listing_args()
    except BadRequest:
        await load_gallery(slug)  # a gallery this guest may not see says so before a wrong argument does
        raise
    favourites_only = request.args.get("favourites") == "1"
    provider = _compact_json()
    if provider is None:  # debug mode's indented JSON: the plain way
        row = await load_gallery(slug)
        guest = await current_guest(create=False)
        return await _page(row, guest, sort=sort, after=request.args.get("after"), favourites_only=favourites_only,
                           limit=limit)
    # The guest, the gallery and the page's rows in one read (load_gallery_with says why).
    row, found = await load_gallery_with(
        slug, lambda conn, gallery, guest: _page_rows(conn, gallery["id"], guest, sort=sort, cursor=cursor,
                                                      favourites_only=favourites_only, limit=limit))
    assert found is not None
    rows, next_cursor = found
    return current_app.response_class(_listing_body(row, rows, next_cursor, provider), mimetype=provider.mimetype)


def _listing_args() -> tuple[str, Any, int]:
    """The listing's ``sort``, decoded ``after`` cursor (None for the first page) and ``limit``."""
    sort = _sort_arg()
    try:
        limit = int(request.args.get("limit", listing.PAGE_SIZE))
    except ValueError as error:
        raise BadRequest(_("limit must be a number.")) from error
    return sort, _cursor(sort, request.args.get("after")), limit


def _cursor(sort: str, after: str | None) -> Any:
    if not after:
        return None
    try:
        return listing.decode_cursor(sort, after)
    except listing.BadCursor as error:
        raise BadRequest(_("The 'after' cursor is not valid; reload the gallery.")) from error


@blueprint.get("/g/<slug>/upload")
async def upload_page(slug: str) -> Any:
    row = await load_gallery(slug)
    if not row["allow_guest_uploads"]:
        raise Forbidden(_("This gallery does not accept photos from guests."))
    guest = await current_guest(create=True)
    settings = services().settings
    return await render_template(
        "guest/upload.html", gallery=row, guest=guest, max_file_mb=settings.guest_max_file_mb,
        max_files=settings.guest_max_files, max_video_mb=settings.guest_max_video_mb,
        max_video_length=duration_label(settings.guest_max_video_seconds), upload_chunk_mb=settings.upload_chunk_mb,
    )


@blueprint.post("/g/<slug>/password")
async def password_submit(slug: str) -> Any:
    svc = services()
    guest = await current_guest(create=False)
    await check_guest_state_change(guest)
    assert guest is not None
    row = await svc.db.read(access.gallery_for_password_form, slug, svc.clock())
    form = await request.form
    # Back to the page the guest came for (the upload page, from a QR code), if it is one of this gallery's.
    pages = (url_for("guest.gallery", slug=slug), url_for("guest.upload_page", slug=slug))
    asked = form.get("next", "")
    back = asked if asked in pages else pages[0]
    if row["password_hash"] is None:
        return redirect(back)
    proof = f"g{row['id']}"
    device = trusted_device(proof, row["password_hash"])
    async with limits().password_throttle.guard(f"gallery:{row['id']}", client_ip(), device) as attempt:
        ok = await svc.verify_password(row["password_hash"], form.get("password", ""))
        if ok:
            attempt.succeeded()
        else:
            attempt.failed()
    if not ok:
        raise access.PasswordRequired(row, wrong_password=True, return_to=back)
    prove_device(proof, row["password_hash"])
    await svc.db.write(guest_q.grant_access, guest.id, row["id"], row["password_version"], svc.clock())
    return redirect(back)
