"""Hearts: a guest marks photos it likes, and may say who it is.

``PUT`` / ``DELETE /api/g/<slug>/favourites/<photo_id>`` add and remove a heart; ``POST /api/g/<slug>/guest``
sets the optional guest name. All three are state changes by a guest: same origin and the session's CSRF
token (``auth.check_guest_state_change``), and a per-session rate limit (:class:`..ratelimit.RateLimit`).
The photo must be one the guest may see in that gallery (``access.visible_photo``); anything else is 404,
whether it exists or not.
"""

from __future__ import annotations

from typing import Any

from quart import Blueprint, request

from picpeak_lite.domain import access, proofing
from picpeak_lite.errors import BadRequest
from picpeak_lite.i18n import _
from picpeak_lite.pipeline.intake import clean_guest_name
from picpeak_lite.store.queries import favourites as favourite_q
from picpeak_lite.store.queries import guests as guest_q
from picpeak_lite.web.auth import check_guest_state_change, current_guest, limits, services
from picpeak_lite.web.views.common import load_gallery

blueprint = Blueprint("favourites", __name__)


async def _guest_change(slug: str) -> tuple[dict[str, Any], Any]:
    gallery = await load_gallery(slug)
    guest = await current_guest(create=False)
    await check_guest_state_change(guest)
    assert guest is not None
    await limits().guest_rate_limit.take(guest.id)
    return gallery, guest


@blueprint.route("/api/g/<slug>/favourites/<int:photo_id>", methods=["PUT", "DELETE"])
async def favourite(slug: str, photo_id: int) -> dict[str, Any]:
    svc = services()
    gallery, guest = await _guest_change(slug)
    adding = request.method == "PUT"

    def change(conn: Any) -> tuple[int, bool]:
        access.visible_photo(conn, gallery, photo_id)
        added = False
        if adding:
            proofing.check_favourite_limit(conn, gallery, guest.id, photo_id)
            added = favourite_q.add(conn, guest.id, photo_id, svc.clock())
        else:
            favourite_q.remove(conn, guest.id, photo_id)
        return favourite_q.count_for_guest(conn, guest.id, gallery["id"]), added

    count, added = await svc.db.write(change)
    if added:
        svc.activity.count(gallery["id"], "favourites")
    return {"id": photo_id, "favourite": adding, "count": count}


@blueprint.post("/api/g/<slug>/guest")
async def set_guest_name(slug: str) -> dict[str, Any]:
    """``{"name": "Aunt Mary"}`` (or an empty name to forget it)."""
    _gallery, guest = await _guest_change(slug)
    data = await request.get_json(silent=True)
    if data is None:
        data = await request.form
    raw = data.get("name") if hasattr(data, "get") else None
    if raw is not None and not isinstance(raw, str):
        raise BadRequest(_("name must be text."))
    name = clean_guest_name(raw)
    await services().db.write(guest_q.set_name, guest.id, name)
    return {"name": name}
