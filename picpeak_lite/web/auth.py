"""Who is asking: the admin (by session cookie or API token) and guests (by guest session cookie).

Also the checks every state-changing request goes through: the request's origin (``Origin`` and
``Sec-Fetch-Site``) and, for cookie-authenticated requests, a CSRF token. API tokens in an ``Authorization``
header cannot be sent by a foreign page, so they need no CSRF token.
"""

from __future__ import annotations

import functools
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, TypeVar
from urllib.parse import urlsplit

from quart import current_app, g, redirect, request, url_for

from picpeak_lite import security
from picpeak_lite.errors import Forbidden, Unauthorized
from picpeak_lite.i18n import _
from picpeak_lite.services import Services
from picpeak_lite.store.queries import admin as admin_q
from picpeak_lite.store.queries import guests as guest_q
from picpeak_lite.web.limits import WebLimits

ADMIN_COOKIE = "pp_admin"
GUEST_COOKIE = "pp_guest"
SAFE_METHODS = ("GET", "HEAD", "OPTIONS")
TOKEN_TOUCH_SECONDS = 60

F = TypeVar("F", bound=Callable[..., Awaitable[Any]])


def services() -> Services:
    return current_app.extensions["picpeak"]


def limits() -> WebLimits:
    """The app's throttles, rate limits and download limiters (``web/limits.py``)."""
    return current_app.extensions["picpeak_limits"]


@dataclass(frozen=True)
class Admin:
    username: str
    csrf_token: str | None  # None for API-token requests: no CSRF needed
    session_hash: str | None
    via_token: bool


@dataclass(frozen=True)
class Guest:
    id: int
    csrf_token: str
    name: str | None


async def current_admin() -> Admin | None:
    """The admin making this request, or None. Cached for the request."""
    if "admin" in g:
        return g.admin
    g.admin = await _load_admin(request.headers.get("Authorization"), request.cookies.get(ADMIN_COOKIE))
    return g.admin


async def admin_from_cookie() -> Admin | None:
    """The admin's browser session on a guest page (for the photographer's preview), or None.

    Only the session cookie counts: an ``Authorization`` header on a guest page is not ours to judge (a guest
    sending a stray one must not get a 401), and a preview is something a person looks at in a browser.
    """
    cookie = request.cookies.get(ADMIN_COOKIE)
    return await _load_admin(None, cookie) if cookie else None


async def admin_from_handshake(authorization: str | None, cookie: str | None) -> Admin | None:
    """The same check for a WebSocket handshake, which has headers and cookies but no ``request``."""
    return await _load_admin(authorization, cookie)


async def _load_admin(authorization: str | None, cookie: str | None) -> Admin | None:
    svc = services()
    if authorization:
        scheme, _space, token = authorization.partition(" ")
        if scheme.lower() != "bearer" or not token.strip():
            raise Unauthorized(_("The Authorization header must be 'Bearer <token>'."))
        row = await svc.db.read(admin_q.get_token, security.token_hash(token.strip()))
        if row is None:
            raise Unauthorized(_("This API token is unknown or has been revoked."))
        now = svc.clock()
        if row["last_used_at"] is None or now - row["last_used_at"] > TOKEN_TOUCH_SECONDS:
            await svc.db.write(admin_q.touch_token, row["id"], now)
        return Admin(username=svc.settings.admin_username, csrf_token=None, session_hash=None, via_token=True)
    if cookie:
        token_hash = security.token_hash(cookie)
        row = await svc.db.read(admin_q.get_session, token_hash, svc.clock())
        if row is not None:
            return Admin(row["username"], row["csrf_token"], token_hash, via_token=False)
    return None


def check_origin() -> None:
    """Refuse a state-changing request that a browser says came from another site."""
    if request.method in SAFE_METHODS:
        return
    if request.headers.get("Sec-Fetch-Site", "").lower() == "cross-site":
        raise Forbidden(_("Cross-site requests are not allowed."))
    origin = request.headers.get("Origin")
    if origin is not None and not origin_allowed(origin, request.host, services().settings.public_url):
        raise Forbidden(_("This request came from another site and was refused."))


def origin_allowed(origin: str, host: str, public_url: str) -> bool:
    if origin == "null":
        return False
    parts = urlsplit(origin)
    if parts.netloc.lower() == host.lower():
        return True
    return bool(public_url) and origin.rstrip("/").lower() == public_url.rstrip("/").lower()


async def check_csrf(expected: str) -> None:
    sent = request.headers.get("X-CSRF-Token")
    if sent is None and request.mimetype in ("application/x-www-form-urlencoded", "multipart/form-data"):
        sent = (await request.form).get("csrf_token")
    if not sent or not security.tokens_equal(sent, expected):
        raise Forbidden(_("The form has expired or is missing its security token. Reload the page and try again."))


def admin_page(view: F) -> F:
    """An admin HTML page: log in first; state changes need the origin check and the CSRF token."""

    @functools.wraps(view)
    async def wrapper(*args: Any, **kwargs: Any) -> Any:
        admin = await current_admin()
        if admin is None:
            if request.method in SAFE_METHODS:
                return redirect(url_for("admin.login", next=request.full_path.rstrip("?")))
            raise Unauthorized(_("Your session has ended. Please log in again."))
        await _check_state_change(admin)
        return await view(*args, **kwargs)

    return wrapper  # type: ignore[return-value]


def admin_api(view: F) -> F:
    """An admin JSON endpoint: session (with origin and CSRF checks) or API token."""

    @functools.wraps(view)
    async def wrapper(*args: Any, **kwargs: Any) -> Any:
        admin = await current_admin()
        if admin is None:
            raise Unauthorized(_("Log in or send 'Authorization: Bearer <token>'."))
        await _check_state_change(admin)
        return await view(*args, **kwargs)

    return wrapper  # type: ignore[return-value]


async def _check_state_change(admin: Admin) -> None:
    if request.method in SAFE_METHODS or admin.via_token:
        return
    check_origin()
    assert admin.csrf_token is not None
    await check_csrf(admin.csrf_token)


async def current_guest(*, create: bool) -> Guest | None:
    """This browser's guest session; with ``create``, start one (the cookie is set after the request)."""
    if "guest" in g and (g.guest is not None or not create):
        return g.guest
    svc = services()
    guest = None
    cookie = request.cookies.get(GUEST_COOKIE)
    if cookie:
        guest = await guest_from_cookie(cookie)
    if guest is None and create:
        token = security.new_token()
        csrf = security.new_token()
        guest_id = await svc.db.write(guest_q.create_session, security.token_hash(token), csrf, svc.clock())
        g.new_guest_cookie = token
        guest = Guest(guest_id, csrf, None)
    g.guest = guest
    return guest


async def guest_from_cookie(cookie: str) -> Guest | None:
    row = await services().db.read(guest_q.get_session, security.token_hash(cookie))
    return Guest(row["id"], row["csrf_token"], row["guest_name"]) if row else None


async def check_guest_state_change(guest: Guest | None) -> None:
    """Guest forms and uploads: same-origin and the guest's CSRF token."""
    check_origin()
    if guest is None:
        raise Forbidden(_("Your browser session has ended. Reload the page and try again."))
    await check_csrf(guest.csrf_token)
