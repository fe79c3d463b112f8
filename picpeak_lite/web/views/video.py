"""Playing a video: its original (or playable preview) inline, with HTTP Range requests, under the photos' rules.

``/g/<slug>/photos/<id>/play`` for guests (the gallery and the photo through ``domain/access.py``, exactly as the
grid and view images: a guest who may see the poster may play the clip) and ``/api/admin/photos/<id>/play`` for
the admin. Browsers fetch video in byte ranges to start fast and to seek: ``web/files.py`` ``send_media`` answers
206 with ``Content-Range``, honours ``If-Range`` (a changed file gets the whole body) and answers 416 for a range
past the end. A clip Chromium cannot play (HEVC) is served as its H.264 preview once the preview lane made one;
until then this answers 409 with the sentence the lightbox shows next to its download link.

In a gallery with downloads off (``/download`` answers 403 there) a guest's ``/play`` never sends the original:
it sends the playable copy, which the preview lane makes for every video of such a gallery (at upload, or when
downloads are turned off), and answers 409 with :data:`PREPARING` until the copy exists. The copy is to the
original what the view image is to a photo: good to watch, not the photographer's file.
"""

from __future__ import annotations

from typing import Any

from quart import Blueprint, Response

from picpeak_lite.domain import access
from picpeak_lite.errors import Conflict, NotFound, NotReady
from picpeak_lite.i18n import N_, _
from picpeak_lite.store.queries import photos as photo_q
from picpeak_lite.store.queries.photos import PhotoStatus
from picpeak_lite.store.storage import original_name, preview_name
from picpeak_lite.web.auth import gallery_api, services
from picpeak_lite.web.files import send_media, send_stored
from picpeak_lite.web.playback import NO_PLAYBACK, NO_PREVIEW, PREPARING, PREVIEW_FAILED
from picpeak_lite.web.views.common import load_gallery

blueprint = Blueprint("video", __name__)

NOT_A_VIDEO = N_("This is a photo, not a video.")


@blueprint.get("/api/admin/photos/<int:photo_id>/play")
@gallery_api
async def admin_play(photo_id: int) -> Response:
    photo = await services().db.read(photo_q.get, photo_id)
    if photo is None:
        raise NotFound(_("There is no such photo."))
    return await play(photo)


@blueprint.get("/g/<slug>/photos/<int:photo_id>/play")
async def guest_play(slug: str, photo_id: int) -> Response:
    gallery = await load_gallery(slug)
    photo = await services().db.read(access.visible_photo, gallery, photo_id)
    return await play(photo, originals=bool(gallery["allow_downloads"]))


async def play(photo: dict[str, Any], *, originals: bool = True) -> Response:
    """The video's playable copy when one is made, else its original when browsers play it and ``originals``
    (the viewer may have the file: the admin, or a guest where downloads are on)."""
    if photo.get("media_type") != "video":
        raise NotFound(_(NOT_A_VIDEO))
    if photo["status"] in (PhotoStatus.PENDING, PhotoStatus.PROCESSING):
        raise NotReady(_("This video is still being processed."), retry_after=5)
    storage = services().storage
    preview = photo.get("preview_status")
    playable = preview is None or photo.get("video_codec") in photo_q.BROWSER_CODECS
    if preview == "complete":
        name, mime = preview_name(photo["storage_key"]), "video/mp4"
    elif originals and playable:
        name, mime = original_name(photo["storage_key"]), photo_q.VIDEO_MIME[photo["format"]]
    elif not originals:
        raise Conflict(_(NO_PLAYBACK if preview == "failed" else PREPARING))
    else:
        raise Conflict(_(PREVIEW_FAILED if preview == "failed" else NO_PREVIEW))
    path = storage.local_path(name)
    try:
        if path is None:  # in a bucket: streamed (or redirected) with the object's ranges and ETag
            return await send_stored(name, mime)
        if not path.exists():
            raise FileNotFoundError(name)
        return await send_media(path, mime)
    except FileNotFoundError:
        raise NotFound(_(photo_q.ORIGINAL_MISSING)) from None
