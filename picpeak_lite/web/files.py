"""Sending stored files: conditional responses in large read steps, and originals as safe attachments.

Every route that answers with a file (photo images, originals, watermarked downloads) goes through here, so the
headers that keep a hostile original from running in the browser are set in one place.

:func:`send_stored` sends an object by its storage name: a local file through ``send_file`` as ever; an object
in a bucket streamed through the server in ranged reads, with the object's ETag and Last-Modified, Range and
If-None-Match handled the same way; or, with ``s3_presigned_redirects``, a redirect to a short-lived signed URL.
Callers make their access checks first and call this last, so a URL is only ever given to who may see the file.
"""

from __future__ import annotations

import datetime as dt
import os
import re
import zlib
from collections import OrderedDict
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import Any, BinaryIO
from urllib.parse import quote

import trio
from quart import Response, current_app, request, send_file
from quart.wrappers.response import ResponseBody
from werkzeug.http import http_date, parse_range_header

from picpeak_lite.errors import NotFound
from picpeak_lite.i18n import _
from picpeak_lite.perrun import PerRun
from picpeak_lite.store.queries import photos as photo_q
from picpeak_lite.store.storage import Storage, original_name
from picpeak_lite.web.auth import services

MIME = {"jpeg": "image/jpeg", "png": "image/png", "webp": "image/webp", "heif": "image/heif",
        "mp4": "video/mp4", "mov": "video/quicktime", "webm": "video/webm"}
EXTENSION = {"jpeg": ".jpg", "png": ".png", "webp": ".webp", "heif": ".heic", "mp4": ".mp4", "mov": ".mov",
             "webm": ".webm"}
# quart-trio reads files in 8 KiB steps with two thread hops each; 256 KiB steps cut the hops 32-fold.
FILE_CHUNK_BYTES = 256 * 1024


async def send_path(path: Any, mimetype: str) -> Response:
    """``send_file`` with ETag/conditional support and large read steps.

    A file of at most one read step (every grid and view image) is read whole in one thread hop and sent from
    memory with the headers ``send_file`` gives (ETag, Last-Modified, public caching, ranges): ``send_file``
    took four hops for it (open, read, the read that finds the end, close), and with 20 guests browsing those
    hops were a fifth of the server's CPU per thumbnail (measured). The images asked for most are then served
    from :class:`SmallFiles` with no hop at all. Raises FileNotFoundError when the file is missing.
    """
    path = Path(path)
    info = os.stat(path)  # a stat of a stored file: microseconds, far less than a thread hop
    small = SMALL_FILES.get().get(path, info)
    if small is None and info.st_size <= FILE_CHUNK_BYTES:
        small = await trio.to_thread.run_sync(_read_if_small, path, limiter=read_limiter())
        if small is not None:
            SMALL_FILES.get().put(path, small)
    if small is None:
        response = await send_file(path, mimetype=mimetype, conditional=True)
        if hasattr(response.response, "buffer_size"):
            response.response.buffer_size = FILE_CHUNK_BYTES
        return response
    response = Response(small.data, mimetype=mimetype)
    response.last_modified = dt.datetime.fromtimestamp(small.mtime, dt.UTC)
    response.cache_control.public = True
    max_age = current_app.get_send_file_max_age(str(path))
    if max_age is not None:
        response.cache_control.max_age = max_age
        response.expires = dt.datetime.now(dt.UTC) + dt.timedelta(seconds=max_age)
    response.set_etag(f"{small.mtime}-{len(small.data)}-{zlib.adler32(bytes(path))}")  # send_file's form
    await response.make_conditional(request, accept_ranges=True, complete_length=len(small.data))
    return response


@dataclass(frozen=True)
class SmallFile:
    """A small file's bytes and what identifies that version of it: inode, size and mtime (in ns, and as
    ``send_file``'s float for the ETag and Last-Modified)."""

    data: bytes
    inode: int
    mtime_ns: int
    mtime: float

    def is_version(self, info: os.stat_result) -> bool:
        return (self.inode, self.mtime_ns, len(self.data)) == (info.st_ino, info.st_mtime_ns, info.st_size)


class SmallFiles:
    """The small stored files sent last (grid and view images), in memory up to :data:`SMALL_FILES_BYTES`,
    least recently sent out first.

    Each request still stats the file, and a cached copy is sent only while inode, size and mtime are those it
    was read with: a derivative made again (a watermark change, a repair; always a new file renamed into
    place, so a new inode) or removed is never sent stale, whichever process or host wrote it. What it saves
    is the thread hop of the read: with 20 guests browsing, each hop costs the event loop a wake-up and a wait
    for the GIL, which under load is the longest part of a thumbnail's answer (``bench/bench_responsive.py``).
    """

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.size = 0
        self._files: OrderedDict[Path, SmallFile] = OrderedDict()

    def get(self, path: Path, info: os.stat_result) -> SmallFile | None:
        found = self._files.get(path)
        if found is None:
            return None
        if not found.is_version(info):
            self._drop(path)
            return None
        self._files.move_to_end(path)
        return found

    def put(self, path: Path, file: SmallFile) -> None:
        if path in self._files:
            self._drop(path)
        if len(file.data) > self.limit:
            return
        self._files[path] = file
        self.size += len(file.data)
        while self.size > self.limit:
            self._drop(next(iter(self._files)))

    def _drop(self, path: Path) -> None:
        self.size -= len(self._files.pop(path).data)


SMALL_FILES_BYTES = 32 * 1024 * 1024  # ~1,000 grid images and 200 views of 24 MP photos per process
SMALL_FILES = PerRun("picpeak_small_files", lambda: SmallFiles(SMALL_FILES_BYTES))


def _read_if_small(path: Path) -> SmallFile | None:
    """The file, if it is at most FILE_CHUNK_BYTES (None for a larger one: it grew since it was looked at)."""
    with open(path, "rb") as file:
        info = os.fstat(file.fileno())
        if info.st_size > FILE_CHUNK_BYTES:
            return None
        data = file.read(info.st_size + 1)
        if len(data) != info.st_size:  # written to while it was read: not a version to keep
            return None
        return SmallFile(data, info.st_ino, info.st_mtime_ns, info.st_mtime)


_READ_LIMITER = PerRun("picpeak_storage_reads", lambda: trio.CapacityLimiter(16))


def read_limiter() -> trio.CapacityLimiter:
    """The threads that read stored files and bucket objects for responses: one limiter per trio run."""
    return _READ_LIMITER.get()


async def send_stored(name: str, mimetype: str, *, disposition: str | None = None) -> Response:
    """A stored object (see the module docstring). Raises FileNotFoundError when it is missing."""
    storage = services().storage
    path = storage.local_path(name)
    if path is not None:
        return await send_path(path, mimetype)
    url = storage.presigned_url(name, content_type=mimetype, disposition=disposition)
    if url is not None:
        # The URL expires: the redirect is never cached.
        return Response("", status=302, headers={"Location": url, "Cache-Control": "private, no-store"})
    info = await trio.to_thread.run_sync(storage.stat, name, limiter=read_limiter())
    body = _ObjectBody(storage, name, info.size)
    streamed = Response(body, mimetype=mimetype)
    streamed.content_length = info.size
    streamed.set_etag(info.etag.strip('"'))
    streamed.last_modified = dt.datetime.fromtimestamp(info.mtime, dt.UTC)
    streamed.cache_control.public = True
    ranged = await answer_range(streamed, body, info.size)
    if ranged is not None:
        return ranged
    # The whole object: Quart's conditional handling for If-None-Match / If-Modified-Since only (ranges above).
    return await streamed.make_conditional(request)


async def answer_range(response: Response, body: Any, size: int) -> Response | None:
    """One byte range of ``body`` (a file or object body with ``make_conditional(begin, end)``), the same for a
    local file and a bucket object: 206 with ``Content-Range``; a suffix range (``bytes=-N``) the last N bytes, or
    the whole when N is larger (RFC 9110 14.1.3); past the end 416 with ``bytes */size``. None where the whole
    is sent instead (no Range; several ranges or a malformed header, as RFC 9110 allows; an ``If-Range`` that
    names another version, so a client never splices ranges of two versions). Every answer says
    ``Accept-Ranges: bytes``."""
    response.headers["Accept-Ranges"] = "bytes"
    wanted = parse_range_header(request.headers.get("Range"))
    if_range = request.headers.get("If-Range")
    current = (response.headers.get("ETag"), response.headers.get("Last-Modified"))
    if wanted is None or wanted.units != "bytes" or len(wanted.ranges) != 1 or (
            if_range is not None and if_range not in current):
        return None
    begin, end = wanted.ranges[0]
    if begin < 0:  # the last -begin bytes
        first, stop = max(0, size + begin), size
    else:
        first, stop = begin, size if end is None else min(end, size)
    if first >= stop:
        refused = Response(f"The range asked for is outside the file's {size} bytes.", status=416,
                           mimetype="text/plain")
        refused.headers.update({"Content-Range": f"bytes */{size}", "Accept-Ranges": "bytes"})
        return refused
    await body.make_conditional(first, stop)  # the body's own begin/end: reads only that span
    response.status_code = 206
    response.headers["Content-Range"] = f"bytes {first}-{stop - 1}/{size}"
    response.content_length = stop - first
    return response


class _ObjectBody(ResponseBody):
    """A bucket object as a response body: one streamed GET of the requested range, read in large steps in
    threads; closed when the response ends or the client goes."""

    def __init__(self, storage: Storage, name: str, size: int) -> None:
        self.storage, self.name, self.size = storage, name, size
        self.begin, self.end = 0, size
        self._reader: BinaryIO | None = None

    async def make_conditional(self, begin: int, end: int | None) -> int:
        self.begin = begin
        self.end = self.size if end is None else min(self.size, end)
        if self.begin >= self.end or abs(self.begin) > self.size:
            from werkzeug.exceptions import RequestedRangeNotSatisfiable

            raise RequestedRangeNotSatisfiable()
        return self.size

    async def __aenter__(self) -> _ObjectBody:
        self._reader = await trio.to_thread.run_sync(self.storage.open, self.name, self.begin, self.end,
                                                     limiter=read_limiter())
        self._left = self.end - self.begin
        return self

    async def __aexit__(self, exc_type: type | None, exc: BaseException | None, tb: TracebackType | None) -> None:
        if self._reader is not None:
            self._reader.close()
            self._reader = None

    def __aiter__(self) -> _ObjectBody:
        return self

    async def __anext__(self) -> bytes:
        if self._reader is None or self._left <= 0:
            raise StopAsyncIteration()
        chunk = await trio.to_thread.run_sync(self._reader.read, min(FILE_CHUNK_BYTES, self._left),
                                              limiter=read_limiter())
        if not chunk:
            raise StopAsyncIteration()
        self._left -= len(chunk)
        return chunk
async def send_media(path: Path, mimetype: str) -> Response:
    """A video inline, for ``<video>``, with byte ranges done by :func:`answer_range` rather than by Quart's
    conditional send (which answers some valid ranges, such as the last byte or a suffix, with a 500), as for
    an object in a bucket. No timeout: a phone may hold one range open for as long as the clip plays. The
    sandbox CSP and nosniff as for every original."""
    stat = await trio.Path(path).stat()
    etag = f'"{stat.st_size:x}-{stat.st_mtime_ns:x}"'
    modified = http_date(stat.st_mtime)
    response = await send_file(path, mimetype=mimetype)  # the app's own (trio) file body, whole file
    body: Any = response.response  # quart-trio's file body: begin/end via make_conditional
    if hasattr(body, "buffer_size"):
        body.buffer_size = FILE_CHUNK_BYTES
    response.headers.update({
        "Accept-Ranges": "bytes", "ETag": etag, "Last-Modified": modified, "Cache-Control": "private, max-age=3600",
        "Content-Security-Policy": "default-src 'none'; sandbox", "X-Content-Type-Options": "nosniff",
    })
    response.timeout = None
    ranged = await answer_range(response, body, stat.st_size)
    if ranged is not None:
        return ranged
    if request.headers.get("If-None-Match") == etag:
        response = Response(b"", status=304)
        response.headers["ETag"] = etag
        return response
    response.content_length = stat.st_size
    return response


async def send_original(photo: dict[str, Any]) -> Response:
    """The original bytes, always as an attachment, with the type we detected (never the client's)."""
    disposition = attachment_header(photo["display_name"], photo["format"])
    try:
        response = await send_stored(original_name(photo["storage_key"]), MIME[photo["format"]],
                                     disposition=disposition)
    except FileNotFoundError:
        raise NotFound(_(photo_q.ORIGINAL_MISSING)) from None
    if response.status_code == 302:
        return response
    response.headers["Content-Disposition"] = disposition
    response.headers["Content-Security-Policy"] = "default-src 'none'; sandbox"
    response.headers["Cache-Control"] = "private, no-cache"
    return response


def attachment_header(display_name: str, fmt: str) -> str:
    """``attachment`` with an ASCII fallback and the UTF-8 name (RFC 6266 / 5987)."""
    name = display_name
    if not name.lower().endswith((EXTENSION[fmt], ".jpeg" if fmt == "jpeg" else EXTENSION[fmt], ".heif", ".m4v")):
        name += EXTENSION[fmt]
    fallback = re.sub(r"[^A-Za-z0-9._ -]", "_", name) or "photo" + EXTENSION[fmt]
    return f"attachment; filename=\"{fallback}\"; filename*=UTF-8''{quote(name, safe='')}"

