"""The studio's brand on every page: its stylesheet (colours and fonts as CSS custom properties), its custom CSS
and its logo, served from our own origin, and the template context that names the studio (``domain/brand.py``).

The three are public (a login page and a protected gallery's password page show the brand too) and carry
nothing private. Each page links them with ``?v=`` the brand's version, so they may be cached for a day and a
change shows at once. The CSP is not touched: the stylesheets are ``style-src 'self'``, the logo ``img-src
'self'``, the fonts ``font-src 'self'``.
"""

from __future__ import annotations

import logging
from typing import Any

import trio
from quart import Blueprint, Quart, Response, g, url_for

from picpeak_lite.domain import brand as brand_rules
from picpeak_lite.errors import NotFound
from picpeak_lite.i18n import _
from picpeak_lite.web.auth import services

log = logging.getLogger(__name__)
blueprint = Blueprint("brand", __name__)

CACHE = "public, max-age=86400"


async def current_brand() -> brand_rules.Brand:
    """The brand, read once per request."""
    if "brand" not in g:
        svc = services()
        g.brand = await svc.db.read(brand_rules.load, svc.settings)
    brand: brand_rules.Brand = g.brand
    return brand


async def _context() -> dict[str, Any]:
    try:
        brand = await current_brand()
    except Exception:  # the error page of a broken database must still render: with the built-in look
        log.exception("the brand could not be read; this page shows the built-in look")
        brand = brand_rules.Brand()
    return {**brand_rules.page_context(brand), "brand_theme": lambda gallery=None: brand_rules.theme_of(
        brand, gallery), "brand_layout": lambda gallery=None: brand_rules.layout_of(brand, gallery)}


def install(app: Quart) -> None:
    app.register_blueprint(blueprint)
    app.context_processor(_context)


@blueprint.get("/brand/brand.css")
async def stylesheet() -> Response:
    brand = await current_brand()
    css = brand_rules.stylesheet(brand, lambda file: url_for("static", filename=f"fonts/{file}"))
    return Response(css, content_type="text/css; charset=utf-8", headers={"Cache-Control": CACHE})


@blueprint.get("/brand/custom.css")
async def custom_css() -> Response:
    """The photographer's own CSS, checked when it was saved (``brand.check_css``) and checked again here, so
    that a row written by anything else is never served: an empty stylesheet instead."""
    brand = await current_brand()
    try:
        css = brand_rules.check_css(brand.custom_css)
    except brand_rules.Invalid:
        css = ""
    return Response(css, content_type="text/css; charset=utf-8", headers={"Cache-Control": CACHE})


@blueprint.get("/brand/logo.png")
async def logo() -> Response:
    """The re-encoded logo (never the uploaded bytes: see ``images.studio_logo``)."""
    svc = services()
    path = brand_rules.logo_path(svc.settings)
    try:
        data = await trio.to_thread.run_sync(path.read_bytes)  # a few hundred KB at most (LOGO_MAX_SIDE)
    except FileNotFoundError:
        raise NotFound(_("This site has no logo.")) from None
    return Response(data, content_type="image/png", headers={"Cache-Control": CACHE})
