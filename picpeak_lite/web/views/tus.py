"""The tus 1.0.0 routes (issue 14): resumable uploads, for any tus client and for our own upload pages.

Creation URLs, beside the multipart routes and with the same guards::

    OPTIONS/POST  /api/admin/galleries/<id>/tus          (admin session with X-CSRF-Token, or an API token)
    OPTIONS/POST  /api/g/<slug>/tus                       (the guest session, X-CSRF-Token, Origin checks)
    HEAD/PATCH/DELETE  .../tus/<32 hex>                   (the upload, its uploader's only: 404 for anyone else)

Core, creation, creation-with-upload, termination, expiration and checksum (sha1, sha256) are implemented as
the specification says: every request but OPTIONS must carry ``Tus-Resumable: 1.0.0`` (412 otherwise, with
``Tus-Version``), every answer carries it; a ``PATCH`` needs ``Content-Type: application/offset+octet-stream``
(415) and the ``Upload-Offset`` the upload is at (409 otherwise, with the real one); past ``Upload-Length`` is
413; an unknown upload 404, an expired one 410; a chunk failing its ``Upload-Checksum`` is 460 and not kept.

What is ours: ``Upload-Metadata`` keys ``filename`` (or ``name``), ``filetype`` (informative: the bytes decide),
``guest_name`` (guests), and ``upload_group``, a key of the client's choice that puts the files of one batch
in one upload group (``pipeline/resumable.py``). The answer to the ``PATCH`` that completes a file (and a
``HEAD`` afterwards) says what became of it: ``Picpeak-Photo-Id``, ``Picpeak-Upload-Id`` (the group to follow
on the status route and ``/ws/uploads/<id>``; absent when the group has no photo) and ``Picpeak-Duplicate``.
A file the intake refuses ends its upload, and that ``PATCH`` is answered as a multipart file's refusal would
be (413, 415, 409 or 400, with ``{"error": ...}``); a ``HEAD`` afterwards answers the same status, its sentence
in ``Picpeak-Error`` (percent-encoded: a HEAD answer has no body). A complete upload is a photo or a refusal
(issue 28): the ``PATCH`` that delivers the last byte answers 204 only once the photo exists; if storing it
fails for a reason that may pass (the bucket, the disk), it answers 503 with Retry-After and the server tries
again by itself (``resumable.Finisher``), and until then ``HEAD`` answers 423 with Retry-After, never the full
offset (which a client takes for success). A ``PATCH`` reaching one process while a request in another is
writing the same upload answers 423 with Retry-After too (``resumable.WriterBusy``).

Guest budgets: creating an upload costs one request of the guest's upload budget (``ratelimit.py``), and the
length it announces is charged to the byte budgets (session and address) at once: an announced upload holds
its bytes whether or not any arrive (``pipeline/resumable.py`` caps what guests may hold unfinished).

A request refused before its body was read has the rest read and dropped (up to DRAIN_MAX; beyond that the
answer says ``Connection: close``): an HTTP client reads the answer only once it has sent its body, so a 409
would otherwise reach it only at its timeout.
"""

from __future__ import annotations

import functools
from collections.abc import Awaitable, Callable
from email.utils import formatdate
from typing import Any
from urllib.parse import quote

import trio
from quart import Blueprint, g, request, url_for

from picpeak_lite import security
from picpeak_lite.errors import AppError, BadRequest, Forbidden, UnsupportedMedia
from picpeak_lite.i18n import N_, _
from picpeak_lite.pipeline import resumable
from picpeak_lite.pipeline.intake import Authorize, Limits
from picpeak_lite.pipeline.resumable import Finished, OffsetMismatch, Owner
from picpeak_lite.store.db import Row
from picpeak_lite.store.queries import tus as tus_q
from picpeak_lite.web.auth import SAFE_METHODS, check_origin, current_guest, gallery_api, limits, services
from picpeak_lite.web.views.common import admin_upload_gallery, client_ip, guest_upload_gallery

blueprint = Blueprint("tus", __name__)

TUS_VERSION = "1.0.0"
EXTENSIONS = "creation,creation-with-upload,termination,expiration,checksum"
OFFSET_TYPE = "application/offset+octet-stream"
DRAIN_MAX = 64 * 1024 * 1024  # the most of a refused body read to keep its connection (8 chunks of the default)
HEAD_WAIT_SECONDS = 10  # the longest a HEAD waits for a try at making the photo that is running now
CSRF_MESSAGE = N_("The page has expired or did not send its security token. Reload the page and try again.")


CREATION_METHODS = ("OPTIONS", "POST")
UPLOAD_METHODS = ("HEAD", "PATCH", "DELETE")
# Every other method reaches a view of this blueprint, so that its 405 carries Tus-Resumable and Allow (werkzeug's
# own 405 comes from routing, before any blueprint), and X-HTTP-Method-Override can turn it into one we take.
OTHER_ON_CREATION = ["GET", "PUT", "PATCH", "DELETE"]
OTHER_ON_UPLOAD = ["GET", "POST", "PUT", "OPTIONS"]


class MethodNotAllowed(AppError):
    status = 405
    title = "Method Not Allowed"

    def __init__(self, allowed: tuple[str, ...]) -> None:
        super().__init__(f"This tus URL takes {', '.join(allowed)}.")
        self.allowed = allowed

    def headers(self) -> dict[str, str]:
        return {"Allow": ", ".join(self.allowed)}


@blueprint.before_request
async def _method_override() -> None:
    """tus: a server MUST take ``X-HTTP-Method-Override`` as the request's method (for clients behind proxies
    that pass only GET and POST). Replaced before any guard runs, so that the guards (the CSRF check of a state
    change) and the protocol see the method meant; one a URL does not take is answered 405 by its view."""
    override = request.headers.get("X-HTTP-Method-Override")
    if override:
        request.method = override.strip().upper()


def _check_method(allowed: tuple[str, ...]) -> None:
    if request.method not in allowed:
        raise MethodNotAllowed(allowed)


class PreconditionFailed(AppError):
    status = 412
    title = "Precondition Failed"

    def headers(self) -> dict[str, str]:
        return {"Tus-Version": TUS_VERSION}


@blueprint.after_request
async def _tus_headers(response: Any) -> Any:
    response.headers["Tus-Resumable"] = TUS_VERSION
    if request.method == "HEAD" and response.status_code >= 400:
        # A HEAD answer has no body: its sentence goes in a header, percent-encoded (static/upload-queue.js).
        sentence = g.get("tus_error")
        if sentence:
            response.headers["Picpeak-Error"] = quote(sentence[:500], safe=" ,.;:()'!?/-")
    has_body = (request.content_length or 0) > 0 or "chunked" in request.headers.get("Transfer-Encoding", "")
    if has_body and not g.get("tus_drained") and not await _drain(DRAIN_MAX):
        response.headers["Connection"] = "close"
    return response


async def _drain(most: int) -> bool:
    """Read and drop the rest of a refused chunk (a 409 for an offset a client got wrong, say) so that the
    client, which reads the answer only once it has sent everything, gets it now and keeps its connection. A
    body larger than ``most`` is not read further: the answer closes the connection instead."""
    if (request.content_length or 0) > most:
        return False
    request.body.stream()  # type: ignore[attr-defined]  # BoundedBody (web/asgi.py)
    dropped = 0
    async for chunk in request.body:
        dropped += len(chunk)
        if dropped > most:
            return False
    return True


# --- admin -------------------------------------------------------------------------------------------------

@blueprint.route("/api/admin/galleries/<int:gallery_id>/tus", methods=["OPTIONS"], provide_automatic_options=False)
async def admin_options(gallery_id: int) -> Any:
    return _options(Limits.admin(services().settings))


@blueprint.post("/api/admin/galleries/<int:gallery_id>/tus")
@gallery_api
async def admin_create(gallery_id: int) -> Any:
    _check_method(("POST",))
    _check_protocol()
    authorize = functools.partial(admin_upload_gallery, gallery_id=gallery_id)
    return await _create(authorize, Limits.admin(services().settings), Owner("admin"),
                         lambda tus_id: url_for("tus.admin_upload", gallery_id=gallery_id, tus_id=tus_id),
                         client_ip=client_ip())


@blueprint.route("/api/admin/galleries/<int:gallery_id>/tus/<tus_id>", methods=["HEAD", "PATCH", "DELETE"],
                 provide_automatic_options=False)
@gallery_api
async def admin_upload(gallery_id: int, tus_id: str) -> Any:
    _check_protocol()
    authorize = functools.partial(admin_upload_gallery, gallery_id=gallery_id)
    await services().db.read(authorize)
    return await _upload(tus_id, gallery_id, Owner("admin"))


@blueprint.route("/api/admin/galleries/<int:gallery_id>/tus", methods=OTHER_ON_CREATION)
async def admin_creation_other(gallery_id: int) -> Any:
    if request.method == "POST":  # X-HTTP-Method-Override: POST
        return await admin_create(gallery_id)
    raise MethodNotAllowed(CREATION_METHODS)


@blueprint.route("/api/admin/galleries/<int:gallery_id>/tus/<tus_id>", methods=OTHER_ON_UPLOAD,
                 provide_automatic_options=False)
async def admin_upload_other(gallery_id: int, tus_id: str) -> Any:
    if request.method == "OPTIONS":
        return _options(Limits.admin(services().settings))
    _check_method(UPLOAD_METHODS)  # before the guards: only an X-HTTP-Method-Override goes on
    return await admin_upload(gallery_id, tus_id)


# --- guests ------------------------------------------------------------------------------------------------

@blueprint.route("/api/g/<slug>/tus", methods=["OPTIONS"], provide_automatic_options=False)
async def guest_options(slug: str) -> Any:
    return _options(Limits.guest(services().settings))


@blueprint.post("/api/g/<slug>/tus")
async def guest_create(slug: str) -> Any:
    _check_method(("POST",))
    owner, authorize, _ = await _guest(slug)
    _check_protocol()
    budgets, ip = limits().guest_upload_limits, client_ip()
    await budgets.take(owner.guest_session_id or 0, ip)
    return await _create(authorize, Limits.guest(services().settings), owner,
                         lambda tus_id: url_for("tus.guest_upload", slug=slug, tus_id=tus_id),
                         client_ip=ip, on_created=_charge(owner, ip))


@blueprint.route("/api/g/<slug>/tus/<tus_id>", methods=["HEAD", "PATCH", "DELETE"], provide_automatic_options=False)
async def guest_upload(slug: str, tus_id: str) -> Any:
    owner, _, gallery = await _guest(slug)
    _check_protocol()
    return await _upload(tus_id, gallery["id"], owner)


@blueprint.route("/api/g/<slug>/tus", methods=OTHER_ON_CREATION)
async def guest_creation_other(slug: str) -> Any:
    if request.method == "POST":  # X-HTTP-Method-Override: POST
        return await guest_create(slug)
    raise MethodNotAllowed(CREATION_METHODS)


@blueprint.route("/api/g/<slug>/tus/<tus_id>", methods=OTHER_ON_UPLOAD, provide_automatic_options=False)
async def guest_upload_other(slug: str, tus_id: str) -> Any:
    if request.method == "OPTIONS":
        return _options(Limits.guest(services().settings))
    _check_method(UPLOAD_METHODS)  # before the guards: only an X-HTTP-Method-Override goes on
    return await guest_upload(slug, tus_id)


async def _guest(slug: str) -> tuple[Owner, Authorize, dict[str, Any]]:
    """The multipart route's guards: the origin, the guest session, its CSRF token (in ``X-CSRF-Token``: a tus
    request has no form), and the gallery as this guest may see it."""
    svc = services()
    check_origin()
    guest = await current_guest(create=False)
    if guest is None:
        raise Forbidden(_("Your browser session has ended. Reload the page and try again."))
    if request.method not in SAFE_METHODS:
        sent = request.headers.get("X-CSRF-Token")
        if not sent or not security.tokens_equal(sent, guest.csrf_token):
            raise Forbidden(_(CSRF_MESSAGE))
    authorize = functools.partial(guest_upload_gallery, slug=slug, guest_session_id=guest.id, clock=svc.clock)
    gallery = await svc.db.read(authorize)
    return Owner("guest", guest.id, guest.name), authorize, gallery


def _charge(owner: Owner, ip: str) -> Callable[[int], Awaitable[None]]:
    budgets = limits().guest_upload_limits
    return lambda size: budgets.charge_bytes(owner.guest_session_id or 0, ip, size)


# --- the protocol ------------------------------------------------------------------------------------------

def _options(file_limits: Limits) -> Any:
    g.tus_drained = True
    return "", 204, {
        "Tus-Version": TUS_VERSION, "Tus-Extension": EXTENSIONS, "Tus-Max-Size": str(file_limits.sink_bytes),
        "Tus-Checksum-Algorithm": ",".join(resumable.CHECKSUMS),
    }


def _check_protocol() -> None:
    if request.headers.get("Tus-Resumable") != TUS_VERSION:
        raise PreconditionFailed(_("This is a tus %(TUS_VERSION)s endpoint: send 'Tus-Resumable: %(TUS_VERSION2)s'.")
                                 % {"TUS_VERSION": TUS_VERSION, "TUS_VERSION2": TUS_VERSION})


def _number(name: str) -> int:
    value = request.headers.get(name)
    if value is None:
        raise BadRequest(_("The %(name)s header is missing.") % {"name": name})
    if not value.isascii() or not value.isdigit() or len(value) > 18:
        raise BadRequest(_("The %(name)s header must be a non-negative integer.") % {"name": name})
    return int(value)


async def _create(authorize: Authorize, file_limits: Limits, owner: Owner, location: Callable[[str], str], *,
                  client_ip: str, on_created: Callable[[int], Awaitable[None]] | None = None) -> Any:
    if "Upload-Concat" in request.headers:
        # Not in Tus-Extension: taken, a client's parallel mode would end in a refusal only after every part.
        raise BadRequest(_("Upload-Concat (tus concatenation) is not supported: send the file as one upload."))
    if "Upload-Defer-Length" in request.headers:
        raise BadRequest(_("Upload-Defer-Length is not supported: send Upload-Length."))
    length = _number("Upload-Length")
    if length == 0:
        raise BadRequest(_("The file is empty: an empty file is not a photo."))
    row = await resumable.create(services(), authorize=authorize, owner=owner, limits=file_limits, length=length,
                                 metadata=request.headers.get("Upload-Metadata"), client_ip=client_ip)
    if on_created is not None:
        await on_created(length)
    headers = {"Location": location(row["id"]), "Upload-Expires": _http_date(row["expires_at"])}
    if request.mimetype == OFFSET_TYPE:  # creation-with-upload: the body is the first chunk
        offset, done = await _receive(row, 0)
        if done is None and offset > 0:
            headers["Upload-Expires"] = _http_date(resumable.idle_expiry(services(), row["created_at"],
                                                                         services().clock()))
        headers["Upload-Offset"] = str(offset)
        headers.update(_finished_headers(done))
    elif not request.content_length:
        g.tus_drained = True
    return "", 201, headers


async def _upload(tus_id: str, gallery_id: int, owner: Owner) -> Any:
    try:
        return await _answer(tus_id, gallery_id, owner)
    except AppError as error:
        g.tus_error = error.message  # a HEAD answer's sentence (_tus_headers)
        raise


async def _answer(tus_id: str, gallery_id: int, owner: Owner) -> Any:
    _check_method(UPLOAD_METHODS)
    svc = services()
    row = await resumable.find(svc, tus_id, gallery_id, owner)
    if request.method == "HEAD":
        headers = {"Upload-Offset": str(row["upload_offset"]), "Upload-Length": str(row["upload_length"]),
                   "Cache-Control": "no-store"}
        if row["metadata"]:
            headers["Upload-Metadata"] = row["metadata"]
        if row["state"] == tus_q.RECEIVING and not resumable.is_finishing(row):
            headers["Upload-Expires"] = _http_date(row["expires_at"])
        else:
            headers.update(_finished_headers(await _outcome(row, head=True)))
        return "", 200, headers
    if request.method == "DELETE":
        await resumable.terminate(svc, row)
        g.tus_drained = not request.content_length
        return "", 204
    if request.mimetype != OFFSET_TYPE:
        raise UnsupportedMedia(_("A PATCH must be sent as Content-Type: %(OFFSET_TYPE)s.")
                               % {"OFFSET_TYPE": OFFSET_TYPE})
    offset = _number("Upload-Offset")
    checksum = resumable.parse_checksum(request.headers.get("Upload-Checksum"))
    if row["state"] == tus_q.DONE or resumable.is_finishing(row):
        # Every byte is here: the last chunk's answer was lost, or its photo is not made yet, and the client
        # asks again. Nothing is sent twice; the answer is the photo, its refusal, or when to ask again.
        if offset != row["upload_length"] or request.content_length:
            raise OffsetMismatch(row["upload_length"])
        g.tus_drained = True
        again = await _outcome(row, head=False)
        return "", 204, {"Upload-Offset": str(row["upload_length"]), **_finished_headers(again)}
    new_offset, done = await _receive(row, offset, checksum)
    headers = {"Upload-Offset": str(new_offset), **_finished_headers(done)}
    if done is None:  # a chunk that added bytes moved the expiry on (resumable.idle_expiry); an empty one did not
        expires = row["expires_at"] if new_offset == offset else resumable.idle_expiry(svc, row["created_at"],
                                                                                       svc.clock())
        headers["Upload-Expires"] = _http_date(expires)
    return "", 204, headers


class Locked(AppError):
    """HEAD of a complete upload whose photo is not made yet: not an offset (a client would take the full one
    for success), but 423 with Retry-After, which tus clients retry (tus-js-client resumes after it, where a
    5xx to HEAD would make it start a new upload)."""

    status = 423
    title = "Locked"

    def __init__(self, pending: resumable.NotFinishedYet) -> None:
        super().__init__(pending.message)
        self.retry_after = pending.retry_after

    def headers(self) -> dict[str, str]:
        return {"Retry-After": str(self.retry_after)}


async def _outcome(row: Row, *, head: bool) -> Finished:
    """What became of a complete upload: its photo, or its refusal raised. One whose photo is not made yet is
    tried now when its try is due; otherwise, or when the try fails, the client is told when to ask again
    (HEAD: 423, PATCH: 503)."""
    svc = services()
    if row["state"] == tus_q.DONE:
        return await resumable.finished(svc, row)
    try:
        if head and resumable.being_finished(svc, row):
            # A try is running, in this process or another (the finisher's, after a restart, say): its outcome
            # if it comes soon, else "ask again" (a slow bucket must not hold a HEAD).
            with trio.move_on_after(HEAD_WAIT_SECONDS):
                await resumable.wait_for_try(svc, row["id"])
            now = await svc.db.read(tus_q.get, row["id"])
            if now is not None and now["state"] == tus_q.DONE:
                return await resumable.finished(svc, now)
            raise resumable.pending_error(svc, now or row)
        if row["finish_after"] is not None and row["finish_after"] > svc.clock():
            # Not due yet: the finisher tries then. A PATCH does not try sooner either, or a client retrying
            # every few seconds would use up tus_finish_attempts, meant for hours, in minutes.
            raise resumable.pending_error(svc, row)
        return await resumable.complete(svc, row["id"])
    except resumable.NotFinishedYet as pending:
        if head:
            raise Locked(pending) from None
        raise


async def _receive(row: Row, offset: int,
                   checksum: tuple[str, bytes] | None = None) -> tuple[int, Finished | None]:
    """Write the body at ``offset``; when that completes the file, make its photo (answered 204 only once it
    exists: ``resumable.complete``)."""
    svc = services()
    await svc.backlog.wait_for_room()  # once upload_lead photos wait for a worker (runtime/backlog.py)
    request.body.stream()  # type: ignore[attr-defined]  # BoundedBody (web/asgi.py): counted by resumable
    new_offset = await resumable.write_chunk(svc, row, offset, request.body, content_length=request.content_length,
                                             checksum=checksum)
    g.tus_drained = True
    await resumable.check_kind(svc, row, offset, new_offset)
    if new_offset < row["upload_length"]:
        return new_offset, None
    return new_offset, await resumable.complete(svc, row["id"])


def _finished_headers(done: Finished | None) -> dict[str, str]:
    if done is None:
        return {}
    headers = {"Picpeak-Duplicate": "true" if done.duplicate else "false"}
    if done.photo_id is not None:
        headers["Picpeak-Photo-Id"] = str(done.photo_id)
    if done.upload_id is not None:
        headers["Picpeak-Upload-Id"] = done.upload_id
    return headers


def _http_date(timestamp: float) -> str:
    return formatdate(timestamp, usegmt=True)
