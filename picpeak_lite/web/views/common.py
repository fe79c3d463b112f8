"""What the views share: the client's address, links, the guest's gallery, and the JSON shape of photos and
uploads. Views import this module, never each other."""

from __future__ import annotations

import ipaddress
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeVar
from urllib.parse import urlsplit

from quart import g, request, url_for

from picpeak_lite.config import Settings, split_host
from picpeak_lite.domain import access
from picpeak_lite.domain.accounts import Actor
from picpeak_lite.errors import BadRequest, Forbidden, NotFound
from picpeak_lite.i18n import _
from picpeak_lite.store.db import Connection, Row, fits_integer
from picpeak_lite.store.queries import admin_photos as admin_photo_q
from picpeak_lite.store.queries import galleries as gallery_q
from picpeak_lite.store.queries import photos as photo_q
from picpeak_lite.store.queries.photos import PhotoStatus
from picpeak_lite.web import locale
from picpeak_lite.web.auth import (
    SAFE_METHODS,
    Guest,
    admin_from_cookie,
    current_admin,
    guest_lookup,
    remember_guest,
    services,
)
from picpeak_lite.web.passwords import DEVICE_COOKIE, Device

T = TypeVar("T")


def client_ip() -> str:
    """The client's address for throttling.

    ``X-Forwarded-For`` is believed only when the peer is one of ``trusted_proxies``: the rightmost address
    that is not itself a trusted proxy is the client. IPv6 addresses count by their /64, since one client
    usually holds a whole /64 and could otherwise rotate addresses to get fresh attempts.
    """
    trusted = trusted_set(services().settings.trusted_proxies)
    address = real_client(request.remote_addr or "unknown", request.headers.get("X-Forwarded-For", ""), trusted)
    return throttle_key(address)


async def current_actor() -> Actor:
    """The account making this request, for the audit trail (``domain/accounts.Actor``)."""
    admin = await current_admin()
    if admin is None:
        return Actor(None, "(nobody)", client_ip())
    return admin.actor(client_ip())


def trusted_device(proof: str, password_hash: str | None) -> str | None:
    """The id of this browser's device cookie when it proved ``proof``'s current password (its failures are
    then counted for it alone), else None: an untrusted client (web/passwords.py)."""
    device = Device.parse(request.cookies.get(DEVICE_COOKIE))
    if device is None or password_hash is None or not device.proved(proof, password_hash):
        return None
    return device.device_id


def prove_device(proof: str, password_hash: str) -> None:
    """The right password was given: this browser's device cookie (made if it had none) now vouches for it."""
    device = Device.parse(request.cookies.get(DEVICE_COOKIE)) or Device.new()
    g.set_device_cookie = device.with_proof(proof, password_hash).value()


def trusted_set(trusted_proxies: str) -> frozenset[str]:
    return frozenset(p.strip() for p in trusted_proxies.split(",") if p.strip())


def real_client(peer: str, forwarded_for: str, trusted: frozenset[str]) -> str:
    """The client's address by the rule above, from the peer and the X-Forwarded-For header (also used by the
    request log, which runs outside a request context)."""
    address = peer
    if address in trusted:
        forwarded = [a.strip() for a in forwarded_for.split(",") if a.strip()]
        for hop in reversed(forwarded):
            address = hop
            if hop not in trusted:
                break
    return address


def throttle_key(address: str) -> str:
    try:
        ip = ipaddress.ip_address(address)
    except ValueError:
        return address
    if isinstance(ip, ipaddress.IPv6Address):
        if ip.ipv4_mapped is not None:
            return str(ip.ipv4_mapped)
        return str(ipaddress.ip_network(f"{ip}/64", strict=False))
    return str(ip)


LOOPBACK_NAMES = ("localhost", "127.0.0.1", "::1")
WILDCARD_HOSTS = ("0.0.0.0", "::", "")
DEFAULT_PORTS = {"http": 80, "https": 443}


def base_url() -> str:
    """Where share links, QR codes and ``og:`` tags point: ``public_url``, else a trusted origin.

    The Host header is the client's to choose: reflected as it is, ``Host: evil.example`` put
    ``http://evil.example/g/<slug>`` into a page a shared cache could hand to everyone. So the request's own
    origin is used only when its Host is one the server answers to anyway (see :func:`host_trusted`); any other
    Host gets the address the server listens on.
    """
    svc = services()
    public = svc.settings.public_url
    if public:
        return public.rstrip("/")
    local = _local_address()
    if host_trusted(request.host, request.scheme, svc.settings.allowed_hosts, svc.bind_url, local):
        return request.host_url.rstrip("/")
    return fallback_url(svc.bind_url, local)


def _local_address() -> tuple[str, int] | None:
    """The address this connection arrived on (the ASGI ``server``), which the client cannot choose."""
    server = request.server
    if isinstance(server, tuple | list) and len(server) == 2 and isinstance(server[1], int):
        return str(server[0]).lower(), server[1]
    return None


def host_trusted(host_header: str, scheme: str, allowed: tuple[str, ...], bind_url: str,
                 local: tuple[str, int] | None) -> bool:
    """Whether a Host header names this server: an ``allowed_hosts`` entry (``host`` on any port, or
    ``host:port``), the bind address (with its localhost / 127.0.0.1 / ::1 forms when it is a loopback or
    wildcard address), or the address the connection arrived on. A bind port of 0 (not bound yet, as under
    a test client) matches any port."""
    try:
        host, port = split_host(host_header)
    except ValueError:
        return False
    port = port if port is not None else DEFAULT_PORTS.get(scheme, 80)
    for entry in allowed:
        entry_host, entry_port = split_host(entry)
        if entry_host == host and entry_port in (None, port):
            return True
    bind = urlsplit(bind_url)
    bind_host = (bind.hostname or "").lower()
    names = {bind_host, *LOOPBACK_NAMES} if bind_host in (*LOOPBACK_NAMES, *WILDCARD_HOSTS) else {bind_host}
    if host in names and bind.port in (0, port):
        return True
    return local is not None and local == (host, port)


def fallback_url(bind_url: str, local: tuple[str, int] | None) -> str:
    """The bind URL; for a wildcard bind (0.0.0.0, ::), which no browser can open, the address the connection
    arrived on instead."""
    bind = urlsplit(bind_url)
    if (bind.hostname or "") in WILDCARD_HOSTS and local is not None:
        host = f"[{local[0]}]" if ":" in local[0] else local[0]
        return f"{bind.scheme}://{host}:{local[1]}"
    return bind_url.rstrip("/")


def describe_links(settings: Settings, bind_url: str) -> str:
    """One line for the start-up log: how share links are made, so that a wrong link is explained at once."""
    if settings.public_url:
        return f"share links use public_url {settings.public_url.rstrip('/')}"
    bind = urlsplit(bind_url)
    bind_host = (bind.hostname or "").lower()
    names = [bind_host, *[n for n in LOOPBACK_NAMES if n != bind_host]] if bind_host in (
        *LOOPBACK_NAMES, *WILDCARD_HOSTS) else [bind_host]
    trusted = [f"[{n}]:{bind.port}" if ":" in n else f"{n}:{bind.port}" for n in names]
    trusted += list(settings.allowed_hosts)
    fallback = "the address the connection arrived on" if bind_host in WILDCARD_HOSTS else bind_url.rstrip("/")
    return (f"share links use the request's Host when it is one of {', '.join(trusted)} (or the address the "
            f"connection arrived on); any other Host gets {fallback}. Set public_url (or allowed_hosts) for the "
            f"address guests use")


def share_url(slug: str) -> str:
    return f"{base_url()}/g/{slug}"


async def load_gallery(slug: str) -> dict[str, Any]:
    """The gallery if this guest may see it (raises NotFound, Gone or PasswordRequired otherwise).

    The photographer's preview: when the guest rule says no (a draft, or no password entered), a reading
    request (GET/HEAD) from a browser holding a live admin session gets the gallery anyway, and
    ``g.admin_preview`` is set so the page can say that guests do not see it this way. Nothing that changes
    state (hearts, names, uploads) and no WebSocket feed is opened by the admin session.
    """
    row, _none = await load_gallery_with(slug, None)
    return row


async def load_gallery_with(slug: str, then: Callable[[Connection, Row, Guest | None], T] | None
                            ) -> tuple[dict[str, Any], T | None]:
    """:func:`load_gallery`, and ``then(conn, gallery, guest)`` read after it: the guest's session, the gallery
    and what the view reads of it (the listing's rows, the photo an image is of) in one database read.

    One thread hop instead of three. Each hop costs the event loop a wake-up and a wait for the GIL, and
    with 20 guests browsing, the hops of the listing and of its thumbnails were a large share of the
    server's CPU per request (measured by ``bench/bench_responsive.py``). ``then`` runs only when the guest
    rule lets the guest in; in the photographer's preview it is read on its own, after the preview's check.
    """
    svc = services()
    lookup = guest_lookup()
    now = svc.clock()

    def read(conn: Connection) -> tuple[Guest | None, Exception | None, dict[str, Any] | None, T | None]:
        guest = lookup.read(conn)
        try:
            row = access.guest_gallery(conn, slug, guest.id if guest else None, now)
        except (NotFound, access.PasswordRequired) as refusal:
            return guest, refusal, None, None
        return guest, None, row, then(conn, row, guest) if then is not None else None

    guest, refusal, found, extra = await svc.db.read(read)
    remember_guest(guest)
    if refusal is not None:
        admin = await admin_from_cookie() if request.method in SAFE_METHODS else None
        if admin is None:
            raise refusal
        row = await svc.db.read(lambda conn: access.guest_gallery(conn, slug, None, now, admin_preview=True))
        if not admin.may_open(row["id"]):  # an editor previews only the galleries granted to them
            raise refusal
        g.admin_preview = True
        if then is not None:
            extra = await svc.db.read(lambda conn: then(conn, row, guest))
    else:
        assert found is not None
        row = found
    # The photographer's language for this gallery, unless the visitor picked one (web/locale.py).
    locale.apply(row.get("language"))
    return row, extra


UPLOAD_ID = re.compile(r"^[0-9a-f]{32}$")


def admin_upload_gallery(conn: Connection, *, gallery_id: int) -> dict[str, Any]:
    """The gallery an admin uploads to (multipart or tus). Run at the start and again at commit."""
    row = gallery_q.row_of(conn, gallery_id)
    if row is None:
        raise NotFound(_("There is no such gallery."))
    return row


def guest_upload_gallery(conn: Connection, *, slug: str, guest_session_id: int, clock: Any) -> dict[str, Any]:
    """The one visibility rule, then the gallery's own switch. Run at the start and again at commit."""
    row = access.guest_gallery(conn, slug, guest_session_id, clock())
    if not row["allow_guest_uploads"]:
        raise Forbidden(_("This gallery does not accept photos from guests."))
    return row


def admin_image_url(photo_id: int, kind: str) -> str:
    return url_for("photos.admin_image", photo_id=photo_id, kind=kind)


def guest_image_url(slug: str, photo_id: int, kind: str) -> str:
    return url_for("photos.guest_image", slug=slug, photo_id=photo_id, kind=kind)


ImageUrl = Callable[[int, str], str]


@dataclass(frozen=True)
class UploadSnapshot:
    """An upload group with its counts and photos, read together (for its status route and feed)."""

    upload: Row
    counts: Row
    photos: list[Row]


def upload_status(snapshot: UploadSnapshot, image_url: ImageUrl) -> dict[str, Any]:
    """The status shape shared by the admin and guest endpoints (and the WebSocket snapshot)."""
    upload, counts = snapshot.upload, snapshot.counts
    return {
        "upload_id": upload["id"],
        "gallery_id": upload["gallery_id"],
        **{k: counts[k] for k in ("total", "pending", "processing", "complete", "failed")},
        "done": upload["completed_at"] is not None,
        "photos": [photo_status(p, image_url) for p in snapshot.photos],
    }


def photo_status(photo: Row, image_url: ImageUrl) -> dict[str, Any]:
    complete = photo["status"] == PhotoStatus.COMPLETE
    return {
        "id": photo["id"],
        "filename": photo["display_name"],
        "status": photo["status"],
        "error": photo["error"],
        "width": photo["width"],
        "height": photo["height"],
        # Read strictly: a query that leaves these columns out fails here instead of calling a video a photo.
        "media_type": photo["media_type"],
        "duration": photo["duration"],
        "thumb_url": image_url(photo["id"], "grid") if complete else None,
        "view_url": image_url(photo["id"], "view") if complete else None,
        # Held back until the admin approves it (moderation): the uploader is told so.
        "awaiting_approval": bool(photo.get("awaiting_approval")),
    }


async def read_upload(upload_id: str) -> UploadSnapshot | None:
    """The upload group, its counts and photos; None for an unknown or malformed id."""
    if not UPLOAD_ID.match(upload_id):
        return None
    return await services().db.read(load_upload, upload_id)


def load_upload(conn: Connection, upload_id: str) -> UploadSnapshot | None:
    upload = photo_q.get_upload(conn, upload_id)
    if upload is None:
        return None
    photos = photo_q.upload_photos(conn, upload_id)
    # Counted from the photos read, not by a query of their own: one statement less for every status poll, and
    # the counts always agree with the list (on PostgreSQL each statement sees its own moment).
    counts: Row = {"total": len(photos), **{status.value: 0 for status in _COUNTED}}
    for photo in photos:
        if photo["status"] in counts:
            counts[photo["status"]] += 1
    return UploadSnapshot(upload, counts, photos)


_COUNTED = (PhotoStatus.PENDING, PhotoStatus.PROCESSING, PhotoStatus.COMPLETE, PhotoStatus.FAILED)


def read_filters(args: Any) -> dict[str, Any]:
    status = args.get("status") or None
    source = args.get("source") or None
    return {
        "status": status if status in admin_photo_q.STATUS_FILTERS else None,
        "source": source if source in admin_photo_q.SOURCE_FILTERS else None,
        "favourites": args.get("favourites") in ("1", "on", "true"),
    }


def filter_query(filters: dict[str, Any]) -> dict[str, str]:
    """The query string of ``read_filters``' output: only the known keys, so no client key can clash with a
    route's own arguments in ``url_for``."""
    query = {key: filters[key] for key in ("status", "source") if filters[key]}
    if filters["favourites"]:
        query["favourites"] = "1"
    return query


async def load_grid(gallery_id: int, filters: dict[str, Any]) -> tuple[list[dict[str, Any]], dict[int, list[str]]]:
    def read(conn: Any) -> tuple[list[dict[str, Any]], dict[int, list[str]]]:
        return (admin_photo_q.list_photos(conn, gallery_id, **filters),
                admin_photo_q.favourites_by_photo(conn, gallery_id))

    return await services().db.read(read)


async def action_and_ids(example_action: str) -> tuple[Any, list[int]]:
    """The JSON body of a bulk action on photos, ``{"action": ..., "ids": [...]}``, with ``ids`` checked to be
    photo ids (integers SQLite can hold, not booleans); the action is the caller's to check."""
    data = await request.get_json(force=True, silent=True)
    if not isinstance(data, dict):
        raise BadRequest(_('Send a JSON object: {"action": %(action)s, "ids": [...]}.') % {"action": example_action})
    ids = data.get("ids")
    if not isinstance(ids, list) or not all(isinstance(i, int) and not isinstance(i, bool) and fits_integer(i)
                                            for i in ids):
        raise BadRequest(_("'ids' must be a list of photo ids."))
    return data.get("action"), ids
