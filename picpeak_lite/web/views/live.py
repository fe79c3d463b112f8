"""Live progress over WebSocket: ``/ws/uploads/<upload_id>``, ``/ws/g/<slug>``, ``/ws/admin/galleries/<id>``.

Each feed is addressed the way its page is, so it asks for no more than the page does: a guest's gallery feed by
the gallery's slug (the capability the guest already holds; the numeric id is guessable and must never open
anything), with exactly the page's rule (unknown or draft 404, expired 410, password 401 until entered); the
admin's gallery feed by id, for the admin only; an upload feed by its random upload id, for the admin or the
guest session that made it while that guest may still see the gallery.

The protocol (JSON text frames) is documented in docs/live.md. In short: on connect a ``snapshot`` carrying
the current sequence number, then ``photo`` deltas in sequence order, ``ping`` every 20 s, ``resync`` (followed
by a fresh snapshot) when this client fell behind, and for uploads a ``done`` when every photo is terminal,
followed by a normal close. ``?since=<seq>`` replays exactly what a reconnecting client missed.

Authorisation and the Origin check happen before the handshake is accepted; a refused handshake gets the HTTP
status the matching page would give (403 for a foreign origin or a feed that is not this client's). Guests see
their own uploads (what the upload's status route shows them), and of a gallery only photos becoming visible
(without file names) or being removed: nothing the guest could not read from the gallery's own routes.
"""

from __future__ import annotations

import contextlib
import functools
import json
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import trio
from quart import Blueprint, Response, websocket

from picpeak_lite.domain import access, feedback, wall
from picpeak_lite.errors import AppError
from picpeak_lite.i18n import _
from picpeak_lite.runtime.broker import Change, Subscription
from picpeak_lite.store.db import Connection, fits_integer
from picpeak_lite.store.queries import changes as change_q
from picpeak_lite.store.queries import feedback as feedback_q
from picpeak_lite.store.queries import galleries as gallery_q
from picpeak_lite.store.queries import photos as photo_q
from picpeak_lite.store.queries.photos import PhotoStatus
from picpeak_lite.web.auth import (
    ADMIN_COOKIE,
    GUEST_COOKIE,
    admin_from_handshake,
    guest_from_cookie,
    limits,
    origin_allowed,
    services,
)
from picpeak_lite.web.limits import GOING_AWAY, LiveFeeds
from picpeak_lite.web.views.common import UploadSnapshot, load_upload, read_upload, upload_status

blueprint = Blueprint("live", __name__)

PING_SECONDS = 20.0
MAX_CLIENT_MESSAGE = 4096


@dataclass(frozen=True)
class Wall:
    """A live wall's connection (``web/views/wall.py``): by the admin's session or the wall link's key."""

    key: str | None
    by_admin: bool
    captions: bool


@dataclass(frozen=True)
class Viewer:
    is_admin: bool
    guest_id: int | None
    wall: Wall | None = None  # a wall sees what guests see, with its own image URLs (and captions if chosen)
    galleries: frozenset[int] | None = None  # an editor account's granted galleries; None: all

    def may_open(self, gallery_id: int) -> bool:
        return self.is_admin and (self.galleries is None or gallery_id in self.galleries)


async def _viewer() -> Viewer | None:
    """Who opens this WebSocket: the admin (session cookie or API token) or a guest session; None if nobody."""
    try:
        admin = await admin_from_handshake(websocket.headers.get("Authorization"), websocket.cookies.get(ADMIN_COOKIE))
    except AppError:
        return None
    if admin is not None:
        return Viewer(True, None, galleries=admin.galleries)
    cookie = websocket.cookies.get(GUEST_COOKIE)
    guest = await guest_from_cookie(cookie) if cookie else None
    return Viewer(False, guest.id) if guest else None


def _refuse(message: str = "Forbidden", status: int = 403) -> Response:
    return Response(message, status=status, content_type="text/plain; charset=utf-8")


FULL = "The server is following too many live pages; this page will try again shortly."


def _counted(route: Callable[..., Awaitable[Response | None]]) -> Callable[..., Awaitable[Response | None]]:
    """Each open WebSocket takes a place in ``max_websockets`` (``limits().websockets``) for as long as it is
    open: one holds about 50 KB that the process keeps for the next one but never gives back, so the cap is
    what they can take together. Past it the handshake is answered 503: ``live.js`` tries again with backoff (up to 15 s
    apart), and an upload's progress falls back to polling."""

    @functools.wraps(route)
    async def counted(*args: Any, **kwargs: Any) -> Response | None:
        places = limits().websockets
        try:
            places.acquire_nowait()
        except trio.WouldBlock:
            refusal = _refuse(FULL, 503)
            refusal.headers["Retry-After"] = "30"
            return refusal
        feeds = limits().feeds
        try:
            if feeds.going_away.is_set():  # the server is stopping: try again once it is back
                refusal = _refuse(GOING_AWAY_TEXT, 503)
                refusal.headers["Retry-After"] = "5"
                return refusal
            return await _until_going_away(feeds, route, *args, **kwargs)
        finally:
            places.release()

    return counted


GOING_AWAY_TEXT = "The server is restarting; this page will reconnect."


async def _until_going_away(feeds: LiveFeeds, route: Callable[..., Awaitable[Response | None]], *args: Any,
                            **kwargs: Any) -> Response | None:
    """Run a feed until it ends, or until the server stops (``LiveFeeds.close_all``): then the feed is
    cancelled and its connection closed with 1001, so that the drain does not wait for it."""
    feeds.opened()
    try:
        route_scope = trio.CancelScope()
        result: Response | None = None
        async with trio.open_nursery() as nursery:
            nursery.start_soon(_cancel_when_going_away, feeds, route_scope)
            with route_scope:
                result = await route(*args, **kwargs)
            nursery.cancel_scope.cancel()
        if route_scope.cancelled_caught:
            # Already closed by the feed, or the client left meanwhile: nothing more to tell it.
            with contextlib.suppress(RuntimeError, trio.BrokenResourceError, trio.ClosedResourceError,
                                     trio.BusyResourceError):
                await websocket.close(GOING_AWAY, "server restarting")
        return result
    finally:
        feeds.closed()


async def _cancel_when_going_away(feeds: LiveFeeds, route_scope: trio.CancelScope) -> None:
    await feeds.going_away.wait()
    route_scope.cancel()


def _origin_ok() -> bool:
    origin = websocket.headers.get("Origin")
    return origin is None or origin_allowed(origin, websocket.host, services().settings.public_url)


class _ConnectionClosing(Exception):
    """The client's connection was closed under a send: the feed ends quietly, the client is gone."""


async def _send(message: dict[str, Any]) -> None:
    """Send one frame. When the client closes its connection (a page that got its "done", a reload), hypercorn
    shuts the socket down from its own task, and not under the lock its sends take: a frame of ours sent in that
    moment meets ``trio.BusyResourceError`` ("another task is currently sending data"), or a broken or closed
    stream just after. That is the client leaving, not a failure: the feed ends without a traceback."""
    try:
        await websocket.send(json.dumps(message, ensure_ascii=False))
    except (trio.BusyResourceError, trio.BrokenResourceError, trio.ClosedResourceError) as error:
        raise _ConnectionClosing from error


async def _read_client_messages(cancel: trio.CancelScope) -> None:
    """Clients have nothing to say but may send small keep-alives; anything large ends the connection."""
    while True:
        message = await websocket.receive()
        if len(message) > MAX_CLIENT_MESSAGE:
            await websocket.close(1009, "message too big")
            cancel.cancel()
            return


def _since() -> int | None:
    """The ``since`` sequence number, or None (a fresh snapshot) when it is missing or not one we could have
    sent: at most 19 ASCII digits within SQLite's range, as the change log's ids are."""
    raw = websocket.args.get("since")
    if raw is None or not raw.isascii() or not raw.isdigit() or len(raw) > 19:
        return None
    value = int(raw)
    return value if fits_integer(value) else None


class GuestAccess:
    """Asks the one visibility function again while a guest's connection lives: an unpublished or expired
    gallery, or a changed password, ends the feed within ``RECHECK_SECONDS`` (or at the next ping)."""

    RECHECK_SECONDS = 5.0

    def __init__(self, viewer: Viewer, slug: str) -> None:
        self.viewer = viewer
        self.slug = slug
        self._checked_at = trio.current_time()

    async def still_allowed(self) -> bool:
        if self.viewer.is_admin or trio.current_time() - self._checked_at < self.RECHECK_SECONDS:
            return True
        svc = services()
        try:
            if self.viewer.wall is not None:  # a replaced or removed wall link ends its walls' feeds
                await svc.db.read(wall.wall_gallery, self.slug, self.viewer.wall.key, self.viewer.wall.by_admin,
                                  svc.clock())
            else:
                await svc.db.read(access.guest_gallery, self.slug, self.viewer.guest_id, svc.clock())
        except AppError:
            await websocket.close(4403, "no longer allowed")
            return False
        self._checked_at = trio.current_time()
        return True


# --- uploads -----------------------------------------------------------------------------------------------

@blueprint.websocket("/ws/uploads/<upload_id>")
@_counted
async def upload_feed(upload_id: str) -> Response | None:
    svc = services()
    if not _origin_ok():
        return _refuse("This page is from another site.")
    viewer = await _viewer()
    if viewer is None:
        return _refuse("Log in first.")
    found = await read_upload(upload_id)
    if not viewer.is_admin and (found is None or found.upload["guest_session_id"] != viewer.guest_id):
        return _refuse("This is not your upload.")
    gallery = await svc.db.read(gallery_q.get, found.upload["gallery_id"]) if found is not None else None
    if viewer.is_admin and gallery is not None and not viewer.may_open(gallery["id"]):
        return _refuse("This gallery is not one of yours.")
    if not viewer.is_admin:
        # The uploader follows it only while they may still see the gallery (expired, unpublished or a changed
        # password end that), as the HTTP status route decides through the same function.
        try:
            await svc.db.read(access.guest_gallery, gallery["slug"] if gallery else "", viewer.guest_id, svc.clock())
        except AppError:
            return _refuse("You cannot see this gallery.")
    await websocket.accept()
    if found is None:
        await _send({"type": "error", "error": _("There is no upload with this id.")})
        await websocket.close(4404, "unknown upload")
        return None
    image_url = _image_url(viewer, gallery["slug"] if gallery else "")
    try:
        with svc.broker.subscribe(lambda change: change.upload_id == upload_id and not change.feedback) as subscription:
            async with trio.open_nursery() as nursery:
                nursery.start_soon(_read_client_messages, nursery.cancel_scope)
                allowed = GuestAccess(viewer, gallery["slug"] if gallery else "")
                await _stream_upload(upload_id, subscription, image_url, _since(), allowed)
                nursery.cancel_scope.cancel()
    except* _ConnectionClosing:
        pass
    return None


async def _stream_upload(upload_id: str, subscription: Subscription, image_url: Callable[[int, str], str],
                         since: int | None, allowed: GuestAccess) -> None:
    db = services().db

    def snapshot(conn: Connection) -> tuple[UploadSnapshot | None, int, int]:
        # The sequence first: on PostgreSQL each statement of a read sees its own snapshot, so the photos read
        # after it hold at least every change up to it (a later change sent again is harmless; one skipped is not).
        seq, oldest = change_q.latest_seq(conn), change_q.oldest_seq(conn)
        return load_upload(conn, upload_id), seq, oldest

    found, seq, oldest = await db.read(snapshot)
    if found is None:  # deleted with its gallery since the handshake
        return
    statuses = {p["id"]: p["status"] for p in found.photos}
    if since is not None and since >= oldest - 1 and since <= seq:
        # Resume: exactly the changes the client missed, then live.
        for row in await db.read(change_q.for_upload_after, upload_id, since):
            if row["seq"] <= seq:
                await _send(_delta(Change.from_row(row), image_url))
    else:
        await _send({"type": "snapshot", "seq": seq, **upload_status(found, image_url)})
    while not _all_terminal(statuses):
        change = await _next_change(subscription)
        if not await allowed.still_allowed():
            return
        if change is None:
            await _send({"type": "ping"})
            continue
        if isinstance(change, Resync):
            found, seq, _ = await db.read(snapshot)
            if found is None:
                return
            statuses = {p["id"]: p["status"] for p in found.photos}
            await _send({"type": "resync"})
            await _send({"type": "snapshot", "seq": seq, **upload_status(found, image_url)})
            continue
        if change.seq <= seq:
            continue
        seq = change.seq
        if change.status == "deleted":
            statuses.pop(change.photo_id, None)
        else:
            statuses[change.photo_id] = change.status
        await _send(_delta(change, image_url))
    final = await db.read(load_upload, upload_id)
    status = upload_status(final, image_url) if final else {"upload_id": upload_id, "total": 0}
    await _send({"type": "done", "seq": seq, **{k: v for k, v in status.items() if k != "photos"}})
    await websocket.close(1000, "done")


def _all_terminal(statuses: dict[int, str]) -> bool:
    return all(s in photo_q.TERMINAL for s in statuses.values())


class Resync:
    """What :func:`_next_change` returns when this client fell behind: it is sent a fresh snapshot."""


RESYNC = Resync()


async def _next_change(subscription: Subscription) -> Change | Resync | None:
    """The next change, :data:`RESYNC` after an overflow, or None when it is time for a ping."""
    if subscription.overflowed:
        subscription.drain()
        return RESYNC
    with trio.move_on_after(PING_SECONDS):
        change = await subscription.receive.receive()
        return RESYNC if subscription.overflowed else change
    return None


def _image_url(viewer: Viewer, slug: str) -> Callable[[int, str], str]:
    if viewer.wall is not None:
        query = f"?key={viewer.wall.key}" if viewer.wall.key else ""
        return lambda photo_id, kind: f"/g/{slug}/wall/photos/{photo_id}.jpg{query}"
    if viewer.is_admin:
        return lambda photo_id, kind: f"/api/admin/photos/{photo_id}/{kind}"
    return lambda photo_id, kind: f"/g/{slug}/photos/{photo_id}/{kind}"


def _delta(change: Change, image_url: Callable[[int, str], str]) -> dict[str, Any]:
    complete = change.status == PhotoStatus.COMPLETE
    return {
        "type": "photo",
        "seq": change.seq,
        "id": change.photo_id,
        "status": change.status,
        "hidden": change.hidden,
        "awaiting_approval": change.awaiting_approval,
        "error": change.error if change.status == PhotoStatus.FAILED else None,
        "filename": change.filename,
        "guest_name": change.guest_name,
        "width": change.width,
        "height": change.height,
        "media_type": change.media_type,
        "duration": change.duration,
        "thumb_url": image_url(change.photo_id, "grid") if complete else None,
        "view_url": image_url(change.photo_id, "view") if complete else None,
    }


# --- galleries ---------------------------------------------------------------------------------------------

@blueprint.websocket("/ws/g/<slug>")
@_counted
async def guest_gallery_feed(slug: str) -> Response | None:
    """The guest page's feed. Only the guest session counts, as on the page: an admin cookie opens nothing here
    (the admin follows galleries by id below), so this feed never shows more than ``/g/<slug>`` does."""
    svc = services()
    if not _origin_ok():
        return _refuse("This page is from another site.")
    cookie = websocket.cookies.get(GUEST_COOKIE)
    guest = await guest_from_cookie(cookie) if cookie else None
    viewer = Viewer(False, guest.id if guest else None)
    try:
        gallery = await svc.db.read(access.guest_gallery, slug, viewer.guest_id, svc.clock())
    except AppError as error:
        # The page's answer, by status: 404 unknown or draft, 410 expired, 401 password not entered yet.
        return _refuse(error.message, error.status)
    return await _serve_gallery(gallery, viewer)


@blueprint.websocket("/ws/g/<slug>/wall")
@_counted
async def wall_feed(slug: str) -> Response | None:
    """The live wall's feed: what the guest feed sends, with the wall's image URLs and, if the gallery shows
    them, guests' names. Opened with the admin's session or the wall link's ``key`` (``domain/wall.py``)."""
    svc = services()
    if not _origin_ok():
        return _refuse("This page is from another site.")
    admin = await _viewer()
    by_admin = admin is not None and admin.is_admin
    if admin is not None and admin.is_admin and admin.galleries is not None:  # an editor: their galleries' walls
        row = await svc.db.read(gallery_q.get_by_slug, slug)
        by_admin = row is not None and admin.may_open(row["id"])
    key = websocket.args.get("key") or None
    try:
        gallery = await svc.db.read(wall.wall_gallery, slug, key, by_admin, svc.clock())
    except AppError as error:
        return _refuse(error.message, error.status)
    return await _serve_gallery(gallery, Viewer(False, None, Wall(key, by_admin, bool(gallery["wall_captions"]))))


@blueprint.websocket("/ws/admin/galleries/<int:gallery_id>")
@_counted
async def admin_gallery_feed(gallery_id: int) -> Response | None:
    """Every change of one gallery, for the admin only (session cookie or API token)."""
    svc = services()
    if not _origin_ok():
        return _refuse("This page is from another site.")
    viewer = await _viewer()
    if viewer is None or not viewer.is_admin:
        return _refuse("Log in first.")
    gallery = await svc.db.read(gallery_q.get, gallery_id)
    if gallery is None:
        return _refuse("There is no such gallery.", 404)
    if not viewer.may_open(gallery_id):
        return _refuse("This gallery is not one of yours.")
    return await _serve_gallery(gallery, viewer)


async def _serve_gallery(gallery: dict[str, Any], viewer: Viewer) -> Response | None:
    svc = services()
    gallery_id = gallery["id"]
    await websocket.accept()
    image_url = _image_url(viewer, gallery["slug"])
    try:
        with svc.broker.subscribe(lambda change: change.gallery_id == gallery_id) as subscription:
            async with trio.open_nursery() as nursery:
                nursery.start_soon(_read_client_messages, nursery.cancel_scope)
                allowed = GuestAccess(viewer, gallery["slug"])
                await _stream_gallery(gallery_id, viewer, subscription, image_url, _since(), allowed)
                nursery.cancel_scope.cancel()
    except* _ConnectionClosing:
        pass
    return None


async def _stream_gallery(gallery_id: int, viewer: Viewer, subscription: Subscription,
                          image_url: Callable[[int, str], str], since: int | None, allowed: GuestAccess) -> None:
    db = services().db

    def positions(conn: Any) -> tuple[int, int]:
        return change_q.latest_seq(conn), change_q.oldest_seq(conn)

    seq, oldest = await db.read(positions)
    if since is not None and since >= oldest - 1 and since <= seq:
        for row in await db.read(change_q.for_gallery_after, gallery_id, since):
            message = await _gallery_message(Change.from_row(row), viewer, image_url)
            if row["seq"] <= seq and message:
                await _send(message)
    else:
        await _send({"type": "snapshot", "seq": seq})
    while True:
        change = await _next_change(subscription)
        if not await allowed.still_allowed():
            return
        if change is None:
            await _send({"type": "ping"})
        elif isinstance(change, Resync):
            seq = await db.read(change_q.latest_seq)
            await _send({"type": "resync"})
            await _send({"type": "snapshot", "seq": seq})
        elif change.seq > seq:
            seq = change.seq
            message = await _gallery_message(change, viewer, image_url)
            if message:
                await _send(message)


async def _gallery_message(change: Change, viewer: Viewer,
                           image_url: Callable[[int, str], str]) -> dict[str, Any] | None:
    """The frame for one change of a gallery, or None when this viewer is told nothing of it."""
    if change.feedback:
        return await _feedback_message(change, viewer)
    return _gallery_delta(change, viewer, image_url)


async def _feedback_message(change: Change, viewer: Viewer) -> dict[str, Any] | None:
    """A like, rating or comment changed on a photo: its counts as they are now (read once per frame; a burst
    of changes is told by its latest counts each time). The admin also gets the held count and the newest
    comment, held or not; guests (and walls, which show no feedback) only counts of what every guest may see,
    and only for a photo they may see: a guest who has the photo open asks for its comments again."""
    if not viewer.is_admin and (viewer.wall is not None or change.awaiting_approval or change.hidden
                                or change.status != PhotoStatus.COMPLETE):
        return None

    def read(conn: Connection) -> dict[str, Any] | None:
        summary = feedback_q.summary(conn, change.photo_id, None)
        message: dict[str, Any] = {
            "type": "feedback", "seq": change.seq, "id": change.photo_id, "likes": summary["likes"],
            "ratings": summary["ratings"],
            "rating": round(summary["rating_mean"], 2) if summary["rating_mean"] is not None else None,
            "comments": summary["comments"]}
        if viewer.is_admin:
            newest = feedback_q.newest_comment(conn, change.photo_id)
            message["held"] = summary["held"]
            message["filename"] = change.filename
            message["comment"] = feedback.comment_json(newest) if newest else None
        return message

    return await services().db.read(read)


def _gallery_delta(change: Change, viewer: Viewer, image_url: Callable[[int, str], str]) -> dict[str, Any] | None:
    """Admins see every change; guests only photos becoming visible or going away."""
    if viewer.is_admin:
        return _delta(change, image_url)
    if change.awaiting_approval:
        # Held back for the admin's review: never seen by guests, so nothing to add or remove (approval arrives
        # as a change of its own, without the mark).
        return None
    if change.status == PhotoStatus.COMPLETE and not change.hidden:
        # Not the file name: it may be another guest's, and the guest listing does not show names either.
        message = {**_delta(change, image_url), "filename": None, "guest_name": None}
        if viewer.wall is not None:
            message["caption"] = change.guest_name if viewer.wall.captions else None
        return message
    if change.status == "deleted" or change.hidden:
        return {"type": "photo", "seq": change.seq, "id": change.photo_id, "status": "removed"}
    return None
