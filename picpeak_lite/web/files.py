"""Sending stored files: conditional responses in large read steps, and originals as safe attachments.

Every route that answers with a file (photo images, originals, watermarked downloads) goes through here, so the
headers that keep a hostile original from running in the browser are set in one place.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any
from urllib.parse import quote

import trio
from quart import Response, request, send_file
from werkzeug.http import http_date, parse_range_header

from picpeak_lite.errors import NotFound
from picpeak_lite.store.queries import photos as photo_q
from picpeak_lite.web.auth import services

MIME = {"jpeg": "image/jpeg", "png": "image/png", "webp": "image/webp", "heif": "image/heif",
        "mp4": "video/mp4", "mov": "video/quicktime", "webm": "video/webm"}
EXTENSION = {"jpeg": ".jpg", "png": ".png", "webp": ".webp", "heif": ".heic", "mp4": ".mp4", "mov": ".mov",
             "webm": ".webm"}
# quart-trio reads files in 8 KiB steps with two thread hops each; 256 KiB steps cut the hops 32-fold.
FILE_CHUNK_BYTES = 256 * 1024


async def send_path(path: Any, mimetype: str) -> Response:
    """``send_file`` with ETag/conditional support and large read steps."""
    response = await send_file(path, mimetype=mimetype, conditional=True)
    if hasattr(response.response, "buffer_size"):
        response.response.buffer_size = FILE_CHUNK_BYTES
    return response


async def send_media(path: Path, mimetype: str) -> Response:
    """A video inline, for ``<video>``, with byte ranges done here rather than by Quart's conditional send
    (which answers some valid ranges, such as the last byte, with a 500). One range (what browsers ask for):
    206 with ``Content-Range``; past the end 416 with ``bytes */size``; ``If-Range`` that does not match the
    ETag or date: the whole file (200), so a client never splices ranges of two versions; several ranges or
    a malformed header: the whole file, as RFC 9110 allows. No timeout: a phone may hold one range open for as
    long as the clip plays. The sandbox CSP and nosniff as for every original."""
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
    size = stat.st_size
    wanted = parse_range_header(request.headers.get("Range"))
    if_range = request.headers.get("If-Range")
    if wanted is not None and wanted.units == "bytes" and len(wanted.ranges) == 1 and if_range in (None, etag,
                                                                                                  modified):
        span = wanted.range_for_length(size)
        if span is None:
            response = Response(f"The range asked for is outside the file's {size} bytes.", status=416,
                                mimetype="text/plain")
            response.headers["Content-Range"] = f"bytes */{size}"
            return response
        first, stop = span
        await body.make_conditional(first, stop)  # the file body's own begin/end: reads only that span
        response.status_code = 206
        response.headers["Content-Range"] = f"bytes {first}-{stop - 1}/{size}"
        response.content_length = stop - first
        return response
    if request.headers.get("If-None-Match") == etag:
        response = Response(b"", status=304)
        response.headers["ETag"] = etag
        return response
    response.content_length = size
    return response


async def send_original(photo: dict[str, Any]) -> Response:
    """The original bytes, always as an attachment, with the type we detected (never the client's)."""
    path = services().storage.original_path(photo["storage_key"])
    if not path.exists():
        raise NotFound(photo_q.ORIGINAL_MISSING)
    response = await send_path(path, MIME[photo["format"]])
    response.headers["Content-Disposition"] = attachment_header(photo["display_name"], photo["format"])
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

