"""``create_app(services)``: the Quart application with its blueprints, the one error handler, security
headers and cookies."""

from __future__ import annotations

import datetime as dt
import json
import logging
from pathlib import Path
from typing import Any

from markupsafe import Markup, escape
from quart import Response, current_app, g, render_template, request, send_from_directory
from quart_trio import QuartTrio
from werkzeug.exceptions import HTTPException

from picpeak_lite.errors import AppError, TooLarge
from picpeak_lite.services import Services
from picpeak_lite.web.accesslog import AccessLog
from picpeak_lite.web.asgi import BackpressureHTTPConnection, BoundedRequest
from picpeak_lite.web.auth import ADMIN_COOKIE, GUEST_COOKIE, services
from picpeak_lite.web.resources import STATIC_DIR, TEMPLATES_DIR

log = logging.getLogger(__name__)

CSP = (
    "default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' data: blob:; "
    "connect-src 'self'; font-src 'self'; object-src 'none'; base-uri 'none'; form-action 'self'; "
    "frame-ancestors 'none'"
)


class PicpeakApp(QuartTrio):
    """QuartTrio with bounded request bodies (see asgi.py)."""

    request_class = BoundedRequest
    asgi_http_class = BackpressureHTTPConnection


def create_app(svc: Services, *, templates_dir: Path = TEMPLATES_DIR, static_dir: Path = STATIC_DIR) -> QuartTrio:
    """The app; the two folders are parameters so that a test can start it as a broken install would be."""
    app = PicpeakApp(
        __name__, template_folder=str(templates_dir), static_folder=str(static_dir),
        static_url_path="/static",
    )
    app.extensions["picpeak"] = svc
    # One log line per request and WebSocket (Quart's documented place for ASGI middleware).
    app.asgi_app = AccessLog(app.asgi_app, svc.settings.trusted_proxies)  # type: ignore[method-assign]
    # Forms and JSON are read whole and limited to 16 MiB; upload bodies are streamed (BoundedBody.stream) and
    # counted by our own code. Quart's 60 s body timeout is wrong for a phone on a slow uplink sending 50 MB.
    app.config["MAX_CONTENT_LENGTH"] = 16 * 1024 * 1024
    app.config["BODY_TIMEOUT"] = None
    # Likewise a zip of a whole wedding or a 2 GB original takes longer than Quart's 60 s response limit.
    app.config["RESPONSE_TIMEOUT"] = None
    app.config["MAX_FORM_MEMORY_SIZE"] = 1024 * 1024
    app.config["TEMPLATES_AUTO_RELOAD"] = False

    from picpeak_lite.web.views import (
        admin_api,
        admin_pages,
        admin_photos,
        admin_settings,
        downloads,
        favourites,
        guest,
        health,
        live,
        photos,
        upload,
    )

    app.register_blueprint(health.blueprint)
    app.register_blueprint(admin_pages.blueprint)
    app.register_blueprint(admin_api.blueprint)
    app.register_blueprint(guest.blueprint)
    app.register_blueprint(downloads.blueprint)
    app.register_blueprint(favourites.blueprint)
    app.register_blueprint(upload.blueprint)
    app.register_blueprint(photos.blueprint)
    app.register_blueprint(live.blueprint)
    app.register_blueprint(admin_photos.blueprint)
    app.register_blueprint(admin_settings.blueprint)

    app.add_url_rule("/favicon.ico", "favicon", _favicon)
    app.register_error_handler(AppError, _render_app_error)
    app.register_error_handler(HTTPException, _render_http_exception)
    app.register_error_handler(Exception, _render_unexpected)
    app.after_request(_after_request)
    app.jinja_env.globals["csrf_field"] = _csrf_field
    app.jinja_env.filters["datetime"] = _format_timestamp
    return app


async def _favicon() -> Response:
    """Browsers ask for /favicon.ico before (or instead of) reading ``<link rel=icon>``: answer, not 404."""
    response = await send_from_directory(str(current_app.static_folder), "favicon.ico", mimetype="image/x-icon")
    response.headers["Cache-Control"] = "public, max-age=86400"
    return response


def wants_json() -> bool:
    if request.path.startswith(("/api/", "/healthz")):
        return True
    best = request.accept_mimetypes.best_match(["text/html", "application/json"])
    return best == "application/json"


async def render_error(error: AppError) -> Response:
    if wants_json():
        response = Response(
            _json_dumps(error.to_json()), status=error.status, content_type="application/json"
        )
    else:
        template = getattr(error, "template", "error.html")
        try:
            html = await render_template(template, error=error)
        except Exception:
            # The error page itself cannot render (templates missing from a broken install): say what happened
            # in plain text rather than an empty 500, and log why. /healthz reports the same problem.
            log.exception("cannot render %s for a %d answer", template, error.status)
            response = Response(f"{error.message}\n(The server cannot render its pages; see its log.)\n",
                                status=error.status, content_type="text/plain; charset=utf-8")
        else:
            response = Response(html, status=error.status, content_type="text/html; charset=utf-8")
    for name, value in error.headers().items():
        response.headers[name] = value
    return response


async def _render_app_error(error: AppError) -> Response:
    from picpeak_lite.domain.access import PasswordRequired
    from picpeak_lite.web.views.guest import password_page

    if isinstance(error, PasswordRequired) and not wants_json():
        return await password_page(error.gallery, status=401)
    return await render_error(error)


async def _render_http_exception(error: HTTPException) -> Response:
    code = error.code or 500
    if code == 413:
        return await render_error(TooLarge("The request is too large."))
    generic = AppError(error.description if code < 500 else None)
    generic.status = code
    generic.message = {404: "Not found", 405: "Method not allowed"}.get(code, error.name)
    return await render_error(generic)


async def _render_unexpected(error: Exception) -> Response:
    log.exception("unexpected error on %s %s", request.method, request.path, exc_info=error)
    return await render_error(AppError("Something went wrong on our side. Please try again."))


def _after_request(response: Response) -> Response:
    headers = response.headers
    headers.setdefault("X-Content-Type-Options", "nosniff")
    headers.setdefault("Content-Security-Policy", CSP)
    headers.setdefault("Referrer-Policy", "same-origin")
    headers.setdefault("X-Frame-Options", "DENY")
    headers.setdefault("Cross-Origin-Opener-Policy", "same-origin")
    if "Cache-Control" not in headers and response.mimetype in ("text/html", "application/json"):
        headers["Cache-Control"] = "no-store"
    settings = services().settings
    cookie_args: dict[str, Any] = {"httponly": True, "samesite": "Lax", "secure": settings.secure_cookies,
                                   "path": "/"}
    if "set_admin_cookie" in g:
        value, max_age = g.set_admin_cookie
        if value is None:
            response.delete_cookie(ADMIN_COOKIE, path="/")
        else:
            response.set_cookie(ADMIN_COOKIE, value, max_age=max_age, **cookie_args)
    if "new_guest_cookie" in g:
        response.set_cookie(GUEST_COOKIE, g.new_guest_cookie, max_age=400 * 86400, **cookie_args)
    return response


def _csrf_field() -> str:
    token = None
    if g.get("admin") is not None:
        token = g.admin.csrf_token
    elif g.get("guest") is not None:
        token = g.guest.csrf_token
    if not token:
        return Markup("")
    return Markup(f'<input type="hidden" name="csrf_token" value="{escape(token)}">')


def _format_timestamp(value: float | None) -> str:
    if value is None:
        return ""
    return dt.datetime.fromtimestamp(value, dt.UTC).strftime("%Y-%m-%d %H:%M UTC")


def _json_dumps(data: Any) -> str:
    return json.dumps(data, ensure_ascii=False)
