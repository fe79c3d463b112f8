"""``create_app(services)``: the Quart application with its blueprints, the one error handler, security
headers and cookies."""

from __future__ import annotations

import functools
import logging
from pathlib import Path
from typing import Any

from markupsafe import Markup, escape
from quart import Response, current_app, g, send_from_directory
from quart_trio import QuartTrio
from werkzeug.routing import IntegerConverter

from picpeak_lite import i18n
from picpeak_lite.resources import STATIC_DIR, TEMPLATES_DIR
from picpeak_lite.services import Services
from picpeak_lite.store.db import INTEGER_MAX
from picpeak_lite.web import errors, locale
from picpeak_lite.web.accesslog import AccessLog
from picpeak_lite.web.asgi import BackpressureHTTPConnection, BoundedRequest
from picpeak_lite.web.auth import ADMIN_COOKIE, GUEST_COOKIE, services
from picpeak_lite.web.limits import WebLimits, wall_clock
from picpeak_lite.web.passwords import DEVICE_COOKIE, DEVICE_COOKIE_DAYS

log = logging.getLogger(__name__)



def content_security_policy(bucket_origin: str | None = None) -> str:
    """The pages' policy. With presigned redirects an ``<img>`` or ``<video>`` whose URL answers 302 to the
    bucket loads from the bucket's origin, so img-src and media-src name it; without it the browser blocks every
    such redirect (a blank gallery, MediaError 4)."""
    bucket = f" {bucket_origin}" if bucket_origin else ""
    return (
        f"default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' data: blob:{bucket}; "
        f"media-src 'self'{bucket}; connect-src 'self'; font-src 'self'; object-src 'none'; base-uri 'none'; "
        "form-action 'self'; frame-ancestors 'none'"
    )



def digits_at_most(bound: int) -> str:
    """A regex for exactly the decimal strings (no sign, at most as many digits as ``bound``) whose value is at
    most ``bound``: shorter numbers, or the same length with a smaller digit after a common prefix, or ``bound``.
    """
    text = str(bound)
    width = len(text)
    choices = [f"[0-9]{{1,{width - 1}}}"]
    for i, digit in enumerate(text):
        if digit != "0":
            choices.append(f"{text[:i]}[0-{int(digit) - 1}][0-9]{{{width - 1 - i}}}")
    choices.append(text)
    return "(?:" + "|".join(choices) + ")"


class RowId(IntegerConverter):
    """``<int:...>`` on every route, HTTP and WebSocket: an id SQLite can hold, or the route does not match.

    Registered as the app's ``int`` converter, so every id route (and every new one) is bounded in one place:
    an id past SQLite's 64-bit range would otherwise reach a query and fail there (apsw's OverflowError, a 500
    with a traceback, from any stranger). No row has such an id, so no match: the usual 404. The bound is in
    the pattern, not in ``to_python``: werkzeug turns a conversion refused after the path matched into a 405 when
    the path has rules for other methods, and ``int()`` never sees a megabyte of digits. ASCII digits only
    (``\\d`` also takes other scripts' digits). Unsigned as before: ``-1`` does not match either.
    """

    regex = digits_at_most(INTEGER_MAX)


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
    # Before any blueprint adds its rules: a rule takes its converter when it is added to the map.
    app.url_map.converters["int"] = RowId
    app.extensions["picpeak_limits"] = WebLimits.for_settings(
        svc.settings, svc.db, wall_clock(svc.clock, svc.monotonic))
    # One log line per request and WebSocket (Quart's documented place for ASGI middleware).
    app.asgi_app = AccessLog(app.asgi_app, svc.settings.trusted_proxies)  # type: ignore[method-assign,assignment]
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
        tus,
        upload,
        video,
    )

    app.register_blueprint(health.blueprint)
    app.register_blueprint(admin_pages.blueprint)
    app.register_blueprint(admin_api.blueprint)
    app.register_blueprint(guest.blueprint)
    app.register_blueprint(downloads.blueprint)
    app.register_blueprint(favourites.blueprint)
    app.register_blueprint(upload.blueprint)
    app.register_blueprint(tus.blueprint)
    app.register_blueprint(photos.blueprint)
    app.register_blueprint(video.blueprint)
    app.register_blueprint(live.blueprint)
    app.register_blueprint(admin_photos.blueprint)
    app.register_blueprint(admin_settings.blueprint)
    # The event itself (issue 16): the review queue, the proofing export, the live wall.
    from picpeak_lite.web.views import proofing, review, wall

    app.register_blueprint(review.blueprint)
    app.register_blueprint(proofing.blueprint)
    app.register_blueprint(wall.blueprint)
    # Guests' feedback (issue 34): likes, ratings, comments and their moderation, the sidecar export.
    from picpeak_lite.web.views import feedback

    app.register_blueprint(feedback.blueprint)
    # The studio's brand (issue 33): its stylesheet, custom CSS and logo, and the pages' context that names it.
    from picpeak_lite.web.views import brand

    brand.install(app)
    # A studio (issue 33): accounts with roles, second factors, the audit trail.
    from picpeak_lite.web.views import accounts

    app.register_blueprint(accounts.blueprint)
    # Email (issue 32): the share button, the test message, the template editor, the guest's selection.
    from picpeak_lite.web.views import email

    app.register_blueprint(email.blueprint)
    from picpeak_lite.web.views import language

    app.register_blueprint(language.blueprint)
    # "Find me" (issue 36): the guests' selfie search, the photographer's switch and face index.
    from picpeak_lite.web.views import findme

    app.register_blueprint(findme.blueprint)

    app.add_url_rule("/favicon.ico", "favicon", _favicon)
    errors.install(app)
    csp = content_security_policy(svc.storage.presigned_origin())  # once: the bucket is fixed at start
    app.after_request(functools.partial(_after_request, csp=csp))
    app.jinja_env.globals["csrf_field"] = _csrf_field
    # The request's language (web/locale.py), then dates, numbers and sizes written as that language writes them.
    app.before_request(_choose_language)
    app.before_websocket(_choose_language)
    app.jinja_env.globals["current_locale"] = i18n.current_locale
    app.jinja_env.globals["languages"] = i18n.LANGUAGES
    app.jinja_env.globals["script_strings"] = locale.script_strings
    app.jinja_env.filters["datetime"] = i18n.format_timestamp
    app.jinja_env.filters["date"] = i18n.format_date
    app.jinja_env.filters["number"] = i18n.format_number
    app.jinja_env.filters["size"] = i18n.format_size
    app.jinja_env.filters["event_type"] = _event_type_label
    # Templates translate with {{ _("...") }} and {{ ngettext(...) }} (picpeak_lite/i18n.py). New-style gettext
    # escapes the message and fills %(name)s placeholders itself, so a translated string cannot break the markup.
    app.jinja_env.add_extension("jinja2.ext.i18n")
    app.jinja_env.install_gettext_callables(  # type: ignore[attr-defined]
        i18n.gettext, i18n.ngettext, newstyle=True
    )
    return app


async def _favicon() -> Response:
    """Browsers ask for /favicon.ico before (or instead of) reading ``<link rel=icon>``: answer, not 404."""
    response = await send_from_directory(str(current_app.static_folder), "favicon.ico", mimetype="image/x-icon")
    response.headers["Cache-Control"] = "public, max-age=86400"
    return response


def _after_request(response: Response, *, csp: str) -> Response:
    headers = response.headers
    headers.setdefault("X-Content-Type-Options", "nosniff")
    headers.setdefault("Content-Security-Policy", csp)
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
    if "set_device_cookie" in g:
        response.set_cookie(DEVICE_COOKIE, g.set_device_cookie, max_age=DEVICE_COOKIE_DAYS * 86400, **cookie_args)
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


def _event_type_label(event_type: str) -> str:
    from picpeak_lite.domain.gallery_fields import EVENT_TYPE_LABELS

    label = EVENT_TYPE_LABELS.get(event_type)
    return i18n.gettext(label) if label else event_type


async def _choose_language() -> None:
    locale.apply()
