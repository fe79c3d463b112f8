"""The admin JSON API under ``/api/admin``: what the admin pages do, for scripts and editing tools.

Authenticated by the admin session (with origin and CSRF checks) or ``Authorization: Bearer <api token>``.
Validation errors are 400 with ``{"error", "fields": {field: message}}``, as on the pages.
"""

from __future__ import annotations

from typing import Any

from quart import Blueprint, request

from picpeak_lite.domain import galleries
from picpeak_lite.errors import BadRequest
from picpeak_lite.i18n import _
from picpeak_lite.pipeline import archive
from picpeak_lite.store.queries import galleries as gallery_q
from picpeak_lite.web.auth import account_api, admin_api, current_admin, gallery_api, services
from picpeak_lite.web.views.common import current_actor, share_url

blueprint = Blueprint("admin_api", __name__, url_prefix="/api/admin")


async def _json_body() -> dict[str, Any]:
    data = await request.get_json(force=True, silent=True)
    if not isinstance(data, dict):
        raise BadRequest(_("Send a JSON object in the request body."))
    return data


@blueprint.get("/galleries")
@account_api
async def list_galleries() -> dict[str, Any]:
    """Every gallery, or an editor's granted ones."""
    me = await current_admin()
    assert me is not None
    rows = await services().db.read(gallery_q.list_all)
    return {"galleries": [galleries.to_json(r, share_url(r["slug"])) for r in rows if me.may_open(r["id"])]}


@blueprint.post("/galleries")
@admin_api
async def create_gallery() -> tuple[dict[str, Any], int]:
    row = await galleries.create_gallery(services(), await _json_body(), await current_actor())
    return galleries.to_json(row, share_url(row["slug"])), 201


@blueprint.get("/galleries/<int:gallery_id>")
@gallery_api
async def get_gallery(gallery_id: int) -> dict[str, Any]:
    row = await galleries.get_gallery(services(), gallery_id)
    return galleries.to_json(row, share_url(row["slug"]))


@blueprint.route("/galleries/<int:gallery_id>", methods=["PATCH", "PUT"])
@admin_api
async def update_gallery(gallery_id: int) -> dict[str, Any]:
    partial = request.method == "PATCH"
    row = await galleries.update_gallery(services(), gallery_id, await _json_body(), partial=partial,
                                       actor=await current_actor())
    return galleries.to_json(row, share_url(row["slug"]))


@blueprint.post("/galleries/<int:gallery_id>/publish")
@admin_api
async def publish(gallery_id: int) -> dict[str, Any]:
    row = await galleries.set_published(services(), gallery_id, True, await current_actor())
    return galleries.to_json(row, share_url(row["slug"]))


@blueprint.post("/galleries/<int:gallery_id>/unpublish")
@admin_api
async def unpublish(gallery_id: int) -> dict[str, Any]:
    row = await galleries.set_published(services(), gallery_id, False, await current_actor())
    return galleries.to_json(row, share_url(row["slug"]))


@blueprint.delete("/galleries/<int:gallery_id>")
@admin_api
async def delete_gallery(gallery_id: int) -> tuple[str, int]:
    await galleries.delete_gallery(services(), gallery_id, await current_actor())
    return "", 204


@blueprint.post("/galleries/<int:gallery_id>/archive")
@admin_api
async def archive_gallery(gallery_id: int) -> tuple[dict[str, Any], int]:
    """202: the archiver task packs the originals; GET the gallery to follow ``archive.state``."""
    row = await archive.start_archive(services(), gallery_id, await current_actor())
    return galleries.to_json(row, share_url(row["slug"])), 202


@blueprint.post("/galleries/<int:gallery_id>/restore")
@admin_api
async def restore_gallery(gallery_id: int) -> tuple[dict[str, Any], int]:
    row = await archive.start_restore(services(), gallery_id, await current_actor())
    return galleries.to_json(row, share_url(row["slug"])), 202
