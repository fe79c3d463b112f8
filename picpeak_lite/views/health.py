"""``GET /healthz``: 200 when the database answers."""

from __future__ import annotations

from quart import Blueprint

from .. import db
from ..auth import services

blueprint = Blueprint("health", __name__)


@blueprint.get("/healthz")
async def healthz() -> dict[str, str]:
    await services().db.read(db.check)
    return {"status": "ok"}
