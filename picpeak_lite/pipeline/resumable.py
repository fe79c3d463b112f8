"""Resumable uploads (tus 1.0.0): the rules between the protocol (``web/views/tus.py``) and the intake.

A tus upload is one file sent in as many requests as it takes. Its bytes grow in ``tmp/tus/<id>`` (a folder of
its own, so that the hourly sweep of ``tmp/`` leaves them alone) and its state is a ``tus_uploads`` row. The id
is 128 random bits and the row names its uploader (the admin, or one guest session): anyone else is told 404.

Durable offsets: a chunk is written, fsynced, and only then is the new offset committed and the request
answered. So ``upload_offset`` never exceeds what is on disk; after a kill -9 the file may hold more (written,
not yet recorded), and the next chunk first cuts it back to the recorded offset. A request cut off mid-chunk
keeps what arrived (fsynced and recorded on the way out, shielded), unless it carried ``Upload-Checksum``: a
chunk that cannot be checked is discarded whole, as one that fails its check (460).

One intake: when the last byte is durable, the file goes through ``Intake`` exactly as a multipart file does
(sniff, size, sha256 and duplicates, gallery cap, durable rename, row, wake the workers), as the photo of the
upload group the row belongs to. A batch shares a group: files created with the same ``upload_group`` metadata
(a key chosen by the client) by the same uploader in the same gallery join the group while it is still
receiving. The group is created, receiving, with the first file of the batch, stays receiving while any of
its files may still arrive, and closes when the last has ended (finished, refused, terminated or expired):
only then can ``upload.completed`` describe the whole batch. A group that ends without a photo is deleted.

Two uploads of the same file never write at once: a new request for an upload that another request is still
writing (a client that reconnected before the server noticed the old connection drop) cancels the old one,
which records what it had, and then goes on from the offset it learns.

Reservations are charged to their owner (issue 27). An unfinished upload holds the bytes it announced: for
the disk check at creation they count against the party that made them only (the admin, or the guests at one
client address), never against anyone else, so a stranger's empty uploads cannot make the disk look full to
others (a chunk's own write still checks the real free space). A guest's announced length is charged to its
upload budget at creation (``web/views/tus.py``), and guests' unfinished uploads are capped, from the
database and so across sessions and restarts: ``tus_unfinished_mb_per_client`` bytes and
:data:`CLIENT_FILES_PER_SESSION_CAP` times ``guest_max_files`` uploads per client address, and
``tus_unfinished_mb_per_gallery`` bytes per gallery (429 past them, as a budget would); ``Upload-Metadata`` is
at most :data:`METADATA_MAX` bytes (it is stored with the row).

Expiry: an unfinished upload expires ``tus_idle_minutes`` after its last progress (its creation, or a chunk
that added bytes), and at the latest ``tus_expiry_hours`` after its creation: a trickle of bytes cannot hold a
reservation for long. Expired, it answers 410 at once and stops counting; the janitor (:func:`expire`) removes
its bytes and leaves a small tombstone (410, without its metadata) for ``tus_expiry_hours``; a finished
upload's row is kept as long, so that a client that lost the last answer can still learn its photo.
"""

from __future__ import annotations

import base64
import hashlib
import logging
import os
import re
import secrets
from collections.abc import AsyncIterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO

import trio

from picpeak_lite.config import Settings, WebhookEndpoint
from picpeak_lite.errors import (
    AppError,
    BadRequest,
    Conflict,
    Gone,
    NotFound,
    TooLarge,
    TooManyRequests,
    UnsupportedMedia,
)
from picpeak_lite.perrun import PerRun
from picpeak_lite.pipeline import transitions
from picpeak_lite.pipeline.intake import (
    MB,
    WRITE_BATCH,
    Authorize,
    Intake,
    Limits,
    clean_filename,
    clean_guest_name,
    gallery_full,
    io_limiter,
)
from picpeak_lite.services import Services
from picpeak_lite.store.db import Connection, Row
from picpeak_lite.store.queries import photos as photo_q
from picpeak_lite.store.queries import tus as tus_q
from picpeak_lite.store.storage import Storage, disk_errors, fsync_dir, remove_quietly

log = logging.getLogger(__name__)

TUS_DIR = "tus"
ORPHAN_GRACE_SECONDS = 600.0  # a file is created just before its row: younger files without one are left alone
CHECKSUMS = {"sha1": hashlib.sha1, "sha256": hashlib.sha256}
GROUP_KEY = re.compile(r"[A-Za-z0-9._~-]{1,64}")
LOST = "The bytes of this upload were lost on the server; please send the file again."
REFUSALS: dict[int, type[AppError]] = {413: TooLarge, 415: UnsupportedMedia, 409: Conflict}
METADATA_MAX = 4096  # Upload-Metadata, as sent: a file name, a type, a guest name and a group key need far less
CLIENT_FILES_PER_SESSION_CAP = 5  # one address's unfinished uploads: as many as 5 sessions', as its budgets are
RESERVATION_RETRY_SECONDS = 60  # Retry-After when a cap on unfinished uploads is reached: others end meanwhile

_WRITERS: PerRun[dict[str, _Writer]] = PerRun("picpeak_tus_writers", dict)


class ChecksumMismatch(AppError):
    """tus's checksum extension: the chunk's bytes do not match ``Upload-Checksum``; it was not kept."""

    status = 460
    title = "Checksum Mismatch"


@dataclass(frozen=True)
class Owner:
    """Who an upload belongs to: the admin (any admin login or API token) or one guest session."""

    uploaded_by: str  # 'admin' or 'guest'
    guest_session_id: int | None = None
    guest_name: str | None = None

    def owns(self, row: Row) -> bool:
        return row["uploaded_by"] == self.uploaded_by and row["guest_session_id"] == self.guest_session_id


@dataclass(frozen=True)
class Finished:
    """What a finished upload became: the answer of its last chunk, and of a HEAD afterwards."""

    photo_id: int | None
    upload_id: str | None  # None when the group has no photo (every file of it was already in the gallery)
    duplicate: bool
    size: int


def partial_path(storage: Storage, tus_id: str) -> Path:
    if len(tus_id) != 32 or any(c not in "0123456789abcdef" for c in tus_id):
        raise ValueError(f"not a tus upload id: {tus_id!r}")
    return storage.tmp_dir / TUS_DIR / tus_id


def expiry_seconds(svc: Services) -> float:
    """How long a finished upload or a tombstone is remembered, and the longest an upload may take in all."""
    return svc.settings.tus_expiry_hours * 3600.0


def idle_expiry(svc: Services, created_at: float, now: float) -> float:
    """When an unfinished upload that made progress at ``now`` expires: ``tus_idle_minutes`` on, but never past
    ``tus_expiry_hours`` after its creation."""
    return min(now + svc.settings.tus_idle_minutes * 60.0, created_at + expiry_seconds(svc))


def parse_metadata(header: str | None) -> dict[str, bytes]:
    """``Upload-Metadata``: comma-separated ``key base64value`` pairs (the value may be left out), at most
    :data:`METADATA_MAX` bytes (it is stored with the upload)."""
    pairs: dict[str, bytes] = {}
    if not header or not header.strip():
        return pairs
    if len(header) > METADATA_MAX:
        raise BadRequest(f"Upload-Metadata may be at most {METADATA_MAX // 1024} KB; send a shorter file name.")
    for item in header.split(","):
        parts = item.strip().split(" ")
        key = parts[0]
        if not key or len(parts) > 2 or key in pairs or any(ord(c) < 33 or ord(c) > 126 for c in key):
            raise BadRequest("Upload-Metadata must be comma-separated pairs of a key and a base64 value.")
        try:
            pairs[key] = base64.b64decode(parts[1], validate=True) if len(parts) == 2 else b""
        except ValueError:
            raise BadRequest(f"The Upload-Metadata value of {key[:40]!r} is not valid base64.") from None
    return pairs


def parse_checksum(header: str | None) -> tuple[str, bytes] | None:
    """``Upload-Checksum: <algorithm> <base64 digest>``; an algorithm we do not offer is a 400 (tus)."""
    if header is None:
        return None
    algorithm, _, value = header.strip().partition(" ")
    if algorithm not in CHECKSUMS:
        raise BadRequest("Upload-Checksum: this server checks sha1 or sha256 only.")
    try:
        return algorithm, base64.b64decode(value.strip(), validate=True)
    except ValueError:
        raise BadRequest("Upload-Checksum: the digest is not valid base64.") from None


def text(meta: dict[str, bytes], *keys: str) -> str | None:
    for key in keys:
        if key in meta:
            return meta[key].decode("utf-8", "replace")
    return None


# --- creation ----------------------------------------------------------------------------------------------

async def create(svc: Services, *, authorize: Authorize, owner: Owner, limits: Limits, length: int,
                 metadata: str | None, client_ip: str | None) -> Row:
    """A new upload for ``owner`` at ``client_ip``: checked against the same limits as a multipart file before
    any byte is sent (size, the gallery's cap, the disk reserve counting what this party's other unfinished
    uploads still announce), and a guest's against the caps on unfinished uploads."""
    meta = parse_metadata(metadata)
    if length > limits.max_file_bytes:
        raise TooLarge(f"The file is larger than the limit of {limits.max_file_bytes // MB} MB.")
    group_key = text(meta, "upload_group")
    if group_key is not None and not GROUP_KEY.fullmatch(group_key):
        raise BadRequest("The upload_group metadata must be 1 to 64 letters, digits or ._~- characters.")
    filename = clean_filename(text(meta, "filename", "name") or "")
    guest_name = owner.guest_name
    if owner.uploaded_by == "guest":
        guest_name = clean_guest_name(text(meta, "guest_name")) or owner.guest_name
    now = svc.clock()
    outstanding = await svc.db.read(tus_q.outstanding_bytes, owner.uploaded_by, client_ip, now)
    await trio.to_thread.run_sync(svc.storage.ensure_space, length + outstanding, limiter=io_limiter())
    tus_id = secrets.token_hex(16)
    path = partial_path(svc.storage, tus_id)
    await trio.to_thread.run_sync(_create_file, path, limiter=io_limiter())
    try:
        return await svc.db.write(
            _create_row, authorize, owner, limits, tus_id, group_key, length, metadata or "", filename, guest_name,
            client_ip, svc.settings, now, idle_expiry(svc, now, now))
    except BaseException:
        remove_quietly(path)
        raise


def _create_file(path: Path) -> None:
    with disk_errors():
        path.parent.mkdir(parents=True, exist_ok=True)
        with open(path, "xb"):
            pass
        fsync_dir(path.parent)


def _create_row(conn: Connection, authorize: Authorize, owner: Owner, limits: Limits, tus_id: str,
                group_key: str | None, length: int, metadata: str, filename: str, guest_name: str | None,
                client_ip: str | None, settings: Settings, now: float, expires_at: float) -> Row:
    gallery = authorize(conn)
    cap = gallery["photo_cap"] or settings.gallery_photo_cap
    if photo_q.count_in_gallery(conn, gallery["id"]) >= cap:
        raise Conflict(gallery_full(cap))
    unfinished = tus_q.unfinished_of_owner(conn, gallery["id"], owner.uploaded_by, owner.guest_session_id, now)
    most = limits.max_files or 1
    if unfinished >= most:
        raise Conflict(f"You have {unfinished} unfinished uploads in this gallery, the most allowed at once; "
                       "finish or cancel some of them first.")
    if owner.uploaded_by == "guest":
        _check_guest_reservations(conn, gallery["id"], client_ip, length, settings, now)
    upload_id = None
    if group_key is not None:
        upload_id = tus_q.open_group(conn, gallery["id"], owner.uploaded_by, owner.guest_session_id, group_key)
        if upload_id is not None and tus_q.count_in_group(conn, upload_id) >= most:
            upload_id = None  # a batch larger than one upload may hold goes on in a new group
    if upload_id is None:
        upload_id = secrets.token_hex(16)
        photo_q.create_upload(conn, upload_id, gallery["id"], owner.uploaded_by, owner.guest_session_id,
                              guest_name, now, expires_at)
    else:
        tus_q.extend_group(conn, upload_id, expires_at)
    tus_q.insert(conn, tus_id=tus_id, gallery_id=gallery["id"], uploaded_by=owner.uploaded_by,
                 guest_session_id=owner.guest_session_id, upload_id=upload_id, group_key=group_key, length=length,
                 metadata=metadata, filename=filename, guest_name=guest_name, client_ip=client_ip, now=now,
                 expires_at=expires_at)
    row = tus_q.get(conn, tus_id)
    assert row is not None
    return row


def _check_guest_reservations(conn: Connection, gallery_id: int, client_ip: str | None, length: int,
                              settings: Settings, now: float) -> None:
    """A guest's new upload fits the caps on unfinished uploads, or is refused (429) until some end. Checked
    in the write transaction that inserts the row, so that requests at once cannot all slip under a cap."""
    if client_ip is not None:
        count, announced = tus_q.guest_unfinished_of_client(conn, client_ip, now)
        if count >= CLIENT_FILES_PER_SESSION_CAP * settings.guest_max_files:
            raise TooManyRequests(RESERVATION_RETRY_SECONDS, (
                f"There are {count} unfinished uploads from your network, the most allowed at once; "
                "finish or cancel some of them, or wait a little and retry."))
        if announced + length > settings.tus_unfinished_mb_per_client * MB:
            raise TooManyRequests(RESERVATION_RETRY_SECONDS, (
                f"Unfinished uploads from your network already hold {announced // MB} MB of the "
                f"{settings.tus_unfinished_mb_per_client} MB allowed at once; finish some first, "
                "or wait a little and retry."))
    in_gallery = tus_q.guest_unfinished_bytes_in_gallery(conn, gallery_id, now)
    if in_gallery + length > settings.tus_unfinished_mb_per_gallery * MB:
        raise TooManyRequests(RESERVATION_RETRY_SECONDS, (
            f"Guests' unfinished uploads to this gallery already hold {in_gallery // MB} MB of the "
            f"{settings.tus_unfinished_mb_per_gallery} MB allowed at once; please wait a little and retry."))


# --- looking an upload up ------------------------------------------------------------------------------------

async def find(svc: Services, tus_id: str, gallery_id: int, owner: Owner) -> Row:
    """The upload, if it is this owner's in this gallery: otherwise 404, whether or not it exists (an id is
    never confirmed to someone else). 410 once it has expired."""
    if len(tus_id) != 32 or any(c not in "0123456789abcdef" for c in tus_id):
        raise NotFound("There is no such upload.")
    row = await svc.db.read(tus_q.get, tus_id)
    if row is None or row["gallery_id"] != gallery_id or not owner.owns(row):
        raise NotFound("There is no such upload.")
    if row["state"] == tus_q.EXPIRED or (row["state"] == tus_q.RECEIVING and row["expires_at"] < svc.clock()):
        raise Gone("This upload has expired; please send the file again.")
    return row


async def finished(svc: Services, row: Row) -> Finished:
    """What a finished row says: its photo, and the group when that group has a photo to follow."""
    upload_id = row["upload_id"]
    if upload_id is not None and (await svc.db.read(photo_q.upload_counts, upload_id))["total"] == 0:
        upload_id = None
    return Finished(row["photo_id"], upload_id, bool(row["duplicate"]), row["upload_length"])


# --- writing a chunk -----------------------------------------------------------------------------------------

@dataclass(eq=False)
class _Writer:
    scope: trio.CancelScope
    done: trio.Event


async def _take_over(tus_id: str) -> _Writer:
    """Become the one request writing this upload: an older one still at it is cancelled and waited for."""
    writers = _WRITERS.get()
    while (old := writers.get(tus_id)) is not None:
        old.scope.cancel()
        await old.done.wait()
    writer = _Writer(trio.CancelScope(), trio.Event())
    writers[tus_id] = writer
    return writer


def _release(tus_id: str, writer: _Writer) -> None:
    writers = _WRITERS.get()
    if writers.get(tus_id) is writer:
        del writers[tus_id]
    writer.done.set()


async def write_chunk(svc: Services, row: Row, offset: int, body: AsyncIterable[bytes], *,
                      content_length: int | None, checksum: tuple[str, bytes] | None) -> int:
    """Append one request's bytes at ``offset``; returns the new durable offset. Answers only once it is
    fsynced and recorded."""
    tus_id = row["id"]
    remaining = row["upload_length"] - offset
    if content_length is not None and content_length > remaining:
        raise TooLarge("This chunk goes past the upload's Upload-Length; nothing of it was kept.")
    writer = await _take_over(tus_id)
    try:
        current = await svc.db.read(tus_q.get, tus_id)
        if current is None or current["state"] == tus_q.EXPIRED:
            raise NotFound("There is no such upload.")
        if current["upload_offset"] != offset or current["state"] != tus_q.RECEIVING:
            raise OffsetMismatch(current["upload_offset"])
        chunk = _Chunk(svc, partial_path(svc.storage, tus_id), offset, remaining, checksum)
        try:
            with writer.scope:
                await chunk.receive(body)
            if writer.scope.cancelled_caught:
                raise Conflict("A newer request for this upload took over; ask for its offset again.")
        finally:
            with trio.CancelScope(shield=True):
                new_offset = await chunk.settle()
                if new_offset != offset:
                    await svc.db.write(_record_offset, tus_id, current["upload_id"], new_offset,
                                       idle_expiry(svc, current["created_at"], svc.clock()))
        return new_offset
    finally:
        _release(tus_id, writer)


class OffsetMismatch(Conflict):
    """409: the request's ``Upload-Offset`` is not where the upload is (the answer says where it is)."""

    def __init__(self, offset: int) -> None:
        super().__init__(f"Upload-Offset does not match: this upload is at {offset} bytes.")
        self.offset = offset

    def headers(self) -> dict[str, str]:
        return {"Upload-Offset": str(self.offset)}


def _record_offset(conn: Connection, tus_id: str, upload_id: str | None, offset: int, expires_at: float) -> None:
    if tus_q.set_offset(conn, tus_id, offset, expires_at) and upload_id is not None:
        tus_q.extend_group(conn, upload_id, expires_at)


class _Chunk:
    """One request's bytes on their way to the end of the partial file."""

    def __init__(self, svc: Services, path: Path, offset: int, remaining: int,
                 checksum: tuple[str, bytes] | None) -> None:
        self.storage = svc.storage
        self.path = path
        self.start = offset
        self.remaining = remaining
        self.checksum = checksum
        self.hasher = CHECKSUMS[checksum[0]]() if checksum else None
        self.written = 0
        self.received = 0
        self.complete = False  # the body was read to its end and is within Upload-Length
        self.mismatch = False
        self.file: BinaryIO | None = None
        self.pending = bytearray()

    async def receive(self, body: AsyncIterable[bytes]) -> None:
        self.file = await trio.to_thread.run_sync(_open_at, self.path, self.start, limiter=io_limiter())
        async for data in body:
            self.received += len(data)
            if self.received > self.remaining:
                raise TooLarge("This chunk goes past the upload's Upload-Length; nothing of it was kept.")
            self.pending += data
            if len(self.pending) >= WRITE_BATCH:
                await self._flush()
        self.complete = True

    async def _flush(self) -> None:
        data, self.pending = self.pending, bytearray()
        if data and self.file is not None:
            await trio.to_thread.run_sync(_append, self.storage, self.file, self.hasher, data, limiter=io_limiter())
            self.written += len(data)

    async def settle(self) -> int:
        """Shielded, on every way out: keep what may be kept, fsynced; returns the offset to record."""
        keep = self.complete or self.checksum is None
        too_long = self.received > self.remaining
        if keep and not too_long:
            try:
                await self._flush()
            except Exception as error:  # a full disk: what was written before it still counts
                log.warning("tus %s: could not write the end of a chunk (%s)", self.path.name, error)
        if keep and not too_long and self.complete and self.checksum is not None:
            assert self.hasher is not None
            if self.hasher.digest() != self.checksum[1]:
                keep = False
                self.mismatch = True
        end = self.start + self.written if keep and not too_long else self.start
        await trio.to_thread.run_sync(_close_at, self.file, self.path, end, limiter=io_limiter())
        self.file = None
        if self.mismatch:
            raise ChecksumMismatch("The chunk does not match its Upload-Checksum; it was not kept.")
        return end


def _open_at(path: Path, offset: int) -> BinaryIO:
    try:
        f = open(path, "r+b")  # noqa: SIM115  # held across the chunk's thread hops, closed by _close_at
    except FileNotFoundError:
        raise NotFound(LOST) from None
    # Bytes past the recorded offset were written but never recorded (a crash, a cut-off chunk): cut them off.
    f.truncate(offset)
    f.seek(offset)
    return f


def _append(storage: Storage, f: BinaryIO, hasher: Any, data: bytearray) -> None:
    with disk_errors():
        storage.ensure_space(len(data))
        if hasher is not None:
            hasher.update(data)
        f.write(data)


def _close_at(f: BinaryIO | None, path: Path, end: int) -> None:
    """Cut the file to ``end`` and fsync it: after this, ``end`` bytes are durable."""
    if f is None:
        return
    try:
        with disk_errors():
            f.flush()
            f.truncate(end)
            os.fsync(f.fileno())
    finally:
        f.close()


# --- finishing -----------------------------------------------------------------------------------------------

async def finish(svc: Services, row: Row, *, authorize: Authorize, limits: Limits) -> Finished:
    """The last byte is durable: the file goes through the intake as the photo of the row's group. A refused
    file ends its upload with the reason (413, 415, 409 or 400); any other failure leaves the upload as it is,
    complete, so that an empty PATCH at its end tries again."""
    tus_id = row["id"]
    path = partial_path(svc.storage, tus_id)
    try:
        sha256, size = await trio.to_thread.run_sync(_hash_file, path, row["upload_length"], limiter=io_limiter())
    except FileNotFoundError:
        await _end(svc, tus_id, None)
        raise Gone(LOST) from None
    gallery = await svc.db.read(authorize)
    intake = Intake(db=svc.db, storage=svc.storage, settings=svc.settings, gallery=gallery, limits=limits,
                    clock=svc.clock)
    intake.upload_id = row["upload_id"]
    with intake:
        sink = intake.adopt_file(row["filename"], path, size, sha256)
        entry = await intake.finish_file(sink)
        assert entry is not None
        await intake.commit(authorize, uploaded_by=row["uploaded_by"], guest_session_id=row["guest_session_id"],
                            guest_name=row["guest_name"])
    if entry.error is not None:
        await _end(svc, tus_id, None)
        remove_quietly(path)
        raise REFUSALS.get(entry.status, BadRequest)(entry.error, errors=[entry.to_json()])
    if not entry.duplicate:
        svc.workers_bell.ring()
    await _end(svc, tus_id, entry)
    done = await svc.db.read(tus_q.get, tus_id)
    upload_id = intake.upload_id if done is None else done["upload_id"]
    if upload_id is not None and (await svc.db.read(photo_q.upload_counts, upload_id))["total"] == 0:
        upload_id = None
    return Finished(entry.photo_id, upload_id, entry.duplicate, size)


def _hash_file(path: Path, length: int) -> tuple[str, int]:
    digest = hashlib.sha256()
    with open(path, "r+b") as f:
        f.truncate(length)
        while block := f.read(MB):
            digest.update(block)
    return digest.hexdigest(), length


async def _end(svc: Services, tus_id: str, entry: Any) -> None:
    """The upload has ended: done with its photo (``entry``), or gone (None). Its group closes with its last."""
    keep_until = svc.clock() + expiry_seconds(svc)
    completed = await svc.db.write(_end_row, svc.settings.webhooks, tus_id, entry, keep_until, svc.clock())
    if completed:
        svc.webhooks_bell.ring()


def _end_row(conn: Connection, endpoints: tuple[WebhookEndpoint, ...], tus_id: str, entry: Any,
             keep_until: float, now: float) -> bool:
    row = tus_q.get(conn, tus_id)
    if row is None:
        return False
    if entry is None:
        tus_q.delete(conn, tus_id)
    else:
        tus_q.mark_done(conn, tus_id, entry.photo_id, entry.duplicate, keep_until)
    return close_group_if_last(conn, endpoints, row["upload_id"], now)


def close_group_if_last(conn: Connection, endpoints: tuple[WebhookEndpoint, ...], upload_id: str | None,
                        now: float) -> bool:
    """When no file of the group may still arrive: an empty group goes, any other may now complete. True when
    ``upload.completed`` was written."""
    if upload_id is None or tus_q.receiving_in_group(conn, upload_id) > 0:
        return False
    if photo_q.delete_upload_if_empty(conn, upload_id):
        return False
    return photo_q.close_receiving(conn, upload_id) and transitions.finish_upload(conn, endpoints, upload_id, now)


# --- termination and expiry ----------------------------------------------------------------------------------

async def terminate(svc: Services, row: Row) -> None:
    """tus termination (DELETE): stop any request still writing, forget the upload, remove its bytes."""
    writer = await _take_over(row["id"])
    try:
        with trio.CancelScope(shield=True):
            await _end(svc, row["id"], None)
            remove_quietly(partial_path(svc.storage, row["id"]))
    finally:
        _release(row["id"], writer)


async def expire(svc: Services) -> int:
    """The janitor's pass: unfinished uploads past their expiry lose their bytes (tombstones answer 410 for
    another period), finished rows and tombstones past theirs are forgotten, and files in ``tmp/tus`` that no
    unfinished upload owns (a crash between the file and its row, a deleted gallery) go. Returns how many
    uploads expired."""
    now = svc.clock()
    busy = sorted(_WRITERS.get())  # a chunk still arriving (slowly) records its progress and expiry on its way out
    rows = await svc.db.write(_expire_rows, svc.settings.webhooks, now, now + expiry_seconds(svc), busy)
    keep = await svc.db.read(tus_q.receiving_ids)
    await trio.to_thread.run_sync(_remove_partials, svc.storage, [r["id"] for r in rows], keep, now,
                                  limiter=io_limiter())
    if rows:
        log.info("tus: %d unfinished uploads expired", len(rows))
        svc.webhooks_bell.ring()
    return len(rows)


def _expire_rows(conn: Connection, endpoints: tuple[WebhookEndpoint, ...], now: float,
                 tombstone_until: float, busy: list[str]) -> list[Row]:
    tus_q.forget_old(conn, now)
    rows = tus_q.expire_due(conn, now, tombstone_until, busy)
    for upload_id in sorted({r["upload_id"] for r in rows if r["upload_id"] is not None}):
        close_group_if_last(conn, endpoints, upload_id, now)
    return rows


def _remove_partials(storage: Storage, expired: list[str], keep: set[str], now: float) -> None:
    for tus_id in expired:
        remove_quietly(partial_path(storage, tus_id))
    folder = storage.tmp_dir / TUS_DIR
    if not folder.exists():
        return
    for entry in os.scandir(folder):
        try:
            if entry.name not in keep and now - entry.stat().st_mtime > ORPHAN_GRACE_SECONDS:
                os.unlink(entry.path)
        except FileNotFoundError:
            pass
