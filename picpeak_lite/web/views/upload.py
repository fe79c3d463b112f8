"""The two upload routes: ``POST /api/admin/galleries/<id>/upload`` and ``POST /api/g/<slug>/upload``.

The body is never parsed by Quart (``await request.files`` spools and is 7x slower): chunks of ``request.body``
go, in slices of at most 256 KiB, through werkzeug's sans-IO ``MultipartDecoder`` into :mod:`..intake`, which
streams each file part to a temp file and owns every rule about files. This module owns the HTTP side: who
may upload, the request-size cap, the form fields, the status of the answer, and closing the connection when
the answer leaves part of the body unread.

Limits, and why they differ:

* Request-level problems stop reading at once and answer with ``Connection: close`` (the only way to stop a
  client that is still sending without leaving the keep-alive connection in a broken state): a
  ``Content-Length`` above what a legitimate request can be, more bytes than that counted as they arrive,
  more files than allowed, whatever their field (413; nothing of that request is kept), more fields or empty
  parts than a form has, a part's headers or a boundary too long, a malformed body (400), a missing CSRF
  token before the first file (403). The answer names at most 50 refused files and counts the rest.
* A full disk (507) stops storing at once, but the rest of the body (within the request cap) is read and
  dropped before the answer: most HTTP clients read the answer only once they have sent everything, and with
  the server no longer reading, a client with a megabyte still to send would wait for its timeout instead.
* A file over the per-file limit is a per-file error: its remaining bytes are counted and dropped (never
  written, never buffered), the request goes on, and the other files are kept. Draining costs at most what
  the request cap already allows a legitimate request, and the guest whose 12th photo was too large keeps
  the other 19. When nothing was accepted the answer is 413 (all too large), 415 (all unsupported), 409
  (gallery full) or 400, with ``errors`` and no ``upload_id``; every 413 also says ``Connection: close``.

Guest uploads are throttled per guest session and per client IP, before any of the body is read (429 with
``Retry-After`` and ``Connection: close``): a budget of requests, and a budget of bytes that each request's
accepted files are charged against once it has been read (see GUEST_UPLOADS_PER_SESSION in ratelimit.py).

A request whose files were all duplicates is accepted (202, each with ``"duplicate": true`` and its existing
id) but creates no upload group, so ``upload_id`` is null: there is nothing to follow, and an id whose status
is 404 must never be handed out.
"""

from __future__ import annotations

import functools
from collections.abc import AsyncIterable, Awaitable, Callable
from typing import Any

import trio
from quart import Blueprint, after_this_request, g, redirect, request, url_for
from werkzeug.exceptions import RequestEntityTooLarge
from werkzeug.sansio.multipart import NEED_DATA, Data, Epilogue, Field, File, MultipartDecoder, State

from picpeak_lite import security
from picpeak_lite.errors import (
    AppError,
    BadRequest,
    Conflict,
    Forbidden,
    InsufficientStorage,
    TooLarge,
    Unauthorized,
    UnsupportedMedia,
)
from picpeak_lite.i18n import N_, _
from picpeak_lite.pipeline import replacement
from picpeak_lite.pipeline.intake import Entry, FileSink, Intake, Limits, Uploader, clean_guest_name
from picpeak_lite.store.queries import photos as photo_q
from picpeak_lite.web.auth import check_origin, current_admin, current_guest, gallery_api, limits, services
from picpeak_lite.web.views.common import admin_upload_gallery, client_ip, current_actor, guest_upload_gallery

blueprint = Blueprint("upload", __name__)


@blueprint.teardown_request
async def _after_upload(_error: BaseException | None) -> None:
    services().trimmer.freed()  # a burst of uploads leaves its buffers scattered over the heap (memory.py)

SLICE = 256 * 1024  # most bytes handed to the decoder at once: Quart hands over everything buffered
FIELD_MAX = 4096  # form fields (csrf_token, guest_name) are small
MAX_FIELDS = 16
# Parts that are neither a file nor a field: a browser sends one empty, nameless file part per file input left
# empty. Without a bound, a body of nothing else would be decoded part by part to its end.
MAX_EMPTY_PARTS = 16
HEAD_MAX = 16 * 1024  # a part's headers, or the text before the first boundary (browsers send none)
BOUNDARY_MAX = 70  # RFC 2046: a boundary is 1 to 70 characters
FILE_FIELD = "photos"
MALFORMED = N_("The upload was cut off or is not valid multipart/form-data.")
CSRF_MESSAGE = N_("The form has expired or is missing its security token. Reload the page and try again.")
FAILURES = {413: TooLarge, 415: UnsupportedMedia, 409: Conflict}

def _closes_unless_drained(view: Any) -> Any:
    """Answer with ``Connection: close`` whenever the body was not read to its end (and on every 413)."""

    @functools.wraps(view)
    async def wrapper(*args: Any, **kwargs: Any) -> Any:
        @after_this_request
        def close_connection(response: Any) -> Any:
            if response.status_code == 413 or not g.get("upload_drained"):
                response.headers["Connection"] = "close"
            return response

        return await view(*args, **kwargs)

    return wrapper


def _csrf_in_header(view: Any) -> Any:
    """Admin uploads with a session cookie carry the CSRF token in ``X-CSRF-Token``. Refuse before
    ``admin_api``'s form fallback would make Quart parse (and spool) the whole multipart body to find one."""

    @functools.wraps(view)
    async def wrapper(*args: Any, **kwargs: Any) -> Any:
        if "Authorization" not in request.headers and "X-CSRF-Token" not in request.headers:
            if await current_admin() is None:
                raise Unauthorized(_("Log in or send 'Authorization: Bearer <token>'."))
            raise Forbidden(_("Send the session's CSRF token in the X-CSRF-Token header with uploads."))
        return await view(*args, **kwargs)

    return wrapper


@blueprint.post("/api/admin/galleries/<int:gallery_id>/upload")
@_closes_unless_drained
@_csrf_in_header
@gallery_api
async def admin_upload(gallery_id: int) -> Any:
    authorize = functools.partial(admin_upload_gallery, gallery_id=gallery_id)
    return await _upload(authorize, Limits.admin(services().settings), uploaded_by="admin")


@blueprint.post("/api/admin/galleries/<int:gallery_id>/photos/<int:photo_id>/replace")
@_closes_unless_drained
@_csrf_in_header
@gallery_api
async def replace_api(gallery_id: int, photo_id: int) -> Any:
    """A re-edited file for a photo (multipart, one file): it keeps its id, place and favourites
    (pipeline/replacement.py). 202: the new version is being made; the previous one waits for confirm/revert."""
    row = await _replace(gallery_id, photo_id, form_csrf=None)
    return {"id": row["id"], "status": row["status"], "sha256": row["sha256"], "replaced": True}, 202


@blueprint.post("/admin/galleries/<int:gallery_id>/photos/<int:photo_id>/replace")
@_closes_unless_drained
async def replace_form(gallery_id: int, photo_id: int) -> Any:
    """The gallery page's per-photo form (no script needed). Not ``admin_page``: its CSRF check would parse the
    whole body; here the token must come as the form's first field, checked before any file byte is stored."""
    admin = await current_admin()
    if admin is None or admin.via_token:
        raise Unauthorized(_("Your session has ended. Please log in again."))
    if admin.galleries is not None and gallery_id not in admin.galleries:  # gallery_page's rule, done here
        raise Forbidden(_("This gallery is not one of yours."))
    check_origin()
    assert admin.csrf_token is not None
    await _replace(gallery_id, photo_id, form_csrf=admin.csrf_token)
    return redirect(url_for("admin.gallery", gallery_id=gallery_id) + "#photos")


async def _replace(gallery_id: int, photo_id: int, *, form_csrf: str | None) -> dict[str, Any]:
    svc = services()
    gallery = await svc.db.read(functools.partial(admin_upload_gallery, gallery_id=gallery_id))
    await replacement.photo_of(svc, gallery_id, photo_id)  # 404 before any byte is read
    if request.mimetype != "multipart/form-data" or not request.mimetype_params.get("boundary"):
        raise UnsupportedMedia(_("Send the new file as multipart/form-data."))
    boundary = request.mimetype_params["boundary"].encode("latin-1")
    if len(boundary) > BOUNDARY_MAX:
        raise BadRequest(_("The multipart boundary is longer than %(BOUNDARY_MAX)s characters.")
                         % {"BOUNDARY_MAX": BOUNDARY_MAX})
    async with replacement.open_intake(svc, gallery) as intake:
        request.body.stream()  # type: ignore[attr-defined]  # BoundedBody (web/asgi.py), as for uploads
        await receive_multipart(intake, request.body, boundary, csrf_token=form_csrf)
        g.upload_drained = True
        return await replacement.replace(svc, intake, photo_id, await current_actor())


@blueprint.post("/api/g/<slug>/upload")
@_closes_unless_drained
async def guest_upload(slug: str) -> Any:
    svc = services()
    check_origin()
    guest = await current_guest(create=False)
    if guest is None:
        raise Forbidden(_("Your browser session has ended. Reload the page and try again."))
    sent = request.headers.get("X-CSRF-Token")
    if sent is not None and not security.tokens_equal(sent, guest.csrf_token):
        raise Forbidden(_(CSRF_MESSAGE))
    budgets, ip = limits().guest_upload_limits, client_ip()
    await budgets.take(guest.id, ip)
    authorize = functools.partial(guest_upload_gallery, slug=slug, guest_session_id=guest.id, clock=svc.clock)
    return await _upload(
        authorize, Limits.guest(svc.settings), uploaded_by="guest", guest_session_id=guest.id,
        default_name=guest.name, form_csrf=None if sent is not None else guest.csrf_token,
        on_accepted=lambda size: budgets.charge_bytes(guest.id, ip, size),
    )


async def _upload(authorize: Any, limits: Limits, *, uploaded_by: str, guest_session_id: int | None = None,
                  default_name: str | None = None, form_csrf: str | None = None,
                  on_accepted: Callable[[int], Awaitable[None]] | None = None) -> Any:
    """``on_accepted`` is told the bytes of the files accepted (duplicates included) once they are committed."""
    svc = services()
    gallery = await svc.db.read(authorize)
    if request.mimetype != "multipart/form-data" or not request.mimetype_params.get("boundary"):
        raise UnsupportedMedia(_("Send the photos as multipart/form-data in the '%(FILE_FIELD)s' field.")
                               % {"FILE_FIELD": FILE_FIELD})
    if request.content_length is not None and request.content_length > limits.max_request_bytes:
        raise TooLarge(_("This upload is larger than the server accepts in one request (at most %(max_files)s files of "
                         "%(mb)s MB).")
                       % {"max_files": limits.max_files, "mb": limits.max_file_bytes // (1024 * 1024)})
    cap = gallery["photo_cap"] or svc.settings.gallery_photo_cap
    if await svc.db.read(photo_q.count_in_gallery, gallery["id"]) >= cap:
        raise Conflict(_("The gallery is full: it holds at most %(cap)s photos.") % {"cap": cap})
    boundary = request.mimetype_params["boundary"].encode("latin-1")
    if len(boundary) > BOUNDARY_MAX:
        raise BadRequest(_("The multipart boundary is longer than %(BOUNDARY_MAX)s characters.")
                         % {"BOUNDARY_MAX": BOUNDARY_MAX})
    # Each file's row is committed (provisional) as soon as its original is durable, and the workers are woken,
    # so processing starts on the first photo; finish() makes them permanent once the body has been read, and
    # a request that ends any other way keeps nothing (see intake's module docstring).
    fields: dict[str, str] = {}

    def current_guest_name() -> str | None:
        if uploaded_by != "guest":
            return None
        return clean_guest_name(fields.get("guest_name")) or default_name

    uploader = Uploader(authorize, uploaded_by, guest_session_id, current_guest_name(), on_commit=svc.workers_bell.ring)
    intake = Intake(db=svc.db, storage=svc.storage, settings=svc.settings, gallery=gallery, limits=limits,
                    clock=svc.clock, uploader=uploader)
    try:
        async with intake:
            request.body.stream()  # type: ignore[attr-defined]  # BoundedBody (web/asgi.py): our limits, counted as bytes arrive; backpressure instead of buffering
            fields = await receive_multipart(intake, request.body, boundary, csrf_token=form_csrf)
            g.upload_drained = True
            if not intake.entries:
                raise BadRequest(_("Choose at least one photo to upload (field '%(FILE_FIELD)s').")
                                 % {"FILE_FIELD": FILE_FIELD})
            if await intake.finish(current_guest_name()):
                svc.webhooks_bell.ring()
    except InsufficientStorage:
        # Out of the intake first, which removed what it had stored of this request: the full disk is not kept
        # full while a slow client sends the rest, which is read and dropped before the 507 (module docstring).
        if not g.get("upload_drained"):
            await _drop_rest(request.body, limits.max_request_bytes)
        raise
    if on_accepted is not None:
        await on_accepted(sum(e.size for e in intake.accepted()))
    if not intake.accepted():
        error: AppError = FAILURES.get(intake.failure_status(), BadRequest)(
            _("None of the files could be accepted."), errors=intake.errors_json())
        raise error
    return intake.answer(), 202


async def _drop_rest(body: AsyncIterable[bytes], max_bytes: int) -> None:
    """Read the rest of the body and drop it; if it ends within ``max_bytes``, the connection stays usable."""
    dropped = 0
    async for chunk in body:
        dropped += len(chunk)
        if dropped > max_bytes:
            return
    g.upload_drained = True


async def receive_multipart(intake: Intake, body: AsyncIterable[bytes], boundary: bytes, *,
                            csrf_token: str | None = None) -> dict[str, str]:
    """Stream a multipart body into ``intake``; returns the small form fields once the body has been read.

    With ``csrf_token``, a ``csrf_token`` field must arrive before the first file part (a no-JS form puts its
    hidden input first); otherwise the request is refused before any file byte is stored.
    """
    arrived, to_store = trio.open_memory_channel[tuple[FileSink, Entry]](0)
    receiver = _Receiver(intake, boundary, csrf_token, arrived)
    try:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(_store_in_order, intake, to_store)
            async with arrived:
                received = 0
                async for chunk in body:
                    received += len(chunk)
                    if received > intake.limits.max_request_bytes:
                        raise TooLarge(_("The upload is larger than this server accepts in one request."))
                    view = memoryview(chunk)
                    for start in range(0, len(view), SLICE):
                        await receiver.feed(view[start : start + SLICE])
                await receiver.feed(None)
    except BaseExceptionGroup as group:
        raise _the_error(group) from None
    if csrf_token is not None and not receiver.csrf_ok:
        raise Forbidden(_(CSRF_MESSAGE))
    return receiver.fields


async def _store_in_order(intake: Intake, to_store: trio.MemoryReceiveChannel[tuple[FileSink, Entry]]) -> None:
    """Stores each file (its checks, the fsync and rename, its row) while the next one arrives: done inline,
    those took the receiving of 50 x 24 MP photos 0.83 s out of 3.0 s, with the client held back meanwhile.
    The channel holds nothing: a file that has arrived waits for the one before to be stored, and, once
    ``upload_lead`` photos wait for a worker, for a worker to take one (runtime/backlog.py)."""
    backlog = services().backlog
    async with to_store:
        async for sink, entry in to_store:
            await backlog.wait_for_room()
            await intake.store_file(sink, entry)


def _the_error(group: BaseExceptionGroup) -> BaseException:
    """What stopped the receiving or the storing (the other one was then cancelled): the error the view
    answers with, as if there had been one task. A group of cancellations only (the client went, the server
    stops) stays the group, for trio's cancel scopes to take apart."""
    leaves: list[BaseException] = []

    def collect(error: BaseException) -> None:
        if isinstance(error, BaseExceptionGroup):
            for inner in error.exceptions:
                collect(inner)
        else:
            leaves.append(error)

    collect(group)
    return next((e for e in leaves if not isinstance(e, trio.Cancelled)), group)


class _Receiver:
    """Turns decoder events into intake calls; holds at most one open file and one small field at a time.

    Every part counts (issue 27): a file part under any field counts toward the request's file limit
    (``Intake.count_file``), any other named part toward :data:`MAX_FIELDS`, an empty nameless file part toward
    :data:`MAX_EMPTY_PARTS`, and a part's headers may not pass :data:`HEAD_MAX`; past any of them the request is
    refused at once with one sentence. So what a request costs and what its answer lists is bounded by those
    limits, never by how many parts a client sends."""

    def __init__(self, intake: Intake, boundary: bytes, csrf_token: str | None,
                 arrived: trio.MemorySendChannel[tuple[FileSink, Entry]]) -> None:
        self.intake = intake
        self.arrived = arrived  # files that arrived in full, to be stored (_store_in_order)
        # The decoder's own buffer stays small because it is fed slices and drained after each one; this
        # bound only stops a part whose headers never end.
        self.decoder = MultipartDecoder(boundary, max_form_memory_size=4 * SLICE)
        self.csrf_token = csrf_token
        self.csrf_ok = False
        self.fields: dict[str, str] = {}
        self.done = False
        self._sink: FileSink | None = None
        self._field: tuple[str, bytearray] | None = None
        self._stray: str | None = None  # a file sent under another field name: its bytes are dropped
        self._stray_bytes = 0
        self._field_count = 0
        self._empty_parts = 0

    async def feed(self, data: memoryview | None) -> None:
        if self.done:
            return
        try:
            self.decoder.receive_data(data)  # type: ignore[arg-type]  # bytearray.extend takes any buffer
        except RequestEntityTooLarge:
            raise BadRequest(_(MALFORMED)) from None
        while True:
            try:
                event = self.decoder.next_event()
            except ValueError:  # werkzeug's word for a malformed or truncated body
                raise BadRequest(_(MALFORMED)) from None
            if event is NEED_DATA:
                # Waiting for the end of a part's headers (or the first boundary), the decoder keeps all of
                # it: its own bound (4 x SLICE) is far more than any form's headers need.
                if self.decoder.state in (State.PREAMBLE, State.PART) and len(self.decoder.buffer) > HEAD_MAX:
                    raise BadRequest(_("A part's headers in the upload are longer than %(num)s KiB.")
                                     % {"num": HEAD_MAX // 1024})
                return
            if isinstance(event, Epilogue):
                self.done = True
                return
            if isinstance(event, File):
                if self.csrf_token is not None and not self.csrf_ok:
                    raise Forbidden(_(CSRF_MESSAGE))
                if event.name == FILE_FIELD:
                    self._sink = self.intake.start_file(event.filename)
                else:
                    if event.filename:
                        self.intake.count_file()
                    self._stray, self._stray_bytes = event.filename, 0
            elif isinstance(event, Field):
                self._field_count += 1
                if self._field_count > MAX_FIELDS:
                    raise BadRequest(_("The upload form has too many fields."))
                self._field = (event.name or "", bytearray())  # a part may have no name at all
            elif isinstance(event, Data):
                await self._data(event)

    async def _data(self, event: Data) -> None:
        if self._sink is not None:
            await self._sink.write(event.data)
            if not event.more_data:
                sink, self._sink = self._sink, None
                entry = self.intake.file_arrived(sink)
                if entry is None:
                    self._empty_part()
                elif entry.error is None:
                    await self.arrived.send((sink, entry))
        elif self._field is not None:
            name, value = self._field
            value += event.data
            if len(value) > FIELD_MAX:
                raise BadRequest(_("The form field %(name)r is too long.") % {"name": name[:40]})
            if not event.more_data:
                self._field = None
                self._end_field(name, value.decode("utf-8", "replace"))
        elif self._stray is not None:
            self._stray_bytes += len(event.data)  # dropped: only whether there were any matters
            if not event.more_data:
                name, self._stray = self._stray, None
                if not name and not self._stray_bytes:
                    self._empty_part()  # an empty file input under another name: not a file at all
                    return
                if not name:
                    self.intake.count_file()  # a named one was counted when its headers arrived
                self.intake.add_error(name, _("Send photos in the '%(field)s' field.") % {"field": FILE_FIELD}, 400)

    def _empty_part(self) -> None:
        self._empty_parts += 1
        if self._empty_parts > MAX_EMPTY_PARTS:
            raise BadRequest(_("The upload form has too many empty file parts."))

    def _end_field(self, name: str, value: str) -> None:
        if name == "csrf_token" and self.csrf_token is not None:
            if not security.tokens_equal(value, self.csrf_token):
                raise Forbidden(_(CSRF_MESSAGE))
            self.csrf_ok = True
        self.fields[name] = value
