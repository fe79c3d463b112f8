"""Access matrix (issue 7, suite 6): every route of the app, called as every kind of visitor.

Every rule of ``app.url_map`` (HTTP and WebSocket) must be classified in :data:`ROUTES`; a new route that is not
fails :func:`test_every_route_is_classified` until someone decides who may call it. Each route is then called as:

* ``nobody`` (no cookies), ``guest_other`` (a guest who entered the password of *another* gallery),
  ``guest_expired`` (a guest of a gallery that has since expired), ``revoked`` (an admin session cookie that was
  revoked), ``admin``, and ``guest_access`` (a guest who entered this gallery's password);

against a password-protected, published gallery with a complete photo and an upload, and (for guest routes) again
against the expired gallery and against a draft (with the admin's own photo and upload). The admin's browser
session previews guest pages (issue 12, point 11): it reads the password gallery and the draft as a guest with
access would, but changes nothing there and opens no guest feed; every other visitor still gets 401 or 404.
The answers are compared with what :data:`CATEGORIES` declares, by status code. Admin calls that change things
use ids that do not exist, so they prove the check passed (404) without deleting the world the other calls need.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

import pytest
import trio

from picpeak_lite import security
from picpeak_lite.domain import accounts
from picpeak_lite.store.queries import admin as admin_q

from . import imagefactory
from .conftest import AuthActions, add_account, websocket_status
from .factories import run_pool_until_idle
from .harness import figures
from .test_upload import multipart, published

CSRF = re.compile(r'name="csrf_token" value="([^"]+)"')
# The accounts (issue 33): the first owner (the fixture's login), an admin, an editor granted the main gallery
# (``editor_own``: the gallery the calls are made against is theirs) and one granted only another gallery
# (``editor_other``); ``disabled`` is an editor's session whose account was then disabled.
ACCOUNTS = ("owner", "admin", "editor_own", "editor_other")
ROLES = ("nobody", "guest_other", "guest_expired", "revoked", "disabled", *ACCOUNTS, "guest_access")
NO_GUEST_SESSION = ("nobody", "revoked", "disabled", *ACCOUNTS)
EDITORS = ("editor_own", "editor_other")
MISSING = 999_999
UNSAFE = ("POST", "PUT", "PATCH", "DELETE")
ADMIN_CHANGE_OK = {200, 201, 204, 302, 400, 404, 409, 415}


def _all(statuses: set[int], **overrides: set[int]) -> dict[str, set[int]]:
    return {role: overrides.get(role, statuses) for role in ROLES}


def passers(guard: str, variant: str) -> tuple[str, ...]:
    """The accounts a guard lets through (web/auth.py: one guard per category of route), for a call against
    the ``variant`` gallery: an editor's own gallery is the main one only."""
    own = ("editor_own",) if variant == "main" else ()
    return {"account": ACCOUNTS, "gallery": ("owner", "admin", *own), "admin": ("owner", "admin"),
            "owner": ("owner",)}[guard]


def _guarded(guard: str, page: bool) -> Callable[[str, str], dict[str, set[int]]]:
    """An admin route behind one guard: those it lets through get the route's answer, other accounts 403;
    without a live account a page redirects a read to the login (an API answers 401), and a change is 401."""

    def expect(method: str, variant: str) -> dict[str, set[int]]:
        through = passers(guard, variant)
        refused = {role: {403} for role in ACCOUNTS if role not in through}
        if method == "GET":
            return _all({302} if page else {401}, **refused, **{role: {200} for role in through})
        return _all({401}, **refused, **{role: ADMIN_CHANGE_OK for role in through})

    return expect


def _preview(method: str, variant: str, statuses: set[int]) -> dict[str, set[int]]:
    """The photographer's preview of a guest page: reading requests of the accounts that may open the gallery."""
    return {role: statuses for role in passers("gallery", variant)} if method == "GET" else {}


def _guest(method: str, variant: str) -> dict[str, set[int]]:
    """Guest reads and guest changes of one gallery: only its guests; an expired gallery is gone for all, a draft
    is there for nobody. The sessions of the accounts that may open the gallery read both (the preview), and
    change neither; an editor of another gallery is a stranger here."""
    if variant == "expired":
        return _all({410})
    if variant == "draft":
        return _all({404}, **_preview(method, variant, {200}))
    return _all({401}, guest_access={200}, **_preview(method, variant, {200}))


def _guest_upload(method: str, variant: str) -> dict[str, set[int]]:
    no_session = {role: {403} for role in NO_GUEST_SESSION}  # no guest session: refused before the gallery is read
    if variant == "expired":
        return _all({410}, **no_session)
    if variant == "draft":
        return _all({404}, **no_session)
    return _all({401}, guest_access={202}, **no_session)


def _password_form(method: str, variant: str) -> dict[str, set[int]]:
    """Public by design (it is how one gets in); a wrong password is 401, without a session 403."""
    no_session = {role: {403} for role in NO_GUEST_SESSION}
    return _all({410} if variant == "expired" else {404} if variant == "draft" else {401}, **no_session)


def _live(method: str, variant: str) -> dict[str, set[int]]:
    """Upload feeds are their uploader's, while the gallery is open, and those of the accounts that may open its
    gallery. In the expired gallery the upload is ``guest_expired``'s own, which no longer entitles them to it;
    the draft's upload is the owner's."""
    accounts = {role: {101} for role in passers("gallery", variant)}
    if variant in ("expired", "draft"):
        return _all({403}, **accounts)
    return _all({403}, guest_access={101}, **accounts)


def _live_guest(method: str, variant: str) -> dict[str, set[int]]:
    """The guest's gallery feed, by slug, answers as the gallery page does for guests (an account's cookie counts
    for nothing there: the preview page opens no feed)."""
    if variant == "expired":
        return _all({410})
    if variant == "draft":
        return _all({404})
    return _all({401}, guest_access={101})


def _live_admin(method: str, variant: str) -> dict[str, set[int]]:
    """The admin gallery feed, by id: the accounts that may open the gallery, whatever its state."""
    return _all({403}, **{role: {101} for role in passers("gallery", variant)})


def _wall(method: str, variant: str) -> dict[str, set[int]]:
    """The live wall: the accounts that may open the gallery, whatever its state, or a wall link's (the galleries
    here have none, so everyone else is refused; test_wall covers the links). Without such a session it tells
    what the gallery page tells a stranger: a draft is 404 (as an unknown slug), an expired gallery 410."""
    return _all({410} if variant == "expired" else {404} if variant == "draft" else {403},
                **{role: {200} for role in passers("gallery", variant)})


def _live_wall(method: str, variant: str) -> dict[str, set[int]]:
    return _all({410} if variant == "expired" else {404} if variant == "draft" else {403},
                **{role: {101} for role in passers("gallery", variant)})


CATEGORIES: dict[str, Callable[[str, str], dict[str, set[int]]]] = {
    "public": lambda method, variant: _all({200}),
    "login_page": lambda method, variant: _all({200}, **{role: {302} for role in ACCOUNTS}),
    "login_submit": lambda method, variant: _all({401}),  # every role sends a wrong password (or no code)
    "account_page": _guarded("account", page=True),
    "account_api": _guarded("account", page=False),
    "gallery_page": _guarded("gallery", page=True),
    "gallery_api": _guarded("gallery", page=False),
    "admin_page": _guarded("admin", page=True),
    "admin_api": _guarded("admin", page=False),
    "owner_page": _guarded("owner", page=True),
    "guest": _guest,
    "guest_upload": _guest_upload,
    "password_form": _password_form,
    "live": _live,
    "live_guest": _live_guest,
    "live_admin": _live_admin,
    "wall": _wall,
    "live_wall": _live_wall,
    "tus_other": lambda method, variant: _all({405}),
    # The language picker: sets its cookie and sends anyone back, whatever they may see.
    "language": lambda method, variant: _all({302}),
}
GUEST_CATEGORIES = ("guest", "guest_upload", "password_form", "live", "live_guest", "live_admin", "wall",
                    "live_wall")
# Whose passing the override key "admin" stands for, by category: the accounts the guard lets through (for the
# guest categories, those whose preview or feed reaches the gallery).
GUARD_OF = {"account_page": "account", "account_api": "account", "gallery_page": "gallery",
            "gallery_api": "gallery", "admin_page": "admin", "admin_api": "admin", "owner_page": "owner"}


def expected(category: str, overrides: dict[str, set[int]], per_variant: list[Any], method: str, variant: str,
             role: str) -> set[int]:
    """What ``role`` must be answered: the category's rule, then the route's overrides (``"admin"``: every
    account the category lets through; a role's own key after it), then its overrides for one variant."""
    answer = CATEGORIES[category](method, variant)[role]
    through = passers(GUARD_OF.get(category, "gallery"), variant)
    layers = ([overrides] if variant != "expired" else []) + ([per_variant[0].get(variant, {})] if per_variant else [])
    for layer in layers:
        if role in through and "admin" in layer:
            answer = layer["admin"]
        if role != "admin" and role in layer:
            answer = layer[role]
    return answer


# endpoint -> (category, {role: statuses} overrides for the main gallery and the draft[, {variant: overrides}])
ROUTES: dict[str, tuple[Any, ...]] = {
    "static": ("public", {}),
    "favicon": ("public", {}),
    "health.healthz": ("public", {}),
    "language.choose": ("language", {}),
    "admin.login": ("login_page", {}),
    "admin.login_submit": ("login_submit", {}),
    "admin.login_code": ("login_submit", {}),  # no password step before it: no pending login
    "admin.logout": ("account_page", {}),
    "admin.dashboard": ("account_page", {}),
    "admin.new_gallery": ("admin_page", {}),
    "admin.create_gallery": ("admin_page", {}),
    "admin.gallery": ("gallery_page", {}),
    "admin.edit_gallery": ("admin_page", {}),
    "admin.update_gallery": ("admin_page", {}),
    "admin.publish": ("admin_page", {}),
    "admin.unpublish": ("admin_page", {}),
    "admin.delete": ("admin_page", {}),
    "admin.qr_sheet": ("gallery_page", {}),
    "admin.qr_image": ("gallery_page", {}),
    "admin.password": ("account_page", {}),
    "admin.password_submit": ("account_page", {}),
    "admin_photos.bulk_form": ("gallery_page", {}),
    "admin_photos.retry_form": ("gallery_page", {}),
    "admin_settings.page": ("owner_page", {}),
    "admin_settings.save_defaults": ("owner_page", {}),
    "admin_settings.save_contact": ("owner_page", {}),
    "admin_settings.save_watermark": ("owner_page", {}),
    "admin.archive_gallery": ("admin_page", {}),
    "admin.restore_gallery": ("admin_page", {}),
    # Without the form's values in the query the preview is 400: the admin got past the check.
    "admin_settings.watermark_preview": ("owner_page", {"admin": {200, 400}}),
    "admin_settings.add_webhook": ("owner_page", {}),
    "admin_settings.toggle_webhook": ("owner_page", {}),
    "admin_settings.delete_webhook": ("owner_page", {}),
    "admin_settings.test_webhook": ("owner_page", {}),
    # Email (issue 32): with email not set up here, the test message is 409 for the admin past the check.
    "email.email_client": ("admin_page", {}),
    "email.send_test": ("owner_page", {}),
    "email.edit_template": ("owner_page", {}),
    "email.save_template": ("owner_page", {}),
    "email.reset_template": ("owner_page", {}),
    "admin_api.list_galleries": ("account_api", {}),  # an editor is listed their galleries
    "admin_api.create_gallery": ("admin_api", {}),
    "admin_api.get_gallery": ("gallery_api", {}),
    "admin_api.update_gallery": ("admin_api", {}),
    "admin_api.delete_gallery": ("admin_api", {}),
    "admin_api.archive_gallery": ("admin_api", {}),
    "admin_api.restore_gallery": ("admin_api", {}),
    "admin_api.publish": ("admin_api", {}),
    "admin_api.unpublish": ("admin_api", {}),
    "admin_photos.list_photos": ("gallery_api", {}),
    "admin_photos.bulk_api": ("gallery_api", {}),
    "admin_photos.cover_api": ("gallery_api", {}),
    # The editor uploads to their own gallery (the others use a gallery id that does not exist).
    "upload.admin_upload": ("gallery_api", {"editor_own": {202}}),
    "photos.admin_upload_status": ("gallery_api", {}),
    "photos.admin_image": ("gallery_api", {}),
    "video.admin_play": ("gallery_api", {"admin": {404}}),
    "photos.retry": ("gallery_api", {}),
    "photos.delete": ("admin_api", {}),
    "guest.gallery": ("guest", {}),
    "guest.photos_page": ("guest", {}),
    "guest.upload_page": ("guest", {}),
    "guest.password_submit": ("password_form", {}),
    "photos.guest_image": ("guest", {}),
    # The world's photo is a JPEG: playing it is a 404 ("not a video") for those who may see it.
    "video.guest_play": ("guest", {"guest_access": {404}, "admin": {404}}),
    # An upload's status is its uploader's: the admin's preview gets past the gallery, not into a guest's upload.
    "photos.guest_upload_status": ("guest", {"admin": {404}}),
    "downloads.photo": ("guest", {}),
    "downloads.gallery_zip": ("guest", {}),
    # No favourites yet is 404 for the guest with access; the favourites call may or may not have run first.
    # The admin's preview session has no favourites: 404 past the gallery's check.
    "downloads.favourites_zip": ("guest", {"guest_access": {200, 404}, "admin": {404}}),
    "favourites.favourite": ("guest", {}),
    "favourites.set_guest_name": ("guest", {}),
    # Email is not set up in this world: the guest with access gets past every check to 409 ("not set up").
    "email.send_favourites": ("guest", {"guest_access": {409}}, {"draft": {"guest_access": {404}}}),
    "upload.guest_upload": ("guest_upload", {}),
    # tus (issue 14): the capabilities are public; every other call of the matrix lacks Tus-Resumable, so a
    # caller who got past the route's guards is answered 412.
    "tus.admin_options": ("public", {}),
    "tus.guest_options": ("public", {}),
    "tus.admin_create": ("gallery_api", {"admin": {412}}),
    "tus.admin_upload": ("gallery_api", {"admin": {412}}),
    # In the draft the gallery is not there for guests (404) before the protocol is looked at.
    "tus.guest_create": ("guest_upload", {"guest_access": {412}}, {"draft": {"guest_access": {404}}}),
    "tus.guest_upload": ("guest_upload", {"guest_access": {412}}, {"draft": {"guest_access": {404}}}),
    # Any other method on a tus URL (issue 28): 405 with Tus-Resumable before any guard; only a request whose
    # X-HTTP-Method-Override names a method the URL takes goes on (with that method's guards; test_tus).
    "tus.admin_creation_other": ("tus_other", {}),
    "tus.admin_upload_other": ("tus_other", {}),
    "tus.guest_creation_other": ("tus_other", {}),
    "tus.guest_upload_other": ("tus_other", {}),
    "live.upload_feed": ("live", {}),
    "live.guest_gallery_feed": ("live_guest", {}),
    "live.admin_gallery_feed": ("live_admin", {}),
    "review.queue_api": ("gallery_api", {}),
    "review.review_api": ("gallery_api", {}),
    "review.review_form": ("gallery_page", {}),
    # No favourites chosen yet is 404 (with its sentence) for the admin; the favourites call may have run first.
    "proofing.export": ("gallery_page", {"admin": {200, 404}}),
    "wall.page": ("wall", {}),
    "wall.photos": ("wall", {}),
    "wall.image": ("wall", {}),
    "wall.qr_code": ("wall", {}),
    "wall.new_link": ("admin_page", {}),
    "wall.remove_link": ("admin_page", {}),
    "live.wall_feed": ("live_wall", {}),
    # Feedback (issue 34): guests of the gallery read and change; the matrix's body has no stars and no text, so a
    # guest past every guard is told 400 for a rating or a comment (a DELETE of a rating is 200).
    "feedback.photo_feedback": ("guest", {}),
    "feedback.like": ("guest", {}),
    "feedback.rating": ("guest", {"guest_access": {200, 400}}, {"draft": {"guest_access": {404}}}),
    "feedback.comment": ("guest", {"guest_access": {400}}, {"draft": {"guest_access": {404}}}),
    "feedback.comments_api": ("gallery_api", {}),
    "feedback.review_api": ("gallery_api", {}),
    "feedback.review_form": ("gallery_page", {}),
    # No feedback given yet is 404 (with its sentence) for the admin.
    "feedback.export": ("gallery_page", {"admin": {200, 404}}),
    "feedback.sidecars_zip": ("gallery_page", {"admin": {200, 404}}),
    # The studio's brand (issue 33): its stylesheets and logo are public (the login and password pages show
    # them); no logo was uploaded in the matrix's world: 404 for everyone, past no guard.
    "brand.stylesheet": ("public", {}),
    "brand.custom_css": ("public", {}),
    "brand.logo": ("public", {role: {404} for role in ROLES}),
    "admin_settings.save_brand": ("owner_page", {}),
    # Accounts (issue 33): the accounts page and the audit trail are the owners'; each account's second factor
    # is its own. The QR code exists while an enrolment is under way (409 otherwise; the start, earlier in the
    # walk, begins one for every account); the confirmation without a right code is 400.
    # "Find me" (issue 36): a guest route like the others; "Find me" is off in the matrix's galleries, so whoever
    # gets past the gallery's checks is told 404 (its sentence). test_findme covers the searches themselves.
    "findme.page": ("guest", {"guest_access": {404}, "admin": {404}}),
    "findme.search": ("guest", {"guest_access": {404}}),
    "findme.not_me": ("guest", {"guest_access": {404}}),
    "findme.switch": ("gallery_page", {}),
    "findme.delete_index": ("gallery_page", {}),
    "accounts.accounts_page": ("owner_page", {}),
    "accounts.add_account": ("owner_page", {}),
    "accounts.set_role": ("owner_page", {}),
    "accounts.set_grants": ("owner_page", {}),
    "accounts.disable": ("owner_page", {}),
    "accounts.enable": ("owner_page", {}),
    "accounts.audit": ("owner_page", {}),
    "accounts.security_page": ("account_page", {}),
    "accounts.totp_start": ("account_page", {}),
    "accounts.totp_qr": ("account_page", {"admin": {200, 409}}),
    "accounts.totp_confirm": ("account_page", {}),
    "accounts.totp_off": ("account_page", {}),
    # Replacing a photo (issue 34): gallery work (an editor of the gallery too); the calls name no real photo.
    "upload.replace_api": ("gallery_api", {}),
    "upload.replace_form": ("gallery_page", {}),
    "admin_photos.replacement_api": ("gallery_api", {}),
    "admin_photos.replacement_form": ("gallery_page", {}),
}
# Arguments a rule's converters cannot tell: a choice for each ``any(...)`` and the file for ``static``.
CHOICES = {"kind": {"admin.qr_image": "png", "photos.admin_image": "original", "email.edit_template": "test",
                    "email.save_template": "test", "email.reset_template": "test"}, "target": {}, "filename": {}}


def rules(app: Any) -> list[Any]:
    return sorted(app.url_map.iter_rules(), key=lambda r: (r.rule, r.endpoint))


async def test_every_route_is_classified(app: Any) -> None:
    endpoints = {rule.endpoint for rule in rules(app)}
    unclassified = sorted(endpoints - set(ROUTES))
    assert unclassified == [], f"classify these routes in ROUTES: {unclassified}"
    assert sorted(set(ROUTES) - endpoints) == [], "ROUTES names routes that no longer exist"


class World:
    """The galleries, photo, upload and visitors the matrix is called against."""

    def __init__(self) -> None:
        self.clients: dict[str, Any] = {}
        self.csrf: dict[str, str | None] = {}
        self.values: dict[str, dict[str, Any]] = {}


async def enter(client: Any, slug: str, password: str) -> str:
    page = await client.get(f"/g/{slug}")
    csrf = CSRF.search(await page.get_data(as_text=True)).group(1)
    entered = await client.post(f"/g/{slug}/password", form={"password": password, "csrf_token": csrf})
    assert entered.status_code == 302
    return csrf


async def build_world(app: Any, services: Any, admin: AuthActions) -> World:
    world = World()
    main = await published(admin, name="Main", password="main-pass", allow_guest_uploads=True,
                           allow_downloads=True)
    other = await published(admin, name="Other", password="other-pass")
    expired = await published(admin, name="Expired", password="old-pass", allow_guest_uploads=True,
                              allow_downloads=True)
    draft = await admin.create_gallery(name="Draft", password="draft-pass", allow_guest_uploads=True,
                                       allow_downloads=True)
    for role in ROLES:
        world.clients[role] = admin.client if role == "owner" else app.test_client()
    world.csrf["owner"] = admin.csrf
    world.csrf["nobody"] = None
    # The other accounts, each logged in through the form in its own browser.
    grants = {"admin": (), "editor_own": (main["id"],), "editor_other": (other["id"],), "disabled": (main["id"],)}
    for role, granted in grants.items():
        await add_account(services, f"x-{role}", "admin" if role == "admin" else "editor", grants=granted)
        session = AuthActions(world.clients[role])
        assert (await session.login(username=f"x-{role}")).status_code == 302
        world.csrf[role] = session.csrf
    disabled_id = (await services.db.read(admin_q.get_user_by_name, "x-disabled"))["id"]
    await services.db.write(accounts.set_disabled, disabled_id, True, services.clock(), accounts.CLI)
    world.csrf["guest_access"] = await enter(world.clients["guest_access"], main["slug"], "main-pass")
    world.csrf["guest_other"] = await enter(world.clients["guest_other"], other["slug"], "other-pass")
    world.csrf["guest_expired"] = await enter(world.clients["guest_expired"], expired["slug"], "old-pass")
    # A guest's upload to each gallery, processed: the photos and uploads the routes are called with.
    uploads = {}
    for variant, role, gallery in (("main", "guest_access", main), ("expired", "guest_expired", expired)):
        body, headers = multipart([(f"{variant}.jpg", _jpeg(len(uploads)))])
        answer = await world.clients[role].post(
            f"/api/g/{gallery['slug']}/upload", data=body, headers={**headers, "X-CSRF-Token": world.csrf[role]})
        assert answer.status_code == 202
        uploads[variant] = await answer.get_json()
    body, headers = multipart([("draft.jpg", _jpeg(5))])
    answer = await admin.client.post(f"/api/admin/galleries/{draft['id']}/upload", data=body,
                                     headers={**headers, "X-CSRF-Token": admin.csrf})
    assert answer.status_code == 202
    uploads["draft"] = await answer.get_json()
    await run_pool_until_idle(services)
    # A second admin login whose session is then revoked; its cookie stays in that browser.
    revoked = AuthActions(world.clients["revoked"])
    assert (await revoked.login()).status_code == 302
    world.csrf["revoked"] = revoked.csrf
    cookie = next(c.value for c in world.clients["revoked"].cookie_jar if c.name == "pp_admin")
    await services.db.write(admin_q.revoke_session, security.token_hash(cookie), services.clock())
    await services.db.write(lambda conn: conn.execute("UPDATE galleries SET expires_at = 1000 WHERE id = ?",
                                                      (expired["id"],)))
    for variant, gallery in (("main", main), ("expired", expired), ("draft", draft)):
        world.values[variant] = {
            "slug": gallery["slug"], "gallery_id": gallery["id"], "photo_id": uploads[variant]["photo_ids"][0],
            "upload_id": uploads[variant]["upload_id"], "endpoint_id": MISSING, "account_id": MISSING,
            "filename": "app.css",
            "tus_id": "0" * 32, "code": "en",
            "kind": "grid", "target": "gallery", "fmt": "txt", "step": "revert",
        }
    return world


def _jpeg(seed: int = 77) -> bytes:
    return imagefactory.save(imagefactory.photo(64, 48, seed=seed), "jpeg")


def url_for_rule(rule: Any, values: dict[str, Any]) -> str:
    def value(match: re.Match[str]) -> str:
        name = match.group(2)
        return str(CHOICES.get(name, {}).get(rule.endpoint, values[name]))

    return re.sub(r"<(?:([a-z]+)(?:\([^)]*\))?:)?([a-z_]+)>", value, rule.rule)


async def call(world: World, rule: Any, method: str, role: str, values: dict[str, Any]) -> int:
    client = world.clients[role]
    if role in ("owner", "admin") and method in UNSAFE:
        values = {**values, **{k: MISSING for k in ("gallery_id", "photo_id", "endpoint_id")
                               if not rule.endpoint.startswith(("favourites.", "upload.guest", "email.send_fav"))}}
    # An editor's changes go to the real gallery and photo (that the guard looks at): they delete nothing, and
    # the matrix's bodies are no valid change, so they are answered 400/409 past the guard (or 403 at it).
    path = url_for_rule(rule, values)
    if getattr(rule, "websocket", False):
        return await ws_status(client, path)
    headers = {"X-CSRF-Token": world.csrf[role]} if world.csrf.get(role) else {}
    kwargs: dict[str, Any] = {"headers": headers, "scope_base": {"client": (f"10.9.{ROLES.index(role)}.1", 1)}}
    if rule.endpoint in ("upload.guest_upload", "upload.admin_upload"):
        body, extra = multipart([(f"{role}.jpg", _jpeg())])
        kwargs.update(data=body, headers={**headers, **extra})
    elif rule.endpoint in ("admin.login_submit", "guest.password_submit"):
        kwargs["form"] = {"username": "admin", "password": "wrong password", "csrf_token": world.csrf[role] or ""}
    elif method in UNSAFE:
        kwargs["json"] = {"name": "x"}
    with trio.fail_after(30):
        response = await client.open(path, method=method, **kwargs)
        await response.get_data()
    return response.status_code


async def ws_status(client: Any, path: str) -> int:
    return await websocket_status(client, path)


def _order(item: tuple[Any, str]) -> tuple[int, str]:
    rule, _ = item
    return (1 if rule.endpoint == "admin.logout" else 0, rule.rule)  # the admin logs out last


async def test_access_matrix(app: Any, services: Any, admin: AuthActions, capsys: pytest.CaptureFixture[str]) -> None:
    world = await build_world(app, services, admin)
    calls = sorted(((rule, method) for rule in rules(app) for method in sorted(rule.methods - {"HEAD", "OPTIONS"})),
                   key=_order)
    mismatches: list[str] = []
    count = 0
    for role in ROLES:
        for rule, method in calls:
            category, overrides, *per_variant = ROUTES[rule.endpoint]
            variants = ("main", "expired", "draft") if category in GUEST_CATEGORIES else ("main",)
            for variant in variants:
                answer = expected(category, overrides, per_variant, method, variant, role)
                status = await call(world, rule, method, role, world.values[variant])
                count += 1
                if status not in answer:
                    mismatches.append(f"{role:13} {method:6} {rule.rule} [{variant}]: {status}, "
                                      f"expected {sorted(answer)}")
    id_routes, id_calls, id_mismatches = await walk_out_of_range_ids(app, world)
    routes = len(rules(app))
    websockets = sum(1 for rule in rules(app) if getattr(rule, "websocket", False))
    figures(capsys, f"access: routes={routes} roles={len(ROLES)} calls={count} mismatches={len(mismatches)}")
    figures(capsys, f"access_matrix: routes={routes} websocket_routes={websockets} roles={len(ROLES)} calls={count} "
                    f"mismatches={len(mismatches)} id_routes={id_routes} out_of_range_calls={id_calls} "
                    f"out_of_range_mismatches={len(id_mismatches)}")
    assert mismatches == [], "\n".join(mismatches)
    assert id_mismatches == [], "\n".join(id_mismatches)


async def test_the_wall_tells_a_stranger_no_more_than_the_gallery_page(app: Any, services: Any,
                                                                         admin: AuthActions) -> None:
    """Every wall route (page, photo list, images, QR code, feed), for an unknown slug, a draft and an expired
    gallery, with no key and with a made-up one, answers a stranger and a guest of another gallery exactly as
    ``/g/<slug>`` answers them: whether a slug exists is not told by the wall (issue 27)."""
    world = await build_world(app, services, admin)
    wall_rules = [rule for rule in rules(app) if ROUTES[rule.endpoint][0] in ("wall", "live_wall")]
    assert {rule.endpoint for rule in wall_rules} >= {"wall.page", "wall.photos", "wall.image", "live.wall_feed"}
    slugs = {"unknown": "no-such-gallery", "draft": world.values["draft"]["slug"],
             "expired": world.values["expired"]["slug"]}
    mismatches: list[str] = []
    count = 0
    for role in ("nobody", "guest_other", "guest_expired"):
        client = world.clients[role]
        for variant, slug in slugs.items():
            page = await client.get(f"/g/{slug}")
            await page.get_data()
            assert page.status_code in (404, 410), (role, variant, page.status_code)
            values = {**world.values["expired" if variant == "unknown" else variant], "slug": slug}
            for rule in wall_rules:
                for query in ("", "?key=made-up-key"):
                    path = url_for_rule(rule, values) + query
                    if getattr(rule, "websocket", False):
                        status = await ws_status(client, path)
                    else:
                        response = await client.get(path)
                        await response.get_data()
                        status = response.status_code
                    count += 1
                    if status != page.status_code:
                        mismatches.append(f"{role} {path}: {status}, the gallery page {page.status_code}")
    assert count >= 3 * 3 * 2 * 4
    assert mismatches == [], "\n".join(mismatches)


# Ids no row can have: SQLite's INTEGER is 64-bit signed, so 2**63 cannot even be bound as a parameter (it used
# to reach the query and fail with a 500). Also a negative id, a huge number, one past what int() converts from
# text, and a digit of another script (which ``\\d`` would read as 1).
OUT_OF_RANGE = (str(2**63), str(2**64), "-1", str(10**30), "9" * 5000, "%D9%A1")
# Who asks: the owner, an editor of the gallery and the guest who may see the gallery (so that an answer other
# than 404 would be the route itself at work, past its checks), and a stranger.
ID_ROLES = ("owner", "editor_own", "guest_access", "nobody")


async def walk_out_of_range_ids(app: Any, world: World) -> tuple[int, int, list[str]]:
    """Every route with an ``<int:...>`` part, HTTP and WebSocket, each such part in turn set to each of
    :data:`OUT_OF_RANGE` (the others valid), every method, as :data:`ID_ROLES`: 404 every time."""
    id_rules = [rule for rule in rules(app) if "<int:" in rule.rule]
    mismatches: list[str] = []
    count = 0
    for rule in id_rules:
        names = re.findall(r"<int:([a-z_]+)>", rule.rule)
        for name in names:
            for bad in OUT_OF_RANGE:
                path = url_for_rule(rule, {**world.values["main"], name: bad})
                for method in sorted(rule.methods - {"HEAD", "OPTIONS"}):
                    for role in ID_ROLES:
                        if getattr(rule, "websocket", False):
                            status = await ws_status(world.clients[role], path)
                        else:
                            status = await raw_call(world, role, method, path)
                        count += 1
                        if status != 404:
                            mismatches.append(f"{role:13} {method:6} {rule.rule} {name}={bad[:24]}: {status}")
    return len(id_rules), count, mismatches


async def raw_call(world: World, role: str, method: str, path: str) -> int:
    headers = {"X-CSRF-Token": world.csrf[role]} if world.csrf.get(role) else {}
    kwargs: dict[str, Any] = {"headers": headers}
    if method in UNSAFE:
        kwargs["json"] = {"name": "x", "ids": [1], "photo_id": None}
    with trio.fail_after(30):
        response = await world.clients[role].open(path, method=method, **kwargs)
        await response.get_data()
    return response.status_code


async def test_the_id_bound_is_exactly_sqlites(admin: AuthActions) -> None:
    """2**63 - 1 still reaches the view (its own 'no such gallery'); 2**63 matches no route (the router's 404)."""
    largest = await admin.client.get(f"/api/admin/galleries/{2**63 - 1}")
    past = await admin.client.get(f"/api/admin/galleries/{2**63}")
    assert largest.status_code == past.status_code == 404
    assert (await largest.get_json())["error"] == "There is no such gallery."
    assert (await past.get_json())["error"] != "There is no such gallery."
    leading_zeros = await admin.client.get("/api/admin/galleries/0000000000000000001")
    assert (await leading_zeros.get_json())["error"] == "There is no such gallery."


# --- moderation: a photo waiting for approval -------------------------------------------------------------------

# What the uploader of a waiting photo may do with it, by endpoint: see its images; nothing else.
UPLOADER_MAY = {"photos.guest_image": {200}}


async def test_a_photo_waiting_for_approval_is_its_uploaders_alone(app: Any, services: Any, admin: AuthActions,
                                                                   capsys: pytest.CaptureFixture[str]) -> None:
    """Every guest route that names a photo, in a gallery whose guest photos need approval, as the uploader and
    as another guest with access: 404 for the other guest on all of them, and for the uploader on all but its
    images; after approval the other guest gets what the matrix above gives a visible photo. The feed is covered
    in test_moderation."""
    gallery = await published(admin, name="Moderated", password="mod-pass", allow_guest_uploads=True,
                              allow_downloads=True, guest_photos_need_approval=True)
    clients = {"uploader": app.test_client(), "other": app.test_client()}
    csrf = {role: await enter(client, gallery["slug"], "mod-pass") for role, client in clients.items()}
    body, headers = multipart([("waiting.jpg", _jpeg(5))])
    answer = await clients["uploader"].post(f"/api/g/{gallery['slug']}/upload", data=body,
                                            headers={**headers, "X-CSRF-Token": csrf["uploader"]})
    assert answer.status_code == 202
    photo_id = (await answer.get_json())["photo_ids"][0]
    await run_pool_until_idle(services)
    photo_rules = [rule for rule in rules(app) if ROUTES[rule.endpoint][0] == "guest" and "photo_id" in rule.rule]
    values = {"slug": gallery["slug"], "photo_id": photo_id, "kind": "grid"}
    mismatches: list[str] = []
    count = 0

    async def walk(expect: Callable[[str, str, Any], set[int]]) -> None:
        nonlocal count
        for rule in photo_rules:
            for method in sorted(rule.methods - {"HEAD", "OPTIONS"}):
                for role, client in clients.items():
                    for kind in ("grid", "view") if rule.endpoint == "photos.guest_image" else ("grid",):
                        path = url_for_rule(rule, {**values, "kind": kind})
                        response = await client.open(path, method=method, headers={"X-CSRF-Token": csrf[role]})
                        await response.get_data()
                        count += 1
                        expected = expect(role, method, rule)
                        if response.status_code not in expected:
                            mismatches.append(f"{role} {method} {path}: {response.status_code}, "
                                              f"expected {sorted(expected)}")

    await walk(lambda role, method, rule: UPLOADER_MAY.get(rule.endpoint, {404}) if role == "uploader" else {404})
    approved = await admin.client.post(f"/api/admin/galleries/{gallery['id']}/review",
                                       json={"action": "approve", "ids": [photo_id]}, headers=admin.headers())
    assert approved.status_code == 200
    # The waiting photo is a JPEG: playing it is "not a video" (404) for everyone, before approval and after.
    # A rating or comment without stars or text (these calls send none) is 400 once the photo may be seen.
    await walk(lambda role, method, rule: {404} if rule.endpoint == "video.guest_play" else
               {400} if rule.endpoint == "feedback.comment" or (rule.endpoint, method) == ("feedback.rating", "PUT")
               else {200})
    figures(capsys, f"access_matrix_awaiting: photo_routes={len(photo_rules)} calls={count} "
                    f"mismatches={len(mismatches)}")
    assert mismatches == [], "\n".join(mismatches)


async def test_play_with_downloads_off_never_sends_the_original(app: Any, services: Any, admin: AuthActions,
                                                                tmp_path: Any) -> None:
    """A guest with access to a gallery whose downloads are off: /download is 403, and /play (whole or any
    range) carries none of the original's bytes; it answers 409 until the playable copy is made."""
    from . import videofactory

    clip = videofactory.make_clip(tmp_path / "clip.mp4", width=320, height=240, seconds=1.0).read_bytes()
    gallery = await published(admin, name="No downloads", password="nodl-pass", allow_downloads=False)
    body, headers = multipart([("clip.mp4", clip)])
    sent = await admin.client.post(f"/api/admin/galleries/{gallery['id']}/upload", data=body,
                                   headers={**headers, **admin.headers()})
    assert sent.status_code == 202, await sent.get_json()
    photo_id = (await sent.get_json())["photo_ids"][0]
    await run_pool_until_idle(services)
    guest = app.test_client()
    await enter(guest, gallery["slug"], "nodl-pass")
    base = f"/g/{gallery['slug']}/photos/{photo_id}"
    assert (await guest.get(f"{base}/download")).status_code == 403
    for extra in ({}, {"Range": "bytes=0-"}, {"Range": f"bytes=0-{len(clip) - 1}"}):
        response = await guest.get(f"{base}/play", headers=extra)
        data = await response.get_data()
        assert response.status_code == 409 and clip[:64] not in data, (extra, response.status_code)
