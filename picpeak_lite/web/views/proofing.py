"""The proofing export: the guests' favourites of a gallery, for the photographer's editing software.

``GET /admin/galleries/<id>/favourites.<fmt>`` with ``fmt`` one of ``txt`` (file names), ``lightroom`` and
``captureone`` (filter strings), ``csv`` (file name, who, when); ``?guest=<name>`` for one guest's choices
(``guest=`` for those who gave no name), everyone's without it. The formats are ``domain/proofing.py``'s.
"""

from __future__ import annotations

import re

from quart import Blueprint, Response, request

from picpeak_lite.domain import galleries, proofing
from picpeak_lite.errors import NotFound
from picpeak_lite.i18n import _
from picpeak_lite.store.queries import proofing as proofing_q
from picpeak_lite.web.auth import gallery_page, services

blueprint = Blueprint("proofing", __name__)

EXTENSIONS = {"txt": "txt", "lightroom": "lightroom.txt", "captureone": "captureone.txt", "csv": "csv"}


@blueprint.get("/admin/galleries/<int:gallery_id>/favourites.<any(txt, lightroom, captureone, csv):fmt>")
@gallery_page
async def export(gallery_id: int, fmt: str) -> Response:
    svc = services()
    gallery = await galleries.get_gallery(svc, gallery_id)
    guest_name = request.args.get("guest")
    if guest_name is not None:
        guest_name = guest_name.strip()
    rows = await svc.db.read(proofing_q.favourites, gallery_id, guest_name)
    if not rows:
        raise NotFound(_("No favourites have been chosen yet.") if guest_name is None
                       else _("This guest has chosen no favourites in this gallery."))
    who = "everyone" if guest_name is None else (guest_name or "guests without a name")
    filename = f"{gallery['slug']}-favourites-{_safe(who)}.{EXTENSIONS[fmt]}"
    response = Response(proofing.render(fmt, rows), content_type=f"{proofing.FORMATS[fmt]}; charset=utf-8")
    response.headers["Content-Disposition"] = f'attachment; filename="{filename}"'
    response.headers["Cache-Control"] = "private, no-store"
    response.headers["X-Content-Type-Options"] = "nosniff"
    return response


def _safe(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9]+", "-", text).strip("-").lower()[:40] or "guest"
