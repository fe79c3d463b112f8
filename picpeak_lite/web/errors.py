"""The one place where errors become responses: HTML pages or JSON, whichever the client asked for.

Views raise :class:`picpeak_lite.errors.AppError` subclasses and never build an error response themselves. An
error chooses its own page (``AppError.page``): the expired page and the password form are errors like any
other, so a guest who follows any link to a closed gallery sees the right page at that address. Anything that
is not an ``AppError`` is a bug: logged with its traceback and answered 500 without internals.
"""

from __future__ import annotations

import json
import logging
from typing import Any
from urllib.parse import urlsplit, urlunsplit

from quart import Response, has_websocket_context, render_template, request, websocket
from quart_trio import QuartTrio
from werkzeug.exceptions import HTTPException

from picpeak_lite.errors import AppError, TooLarge
from picpeak_lite.i18n import _
from picpeak_lite.web import locale
from picpeak_lite.web.auth import admin_from_cookie, current_guest

log = logging.getLogger(__name__)


def install(app: QuartTrio) -> None:
    """Register the handlers: ours, werkzeug's HTTP errors (404 routing, 405, 413), and everything else."""
    app.register_error_handler(AppError, render_error)
    app.register_error_handler(HTTPException, _render_http_exception)
    app.register_error_handler(Exception, _render_unexpected)


def wants_json() -> bool:
    if request.path.startswith(("/api/", "/healthz")):
        return True
    best = request.accept_mimetypes.best_match(["text/html", "application/json"])
    return best == "application/json"


async def render_error(error: AppError) -> Response:
    if has_websocket_context():
        # A refused WebSocket handshake (no such route, a bad id, no access): there is no ``request`` to read,
        # and the client only shows the status, so a plain sentence.
        response = Response(error.message, status=error.status, content_type="text/plain; charset=utf-8")
    elif wants_json():
        response = Response(json_dumps(error.to_json()), status=error.status, content_type="application/json")
    else:
        if getattr(error, "language", None):
            locale.apply(error.language)  # type: ignore[attr-defined]
        if error.needs_guest_session:
            await current_guest(create=True)
        context = error.page_context()
        if error.page == "error.html":
            context["way_on"] = await _way_on()
        try:
            html = await render_template(error.page, **context)
        except Exception:
            # The error page itself cannot render (templates missing from a broken install): say what happened
            # in plain text rather than an empty 500, and log why. /healthz reports the same problem.
            log.exception("cannot render %s for a %d answer", error.page, error.status)
            response = Response(f"{error.message}\n(The server cannot render its pages; see its log.)\n",
                                status=error.status, content_type="text/plain; charset=utf-8")
        else:
            response = Response(html, status=error.status, content_type="text/html; charset=utf-8")
    for name, value in error.headers().items():
        response.headers[name] = value
    return response


async def _way_on() -> dict[str, str | None]:
    """Where a person on an error page can go next (issue 35 #18: the 404 page was a dead end). The
    photographer (a live admin session, or any ``/admin`` address) is sent to the galleries or the login; a
    guest, who has only the link they were given, back to the page of ours they came from, if any, and told
    what to check. A guest is never shown an admin link."""
    try:
        admin = await admin_from_cookie()
    except Exception:  # the database cannot answer (the error may be that): no session is assumed
        admin = None
    if admin is not None:
        return {"href": "/admin/", "label": _("Back to your galleries"), "hint": None}
    if request.path == "/admin" or request.path.startswith("/admin/"):
        return {"href": "/admin/login", "label": _("Log in as the photographer"), "hint": None}
    referrer = urlsplit(request.referrer or "")
    came_from = (referrer.netloc == request.host and referrer.scheme in ("http", "https")
                 and referrer.path.startswith("/") and not referrer.path.startswith("//")
                 and referrer.path != request.path)
    return {
        "href": urlunsplit(("", "", referrer.path, referrer.query, "")) if came_from else None,
        "label": _("Back to the previous page"),
        "hint": _("Please check that the link is complete, exactly as your photographer sent it, or ask them "
                  "for it again."),
    }


async def _render_http_exception(error: HTTPException) -> Response:
    code = error.code or 500
    if code == 413:
        return await render_error(TooLarge(_("The request is too large.")))
    generic = AppError(error.description if code < 500 else None)
    generic.status = code
    generic.message = {400: _("Bad request"), 403: _("Forbidden"), 404: _("Not found"),
                       405: _("Method not allowed")}.get(code, error.name)
    return await render_error(generic)


async def _render_unexpected(error: Exception) -> Response:
    where = ("WebSocket", websocket.path) if has_websocket_context() else (request.method, request.path)
    log.exception("unexpected error on %s %s", *where, exc_info=error)
    return await render_error(AppError(_("Something went wrong on our side. Please try again.")))


def json_dumps(data: Any) -> str:
    return json.dumps(data, ensure_ascii=False)
