"""A zip archive streamed while it is built: no temp copy, no whole archive in memory.

The standard library's :mod:`zipfile` writes into a small sink that is not seekable, so it emits each entry
with a data descriptor (sizes and CRC after the data) and the central directory at the end; we drain the sink
after every step and hand the bytes to the response. Photos are already compressed (JPEG, HEIC, PNG, WebP), so
entries are ``ZIP_STORED``: deflating them again costs CPU for a percent or two. zip64 is on, so archives and
entries past 4 GiB work.

File reads and CRC computation run in worker threads (``trio.to_thread.run_sync``) in steps of
:data:`CHUNK_BYTES`; the event loop only moves finished chunks. If the client goes away, the generator is
closed at its next ``yield`` and the open file is closed with it.

Entry names come from display names made safe by :func:`entry_names`: no directories, no ``..``, no NUL or
control characters, nothing Windows refuses, the right extension, and no two names that a case-insensitive
file system would merge.
"""

from __future__ import annotations

import datetime as dt
import os
import re
import unicodedata
import zipfile
from collections.abc import AsyncIterator, Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any, BinaryIO

import trio

CHUNK_BYTES = 256 * 1024
MAX_NAME_CHARS = 120
EXTENSIONS = {"jpeg": (".jpg", ".jpeg"), "png": (".png",), "webp": (".webp",), "heif": (".heic", ".heif"),
              "mp4": (".mp4", ".m4v"), "mov": (".mov",), "webm": (".webm",)}
_UNSAFE = re.compile(r'[\x00-\x1f\x7f<>:"/\\|?*]')
_RESERVED = re.compile(r"^(con|prn|aux|nul|com\d|lpt\d)(\..*)?$", re.IGNORECASE)
# The smallest date a zip header can hold.
ZIP_EPOCH = (1980, 1, 1, 0, 0, 0)


@dataclass(frozen=True)
class Entry:
    """One file of the archive: either stream what ``open()`` returns (a stored file or object, opened in a
    worker thread) as it is, or store what ``render()`` returns (a watermarked copy, made in a worker thread)."""

    name: str
    open: Callable[[], BinaryIO]
    date_time: tuple[int, int, int, int, int, int] = ZIP_EPOCH
    render: Callable[[], bytes] | None = None


class _Sink:
    """Unseekable: zipfile sees that ``seek`` is missing and writes data descriptors instead of seeking back."""

    def __init__(self) -> None:
        self._chunks: list[bytes] = []
        self._position = 0

    def write(self, data: Any) -> int:
        self._chunks.append(bytes(data))
        self._position += len(data)
        return len(data)

    def tell(self) -> int:
        return self._position

    def flush(self) -> None:
        pass

    def drain(self) -> bytes:
        data = b"".join(self._chunks)
        self._chunks.clear()
        return data


async def stream_zip(entries: Iterable[Entry], *, limiter: trio.CapacityLimiter | None = None
                     ) -> AsyncIterator[bytes]:
    """Yield the archive in pieces of about :data:`CHUNK_BYTES`. A file that vanished meanwhile (the photo was
    deleted while the zip streamed) is left out."""
    sink = _Sink()
    archive = zipfile.ZipFile(sink, "w", compression=zipfile.ZIP_STORED, allowZip64=True)  # type: ignore[call-overload]

    async def in_thread(fn: Callable[..., Any], *args: Any) -> Any:
        return await trio.to_thread.run_sync(fn, *args, limiter=limiter)

    for entry in entries:
        if entry.render is not None:
            try:
                data = await in_thread(entry.render)
            except FileNotFoundError:
                continue
            await in_thread(_write_bytes, archive, entry, data)
            yield sink.drain()
            continue
        try:
            source: BinaryIO = await in_thread(entry.open)
        except FileNotFoundError:
            continue
        try:
            writer = await in_thread(_open_entry, archive, entry, source)
            while await in_thread(_copy_step, source, writer):
                yield sink.drain()
            await in_thread(writer.close)
            yield sink.drain()
        finally:
            source.close()
    await in_thread(archive.close)
    yield sink.drain()


def _zipinfo(entry: Entry, size: int) -> zipfile.ZipInfo:
    info = zipfile.ZipInfo(entry.name, date_time=entry.date_time)
    info.compress_type = zipfile.ZIP_STORED
    info.file_size = size
    info.external_attr = 0o644 << 16
    return info


def _open_entry(archive: zipfile.ZipFile, entry: Entry, source: BinaryIO) -> Any:
    size = _size_of(source)
    return archive.open(_zipinfo(entry, size), "w", force_zip64=size >= zipfile.ZIP64_LIMIT)


def _size_of(source: BinaryIO) -> int:
    size = getattr(source, "size", None)  # a bucket object's reader knows its length
    return size if isinstance(size, int) else os.fstat(source.fileno()).st_size


def _copy_step(source: BinaryIO, writer: Any) -> bool:
    data = source.read(CHUNK_BYTES)
    if not data:
        return False
    writer.write(data)
    return True


def _write_bytes(archive: zipfile.ZipFile, entry: Entry, data: bytes) -> None:
    with archive.open(_zipinfo(entry, len(data)), "w", force_zip64=len(data) >= zipfile.ZIP64_LIMIT) as writer:
        writer.write(data)


def safe_name(display_name: str, fmt: str, *, force_extension: str | None = None) -> str:
    """A display name fit to be a file name in a zip: one path component, printable, with an extension that
    matches the format (``force_extension`` replaces any other, e.g. ``.jpg`` for watermarked copies)."""
    name = unicodedata.normalize("NFC", display_name)
    name = re.split(r"[/\\]", name)[-1]  # the last path component only
    name = _UNSAFE.sub("_", name)
    name = re.sub(r"\s+", " ", name).strip(" .")  # no leading dots ('..', hidden files), no trailing dot/space
    stem, dot, ext = name.rpartition(".")
    if not dot:
        stem, ext = name, ""
    allowed = (force_extension,) if force_extension else EXTENSIONS[fmt]
    if ext and "." + ext.lower() in allowed:
        extension = "." + ext  # 'IMG_1.JPG' keeps its own spelling
    else:
        known = any("." + ext.lower() in spellings for spellings in EXTENSIONS.values())
        if ext and not known:
            stem = f"{stem}.{ext}"  # 'my.party' is a name with a dot, not an extension
        extension = allowed[0]
    stem = stem.strip(" .") or "photo"
    if _RESERVED.match(stem):
        stem = "_" + stem
    return stem[:MAX_NAME_CHARS] + extension


def entry_names(items: Sequence[tuple[str, str]], *, force_extension: str | None = None) -> list[str]:
    """Safe, unique names for ``(display_name, format)`` pairs, in order: 'a.jpg', 'a (2).jpg', ...

    Uniqueness is case-insensitive, because the archive will be unpacked on macOS and Windows."""
    taken: set[str] = set()
    names = []
    for display_name, fmt in items:
        name = safe_name(display_name, fmt, force_extension=force_extension)
        stem, _, ext = name.rpartition(".")
        candidate, n = name, 1
        while candidate.casefold() in taken:
            n += 1
            candidate = f"{stem} ({n}).{ext}"
        taken.add(candidate.casefold())
        names.append(candidate)
    return names


def zip_date(taken_at: str | None, fallback: float) -> tuple[int, int, int, int, int, int]:
    """The entry's date: the capture time when known, else ``fallback`` (epoch seconds, UTC)."""
    moment = None
    if taken_at:
        try:
            moment = dt.datetime.fromisoformat(taken_at)
        except ValueError:
            moment = None
    if moment is None:
        moment = dt.datetime.fromtimestamp(fallback, dt.UTC)
    stamp = (moment.year, moment.month, moment.day, moment.hour, moment.minute, moment.second)
    return max(stamp, ZIP_EPOCH)
