"""Guests' likes, star ratings and comments on photos, the photographer's moderation of comments, and the
feedback exports (a CSV, a readable list, and a zip of XMP sidecars for Lightroom Classic).

Guests, under ``/api/g/<slug>/photos/<photo_id>/``: ``GET feedback`` (counts, this guest's like and rating, the
comments it may see), ``PUT`` / ``DELETE like``, ``PUT`` (``{"stars": 1..5}``) / ``DELETE rating``, ``POST
comments`` (``{"text": ..., "name": ...}``; the name only when the session has none yet). Changes are a guest's
state changes as hearts are: same origin, the session's CSRF token, the per-session rate limit, and comments a
stricter one of their own (``WebLimits.comment_rate_limit``). The photo must be one the guest may see; anything
else is 404, whether it exists or not.

The admin: ``GET`` / ``POST /api/admin/galleries/<id>/comments`` (the list; ``{"action": "approve" | "reject" |
"delete", "ids": [...]}``) and the same action as a form post under ``/admin`` that redirects back;
``/admin/galleries/<id>/feedback.csv`` / ``.txt`` and ``/admin/galleries/<id>/sidecars.zip``. The rules and
formats are ``domain/feedback.py``'s; everyone is told of changes by the gallery feeds (``web/views/live.py``).
"""

from __future__ import annotations

import io
import re
import zipfile
from typing import Any

import trio
from quart import Blueprint, Response, redirect, request, url_for

from picpeak_lite.domain import access, feedback, galleries
from picpeak_lite.errors import BadRequest, NotFound, TooManyRequests
from picpeak_lite.i18n import _
from picpeak_lite.pipeline.intake import clean_guest_name
from picpeak_lite.store.db import Connection, fits_integer
from picpeak_lite.store.queries import feedback as feedback_q
from picpeak_lite.store.queries import guests as guest_q
from picpeak_lite.web.auth import check_guest_state_change, current_guest, gallery_api, gallery_page, limits, services
from picpeak_lite.web.views.common import action_and_ids, current_actor, load_gallery

blueprint = Blueprint("feedback", __name__)

MAX_IDS = 5000
REVIEWED = {"approve": "approved", "reject": "rejected", "delete": "deleted"}  # the audit trail's action
PHOTO = "/api/g/<slug>/photos/<int:photo_id>"


async def _guest_change(slug: str) -> tuple[dict[str, Any], Any]:
    gallery = await load_gallery(slug)
    guest = await current_guest(create=False)
    await check_guest_state_change(guest)
    assert guest is not None
    await limits().guest_rate_limit.take(guest.id)
    return gallery, guest


async def _body() -> dict[str, Any]:
    data = await request.get_json(force=True, silent=True)
    if not isinstance(data, dict):
        raise BadRequest(_("Send a JSON object."))
    return data


def _photo_feedback(conn: Connection, photo_id: int, guest_session_id: int | None) -> dict[str, Any]:
    return {"id": photo_id, **feedback.summary_json(feedback_q.summary(conn, photo_id, guest_session_id)),
            "comment_list": [feedback.comment_json(c, guest_session_id=guest_session_id)
                             for c in feedback_q.comments_for(conn, photo_id, guest_session_id=guest_session_id,
                                                              admin=False)]}


@blueprint.get(PHOTO + "/feedback")
async def photo_feedback(slug: str, photo_id: int) -> dict[str, Any]:
    svc = services()
    gallery = await load_gallery(slug)
    guest = await current_guest(create=False)
    guest_id = guest.id if guest else None

    def read(conn: Connection) -> dict[str, Any]:
        access.visible_photo(conn, gallery, photo_id)
        return _photo_feedback(conn, photo_id, guest_id)

    return {**await svc.db.read(read), "name": guest.name if guest else None,
            "hold_comments": bool(gallery["hold_comments"])}


@blueprint.route(PHOTO + "/like", methods=["PUT", "DELETE"])
async def like(slug: str, photo_id: int) -> dict[str, Any]:
    svc = services()
    gallery, guest = await _guest_change(slug)
    adding = request.method == "PUT"

    def change(conn: Connection) -> dict[str, Any]:
        access.visible_photo(conn, gallery, photo_id)
        if adding:
            feedback_q.set_like(conn, guest.id, photo_id, svc.clock())
        else:
            feedback_q.remove_like(conn, guest.id, photo_id)
        return feedback.summary_json(feedback_q.summary(conn, photo_id, guest.id))

    return {"id": photo_id, **await svc.db.write(change)}


@blueprint.route(PHOTO + "/rating", methods=["PUT", "DELETE"])
async def rating(slug: str, photo_id: int) -> dict[str, Any]:
    svc = services()
    gallery, guest = await _guest_change(slug)
    await svc.db.read(access.visible_photo, gallery, photo_id)  # a photo the guest may not see is 404 first
    stars = feedback.parse_stars((await _body()).get("stars")) if request.method == "PUT" else None

    def change(conn: Connection) -> dict[str, Any]:
        access.visible_photo(conn, gallery, photo_id)
        if stars is not None:
            feedback_q.set_rating(conn, guest.id, photo_id, stars, svc.clock())
        else:
            feedback_q.remove_rating(conn, guest.id, photo_id)
        return feedback.summary_json(feedback_q.summary(conn, photo_id, guest.id))

    return {"id": photo_id, **await svc.db.write(change)}


@blueprint.post(PHOTO + "/comments")
async def comment(slug: str, photo_id: int) -> tuple[dict[str, Any], int]:
    svc = services()
    gallery, guest = await _guest_change(slug)
    await svc.db.read(access.visible_photo, gallery, photo_id)  # a photo the guest may not see is 404 first
    data = await _body()
    body = feedback.clean_comment(data.get("text"))
    raw_name = data.get("name")
    if raw_name is not None and not isinstance(raw_name, str):
        raise BadRequest(_("The name must be text."))
    name = guest.name or clean_guest_name(raw_name)
    if not name:
        raise BadRequest(_("Tell us your name first: it is shown with your comment."))
    try:
        await limits().comment_rate_limit.take(guest.id)
    except TooManyRequests as error:
        raise TooManyRequests(error.retry_after, _("You are commenting very fast: please wait %(seconds)d seconds "
                                                   "and try again.") % {"seconds": error.retry_after}) from None

    def change(conn: Connection) -> dict[str, Any]:
        access.visible_photo(conn, gallery, photo_id)
        if not guest.name:
            guest_q.set_name(conn, guest.id, name)
        row = feedback.add_comment(conn, gallery, photo_id, guest.id, name, body, svc.clock())
        return {"comment": feedback.comment_json(row, guest_session_id=guest.id),
                **_photo_feedback(conn, photo_id, guest.id)}

    result = await svc.db.write(change)
    held = result["comment"]["status"] == "held"
    return {**result, "name": name,
            "message": _("Thank you! Your comment is shown to others once the photographer has approved it.")
            if held else None}, 201


# --- the photographer --------------------------------------------------------------------------------------

@blueprint.get("/api/admin/galleries/<int:gallery_id>/comments")
@gallery_api
async def comments_api(gallery_id: int) -> dict[str, Any]:
    svc = services()
    gallery = await galleries.get_gallery(svc, gallery_id)
    rows = await svc.db.read(feedback_q.gallery_comments, gallery_id)
    return {"gallery_id": gallery_id, "hold_comments": bool(gallery["hold_comments"]),
            "comments": [{**feedback.comment_json(r), "filename": r["display_name"]} for r in rows]}


@blueprint.post("/api/admin/galleries/<int:gallery_id>/comments")
@gallery_api
async def review_api(gallery_id: int) -> dict[str, Any]:
    action, ids = await action_and_ids('"approve"')
    done = await apply_review(gallery_id, action, ids)
    return {"action": action, "changed": done, "ids": done}


@blueprint.post("/admin/galleries/<int:gallery_id>/comments")
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
    return redirect(url_for("admin.gallery", gallery_id=gallery_id) + "#feedback")


async def apply_review(gallery_id: int, action: Any, ids: list[int]) -> list[int]:
    svc = services()
    if action not in feedback.ACTIONS:
        raise BadRequest(_("Choose one of: %(actions)s.") % {"actions": ", ".join(feedback.ACTIONS)})
    if not ids:
        raise BadRequest(_("Select at least one comment."))
    if len(ids) > MAX_IDS:
        raise BadRequest(_("At most %(max)d comments at once.") % {"max": MAX_IDS})
    await galleries.get_gallery(svc, gallery_id)
    actor, now = await current_actor(), svc.clock()

    def review_and_record(conn: Connection) -> list[int]:
        done = feedback.review(conn, gallery_id, action, ids, now)
        if done:  # the trail says what happened: nothing when every comment was already dealt with
            actor.record(conn, now, f"comments.{REVIEWED[action]}", gallery_id=gallery_id,
                         detail="comments " + ", ".join(map(str, done)))
        return done

    return await svc.db.write(review_and_record)


def _export_rows(conn: Connection, gallery_id: int) -> tuple[list[Any], list[Any], list[Any]]:
    return (feedback_q.per_photo(conn, gallery_id), feedback_q.approved_comments(conn, gallery_id),
            feedback_q.ratings_by_name(conn, gallery_id))


@blueprint.get("/admin/galleries/<int:gallery_id>/feedback.<any(csv, txt):fmt>")
@gallery_page
async def export(gallery_id: int, fmt: str) -> Response:
    svc = services()
    gallery = await galleries.get_gallery(svc, gallery_id)
    photos, comments, ratings = await svc.db.read(_export_rows, gallery_id)
    if not photos:
        raise NotFound(_("No guest has given feedback on a photo yet."))
    if fmt == "csv":
        text, mimetype = feedback.feedback_csv(photos, comments, ratings), "text/csv"
    else:
        text, mimetype = feedback.feedback_text(photos, comments), "text/plain"
    return _attachment(Response(text, content_type=f"{mimetype}; charset=utf-8"),
                       f"{_safe(gallery['slug'])}-feedback.{fmt}")


@blueprint.get("/admin/galleries/<int:gallery_id>/sidecars.zip")
@gallery_page
async def sidecars_zip(gallery_id: int) -> Response:
    """Every photo with feedback or a favourite as ``<original stem>.xmp`` in one zip (small files: built in
    memory, in a thread)."""
    svc = services()
    gallery = await galleries.get_gallery(svc, gallery_id)
    photos, comments, _ratings = await svc.db.read(_export_rows, gallery_id)
    if not photos:
        raise NotFound(_("No guest has given feedback on a photo yet."))

    def build() -> bytes:
        out = io.BytesIO()
        with zipfile.ZipFile(out, "w", zipfile.ZIP_DEFLATED) as archive:
            for name, data in feedback.sidecars(photos, comments):
                archive.writestr(name, data)
        return out.getvalue()

    data = await trio.to_thread.run_sync(build, limiter=limits().download_limiter)
    return _attachment(Response(data, mimetype="application/zip"), f"{_safe(gallery['slug'])}-xmp-sidecars.zip")


def _attachment(response: Response, filename: str) -> Response:
    response.headers["Content-Disposition"] = f'attachment; filename="{filename}"'
    response.headers["Cache-Control"] = "private, no-store"
    response.headers["X-Content-Type-Options"] = "nosniff"
    return response


def _safe(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9]+", "-", text).strip("-").lower()[:60] or "gallery"
