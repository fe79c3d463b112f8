"""``GET /healthz``: 200 when the database answers."""

from __future__ import annotations

from quart import Blueprint

from picpeak_lite.store import db
from picpeak_lite.web.auth import services

blueprint = Blueprint("health", __name__)


@blueprint.get("/healthz")
async def healthz() -> dict[str, str]:
    await services().db.read(db.check)
    return {"status": "ok"}
