"""Receiving photos. Uploads over HTTP and the folder importer share everything in this module.

A file travels: bytes -> :class:`FileSink` (a temp file in ``data_dir/tmp``, its sha256 computed on the way,
bytes counted against the per-file limit as they arrive) -> duplicate check by sha256 -> the cheap header
check (``images.sniff`` in a thread: magic bytes and header, no decode) -> a generated storage key, reserved by
a short transaction (schema 28; a block of keys at a time, :meth:`Intake._reserved_key`) ->
``Storage.commit_original`` (fsync, atomic rename under that key, fsync of the directory) -> a transaction that
re-checks who may upload, duplicates and the gallery's cap, takes the key's reservation (gone: the reconciler
removed the file as expired, and the file is reported lost), creates the upload group and a ``pending`` row per
new photo. That transaction asks the storage nothing (with S3 it would be a network call holding the writer). A
crash between reservation and commit leaves a reserved file without a row (the reconciler's business once the
reservation expired), never a row without a file.

Two ways to commit. The importer stages files and calls :meth:`Intake.commit` per batch. An HTTP upload
passes an :class:`Uploader`: each file's row is committed as soon as its original is durable, so the workers
start on the first photo while the rest of the request arrives (issue 18). Those rows are ``provisional`` and
the group is ``receiving`` (a lease, schema 7) until :meth:`Intake.finish` — run once the whole body was read
— re-checks the permission, makes them permanent and lets the group complete; only then does the caller
answer 202. So an upload group completes (``upload.completed``) only after its request has ended, and what a
client was told stays exactly as before: a request that does not end in its 202 (client gone, 413, 507, a
malformed body, the permission withdrawn) keeps nothing. Its provisional rows are deleted with their files on
the way out (:meth:`Intake.__aexit__`), and if the process dies instead, the janitor does it once the lease
has run out (``transitions.abandon_expired_uploads``). Photos of a request still arriving are processed and,
once complete, visible like any other (never before: the guest rule is ``status = 'complete'``); if the
request is then cut off they are deleted as an admin's delete would (``photo.deleted`` for those announced).

Cleanup: :class:`Intake` is a context manager whose exit is synchronous, so a cancellation (client gone)
cannot interrupt it (an HTTP upload uses ``async with``, which first takes its rows back, shielded). It
removes every temp file still open and every renamed original no row points at.
Every thread hop here is uncancellable (trio's default), so when the exit runs, no other step is still
writing or moving a file: a file is either still a temp file or already in storage, never in between.

No Quart and no HTTP here: ``web/views/upload.py`` turns a multipart body into :meth:`Intake.start_file` /
:meth:`FileSink.write` / :meth:`Intake.file_arrived` calls, and stores each file that arrived
(:meth:`Intake.store_file`, one at a time, in order) while the next one arrives; its nursery has ended before
the intake's exit runs. ``ops/importer.py`` calls :meth:`Intake.finish_file` (both halves) for files on disk,
``pipeline/resumable.py`` hands over a finished tus upload's file (:meth:`Intake.adopt_file`), and a hot folder
that references its originals in place hands over its files to be linked, never moved (:meth:`Intake.refer_file`).

Longer than 400 lines on purpose: the durable steps, the per-file commits and the take-back on every exit path
are one protocol whose crash safety is argued above; split over files, a reader could no longer check it
in one place.
"""

from __future__ import annotations

import hashlib
import logging
import secrets
import unicodedata
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any, BinaryIO

import trio

from picpeak_lite.config import Settings
from picpeak_lite.errors import Conflict, NotFound, TooLarge
from picpeak_lite.i18n import N_, _
from picpeak_lite.media import images, video
from picpeak_lite.perrun import PerRun
from picpeak_lite.pipeline import attempts, transitions, video_intake
from picpeak_lite.store import locks
from picpeak_lite.store.db import Connection, Database
from picpeak_lite.store.queries import photos as photo_q
from picpeak_lite.store.queries import reservations as reservations_q
from picpeak_lite.store.storage import Storage, disk_errors, new_key, remove_quietly

MB = 1024 * 1024
# Keys are reserved in blocks that double from 1 up to this (Intake._reserved_key): a request of many files pays
# a few short writes instead of one per file (each a commit the workers' writes queue with, on SQLite an fsync).
KEY_BLOCK_MAX = 32
# Spare keys older than this are given back and fresh ones reserved: a key's reservation must be far younger than
# the reconciler's grace period when its file is written (a slow phone may take minutes over a block of files).
KEY_FRESH_SECONDS = 60.0
WRITE_BATCH = 1024 * 1024  # bytes collected before one thread hop writes them (memory per upload vs. hops)
PART_OVERHEAD = 64 * 1024  # per-part headers and boundaries, for the request-size cap
NAME_MAX_BYTES = 255
ERRORS_LISTED = 50  # refused files named in one answer; the rest are counted (Intake.errors_json)
GUEST_NAME_MAX = 100
# Bidi embedding/override/isolate marks and invisible direction marks: they make "gpj.exe" look like "exe.jpg".
BIDI = frozenset("\u202a\u202b\u202c\u202d\u202e\u2066\u2067\u2068\u2069\u200e\u200f\u061c")

log = logging.getLogger(__name__)

LOST = N_("The file was lost before it could be saved; please upload it again.")
ABANDONED = N_("The upload took longer than the server waits between signs of life and was given up; "
               "please send it again.")
DELETED = "The photo was deleted while the upload was still arriving."

_IO_LIMITER = PerRun("picpeak_intake_io", lambda: trio.CapacityLimiter(8))
_RECEIVING: PerRun[set[str]] = PerRun("picpeak_intake_receiving", set)


def io_limiter() -> trio.CapacityLimiter:
    """The threads that write, check and move received files: one limiter per trio run."""
    return _IO_LIMITER.get()


def receiving_uploads() -> set[str]:
    """The upload groups whose requests this process is receiving now: the janitor renews their leases."""
    return _RECEIVING.get()


@dataclass(frozen=True)
class Limits:
    max_file_bytes: int
    max_files: int | None  # None: no limit per request (the importer)
    max_pixels: int | None = None  # None: settings.max_pixels; guests may have a lower limit
    max_video_bytes: int | None = None  # None: max_file_bytes; guests' videos may be larger than their photos
    max_video_seconds: int | None = None  # None: any length

    @classmethod
    def admin(cls, s: Settings) -> Limits:
        return cls(s.admin_max_file_mb * MB, s.admin_max_files)

    @classmethod
    def guest(cls, s: Settings) -> Limits:
        return cls(s.guest_max_file_mb * MB, s.guest_max_files, min(s.guest_max_pixels, s.max_pixels),
                   s.guest_max_video_mb * MB, s.guest_max_video_seconds)

    @property
    def video_bytes(self) -> int:
        return self.max_file_bytes if self.max_video_bytes is None else self.max_video_bytes

    @property
    def sink_bytes(self) -> int:
        """What a file may grow to while it arrives: whether it is a video is known only once it is in."""
        return max(self.max_file_bytes, self.video_bytes)

    @property
    def max_request_bytes(self) -> int:
        """The largest body a legitimate request can have: every file at the limit, plus form overhead."""
        return (self.max_files or 1) * (self.sink_bytes + PART_OVERHEAD) + MB


@dataclass(eq=False)
class Entry:
    """What became of one received file; ``error`` and ``status`` are set for a refused one."""

    filename: str  # the cleaned display name
    size: int = 0
    sha256: str = ""
    header: images.ImageHeader | None = None
    video: video.VideoInfo | None = None  # the probe's facts when the file is a video
    key: str | None = None  # set (before the rename starts) once the file goes into storage
    inserted: bool = False  # a committed row points at ``key``
    photo_id: int | None = None
    duplicate: bool = False
    error: str | None = None
    status: int = 0
    same_as: Entry | None = None  # an earlier file of the same request with the same bytes

    def to_json(self) -> dict[str, Any]:
        if self.error is not None:
            return {"filename": self.filename, "error": self.error}
        return {"id": self.photo_id, "filename": self.filename, "size": self.size, "duplicate": self.duplicate}


def clean_filename(raw: str) -> str:
    """The client's file name as a display name only: last path segment, no control, bidi or NUL characters,
    no leading dots, at most 255 bytes of UTF-8 (the extension kept when possible); never used as a path."""
    name = raw.replace("\\", "/").rsplit("/", 1)[-1]
    name = unicodedata.normalize("NFC", _visible(name)).strip().lstrip(".").strip()
    if len(name.encode()) > NAME_MAX_BYTES:
        stem, dot, ext = name.rpartition(".")
        if not dot or not stem or len(ext.encode()) > 16:
            stem, dot, ext = name, "", ""
        room = NAME_MAX_BYTES - len((dot + ext).encode())
        name = stem.encode()[:room].decode("utf-8", "ignore").rstrip() + dot + ext
    return name or "photo"


def clean_guest_name(raw: str | None) -> str | None:
    """A guest's name for the photos they upload: printable, single-spaced, at most 100 characters."""
    if raw is None:
        return None
    name = " ".join(unicodedata.normalize("NFC", _visible(raw, keep_space=True)).split())
    return name[:GUEST_NAME_MAX].strip() or None


def _visible(text: str, *, keep_space: bool = False) -> str:
    def keep(c: str) -> bool:
        if c in BIDI:
            return False
        if keep_space and c in "\t\r\n":
            return True  # becomes a space when the caller collapses whitespace
        return unicodedata.category(c) not in ("Cc", "Cs", "Zl", "Zp")

    return "".join(c for c in text if keep(c))


class FileSink:
    """One incoming file, streamed to a temp file; ``write`` collects ~1 MiB before one thread hop writes it.

    The chunks are kept as they came (the parser's own bytes objects) and hashed and written in that thread:
    the event loop, which receives every upload, copies nothing."""

    def __init__(self, storage: Storage, raw_name: str, max_bytes: int) -> None:
        self.raw_name = raw_name
        self.storage = storage
        self.temp = storage.new_temp_path()
        self.size = 0
        self.too_large = False
        self._max = max_bytes
        self._hash = hashlib.sha256()
        self._file: BinaryIO | None = None
        self._pending: list[bytes] = []
        self._pending_bytes = 0
        self._received: str | None = None  # the sha256 of a file received in full elsewhere (adopt)
        self.referenced = False  # a hot folder's file referenced in place: never moved, never removed (refer)

    @classmethod
    def adopt(cls, storage: Storage, raw_name: str, path: Path, size: int, sha256: str) -> FileSink:
        """A file already received in full and durable (a finished tus upload, ``pipeline/resumable.py``): it
        goes through the same checks and the same move into storage as a streamed one, and nothing is written."""
        sink = cls(storage, raw_name, size)
        sink.temp, sink.size, sink._received = path, size, sha256
        return sink

    @classmethod
    def refer(cls, storage: Storage, raw_name: str, path: Path, size: int, sha256: str) -> FileSink:
        """A file in a hot folder that stays where it is (``ops/hotfolder.py``, in place): the same checks, then
        a link to it instead of the move (``Storage.link_original``); nothing ever writes or removes it."""
        sink = cls.adopt(storage, raw_name, path, size, sha256)
        sink.referenced = True
        return sink

    @property
    def sha256(self) -> str:
        return self._received or self._hash.hexdigest()

    async def write(self, data: bytes) -> None:
        if self.too_large:
            return  # the rest of an over-limit file is counted by the caller and dropped, never stored
        self.size += len(data)
        if self.size > self._max:
            self.too_large = True
            self._pending, self._pending_bytes = [], 0
            self.discard()
            return
        self._pending.append(data)
        self._pending_bytes += len(data)
        if self._pending_bytes >= WRITE_BATCH:
            await self._flush(final=False)

    async def close(self) -> None:
        """Write what is left and close the file (it stays in tmp/ until moved or discarded)."""
        if self._received is None:
            await self._flush(final=True)

    async def _flush(self, *, final: bool) -> None:
        data, self._pending, self._pending_bytes = self._pending, [], 0
        self._file = await trio.to_thread.run_sync(
            _write_batch, self.storage, self.temp, self._file, self._hash, data, final, limiter=io_limiter()
        )

    def discard(self) -> None:
        """Close and remove the temp file. Sync, so that no cancellation can stop it half-way."""
        if self._file is not None:
            self._file.close()
            self._file = None
        if not self.referenced:
            remove_quietly(self.temp)


def _write_batch(storage: Storage, path: Path, f: BinaryIO | None, hasher: Any, chunks: list[bytes],
                 final: bool) -> BinaryIO | None:
    try:
        with disk_errors():
            storage.ensure_space(sum(len(chunk) for chunk in chunks))
            if f is None:
                f = _create(storage, path)
            # Chunk by chunk, not joined: a joined MiB is a fresh mapping each time (runtime/memory.py), whose
            # page faults cost more than the hashing of it.
            for chunk in chunks:
                hasher.update(chunk)
                f.write(chunk)
            del chunks[:]
            if final:
                f.close()
                return None
            return f
    except BaseException:
        if f is not None:
            f.close()
        raise


def _create(storage: Storage, path: Path) -> BinaryIO:
    try:
        return open(path, "xb")
    except FileNotFoundError:
        storage.create_dirs()  # a fresh or tidied data directory: the server normally creates these at start
        return open(path, "xb")


Authorize = Callable[[Connection], dict[str, Any]]
Outcome = tuple[int | None, bool, str | None]  # (photo id, already in the gallery, error)


@dataclass(frozen=True)
class Uploader:
    """Who sends an HTTP upload, known when it starts: each file's row is committed as it is stored."""

    authorize: Authorize
    uploaded_by: str
    guest_session_id: int | None = None
    guest_name: str | None = None  # the session's; the form's field, if it comes later, replaces it in finish()
    on_commit: Callable[[], None] = lambda: None  # wakes the workers


class Intake:
    """Files received for one gallery: one upload request, or one run of the importer (committed in batches)."""

    def __init__(self, *, db: Database, storage: Storage, settings: Settings, gallery: dict[str, Any],
                 limits: Limits, clock: Callable[[], float], uploader: Uploader | None = None) -> None:
        self.db = db
        self.storage = storage
        self.settings = settings
        self.gallery_id: int = gallery["id"]
        self.limits = limits
        self.clock = clock
        self.entries: list[Entry] = []
        self.upload_id: str | None = None
        self.files_seen = 0
        self._cap = gallery["photo_cap"] or settings.gallery_photo_cap
        self._room: int | None = None  # free places in the gallery, learnt on the first file
        self._open: set[FileSink] = set()
        self._stored: list[Entry] = []  # renamed into storage, not yet committed
        self._seen: dict[str, Entry] = {}
        self._uploader = uploader
        self._finished = False
        self._spare_keys: list[str] = []  # reserved, no file written under them yet
        self._spare_since = 0.0
        self._key_block = 1

    def __enter__(self) -> Intake:
        assert self._uploader is None, "an HTTP upload's intake is entered with 'async with'"
        return self

    async def __aenter__(self) -> Intake:
        return self

    async def __aexit__(self, *exc: object) -> None:
        """Take back the provisional rows of a request that did not get to :meth:`finish`, then the files."""
        try:
            if self.upload_id is not None and not self._finished:
                with trio.CancelScope(shield=True):
                    await self._abandon()
        finally:
            if self.upload_id is not None:
                receiving_uploads().discard(self.upload_id)
            self._exit()
            if self._spare_keys:
                with trio.CancelScope(shield=True):
                    await self._release_spare_keys()

    async def _release_spare_keys(self) -> None:
        """Give back the keys reserved for files that never came. Should this fail (or the process die first),
        they expire and the reconciler deletes them: no file was written under them, so nothing else goes."""
        spare, self._spare_keys = self._spare_keys, []
        try:
            await self.db.write(reservations_q.release, spare)
        except Exception as error:
            log.warning("upload: %d unused key reservations left to expire (%s)", len(spare), error)

    async def _reserved_key(self) -> str:
        """A new storage key, reserved (committed) before its file is written: the reconciler leaves a reserved
        key's files alone until the reservation expires, and the commit of the file's row takes it
        (pipeline/janitor.py says the order and why). Reserved in blocks that double up to
        :data:`KEY_BLOCK_MAX`; an intake entered with ``with`` (the importer, hot folders) leaves its spare keys
        to expire."""
        now = self.clock()
        if not self._spare_keys or now - self._spare_since > KEY_FRESH_SECONDS:
            stale, block = self._spare_keys, [new_key() for _ in range(self._key_block)]

            def renew(conn: Connection) -> None:
                reservations_q.release(conn, stale)
                reservations_q.reserve(conn, block, now)
            await self.db.write(renew)
            self._spare_keys, self._spare_since = block, now
            self._key_block = min(KEY_BLOCK_MAX, self._key_block * 2)
        return self._spare_keys.pop()

    async def _abandon(self) -> None:
        assert self.upload_id is not None
        try:
            rows = await self.db.write(transitions.abandon_upload, self.settings.webhooks, self.upload_id,
                                       self.clock())
        except Exception as error:  # a full disk, say: no traceback, the reason is known and recovery automatic
            # The rows stay provisional, the group receiving: the janitor takes them back once the lease ends.
            log.error("upload %s: could not take back the rows of a request that was cut off (%s); the janitor "
                      "will once its lease has run out", self.upload_id, error)
            return
        # A worker of this process may still be making one of these photos' derivatives: let it finish, so
        # that none of its files is written after the removal below.
        busy = [r["claim_token"] for r in rows if r["status"] == "processing" and r["claim_token"]]
        if busy:
            with trio.move_on_after(self.settings.lease_seconds):  # a hung worker loses its lease anyway
                await attempts.wait_until_over(busy)
        deleted = {r["storage_key"] for r in rows}
        for entry in self.entries:
            if entry.key in deleted:
                entry.inserted = False  # the file goes below, with the derivatives a worker may have made
        if deleted:
            await trio.to_thread.run_sync(_remove_photo_files, self.storage, sorted(deleted), limiter=io_limiter())

    def __exit__(self, *exc: object) -> None:
        self._exit()

    def _exit(self) -> None:
        for sink in self._open:
            sink.discard()
        self._open.clear()
        for entry in self.entries:
            if entry.key is not None and not entry.inserted:
                self.storage.forget_original(entry.key)
                entry.key = None

    def count_file(self) -> None:
        """One more file part in this request, whatever its field: past ``max_files`` the request is refused
        at once, so that no part a client sends is free (each would cost an entry and a line of the answer)."""
        self.files_seen += 1
        if self.limits.max_files is not None and self.files_seen > self.limits.max_files:
            raise TooLarge(_("Too many files in one upload (at most %(max_files)s); nothing was saved, please send "
                             "them in smaller batches.") % {"max_files": self.limits.max_files})

    def start_file(self, raw_name: str) -> FileSink:
        self.count_file()
        sink = FileSink(self.storage, raw_name, self.limits.sink_bytes)
        self._open.add(sink)
        return sink

    def adopt_file(self, raw_name: str, path: Path, size: int, sha256: str) -> FileSink:
        """A file received in full elsewhere, for :meth:`finish_file`. Not counted as open: if a step fails with
        an exception, the file stays where it is (the tus upload can finish again); refused, it is removed."""
        self.files_seen += 1
        return FileSink.adopt(self.storage, raw_name, path, size, sha256)

    def refer_file(self, raw_name: str, path: Path, size: int, sha256: str) -> FileSink:
        """A file referenced in place (:meth:`FileSink.refer`), for :meth:`finish_file`."""
        self.files_seen += 1
        return FileSink.refer(self.storage, raw_name, path, size, sha256)

    def add_error(self, raw_name: str, error: str, status: int) -> Entry:
        entry = Entry(clean_filename(raw_name), error=error, status=status)
        self.entries.append(entry)
        return entry

    async def finish_file(self, sink: FileSink) -> Entry | None:
        """Check a file that arrived in full and move it into storage, or record why not."""
        entry = self.file_arrived(sink)
        if entry is not None and entry.error is None:
            await self.store_file(sink, entry)
        return entry

    def file_arrived(self, sink: FileSink) -> Entry | None:
        """The first half of :meth:`finish_file`, at once and in the order files arrive: the file's entry (its
        place in the answer), or None for a part that was no file. An entry without an error is then given to
        :meth:`store_file`, which may run while the next file arrives."""
        if not sink.raw_name and sink.size == 0 and not sink.too_large:
            # A browser form with no file chosen sends one empty, nameless part: not a file at all.
            self._drop(sink)
            self.files_seen -= 1
            return None
        entry = Entry(clean_filename(sink.raw_name), size=sink.size)
        self.entries.append(entry)
        if sink.too_large:
            self._drop(sink)
            entry.error = _("The file is larger than the limit of %(num)s MB.") % {"num": self.limits.sink_bytes // MB}
            entry.status = 413
        return entry

    async def store_file(self, sink: FileSink, entry: Entry) -> None:
        """Check the file and move it into storage (or record why not), and for an HTTP upload commit its row.
        Files are stored one at a time, in the order they arrived: duplicates and the gallery's cap count them
        in that order."""
        await sink.close()
        entry.sha256 = sink.sha256
        await self._check(sink, entry)
        if self._uploader is not None and self._stored:
            who = self._uploader
            await self._write_staged(who.authorize, who.uploaded_by, who.guest_session_id, who.guest_name,
                                     provisional=True)
            who.on_commit()

    async def _check(self, sink: FileSink, entry: Entry) -> None:
        earlier = self._seen.get(entry.sha256)
        if earlier is not None:
            self._drop(sink)
            entry.same_as = earlier
            entry.duplicate = True
            return
        existing = await self.db.read(photo_q.find_by_sha, self.gallery_id, entry.sha256)
        # A failed photo sent again goes on to the commit, which retries it (the failure may have been the
        # server's: a full disk, a crash); anything else already there is simply a duplicate.
        if existing is not None and existing["status"] != "failed":
            self._drop(sink)
            entry.duplicate, entry.photo_id = True, existing["id"]
            return
        # The header decides: over the pixel limit, or needing more decode memory than the whole budget
        # (decode_memory_mb), it is refused here with its size, never stored and never decoded. A video is
        # known by its container's bytes and checked by its probe (pipeline/video_intake.py).
        s = self.settings
        if await trio.to_thread.run_sync(video_intake.container_of, sink.temp, limiter=io_limiter()):
            try:
                entry.header, entry.video = await video_intake.check(
                    sink.temp, sink.size, settings=s, max_bytes=self.limits.video_bytes,
                    max_seconds=self.limits.max_video_seconds,
                    max_pixels=min(self.limits.max_pixels or s.max_pixels, video.MAX_FRAME_PIXELS))
            except video_intake.Refused as refused:
                self._drop(sink)
                entry.error, entry.status = refused.reason, refused.status
                return
        elif sink.size > self.limits.max_file_bytes:
            self._drop(sink)
            entry.error = (_("The file is larger than the limit of %(num)s MB.")
                           % {"num": self.limits.max_file_bytes // MB})
            entry.status = 413
            return
        else:
            check = partial(images.sniff, sink.temp, max_pixels=self.limits.max_pixels or s.max_pixels,
                            max_bytes=s.decode_memory_mb * MB, view_px=s.view_px)
            try:
                entry.header = await trio.to_thread.run_sync(check, limiter=io_limiter())
            except images.InvalidImage as error:
                self._drop(sink)
                entry.error = _(error.reason)  # a fixed sentence is translated; a measured one stays as is
                entry.status = 415 if error.reason == images.UNSUPPORTED else 413 if error.too_large else 400
                return
        if self._room is None:
            self._room = self._cap - await self.db.read(photo_q.count_in_gallery, self.gallery_id)
        if self._room <= 0:
            self._drop(sink)
            entry.error, entry.status = gallery_full(self._cap), 409
            return
        # Set before the hop: if the rename half-happens, the exit removes both places.
        entry.key = await self._reserved_key()
        if sink.referenced:
            await trio.to_thread.run_sync(self.storage.link_original, sink.temp, entry.key, limiter=io_limiter())
        else:
            await trio.to_thread.run_sync(self.storage.commit_original, sink.temp, entry.key, entry.sha256,
                                          limiter=io_limiter())
        self._open.discard(sink)  # no longer a temp file: nothing may unlink its old name now
        self._stored.append(entry)
        self._seen[entry.sha256] = entry
        self._room -= 1

    def _drop(self, sink: FileSink) -> None:
        sink.discard()
        self._open.discard(sink)

    async def commit(self, authorize: Authorize, *, uploaded_by: str, guest_session_id: int | None = None,
                     guest_name: str | None = None) -> None:
        """Insert the rows for everything stored since the last commit, in one transaction.

        ``authorize(conn)`` runs inside the transaction and returns the gallery row or raises: the
        permission checked when the request started is checked again at the moment the rows are written.
        The upload group is created only when at least one new photo is inserted.
        """
        assert self._uploader is None, "an HTTP upload's files are committed one by one; call finish()"
        await self._write_staged(authorize, uploaded_by, guest_session_id, guest_name, provisional=False)
        self._resolve_same_as()

    async def finish(self, guest_name: str | None) -> bool:
        """The request's body was read to its end: in one transaction, check the permission again, make this
        request's rows permanent (and every photo it was told is already in the gallery), set the form's guest
        name, and let the group complete. Returns True when ``upload.completed`` was written (every photo was
        already processed): the caller wakes the webhook sender. Until this ran, :meth:`__aexit__` takes the
        rows back."""
        who = self._uploader
        assert who is not None
        entries = [e for e in self.entries if e.error is None and e.same_as is None and e.photo_id is not None]
        outcome = await self.db.write(
            _close, who.authorize, self.gallery_id, self.upload_id, [(e.photo_id, e.duplicate) for e in entries],
            guest_name if guest_name != who.guest_name else None, self.settings.webhooks, self.clock(),
        )
        # No checkpoint before these marks (as in commit): the rows are permanent now, whatever happens next.
        self._finished = True
        missing, completed = outcome
        for entry in entries:
            if entry.photo_id in missing:
                entry.error, entry.status = (LOST, 409) if entry.duplicate else (DELETED, 409)
                entry.inserted = False
                entry.photo_id = None
        self._resolve_same_as()
        return completed

    async def _write_staged(self, authorize: Authorize, uploaded_by: str, guest_session_id: int | None,
                            guest_name: str | None, *, provisional: bool) -> None:
        staged, self._stored = self._stored, []
        if staged:
            rows = [(e.key, e.sha256, e.filename, e.size, e.header, e.video) for e in staged]
            lease = self.settings.lease_seconds if provisional else None
            upload_id, outcomes = await self.db.write(
                _record, authorize, self.gallery_id, rows, self.upload_id, uploaded_by,
                guest_session_id, guest_name, self.settings.gallery_photo_cap, self.clock(), lease,
            )
            # No checkpoint between the write returning and these marks: a cancellation that arrives now
            # finds the committed files marked as such and leaves them alone.
            if provisional and upload_id is not None and self.upload_id is None:
                receiving_uploads().add(upload_id)
            self.upload_id = upload_id
            for entry, (photo_id, duplicate, error) in zip(staged, outcomes, strict=True):
                entry.photo_id, entry.duplicate = photo_id, duplicate
                entry.inserted = photo_id is not None and not duplicate
                if error is not None:
                    entry.error, entry.status = error, 409
            orphans = [e.key for e in staged if e.key is not None and not e.inserted]
            if orphans:
                await trio.to_thread.run_sync(_remove_originals, self.storage, orphans, limiter=io_limiter())
                for e in staged:
                    if not e.inserted:
                        e.key = None

    def _resolve_same_as(self) -> None:
        for entry in self.entries:
            if entry.same_as is not None and (entry.same_as.photo_id is not None or entry.same_as.error):
                entry.photo_id, entry.error, entry.status = (
                    entry.same_as.photo_id, entry.same_as.error, entry.same_as.status)
                entry.duplicate = entry.error is None
                entry.same_as = None

    def accepted(self) -> list[Entry]:
        return [e for e in self.entries if e.error is None]

    def errors(self) -> list[Entry]:
        return [e for e in self.entries if e.error is not None]

    def errors_json(self) -> list[dict[str, Any]]:
        """The refused files for an answer: the first :data:`ERRORS_LISTED`, then one line that counts the rest,
        so that no answer grows with the number of files refused (the importer prints its own)."""
        errors = self.errors()
        listed = [e.to_json() for e in errors[:ERRORS_LISTED]]
        if len(errors) > ERRORS_LISTED:
            listed.append({"filename": "", "error": f"and {len(errors) - ERRORS_LISTED} more files refused."})
        return listed

    def answer(self) -> dict[str, Any]:
        """The 202 body. ``photo_ids`` lists every accepted file's photo, duplicates' existing ids included."""
        accepted, errors = self.accepted(), self.errors()
        new = sum(1 for e in accepted if not e.duplicate)
        return {
            "upload_id": self.upload_id,
            "count": len(accepted),
            "photo_ids": [e.photo_id for e in accepted],
            "photos": [e.to_json() for e in accepted],
            "errors": self.errors_json(),
            "successCount": len(accepted),
            "failureCount": len(errors),
            "totalFiles": len(self.entries),
            "message": f"{new} new, {len(accepted) - new} already in the gallery, {len(errors)} refused.",
        }

    def failure_status(self) -> int:
        """When nothing was accepted: the status all errors share (413, 415, 409), else 400."""
        statuses = {e.status for e in self.errors()}
        return statuses.pop() if len(statuses) == 1 else 400


def gallery_full(cap: int) -> str:
    return _("The gallery is full: it holds at most %(cap)s photos.") % {"cap": cap}


def _record(conn: Connection, authorize: Authorize, gallery_id: int, rows: list[tuple[Any, ...]],
            upload_id: str | None, uploaded_by: str, guest_session_id: int | None, guest_name: str | None,
            default_cap: int, now: float, lease: float | None = None) -> tuple[str | None, list[Outcome]]:
    """``lease``: the rows are provisional and the group is receiving for that long (renewed each time). Each
    file's key reservation is taken here; no storage call is made (the transaction holds the writer)."""
    locks.hold(conn, locks.PHOTO_ROWS)
    gallery = authorize(conn)
    if gallery["id"] != gallery_id:
        raise NotFound(_("The gallery was removed while the photos were uploading."))
    if gallery["archive_state"] != "active":  # checked under the lock that archiving's first step takes
        raise Conflict(_("The gallery is archived; restore it before adding photos."))
    if lease is not None and upload_id is not None and not photo_q.renew_receiving(conn, [upload_id], now + lease):
        raise Conflict(_(ABANDONED))
    cap = gallery["photo_cap"] or default_cap
    count = photo_q.count_in_gallery(conn, gallery_id)
    outcomes: list[Outcome] = []
    for key, sha256, name, size, header, clip in rows:
        # Taken whatever becomes of the file: a row points at it now, or the intake removes it after this commit.
        reserved = reservations_q.take(conn, key)
        existing = photo_q.find_by_sha(conn, gallery_id, sha256)
        if existing is not None:
            if existing["status"] == "failed":
                photo_q.retry(conn, existing["id"])
            outcomes.append((existing["id"], True, None))
            continue
        if not reserved:
            # The reconciler deleted the reservation as expired (a very slow upload) and so removes the file: this
            # says so instead of answering 202 for a photo without its file.
            outcomes.append((None, False, LOST))
            continue
        if count >= cap:
            outcomes.append((None, False, gallery_full(cap)))
            continue
        if upload_id is None:
            upload_id = secrets.token_hex(16)
            photo_q.create_upload(conn, upload_id, gallery_id, uploaded_by, guest_session_id, guest_name, now,
                                  None if lease is None else now + lease)
        photo_id = photo_q.insert_photo(
            conn, gallery_id=gallery_id, upload_id=upload_id, storage_key=key, sha256=sha256, display_name=name,
            size=size, format=header.format, uploaded_by=uploaded_by, guest_name=guest_name,
            width=header.width, height=header.height, now=now, provisional=lease is not None,
            video=None if clip is None else clip.to_json(),
        )
        outcomes.append((photo_id, False, None))
        count += 1
    return upload_id, outcomes


def _close(conn: Connection, authorize: Authorize, gallery_id: int, upload_id: str | None,
           accepted: list[tuple[int, bool]], guest_name: str | None, endpoints: Any,
           now: float) -> tuple[set[int], bool]:
    """:meth:`Intake.finish`'s transaction. Returns (accepted photo ids that are gone, upload completed)."""
    gallery = authorize(conn)
    if gallery["id"] != gallery_id:
        raise NotFound(_("The gallery was removed while the photos were uploading."))
    kept: set[int] = set()
    if upload_id is not None:
        if not photo_q.close_receiving(conn, upload_id):
            raise Conflict(_(ABANDONED))
        kept = photo_q.keep_upload_photos(conn, upload_id)
        if guest_name is not None:
            photo_q.set_upload_guest_name(conn, upload_id, guest_name)
    missing = set()
    for photo_id, duplicate in accepted:
        # A duplicate may be the provisional photo of another request still arriving: it stays now.
        if (duplicate and not photo_q.keep_photo(conn, photo_id)) or (not duplicate and photo_id not in kept):
            missing.add(photo_id)
    completed = upload_id is not None and transitions.finish_upload(conn, endpoints, upload_id, now)
    return missing, completed


def _remove_photo_files(storage: Storage, keys: list[str]) -> None:
    for key in keys:
        storage.remove_photo_files(key)


def _remove_originals(storage: Storage, keys: list[str]) -> None:
    for key in keys:
        storage.remove_original(key)
