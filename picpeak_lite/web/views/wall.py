"""The live wall: ``/g/<slug>/wall``, a full-screen slideshow of a gallery's visible photos for the hall.

The page (``templates/wall.html`` with ``static/wall.js``) starts from ``/api/g/<slug>/wall/photos`` and then
follows the gallery over ``/ws/g/<slug>/wall`` (``web/views/live.py``): a photo that becomes visible is pushed
and shown next. Its images are the preview (``view``) images, under ``/g/<slug>/wall/photos/<id>.jpg``, never
originals; the QR code in its corner is for the guest upload page (or the gallery, without guest uploads).

Every route asks ``domain/wall.py`` who may look: the admin's session, or the wall link's ``key``. The admin
makes, replaces and removes the wall link on the gallery page (the form posts below).
"""

from __future__ import annotations

from typing import Any

from quart import Blueprint, Response, redirect, render_template, request, url_for

from picpeak_lite.domain import admin_settings, galleries, wall
from picpeak_lite.errors import NotFound
from picpeak_lite.i18n import _
from picpeak_lite.media import images
from picpeak_lite.store.queries import galleries as gallery_q
from picpeak_lite.store.queries import photos as photo_q
from picpeak_lite.store.queries import wall as wall_q
from picpeak_lite.store.storage import derived_name
from picpeak_lite.web import qr
from picpeak_lite.web.auth import admin_page, current_admin, services
from picpeak_lite.web.files import send_stored
from picpeak_lite.web.views.common import share_url

blueprint = Blueprint("wall", __name__)

START_PHOTOS = 300  # the rotation the wall starts with: the newest visible photos


async def _wall_gallery(slug: str) -> tuple[dict[str, Any], str | None]:
    svc = services()
    key = request.args.get("key") or None
    admin = await current_admin()
    by_admin = admin is not None
    if admin is not None and admin.galleries is not None:  # an editor: only the walls of their galleries
        row = await svc.db.read(gallery_q.get_by_slug, slug)
        by_admin = row is not None and admin.may_open(row["id"])
    gallery = await svc.db.read(wall.wall_gallery, slug, key, by_admin, svc.clock())
    return gallery, key


def image_url(slug: str, photo_id: int, key: str | None) -> str:
    return url_for("wall.image", slug=slug, photo_id=photo_id, key=key)


@blueprint.get("/g/<slug>/wall")
async def page(slug: str) -> Any:
    gallery, key = await _wall_gallery(slug)
    target = share_url(gallery["slug"]) + ("/upload" if gallery["allow_guest_uploads"] else "")
    svc = services()
    mark = await svc.db.read(admin_settings.gallery_watermark, svc.settings, gallery)
    response = Response(await render_template(
        "wall.html", gallery=gallery, key=key, upload_link=target, qr_side=qr_side(mark),
        studio_side="left" if mark is not None and mark.position == "top-right" else "right",  # clear of the mark
        photos_url=url_for("wall.photos", slug=slug, key=key), qr_url=url_for("wall.qr_code", slug=slug, key=key),
        ws_path=f"/ws/g/{slug}/wall" + (f"?key={key}" if key else ""),
    ))
    response.headers["Cache-Control"] = "private, no-store"
    response.headers["Referrer-Policy"] = "no-referrer"  # the key is in the address
    return response


def qr_side(mark: images.Watermark | None) -> str:
    """The bottom corner for the QR code: the right, unless the gallery's watermark is there (a landscape photo
    fills the screen's width, and the box would cover the mark the photographer asked for)."""
    return "left" if mark is not None and mark.position == "bottom-right" else "right"


@blueprint.get("/api/g/<slug>/wall/photos")
async def photos(slug: str) -> dict[str, Any]:
    gallery, key = await _wall_gallery(slug)
    rows = await services().db.read(wall_q.visible_photos, gallery["id"], START_PHOTOS)
    captions = bool(gallery["wall_captions"])
    return {"photos": [{"id": r["id"], "view_url": image_url(slug, r["id"], key), "width": r["width"],
                        "height": r["height"], "caption": r["guest_name"] if captions else None} for r in rows]}


@blueprint.get("/g/<slug>/wall/photos/<int:photo_id>.jpg")
async def image(slug: str, photo_id: int) -> Response:
    gallery, _key = await _wall_gallery(slug)
    photo = await services().db.read(photo_q.get_visible, gallery["id"], photo_id)
    if photo is None:
        raise NotFound(_("There is no such photo in this gallery."))
    try:
        response = await send_stored(derived_name(photo["storage_key"], "view"), "image/jpeg")
    except FileNotFoundError:
        raise NotFound(_("The image file is missing.")) from None
    response.headers["Cache-Control"] = "private, max-age=3600"
    return response


@blueprint.get("/g/<slug>/wall/qr.svg")
async def qr_code(slug: str) -> Response:
    gallery, _key = await _wall_gallery(slug)
    target = share_url(gallery["slug"]) + ("/upload" if gallery["allow_guest_uploads"] else "")
    return Response(qr.render(target, "svg", scale=6), content_type=qr.KINDS["svg"],
                    headers={"Cache-Control": "private, no-cache"})


@blueprint.post("/admin/galleries/<int:gallery_id>/wall-link")
@admin_page
async def new_link(gallery_id: int) -> Any:
    """A new wall link; the one before it stops working at once (open walls close within seconds)."""
    svc = services()
    await galleries.get_gallery(svc, gallery_id)
    await svc.db.write(wall_q.set_token, gallery_id, wall.new_token(), svc.clock())
    return redirect(url_for("admin.gallery", gallery_id=gallery_id) + "#wall")


@blueprint.post("/admin/galleries/<int:gallery_id>/wall-link/remove")
@admin_page
async def remove_link(gallery_id: int) -> Any:
    svc = services()
    await galleries.get_gallery(svc, gallery_id)
    await svc.db.write(wall_q.set_token, gallery_id, None, svc.clock())
    return redirect(url_for("admin.gallery", gallery_id=gallery_id) + "#wall")
