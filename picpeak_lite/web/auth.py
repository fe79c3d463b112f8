"""Who is asking: an account (by session cookie or API token) and guests (by guest session cookie).

What an account may call is decided here by the route's category, one decorator each (``domain/accounts.py``
has the rule): :func:`account_page` / :func:`account_api` (any account: its own password, second factor, the
dashboard of what it may see), :func:`gallery_page` / :func:`gallery_api` (a gallery's work: owners and admins,
and editors granted the gallery named by the route's ``gallery_id``, ``photo_id`` or ``upload_id``),
:func:`admin_page` / :func:`admin_api` (owners and admins: all galleries; the default for a new admin route)
and :func:`owner_page` / :func:`owner_api` (owners: accounts, settings, the audit trail). The account's row is
read with its session or token on every request, so a disabled account is refused at its next request.

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
from picpeak_lite.domain import accounts
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
    """An account making a request (any role: the name is older than the roles)."""

    username: str
    csrf_token: str | None  # None for API-token requests: no CSRF needed
    session_hash: str | None
    via_token: bool
    account_id: int = 0
    role: str = "owner"
    galleries: frozenset[int] | None = None  # an editor's granted galleries; None: all

    def may_open(self, gallery_id: int) -> bool:
        return self.galleries is None or gallery_id in self.galleries

    def actor(self, ip: str = "") -> accounts.Actor:
        return accounts.Actor(self.account_id, self.username, ip)


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
        scheme, _sep, token = authorization.partition(" ")
        if scheme.lower() != "bearer" or not token.strip():
            raise Unauthorized(_("The Authorization header must be 'Bearer <token>'."))
        row, grants = await svc.db.read(_with_grants, admin_q.get_token, security.token_hash(token.strip()))
        if row is None:
            raise Unauthorized(_("This API token is unknown, has been revoked, or its account is disabled."))
        now = svc.clock()
        if row["last_used_at"] is None or now - row["last_used_at"] > TOKEN_TOUCH_SECONDS:
            await svc.db.write(admin_q.touch_token, row["id"], now)
        return Admin(row["username"], None, None, via_token=True, account_id=row["user_id"], role=row["role"],
                     galleries=grants)
    if cookie:
        token_hash = security.token_hash(cookie)
        row, grants = await svc.db.read(_with_grants, admin_q.get_session, token_hash, svc.clock())
        if row is not None:
            return Admin(row["username"], row["csrf_token"], token_hash, via_token=False, account_id=row["user_id"],
                         role=row["role"], galleries=grants)
    return None


def _with_grants(conn: Any, find: Callable[..., Any], *args: Any) -> tuple[Any, frozenset[int] | None]:
    """The session or token row, and (for an editor) the galleries granted, in one snapshot."""
    row = find(conn, *args)
    if row is None or accounts.sees_all_galleries(row["role"]):
        return row, None
    return row, frozenset(admin_q.granted_galleries(conn, row["user_id"]))


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


Check = Callable[["Admin", dict[str, Any]], Awaitable[None]]


def _guarded(check: Check, *, page: bool) -> Callable[[F], F]:
    """A decorator for one category of admin route: log in first (a page redirects a reading request to the
    login; an API answers 401), then ``check`` the account's role, then the origin and CSRF checks of a state
    change."""

    def decorate(view: F) -> F:
        @functools.wraps(view)
        async def wrapper(*args: Any, **kwargs: Any) -> Any:
            admin = await current_admin()
            if admin is None:
                if page and request.method in SAFE_METHODS:
                    return redirect(url_for("admin.login", next=request.full_path.rstrip("?")))
                if page:
                    raise Unauthorized(_("Your session has ended. Please log in again."))
                raise Unauthorized(_("Log in or send 'Authorization: Bearer <token>'."))
            await check(admin, kwargs)
            await _check_state_change(admin)
            return await view(*args, **kwargs)

        return wrapper  # type: ignore[return-value]

    return decorate


async def _any_account(admin: Admin, kwargs: dict[str, Any]) -> None:
    return None


async def _all_galleries(admin: Admin, kwargs: dict[str, Any]) -> None:
    if not accounts.sees_all_galleries(admin.role):
        raise Forbidden(_("Your account's role does not allow this."))


async def _owner(admin: Admin, kwargs: dict[str, Any]) -> None:
    if not accounts.may_manage_accounts(admin.role):
        raise Forbidden(_("Only an owner may do this."))


async def _route_gallery(admin: Admin, kwargs: dict[str, Any]) -> None:
    """An editor reaches the gallery the route names (by ``gallery_id``, ``photo_id`` or ``upload_id``) only if
    it was granted; one that does not exist is left to the view (its own 404)."""
    if admin.galleries is None:
        return
    gallery_id = await route_gallery_id(kwargs)
    if gallery_id is not None and gallery_id not in admin.galleries:
        raise Forbidden(_("This gallery is not one of yours."))


async def route_gallery_id(kwargs: dict[str, Any]) -> int | None:
    """The gallery a route's arguments name, or None when they name nothing that exists."""
    if "gallery_id" in kwargs:
        return int(kwargs["gallery_id"])
    db = services().db
    if "photo_id" in kwargs:
        return await db.read(admin_q.gallery_of_photo, int(kwargs["photo_id"]))
    if "upload_id" in kwargs:
        return await db.read(admin_q.gallery_of_upload, str(kwargs["upload_id"]))
    return None


def require_delete(admin: Admin | None) -> None:
    """Deleting photos or galleries: owners and admins only (domain/accounts.py)."""
    if admin is None or not accounts.may_delete(admin.role):
        raise Forbidden(_("Your account may not delete photos or galleries; hide them instead."))


# The categories (module docstring). A new admin route takes one of these pairs.
account_page = _guarded(_any_account, page=True)
account_api = _guarded(_any_account, page=False)
gallery_page = _guarded(_route_gallery, page=True)
gallery_api = _guarded(_route_gallery, page=False)
admin_page = _guarded(_all_galleries, page=True)
admin_api = _guarded(_all_galleries, page=False)
owner_page = _guarded(_owner, page=True)
owner_api = _guarded(_owner, page=False)


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
    return await services().db.read(read_guest, cookie)


def read_guest(conn: Any, cookie: str | None) -> Guest | None:
    """The guest session a cookie names (None for none), read on ``conn``: :func:`guest_lookup` lets a view
    read it inside its own read, one thread hop instead of two."""
    if not cookie:
        return None
    row = guest_q.get_session(conn, security.token_hash(cookie))
    return Guest(row["id"], row["csrf_token"], row["guest_name"]) if row else None


@dataclass(frozen=True)
class GuestLookup:
    """This request's guest session, known already (``known``) or still to be read from ``cookie``."""

    known: bool
    guest: Guest | None
    cookie: str | None

    def read(self, conn: Any) -> Guest | None:
        return self.guest if self.known else read_guest(conn, self.cookie)


def guest_lookup() -> GuestLookup:
    """What :func:`current_guest` would read, to be read inside a caller's own read (``GuestLookup.read``) and
    then handed to :func:`remember_guest`."""
    if "guest" in g:
        return GuestLookup(True, g.guest, None)
    return GuestLookup(False, None, request.cookies.get(GUEST_COOKIE))


def remember_guest(guest: Guest | None) -> None:
    """The session a :class:`GuestLookup` read is this request's (:func:`current_guest` returns it)."""
    if "guest" not in g:
        g.guest = guest


async def check_guest_state_change(guest: Guest | None) -> None:
    """Guest forms and uploads: same-origin and the guest's CSRF token."""
    check_origin()
    if guest is None:
        raise Forbidden(_("Your browser session has ended. Reload the page and try again."))
    await check_csrf(guest.csrf_token)
