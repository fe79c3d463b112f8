"""Whether a file that is still on its way into a folder has reached its end, from its structure alone.

A hot folder (``ops/hotfolder.py``) must never take a file half written: an FTP upload from a camera can take
ten seconds or more, with pauses. A quiet period (size and time unchanged for a while) is not enough on its
own, since a stalled sender looks quiet, so a file is taken only when its bytes also say they are complete:

- JPEG: its last marker is EOI (``FF D9``), after any padding of zero bytes some cameras add;
- PNG: it ends with the ``IEND`` chunk and its CRC;
- WebP: the RIFF header's length is the file's length;
- HEIF/HEIC, MP4, MOV (ISO base media files): the top-level boxes, walked by their sizes, end exactly at the
  file's end (a box of size 0 runs to the end and is accepted only as the last one).

A half file fails these (a writer that stops at a box boundary before ``moov`` is the one case that passes: the
quiet period covers it). Anything else is judged complete: the upload's own header check then refuses it.
Sync and pure: reads at most a few KB from the end and the box headers.
"""

from __future__ import annotations

import os
import struct
from pathlib import Path
from typing import BinaryIO

JPEG_START = b"\xff\xd8\xff"
PNG_START = b"\x89PNG\r\n\x1a\n"
PNG_END = b"\x00\x00\x00\x00IEND\xaeB`\x82"
TAIL_BYTES = 64 * 1024
MAX_BOXES = 100_000


def looks_whole(path: Path) -> bool:
    """True when ``path`` ends where its format says it ends (see the module docstring)."""
    with open(path, "rb") as f:
        size = os.fstat(f.fileno()).st_size
        head = f.read(16)
        if head.startswith(JPEG_START):
            return _jpeg_ends(f, size)
        if head.startswith(PNG_START):
            return size >= len(PNG_END) and _tail(f, size, len(PNG_END)) == PNG_END
        if head[:4] == b"RIFF" and head[8:12] == b"WEBP":
            return struct.unpack("<I", head[4:8])[0] + 8 == size
        if head[4:8] in (b"ftyp", b"wide", b"mdat", b"moov", b"free", b"skip"):
            return _boxes_end(f, size)
        return size > 0


def _tail(f: BinaryIO, size: int, length: int) -> bytes:
    f.seek(max(0, size - length))
    return f.read(length)


def _jpeg_ends(f: BinaryIO, size: int) -> bool:
    tail = _tail(f, size, TAIL_BYTES).rstrip(b"\x00")
    return tail.endswith(b"\xff\xd9")


def _boxes_end(f: BinaryIO, size: int) -> bool:
    offset = 0
    for _ in range(MAX_BOXES):
        if offset == size:
            return True
        f.seek(offset)
        header = f.read(16)
        if len(header) < 8:
            return False
        length = struct.unpack(">I", header[:4])[0]
        if length == 1:
            if len(header) < 16:
                return False
            length = struct.unpack(">Q", header[8:16])[0]
        elif length == 0:
            return True  # runs to the end of the file (only the last box may)
        if length < 8:
            return False
        offset += length
        if offset > size:
            return False
    return False
