"""Sending stored files: conditional responses in large read steps, and originals as safe attachments.

Every route that answers with a file (photo images, originals, watermarked downloads) goes through here, so the
headers that keep a hostile original from running in the browser are set in one place.
"""

from __future__ import annotations

import re
from typing import Any
from urllib.parse import quote

from quart import Response, send_file

from picpeak_lite.errors import NotFound
from picpeak_lite.store.queries import photos as photo_q
from picpeak_lite.web.auth import services

MIME = {"jpeg": "image/jpeg", "png": "image/png", "webp": "image/webp", "heif": "image/heif"}
EXTENSION = {"jpeg": ".jpg", "png": ".png", "webp": ".webp", "heif": ".heic"}
# quart-trio reads files in 8 KiB steps with two thread hops each; 256 KiB steps cut the hops 32-fold.
FILE_CHUNK_BYTES = 256 * 1024


async def send_path(path: Any, mimetype: str) -> Response:
    """``send_file`` with ETag/conditional support and large read steps."""
    response = await send_file(path, mimetype=mimetype, conditional=True)
    if hasattr(response.response, "buffer_size"):
        response.response.buffer_size = FILE_CHUNK_BYTES
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
    if not name.lower().endswith((EXTENSION[fmt], ".jpeg" if fmt == "jpeg" else EXTENSION[fmt], ".heif")):
        name += EXTENSION[fmt]
    fallback = re.sub(r"[^A-Za-z0-9._ -]", "_", name) or "photo" + EXTENSION[fmt]
    return f"attachment; filename=\"{fallback}\"; filename*=UTF-8''{quote(name, safe='')}"

