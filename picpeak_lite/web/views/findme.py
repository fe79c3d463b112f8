""""Find me" (issue 36): a guest's selfie search, and the photographer's switch and face index.

Guests: ``GET /g/<slug>/findme`` (the consent notice, then the camera or a chosen photo), ``POST
/api/g/<slug>/findme`` with the picture as the raw body (``image/*``, at most ``MAX_SELFIE``), answered with the
photos that match (ids, image URLs, how near; never an embedding), ``POST /api/g/<slug>/findme/not-me``
(``{"face": id, "shown": [{"face": id, "distance": d}, ...]}``: the results on the guest's screen) which
remembers, for this guest session, that the face is not them and says which of the shown faces to hide with it
(``pipeline/faces.like_refused``). The selfie is read into memory (never a multipart form, whose parser
spools big files to disk), embedded in an image child and dropped: no file, no row, no log line holds it.

The photographer (the gallery guard): ``POST /admin/galleries/<id>/findme`` (switch, and whether guests' own
photos are indexed) and ``POST /admin/galleries/<id>/findme/delete`` (the index goes at once, the switch off).
"""

from __future__ import annotations

from typing import Any

from quart import Blueprint, redirect, render_template, request, url_for

from picpeak_lite.domain import galleries
from picpeak_lite.errors import BadRequest, NotFound, TooLarge, TooManyRequests, Unprocessable, UnsupportedMedia
from picpeak_lite.i18n import _, ngettext
from picpeak_lite.media import faces as media_faces
from picpeak_lite.pipeline import faces
from picpeak_lite.store.db import Connection, fits_integer
from picpeak_lite.store.queries import faces as faces_q
from picpeak_lite.web.auth import (
    Guest,
    check_guest_state_change,
    current_guest,
    gallery_page,
    limits,
    services,
)
from picpeak_lite.web.views.common import current_actor, load_gallery

blueprint = Blueprint("findme", __name__)

MAX_SELFIE = 12 * 1024 * 1024
MAX_SHOWN = 1000
# "Not me" is remembered per guest session and gallery, at most this many faces (store/queries/faces.py).
MAX_EXCLUDED = 2000


def _problem(kind: str) -> str:
    return {
        "no_face": _("No face was found in this picture. Try again facing the camera, in good light."),
        "several_faces": _("This picture shows more than one face. Take a selfie of just yourself."),
        "unreadable": _("This picture could not be read. Try a JPEG, PNG or HEIC photo."),
        "too_slow": _("Looking at this picture took too long. Try a smaller one."),
    }[kind]


async def _gallery_with_find_me(slug: str) -> dict[str, Any]:
    gallery = await load_gallery(slug)
    if not gallery["find_me"]:
        raise NotFound(_("\"Find me\" is not switched on for this gallery."))
    return gallery


@blueprint.get("/g/<slug>/findme")
async def page(slug: str) -> Any:
    gallery = await _gallery_with_find_me(slug)
    guest = await current_guest(create=True)
    return await render_template("guest/findme.html", gallery=gallery, guest=guest,
                                 available=media_faces.available(), how_to_enable=faces.how_to_enable(),
                                 max_mb=MAX_SELFIE // (1024 * 1024))


async def _searching_guest(slug: str) -> tuple[dict[str, Any], Guest]:
    gallery = await _gallery_with_find_me(slug)
    guest = await current_guest(create=False)
    await check_guest_state_change(guest)
    assert guest is not None
    return gallery, guest


@blueprint.post("/api/g/<slug>/findme")
async def search(slug: str) -> dict[str, Any]:
    gallery, guest = await _searching_guest(slug)
    if not media_faces.available():
        raise Unprocessable(faces.how_to_enable())
    if not request.mimetype.startswith("image/") and request.mimetype != "application/octet-stream":
        raise UnsupportedMedia(_("Send the picture itself (an image) as the request's body."))
    if request.content_length is not None and request.content_length > MAX_SELFIE:
        raise TooLarge(_("The picture is too large; at most %(mb)d MB.") % {"mb": MAX_SELFIE // (1024 * 1024)})
    try:
        await limits().findme_rate_limit.take(guest.id)
    except TooManyRequests as error:
        raise TooManyRequests(error.retry_after,
                              _("Too many searches at once; please wait a few seconds and try again.")) from None
    data = await request.get_data(cache=False, as_text=False, parse_form_data=False)
    assert isinstance(data, bytes)  # as_text=False
    if len(data) > MAX_SELFIE:
        raise TooLarge(_("The picture is too large; at most %(mb)d MB.") % {"mb": MAX_SELFIE // (1024 * 1024)})
    if not data:
        raise BadRequest(_("The picture is empty."))
    svc = services()
    try:
        async with limits().findme_limiter:
            query = await faces.selfie_embedding(svc, data)
    except faces.SelfieProblem as problem:
        raise Unprocessable(_problem(problem.kind), kind=problem.kind) from None
    finally:
        del data
    excluded = await svc.db.read(faces_q.not_me_of, guest.id, gallery["id"])
    matches = await faces.search(svc, gallery["id"], query, excluded, limiter=limits().findme_compare)
    return {"matches": [_match_json(gallery["slug"], match) for match in matches], "message": _found(len(matches))}


def _found(count: int) -> str:
    if not count:
        return _("No photo of you was found yet.")
    return ngettext("%(num)d photo found.", "%(num)d photos found.", count) % {"num": count}


def _match_json(slug: str, match: faces.Match) -> dict[str, Any]:
    return {"photo_id": match.photo_id, "face_id": match.face_id, "distance": round(match.distance, 3),
            "grid_url": url_for("photos.guest_image", slug=slug, photo_id=match.photo_id, kind="grid"),
            "view_url": url_for("photos.guest_image", slug=slug, photo_id=match.photo_id, kind="view")}


@blueprint.post("/api/g/<slug>/findme/not-me")
async def not_me(slug: str) -> dict[str, Any]:
    gallery, guest = await _searching_guest(slug)
    await limits().guest_rate_limit.take(guest.id)
    data = await request.get_json(force=True, silent=True)
    if not isinstance(data, dict):
        raise BadRequest(_("Send a JSON object."))
    refused, shown = data.get("face"), _shown(data.get("shown", []))
    if not isinstance(refused, int) or not fits_integer(refused) or shown is None:
        raise BadRequest(_("Say which face is not you (its number) and which faces are shown."))
    svc = services()
    hide = await faces.like_refused(svc, gallery["id"], refused, shown)
    if not hide:
        raise NotFound(_("That face is not in this gallery."))
    await svc.db.write(faces_q.add_not_me, guest.id, gallery["id"], hide, MAX_EXCLUDED)
    return {"hide": hide, "message": _found(len(set(shown) - set(hide)))}


def _shown(value: Any) -> dict[int, float] | None:
    """``[{"face": id, "distance": d}, ...]`` as {id: d}, or None when it is not that."""
    if not isinstance(value, list) or len(value) > MAX_SHOWN:
        return None
    shown = {}
    for item in value:
        face, distance = (item.get("face"), item.get("distance")) if isinstance(item, dict) else (None, None)
        if (not isinstance(face, int) or isinstance(face, bool) or not fits_integer(face)
                or not isinstance(distance, int | float) or isinstance(distance, bool) or not 0 <= distance <= 4):
            return None
        shown[face] = float(distance)
    return shown


@blueprint.post("/admin/galleries/<int:gallery_id>/findme")
@gallery_page
async def switch(gallery_id: int) -> Any:
    svc = services()
    await galleries.get_gallery(svc, gallery_id)
    form = await request.form
    on = form.get("find_me") == "on"
    if on and not media_faces.available():
        raise Unprocessable(faces.how_to_enable())
    guest_uploads, actor, now = form.get("find_me_guest_uploads") == "on", await current_actor(), svc.clock()

    def switch_and_record(conn: Connection) -> None:
        faces_q.set_find_me(conn, gallery_id, on, guest_uploads, now)
        actor.record(conn, now, "gallery.updated", gallery_id=gallery_id,
                     detail=f"find me {'on' if on else 'off'}, guests' photos {'on' if guest_uploads else 'off'}")

    await svc.db.write(switch_and_record)
    if on:
        svc.faces_bell.ring()
    return redirect(url_for("admin.gallery", gallery_id=gallery_id) + "#findme")


@blueprint.post("/admin/galleries/<int:gallery_id>/findme/delete")
@gallery_page
async def delete_index(gallery_id: int) -> Any:
    svc = services()
    await galleries.get_gallery(svc, gallery_id)
    actor, now = await current_actor(), svc.clock()

    def delete_and_record(conn: Connection) -> None:
        deleted = faces_q.delete_index(conn, gallery_id, now)
        actor.record(conn, now, "gallery.updated", gallery_id=gallery_id,
                     detail=f"find me off, face index deleted ({deleted} faces)")

    await svc.db.write(delete_and_record)
    return redirect(url_for("admin.gallery", gallery_id=gallery_id) + "#findme")
