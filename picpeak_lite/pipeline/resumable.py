"""Resumable uploads (tus 1.0.0): the rules between the protocol (``web/views/tus.py``) and the intake.

A tus upload is one file sent in as many requests as it takes. Its bytes grow in ``tmp/tus/<id>`` (a folder of
its own, so that the hourly sweep of ``tmp/`` leaves them alone), or, with ``tus_bytes`` bucket (auto: S3 and
PostgreSQL, several hosts), as pieces in the bucket that any host may add to and read back
(``pipeline/tuspieces.py``, :class:`_BucketChunk`: the offset moves only once a piece's PUT succeeded, in the same
fenced record), and its state is a ``tus_uploads`` row. The id
is 128 random bits and the row names its uploader (the admin, or one guest session): anyone else is told 404.

Durable offsets: a chunk is written, fsynced, and only then is the new offset committed and the request
answered. So ``upload_offset`` never exceeds what is on disk; after a kill -9 the file may hold more (written,
not yet recorded), and the next chunk first cuts it back to the recorded offset. A request cut off mid-chunk
keeps what arrived (fsynced and recorded on the way out, shielded), unless it carried ``Upload-Checksum``: a
chunk that cannot be checked is discarded whole, as one that fails its check (460).

One intake: when the last byte is durable, the file goes through ``Intake`` exactly as a multipart file does
(sniff, size, sha256 and duplicates, gallery cap, durable rename, row, wake the workers), as the photo of the
upload group the row belongs to; from then on making that photo is the server's job, tried again after a failure
or a crash until the photo exists or the file is refused (see "finishing" below). A batch shares a group: files
created with the same ``upload_group`` metadata (a key chosen by the client) by the same uploader in the same
gallery join the group while it is still receiving. The group is created, receiving, with the first file of the
batch, stays receiving while any of its files may still arrive, and closes when the last has ended (finished,
refused, terminated or expired): only then can ``upload.completed`` describe the whole batch. A group that ends
without a photo is deleted.

Several processes (``serve --processes N``, a ``worker``; later several hosts) may answer the requests of one
upload, so who writes it and who makes its photo are held in its row, not in one process's memory:

- Writing: a request writes only under the row's writer lease (its process's ``Services.instance``, its own
  token, until when), taken in one guarded update, renewed while bytes flow (every
  :data:`WRITER_RENEW_SECONDS`, never one write per piece) and let go with the offset it records. That record is
  fenced by the token: a writer whose lease was taken over can never move the offset, and it stops writing to the
  file :data:`WRITER_MARGIN_SECONDS` before its lease could run out unrenewed. Within a process a new request for
  an upload that another request is still writing (a client that reconnected before the server noticed the old
  connection drop) cancels the old one, which records what it had, and goes on from the offset it learns; a
  request reaching another process while a live lease is held is told 423 with Retry-After (tus clients and
  ``static/upload-queue.js`` retry it); a lease past its time is taken over (its holder died).
- Finishing: a try at making the photo claims the row (a token and a deadline sized to the file, as
  ``store/queries/claims.py`` claims a photo), so that the last PATCH in one process and the :class:`Finisher` in
  another never both make it; a HEAD in any process answers 423 while a try holds a live claim.
- Expiry (:func:`expire`) spares an upload whose writer lease is live, so the janitor may run in any process.

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
import contextlib
import functools
import hashlib
import logging
import os
import re
import secrets
import shutil
from collections.abc import AsyncIterable, AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO

import trio

from picpeak_lite.config import Settings, WebhookEndpoint
from picpeak_lite.domain import access
from picpeak_lite.errors import (
    AppError,
    BadRequest,
    Conflict,
    Forbidden,
    Gone,
    NotFound,
    StorageUnavailable,
    TooLarge,
    TooManyRequests,
    UnsupportedMedia,
)
from picpeak_lite.i18n import N_, _
from picpeak_lite.media import video
from picpeak_lite.perrun import PerRun
from picpeak_lite.pipeline import transitions, tuspieces, video_intake
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
from picpeak_lite.runtime.lease import holder_is_gone
from picpeak_lite.services import Services
from picpeak_lite.store.db import Connection, Row
from picpeak_lite.store.queries import galleries as gallery_q
from picpeak_lite.store.queries import photos as photo_q
from picpeak_lite.store.queries import tus as tus_q
from picpeak_lite.store.storage import Storage, disk_errors, fsync_dir, remove_quietly

log = logging.getLogger(__name__)

TUS_DIR = "tus"
ORPHAN_GRACE_SECONDS = 600.0  # a file is created just before its row: younger files without one are left alone
CHECKSUMS = {"sha1": hashlib.sha1, "sha256": hashlib.sha256}
GROUP_KEY = re.compile(r"[A-Za-z0-9._~-]{1,64}")
LOST = N_("The bytes of this upload were lost on the server; please send the file again.")
REFUSALS: dict[int, type[AppError]] = {413: TooLarge, 415: UnsupportedMedia, 409: Conflict}
METADATA_MAX = 4096  # Upload-Metadata, as sent: a file name, a type, a guest name and a group key need far less
CLIENT_FILES_PER_SESSION_CAP = 5  # one address's unfinished uploads: as many as 5 sessions', as its budgets are
HEADER_BYTES = 64  # what tells a video from a photo (video.sniff_container, through video_intake.container_of)
RESERVATION_RETRY_SECONDS = 60  # Retry-After when a cap on unfinished uploads is reached: others end meanwhile

# The requests writing uploads in this process, by (Services.instance, upload id): a newer one cancels an older
# one here; across processes the writer lease in the row decides (queries/tus.py claim_writer).
_WRITERS: PerRun[dict[tuple[str, str], _Writer]] = PerRun("picpeak_tus_writers", dict)
WRITER_LEASE_SECONDS = 30.0  # a writer's hold on its upload, recorded in the row
WRITER_RENEW_SECONDS = 10.0  # renewed when a piece arrives this long after the last renewal (while bytes flow)
WRITER_MARGIN_SECONDS = 10.0  # no byte is written later than this before the lease would run out unrenewed


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
        raise BadRequest(_("Upload-Metadata may be at most %(num)s KB; send a shorter file name.")
                         % {"num": METADATA_MAX // 1024})
    for item in header.split(","):
        parts = item.strip().split(" ")
        key = parts[0]
        if not key or len(parts) > 2 or key in pairs or any(ord(c) < 33 or ord(c) > 126 for c in key):
            raise BadRequest(_("Upload-Metadata must be comma-separated pairs of a key and a base64 value."))
        try:
            pairs[key] = base64.b64decode(parts[1], validate=True) if len(parts) == 2 else b""
        except ValueError:
            raise BadRequest(_("The Upload-Metadata value of %(key)r is not valid base64.")
                             % {"key": key[:40]}) from None
    return pairs


def parse_checksum(header: str | None) -> tuple[str, bytes] | None:
    """``Upload-Checksum: <algorithm> <base64 digest>``; an algorithm we do not offer is a 400 (tus)."""
    if header is None:
        return None
    algorithm, _space, value = header.strip().partition(" ")
    if algorithm not in CHECKSUMS:
        raise BadRequest(_("Upload-Checksum: this server checks sha1 or sha256 only."))
    try:
        return algorithm, base64.b64decode(value.strip(), validate=True)
    except ValueError:
        raise BadRequest(_("Upload-Checksum: the digest is not valid base64.")) from None


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
    # Whether it is a video is known from its first bytes only: up to the larger (video) limit now, and a
    # photo is held to its own limit once they arrive (check_kind), as a multipart file is when it has arrived.
    if length > limits.sink_bytes:
        raise TooLarge(_("The file is larger than the limit of %(num)s MB.") % {"num": limits.sink_bytes // MB})
    group_key = text(meta, "upload_group")
    if group_key is not None and not GROUP_KEY.fullmatch(group_key):
        raise BadRequest(_("The upload_group metadata must be 1 to 64 letters, digits or ._~- characters."))
    filename = clean_filename(text(meta, "filename", "name") or "")
    guest_name = owner.guest_name
    if owner.uploaded_by == "guest":
        guest_name = clean_guest_name(text(meta, "guest_name")) or owner.guest_name
    now = svc.clock()
    outstanding = await svc.db.read(tus_q.outstanding_bytes, owner.uploaded_by, client_ip, now)
    await trio.to_thread.run_sync(svc.storage.ensure_space, length + outstanding, limiter=io_limiter())
    tus_id = secrets.token_hex(16)
    path = partial_path(svc.storage, tus_id)
    local = not svc.settings.tus_in_bucket  # in the bucket, the pieces come with the bytes
    if local:
        await trio.to_thread.run_sync(_create_file, path, limiter=io_limiter())
    try:
        return await svc.db.write(
            _create_row, authorize, owner, limits, tus_id, group_key, length, metadata or "", filename, guest_name,
            client_ip, svc.settings, now, idle_expiry(svc, now, now))
    except BaseException:
        if local:
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
        raise Conflict(_("You have %(unfinished)s unfinished uploads in this gallery, the most allowed at once; finish "
                         "or cancel some of them first.") % {"unfinished": unfinished})
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
                _("There are %(count)s unfinished uploads from your network, the most allowed at once; finish or "
                  "cancel some of them, or wait a little and retry.") % {"count": count}))
        if announced + length > settings.tus_unfinished_mb_per_client * MB:
            raise TooManyRequests(RESERVATION_RETRY_SECONDS, (
                _("Unfinished uploads from your network already hold %(held)s MB of the "
                  "%(tus_unfinished_mb_per_client)s MB allowed at once; finish some first, or wait a little and retry.")
                % {"held": announced // MB, "tus_unfinished_mb_per_client": settings.tus_unfinished_mb_per_client}))
    in_gallery = tus_q.guest_unfinished_bytes_in_gallery(conn, gallery_id, now)
    if in_gallery + length > settings.tus_unfinished_mb_per_gallery * MB:
        raise TooManyRequests(RESERVATION_RETRY_SECONDS, (
            _("Guests' unfinished uploads to this gallery already hold %(held)s MB of the "
              "%(tus_unfinished_mb_per_gallery)s MB allowed at once; please wait a little and retry.")
            % {"held": in_gallery // MB, "tus_unfinished_mb_per_gallery": settings.tus_unfinished_mb_per_gallery}))


# --- looking an upload up ------------------------------------------------------------------------------------

async def find(svc: Services, tus_id: str, gallery_id: int, owner: Owner) -> Row:
    """The upload, if it is this owner's in this gallery: otherwise 404, whether or not it exists (an id is
    never confirmed to someone else). 410 once it has expired."""
    if len(tus_id) != 32 or any(c not in "0123456789abcdef" for c in tus_id):
        raise NotFound(_("There is no such upload."))
    row = await svc.db.read(tus_q.get, tus_id)
    if row is None or row["gallery_id"] != gallery_id or not owner.owns(row):
        raise NotFound(_("There is no such upload."))
    unfinished = row["state"] == tus_q.RECEIVING and not is_finishing(row)  # a complete one never expires
    if row["state"] == tus_q.EXPIRED or (unfinished and row["expires_at"] < svc.clock()):
        raise Gone(_("This upload has expired; please send the file again."))
    return row


# --- writing a chunk -----------------------------------------------------------------------------------------

@dataclass(eq=False)
class _Writer:
    scope: trio.CancelScope
    done: trio.Event


async def _take_over(svc: Services, tus_id: str) -> _Writer:
    """Become the one request of this process writing this upload: an older one still at it is cancelled and
    waited for (it records what it had and lets its writer lease go)."""
    writers, key = _WRITERS.get(), (svc.instance, tus_id)
    while (old := writers.get(key)) is not None:
        old.scope.cancel()
        await old.done.wait()
    writer = _Writer(trio.CancelScope(), trio.Event())
    writers[key] = writer
    return writer


def _release(svc: Services, tus_id: str, writer: _Writer) -> None:
    writers, key = _WRITERS.get(), (svc.instance, tus_id)
    if writers.get(key) is writer:
        del writers[key]
    writer.done.set()


class WriterBusy(AppError):
    """423: a request in another process is writing this upload now (its writer lease is live). Not a 409: the
    offset is moving; tus clients (tus-js-client, ``static/upload-queue.js``) retry a 423 after Retry-After."""

    status = 423
    title = "Locked"

    def __init__(self, retry_after: float) -> None:
        super().__init__(_("Another request is sending this upload right now; ask for its offset again in a moment."))
        self.retry_after = max(1, int(retry_after + 0.999))

    def headers(self) -> dict[str, str]:
        return {"Retry-After": str(self.retry_after)}


class TakenOver(Conflict):
    """409: this request no longer holds the upload (a newer request took over, in this process or, after its
    lease ran out, in another); what it wrote after that was not recorded."""

    def __init__(self) -> None:
        super().__init__(_("A newer request for this upload took over; ask for its offset again."))


class _WriterLease:
    """This request's writer lease on the upload's row. Renewed while bytes flow, at most once every
    :data:`WRITER_RENEW_SECONDS` (one database write, never one per piece); bytes go to the file only while the
    lease is surely still this request's: before :attr:`deadline`, which a renewal moves on. The checks are on
    the event loop just before each write's thread hop (a worker thread has no trio clock)."""

    def __init__(self, svc: Services, row: Row, token: str, taken_at: float) -> None:
        self.svc = svc
        self.row = row
        self.token = token
        self.renewed_at = taken_at
        self.lost = False

    @property
    def deadline(self) -> float:
        return self.renewed_at + WRITER_LEASE_SECONDS - WRITER_MARGIN_SECONDS

    async def keep(self) -> bool:
        """Renewed when due; False once the lease is no longer this request's (taken over, or the upload ended)."""
        if self.lost:
            return False
        now = self.svc.clock()
        if now - self.renewed_at < WRITER_RENEW_SECONDS:
            return True
        if await self.svc.db.write(tus_q.renew_writer, self.row["id"], self.token, now + WRITER_LEASE_SECONDS,
                                   idle_expiry(self.svc, self.row["created_at"], now)):
            self.renewed_at = now
        else:
            self.lost = True
        return not self.lost

    async def ensure(self) -> None:
        """Before bytes go to the file: the lease is this request's until past the write; TakenOver if not."""
        while True:
            if not await self.keep():
                raise TakenOver()
            if self.svc.clock() < self.deadline:
                return  # else the renewal itself was slow: renewed again (due by now) before writing


async def _take_lease(svc: Services, tus_id: str, offset: int) -> _WriterLease:
    """The writer lease for a chunk at ``offset``, or why not: 404 (gone), 409 (another offset; the real one is
    told), 423 (a request in another process is writing it now)."""
    token = secrets.token_hex(16)
    now = svc.clock()
    row = await svc.db.write(tus_q.claim_writer, tus_id, offset, svc.instance, token, now,
                             now + WRITER_LEASE_SECONDS)
    if row is not None:
        return _WriterLease(svc, row, token, now)
    current = await svc.db.read(tus_q.get, tus_id)
    if current is None or current["state"] == tus_q.EXPIRED:
        raise NotFound(_("There is no such upload."))
    if current["state"] != tus_q.RECEIVING:
        raise OffsetMismatch(current["upload_offset"])
    if current["writer_token"] is not None and current["writer_until"] >= now:
        if holder_is_gone(current["writer_id"]):  # this machine's server was killed mid-chunk and started again
            row = await svc.db.write(tus_q.claim_writer, tus_id, offset, svc.instance, token, now,
                                     now + WRITER_LEASE_SECONDS, current["writer_id"])
            if row is not None:
                return _WriterLease(svc, row, token, now)
        raise WriterBusy(current["writer_until"] - now)
    if current["upload_offset"] != offset or is_finishing(current):
        raise OffsetMismatch(current["upload_offset"])
    raise WriterBusy(1)  # its lease was let go just now: ask again


def limits_of(svc: Services, row: Row) -> Limits:
    return Limits.admin(svc.settings) if row["uploaded_by"] == "admin" else Limits.guest(svc.settings)


async def check_kind(svc: Services, row: Row, before: int, after: int) -> None:
    """Once the first bytes have arrived (the chunk that took the offset from ``before`` to ``after``): an
    upload announced larger than the photo limit must be a video (its container by the bytes, as the intake
    tells), or it is refused now (413, the multipart sentence) and ends, its bytes gone."""
    limits = limits_of(svc, row)
    length = row["upload_length"]
    if length <= limits.max_file_bytes or before >= HEADER_BYTES or after < min(HEADER_BYTES, length):
        return
    if svc.settings.tus_in_bucket:
        head = await trio.to_thread.run_sync(tuspieces.head_bytes, svc.storage, row["id"], after, HEADER_BYTES,
                                             limiter=io_limiter())
        kind = video.sniff_container(head)
    else:
        kind = await trio.to_thread.run_sync(video_intake.container_of, partial_path(svc.storage, row["id"]),
                                             limiter=io_limiter())
    if kind is None:
        message = f"The file is larger than the limit of {limits.max_file_bytes // MB} MB."
        current = await svc.db.read(tus_q.get, row["id"])
        if current is not None:
            await _refuse(svc, current, message, 413)
        raise TooLarge(message)


async def write_chunk(svc: Services, row: Row, offset: int, body: AsyncIterable[bytes], *,
                      content_length: int | None, checksum: tuple[str, bytes] | None) -> int:
    """Append one request's bytes at ``offset``; returns the new durable offset. Answers only once it is
    fsynced and recorded."""
    tus_id = row["id"]
    remaining = row["upload_length"] - offset
    if content_length is not None and content_length > remaining:
        raise TooLarge(_("This chunk goes past the upload's Upload-Length; nothing of it was kept."))
    writer = await _take_over(svc, tus_id)
    try:
        lease = await _take_lease(svc, tus_id, offset)
        current = lease.row
        chunk: _Chunk | _BucketChunk
        if svc.settings.tus_in_bucket:
            chunk = _BucketChunk(svc, tus_id, offset, remaining, checksum, lease)
        else:
            chunk = _Chunk(svc, partial_path(svc.storage, tus_id), offset, remaining, checksum, lease)
        outcome = None
        try:
            try:
                with writer.scope:
                    await chunk.receive(body)
                if writer.scope.cancelled_caught:
                    raise TakenOver()
            finally:
                with trio.CancelScope(shield=True):
                    new_offset = await chunk.settle()
                    outcome = await svc.db.write(_record_offset, tus_id, lease.token, current["upload_id"], offset,
                                                 new_offset, idle_expiry(svc, current["created_at"], svc.clock()))
                    if outcome == RECORDED and new_offset == current["upload_length"]:
                        # Every byte is durable: the photo is the server's to make now, also when this request
                        # ends before it asks (the client went after its last byte, a newer request took over).
                        svc.finisher_bell.ring()
                    if chunk.mismatch and outcome == RECORDED:
                        raise ChecksumMismatch(_("The chunk does not match its Upload-Checksum; it was not kept."))
                    if chunk.error is not None and outcome == RECORDED:
                        raise chunk.error  # the bucket failed at the end: what was stored before it is recorded
        except TakenOver:
            if outcome == GONE:  # its lease went with the upload (deleted in another process, say): told as such
                raise NotFound(_("There is no such upload.")) from None
            raise
        if outcome == GONE:  # the upload ended meanwhile (expired, deleted): its bytes are not kept
            raise NotFound(_("There is no such upload."))
        if outcome == TAKEN:  # its lease ran out and another request has the upload now: nothing recorded
            raise TakenOver()
        assert new_offset is not None
        return new_offset
    finally:
        _release(svc, tus_id, writer)


class OffsetMismatch(Conflict):
    """409: the request's ``Upload-Offset`` is not where the upload is (the answer says where it is)."""

    def __init__(self, offset: int) -> None:
        super().__init__(f"Upload-Offset does not match: this upload is at {offset} bytes.")
        self.offset = offset

    def headers(self) -> dict[str, str]:
        return {"Upload-Offset": str(self.offset)}


RECORDED, GONE, TAKEN = "recorded", "gone", "taken"


def _record_offset(conn: Connection, tus_id: str, token: str, upload_id: str | None, start: int,
                   offset: int | None, expires_at: float) -> str:
    """The request ends: its new offset recorded (if it added bytes) and its lease let go, both only while the
    lease is its own. RECORDED; GONE when the upload ended meanwhile (expired, deleted); TAKEN when another
    request holds it now (``offset`` None: this request knows it lost the lease and wrote no further)."""
    if offset == start:
        if tus_q.release_writer(conn, tus_id, token):
            return RECORDED
    elif offset is not None and tus_q.set_offset(conn, tus_id, token, offset, expires_at):
        if upload_id is not None:
            tus_q.extend_group(conn, upload_id, expires_at)
        return RECORDED
    row = tus_q.get(conn, tus_id)
    return TAKEN if row is not None and row["state"] == tus_q.RECEIVING else GONE


class _Receiving:
    """What both kinds of chunk share: the request's bytes counted against ``Upload-Length`` as they come, gathered
    into batches of :data:`WRITE_BATCH`, under the writer lease, and ``Upload-Checksum`` checked at the end."""

    def __init__(self, svc: Services, offset: int, remaining: int, checksum: tuple[str, bytes] | None,
                 lease: _WriterLease) -> None:
        self.storage = svc.storage
        self.lease = lease
        self.start = offset
        self.remaining = remaining
        self.checksum = checksum
        self.hasher = CHECKSUMS[checksum[0]]() if checksum else None
        self.received = 0
        self.complete = False  # the body was read to its end and is within Upload-Length
        self.mismatch = False
        self.file: BinaryIO | None = None
        self.pending = bytearray()
        self.error: AppError | None = None  # (the bucket's chunk only)

    async def receive(self, body: AsyncIterable[bytes]) -> None:
        await self.lease.ensure()
        await self._begin()
        async for data in body:
            if not await self.lease.keep():  # renewed while bytes flow (a clock check, a write when due)
                raise TakenOver()
            self.received += len(data)
            if self.received > self.remaining:
                raise TooLarge(_("This chunk goes past the upload's Upload-Length; nothing of it was kept."))
            self.pending += data
            if len(self.pending) >= WRITE_BATCH:
                await self._batch()
        self.complete = True

    async def _begin(self) -> None:
        """Before the first byte (under the lease)."""

    async def _batch(self) -> None:
        """:attr:`pending` holds a whole batch."""
        raise NotImplementedError

    def _checksum_differs(self) -> bool:
        """The whole body arrived with an ``Upload-Checksum`` that its bytes do not match."""
        if not self.complete or self.checksum is None:
            return False
        assert self.hasher is not None
        return self.hasher.digest() != self.checksum[1]


class _Chunk(_Receiving):
    """One request's bytes on their way to the end of the partial file."""

    def __init__(self, svc: Services, path: Path, offset: int, remaining: int,
                 checksum: tuple[str, bytes] | None, lease: _WriterLease) -> None:
        super().__init__(svc, offset, remaining, checksum, lease)
        self.path = path
        self.written = 0

    async def _begin(self) -> None:
        self.file = await trio.to_thread.run_sync(_open_at, self.path, self.start, limiter=io_limiter())

    async def _batch(self) -> None:
        await self._flush()

    async def _flush(self) -> None:
        data, self.pending = self.pending, bytearray()
        if data and self.file is not None:
            await self.lease.ensure()
            await trio.to_thread.run_sync(_append, self.storage, self.file, self.hasher, data, limiter=io_limiter())
            self.written += len(data)

    async def settle(self) -> int | None:
        """Shielded, on every way out: keep what may be kept, fsynced; returns the offset to record, or None when
        the lease is no longer this request's (the file is then left as it is: its next writer cuts it back to
        the recorded offset). A mismatch is :attr:`mismatch` (raised by the caller once the lease is let go)."""
        keep = self.complete or self.checksum is None
        too_long = self.received > self.remaining
        if keep and not too_long:
            try:
                await self._flush()
            except TakenOver:
                pass
            except Exception as error:  # a full disk: what was written before it still counts
                log.warning("tus %s: could not write the end of a chunk (%s)", self.path.name, error)
        if keep and not too_long and self._checksum_differs():
            keep = False
            self.mismatch = True
        end = self.start + self.written if keep and not too_long else self.start
        file, self.file = self.file, None
        try:
            await self.lease.ensure()  # cutting the file back is a write too
        except TakenOver:
            await trio.to_thread.run_sync(_close_quietly, file, limiter=io_limiter())
            return None
        except BaseException:  # the database is down: the file is closed untouched, and the error goes on
            await trio.to_thread.run_sync(_close_quietly, file, limiter=io_limiter())
            raise
        await trio.to_thread.run_sync(_close_at, file, self.path, end, limiter=io_limiter())
        return end


def _open_at(path: Path, offset: int) -> BinaryIO:
    try:
        f = open(path, "r+b")  # noqa: SIM115  # held across the chunk's thread hops, closed by _close_at
    except FileNotFoundError:
        raise NotFound(_(LOST)) from None
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


def _close_quietly(f: BinaryIO | None) -> None:
    """A writer that lost its lease closes its file without touching it."""
    if f is not None:
        with contextlib.suppress(OSError):
            f.close()


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


class _BucketChunk(_Receiving):
    """One request's bytes on their way to the bucket (``tus_bytes``: bucket; ``pipeline/tuspieces.py``).

    Received as in local mode, into local temp files (so that ``Upload-Checksum`` and the disk reserve work as
    before), one per piece of at most :data:`tuspieces.PIECE_BYTES`; each full piece is PUT as its own object
    at once (with ``Upload-Checksum``: only once the whole request matched it, so a corrupt piece never reaches
    the bucket), under the writer lease, and a byte counts only once its piece is stored. The pieces are PUT in
    order and the first failure stops the rest, so what is recorded is always one run from the start offset."""

    def __init__(self, svc: Services, tus_id: str, offset: int, remaining: int,
                 checksum: tuple[str, bytes] | None, lease: _WriterLease) -> None:
        super().__init__(svc, offset, remaining, checksum, lease)
        self.tus_id = tus_id
        self.durable = 0  # bytes from the start offset whose pieces are stored
        self.failed = False  # a PUT failed: no later piece is PUT (it would leave a gap)
        self.file_path: Path | None = None
        self.file_bytes = 0
        self.full: list[tuple[Path, int]] = []  # closed pieces waiting for their PUT, in order

    async def _batch(self) -> None:
        await self._flush(put=self.checksum is None)

    async def _flush(self, *, put: bool) -> None:
        data, self.pending = self.pending, bytearray()
        view = memoryview(data)
        while view:
            room = tuspieces.PIECE_BYTES - self.file_bytes
            part, view = view[:room], view[room:]
            await trio.to_thread.run_sync(self._write, part, limiter=io_limiter())
            if self.file_bytes == tuspieces.PIECE_BYTES:
                await trio.to_thread.run_sync(self._close_piece, limiter=io_limiter())
                if put:
                    await self._put_full()

    def _write(self, data: memoryview) -> None:
        with disk_errors():
            self.storage.ensure_space(len(data))
            if self.file is None:
                self.file_path = self.storage.new_temp_path()
                self.file_path.parent.mkdir(parents=True, exist_ok=True)
                self.file = open(self.file_path, "xb")  # noqa: SIM115  # held across hops, closed by _close_piece
            if self.hasher is not None:
                self.hasher.update(data)
            self.file.write(data)
            self.file_bytes += len(data)

    def _close_piece(self) -> None:
        """The piece being written is complete: closed, and queued for its PUT (the bucket is what is durable)."""
        file, self.file = self.file, None
        if file is not None:
            file.close()
            assert self.file_path is not None
            self.full.append((self.file_path, self.file_bytes))
        self.file_path, self.file_bytes = None, 0

    async def _put_full(self) -> None:
        while self.full and not self.failed:
            path, size = self.full[0]
            at = self.start + self.durable
            await self.lease.ensure()  # a PUT is a write: only under the lease
            try:
                await trio.to_thread.run_sync(self.storage.put_file, path, tuspieces.piece_name(self.tus_id, at,
                                                                                                 at + size),
                                              limiter=io_limiter())
            except BaseException:
                self.failed = True
                raise
            self.full.pop(0)
            self.durable += size

    async def settle(self) -> int | None:
        """Shielded, on every way out: store what may be kept (the rest of the body as a last piece); returns the
        offset to record, or None when the lease is no longer this request's. A bucket failure here is
        :attr:`error` (the caller records what was stored before it, then raises it)."""
        keep = (self.complete or self.checksum is None) and self.received <= self.remaining
        try:
            if keep and not self.failed:
                await self._flush(put=False)
                await trio.to_thread.run_sync(self._close_piece, limiter=io_limiter())
                if self._checksum_differs():
                    keep = False
                    self.mismatch = True
                if keep:
                    await self._put_full()
        except TakenOver:
            pass
        except AppError as error:  # the bucket down (503), the disk full (507): what was stored still counts
            log.warning("tus %s: could not store the end of a chunk (%s)", self.tus_id, error.message)
            self.error = error
        except Exception as error:
            log.warning("tus %s: could not store the end of a chunk (%s)", self.tus_id, error)
            self.error = StorageUnavailable(retry_after=10)
        finally:
            await trio.to_thread.run_sync(self._discard, limiter=io_limiter())
        if self.lease.lost:
            return None
        # A body past Upload-Length keeps nothing (as in local mode): the pieces it stored lie past the offset.
        return self.start + self.durable if self.received <= self.remaining else self.start

    def _discard(self) -> None:
        """The local temp files of pieces not stored (a failure, a mismatch, a lost lease) go."""
        if self.file is not None:
            _close_quietly(self.file)
            self.file = None
        for path in [p for p, _size in self.full] + ([self.file_path] if self.file_path else []):
            remove_quietly(path)
        self.full, self.file_path, self.file_bytes = [], None, 0


# --- finishing -----------------------------------------------------------------------------------------------
#
# Once every byte is durable the upload is complete, and making its photo is the server's job: the row stays
# 'receiving' with ``upload_offset = upload_length`` (it never expires) until the photo exists (done, with its
# photo) or the file is refused (done, with ``error``). The request that delivered the last byte tries at once
# and answers 204 only when the photo exists; a failure that may pass (the bucket, the disk, a crash) is
# recorded and tried again by :class:`Finisher` with a doubling delay, at most ``tus_finish_attempts`` times,
# and meanwhile HEAD answers 423 (never an offset that says "done"). The tus file is handed to the intake as a
# hard link, so that it stays where it is until the photo's row is committed: a failed try loses no byte.
# A try runs under a claim in the row (finish_token, finish_until), whichever process runs it; within a process
# a lock also makes a second caller wait for the running try instead of polling the row.

FINISH_FIRST_DELAY = 5.0  # seconds before the second try; doubled for each further one
FINISH_MAX_DELAY = 600.0
REFUSED: dict[int, type[AppError]] = {**REFUSALS, 403: Forbidden, 404: NotFound, 410: Gone}

_FINISHING: PerRun[dict[tuple[str, str], trio.Lock]] = PerRun("picpeak_tus_finishing", dict)
FINISH_LEASE_SECONDS = 30.0  # a try's claim: this long, plus its file's bytes at FINISH_MIN_RATE (finish_deadline)
FINISH_MIN_RATE = 2 * MB  # bytes a second: slower than any disk, and than a bucket a server should use
FINISH_POLL_SECONDS = 0.5  # how often a request waiting for another process's try looks at the row


class NotFinishedYet(AppError):
    """Every byte arrived but the photo is not made yet (a try failed, or is due later): ask again then. 503 to
    the PATCH that delivered the last byte (tus clients retry it); HEAD says 423 (see ``web/views/tus.py``)."""

    status = 503
    title = "The photo is not made yet"

    def __init__(self, message: str, retry_after: float) -> None:
        super().__init__(message)
        self.retry_after = max(1, int(retry_after + 0.999))

    def headers(self) -> dict[str, str]:
        return {"Retry-After": str(self.retry_after)}


def is_finishing(row: Row) -> bool:
    """Complete (every byte durable) and waiting for its photo."""
    return row["state"] == tus_q.RECEIVING and row["upload_offset"] == row["upload_length"]


def finish_delay(attempts: int) -> float:
    """The wait after ``attempts`` failed tries: 5 s, doubling, at most 10 minutes."""
    return min(FINISH_FIRST_DELAY * 2 ** max(0, attempts - 1), FINISH_MAX_DELAY)


def pending_error(svc: Services, row: Row) -> NotFinishedYet:
    """What a client is told while the photo of a complete upload is not made yet."""
    wait = max(0.0, (row["finish_after"] or 0.0) - svc.clock())
    return NotFinishedYet(_("Every byte of this file arrived; the server is still storing it as a photo. "
                          "Ask again in a moment."), wait or 1.0)


def refusal(row: Row) -> AppError:
    """A done upload without a photo: its refusal, as the PATCH that ended it was told."""
    return REFUSED.get(row["error_status"], BadRequest)(row["error"])


async def finished(svc: Services, row: Row) -> Finished:
    """What a done row says: its photo, and the group when that group has a photo to follow; a refused one
    raises its refusal."""
    if row["error"] is not None:
        raise refusal(row)
    upload_id = row["upload_id"]
    if upload_id is not None and (await svc.db.read(photo_q.upload_counts, upload_id))["total"] == 0:
        upload_id = None
    return Finished(row["photo_id"], upload_id, bool(row["duplicate"]), row["upload_length"])


async def complete(svc: Services, tus_id: str, *, wait: bool = True) -> Finished:
    """Make the photo of a complete upload now (or learn what became of it): its Finished, or the refusal (a
    4xx that is final), or :class:`NotFinishedYet` when the try failed for a reason that may pass (recorded,
    and tried again by the :class:`Finisher`). One try at a time per upload, in any process: a later caller
    waits for the running one (``wait=False``: is told :class:`NotFinishedYet` when it runs in another process)."""
    settled = False
    try:
        async with _finishing(svc, tus_id):
            waited = False
            while True:
                row = await svc.db.read(tus_q.get, tus_id)
                if row is None:
                    raise NotFound(_("There is no such upload."))
                if row["state"] == tus_q.DONE:
                    settled = True
                    return await finished(svc, row)
                if not is_finishing(row):
                    raise OffsetMismatch(row["upload_offset"])
                if waited and row["finish_after"] is not None and row["finish_after"] > svc.clock():
                    raise pending_error(svc, row)  # the try waited for failed: the next is due later
                if not being_finished(svc, row):
                    result = await _claimed_try(svc, tus_id, row["upload_length"])
                    if result is not None:
                        settled = True
                        return result
                # Another process's try holds the claim (or took it just before this one): its outcome is ours.
                if not wait:
                    raise pending_error(svc, row)
                await trio.sleep(FINISH_POLL_SECONDS)
                waited = True
    except AppError as error:
        settled = settled or error.status < 500
        raise
    finally:
        if not settled:
            svc.finisher_bell.ring()  # cut off or failed: the Finisher goes on (and learns the next due time)


def finish_deadline(length: int, now: float) -> float:
    """Until when a try at the photo of a file of ``length`` bytes holds its claim: long enough for the slowest
    storage a server should have (the file is hashed, checked and stored: FINISH_MIN_RATE), short enough that
    the try of a process that died is taken over soon (a 20 MB photo: 40 s)."""
    return now + FINISH_LEASE_SECONDS + length / FINISH_MIN_RATE


async def _claimed_try(svc: Services, tus_id: str, length: int) -> Finished | None:
    """One try under a claim in the row; None when another process's try claimed it first.

    The claim is not renewed (a renewing task's timer would also be what a test's autojump clock jumps to while
    the try waits for its threads): its deadline is sized to the file. A try that outlives it may meet a second
    one, which still makes no second photo: a gallery holds a content once (UNIQUE (gallery_id, sha256)), the
    second finds it as its own photo, and the row is marked done once (its state guards every mark)."""
    token = secrets.token_hex(16)
    now = svc.clock()
    row = await svc.db.write(tus_q.claim_finish, tus_id, token, now, finish_deadline(length, now))
    if row is None:
        return None
    try:
        return await _try_finish(svc, row)
    finally:
        with trio.CancelScope(shield=True):
            await svc.db.write(tus_q.release_finish, tus_id, token)


def being_finished(svc: Services, row: Row) -> bool:
    """A try at making this upload's photo holds a live claim now, in this process or another."""
    return (row["state"] == tus_q.RECEIVING and row["finish_token"] is not None
            and row["finish_until"] >= svc.clock())


async def wait_for_try(svc: Services, tus_id: str) -> None:
    """Until no try at this upload's photo holds a live claim (one in this process is waited for at once, one in
    another by looking at the row); the caller bounds the wait."""
    lock = _FINISHING.get().get((svc.instance, tus_id))
    if lock is not None and lock.locked():
        async with _finishing(svc, tus_id):
            pass
    while True:  # a try in another process: only its row tells when it has ended
        row = await svc.db.read(tus_q.get, tus_id)
        if row is None or not being_finished(svc, row):
            return
        await trio.sleep(FINISH_POLL_SECONDS)


@contextlib.asynccontextmanager
async def _finishing(svc: Services, tus_id: str) -> AsyncIterator[None]:
    """One try at a time per upload in this process (the request's, a HEAD's, the Finisher's; a DELETE waits
    for it too); across processes the claim in the row decides."""
    locks, key = _FINISHING.get(), (svc.instance, tus_id)
    lock = locks.setdefault(key, trio.Lock())
    try:
        async with lock:
            yield
    finally:
        if lock.statistics().tasks_waiting == 0 and not lock.locked() and locks.get(key) is lock:
            del locks[key]


async def _try_finish(svc: Services, row: Row) -> Finished:
    tus_id = row["id"]
    path = partial_path(svc.storage, tus_id)
    try:
        entry, upload_id = await _adopt(svc, row, path)
    except tuspieces.Lost as error:  # the bucket's pieces do not cover the recorded bytes: gone
        log.error("tus %s: %s", tus_id, error)
        await _refuse(svc, row, LOST, 410)
        raise Gone(_(LOST)) from None
    except FileNotFoundError as error:
        if svc.settings.tus_in_bucket or await trio.to_thread.run_sync(path.exists, limiter=io_limiter()):
            # The tus file is whole: something on the way went missing (a bucket's object, a temp file), which
            # another try may not meet; only the tus file's own loss makes the bytes gone.
            raise await _failed_try(svc, row, error.strerror or str(error)) from error
        await _refuse(svc, row, LOST, 410)
        raise Gone(_(LOST)) from None
    except AppError as error:
        if error.status >= 500:  # its title: its message speaks of a request ("nothing was saved")
            raise await _failed_try(svc, row, error.title) from error
        await _refuse(svc, row, error.message, error.status)
        raise
    except Exception as error:  # a full disk, a bucket error: the bytes are still here, tried again later
        reason = error.strerror if isinstance(error, OSError) and error.strerror else str(error) or type(error).__name__
        raise await _failed_try(svc, row, reason) from error
    if entry.error is not None:
        await _refuse(svc, row, entry.error, entry.status or 400)
        raise REFUSALS.get(entry.status or 400, BadRequest)(entry.error, errors=[entry.to_json()])
    if entry.duplicate and row["upload_id"] is not None:
        # Its own photo, made by a try that a crash cut off before the row was marked: not a duplicate.
        photo = await svc.db.read(photo_q.get, entry.photo_id)
        entry.duplicate = photo is None or photo["upload_id"] != row["upload_id"]
    if not entry.duplicate:
        svc.workers_bell.ring()
    await _end(svc, tus_id, entry)
    await remove_bytes(svc, tus_id)
    done = await svc.db.read(tus_q.get, tus_id)
    upload_id = upload_id if done is None else done["upload_id"]
    if upload_id is not None and (await svc.db.read(photo_q.upload_counts, upload_id))["total"] == 0:
        upload_id = None
    return Finished(entry.photo_id, upload_id, entry.duplicate, row["upload_length"])


async def _adopt(svc: Services, row: Row, path: Path) -> tuple[Any, str | None]:
    """The file through the intake as the photo of the row's group, from a hard link to the tus file (which
    stays until the photo's row is committed). Raises when a step fails; a refusal is the entry's error. In the
    bucket (``tus_bytes``), from a local temp file the recorded range of its pieces is read into, in order; the
    pieces stay until the photo's row is committed too."""
    link = svc.storage.new_temp_path()
    if svc.settings.tus_in_bucket:
        size = row["upload_length"]
        sha256 = await trio.to_thread.run_sync(tuspieces.assemble, svc.storage, row["id"], size, link,
                                               limiter=io_limiter())
    else:
        sha256, size = await trio.to_thread.run_sync(_hash_file, path, row["upload_length"], limiter=io_limiter())
        await trio.to_thread.run_sync(_link, path, link, limiter=io_limiter())
    try:
        limits = limits_of(svc, row)
        authorize = functools.partial(upload_gallery, row=row, clock=svc.clock)
        gallery = await svc.db.read(authorize)
        intake = Intake(db=svc.db, storage=svc.storage, settings=svc.settings, gallery=gallery, limits=limits,
                        clock=svc.clock)
        intake.upload_id = row["upload_id"]
        with intake:
            sink = intake.adopt_file(row["filename"], link, size, sha256)
            entry = await intake.finish_file(sink)
            assert entry is not None
            await intake.commit(authorize, uploaded_by=row["uploaded_by"], guest_session_id=row["guest_session_id"],
                                guest_name=row["guest_name"])
        return entry, intake.upload_id
    finally:
        remove_quietly(link)  # gone already when it was stored; a failed or refused try leaves no temp file


def upload_gallery(conn: Connection, *, row: Row, clock: Any) -> Row:
    """Who may add this upload's photo, asked again when it is made (perhaps long after its last request): the
    admin while the gallery exists; a guest while the gallery is open to this guest session and takes guests'
    photos (``web/views/common.py`` asks the same at the request)."""
    gallery = gallery_q.get(conn, row["gallery_id"])
    if gallery is None:
        raise NotFound(_("The gallery was removed while the photos were uploading."))
    if row["uploaded_by"] == "guest":
        gallery = access.guest_gallery(conn, gallery["slug"], row["guest_session_id"], clock())
        if not gallery["allow_guest_uploads"]:
            raise Forbidden(_("This gallery does not accept photos from guests."))
    return gallery


def _link(path: Path, link: Path) -> None:
    with disk_errors():
        link.parent.mkdir(parents=True, exist_ok=True)
        try:
            os.link(path, link)
            # The link shares the tus file's inode and so its time of the last chunk, perhaps hours ago: the
            # temp sweep and the orphan reconciler judge files by that time, and must see a file made now.
            os.utime(link)
        except OSError:  # another file system, or none that links: a copy
            shutil.copyfile(path, link)


async def _failed_try(svc: Services, row: Row, reason: str) -> AppError:
    """Record a try that failed for a reason that may pass; the error to raise: when to ask again, or, after
    ``tus_finish_attempts`` tries, the final refusal (410, the bytes go)."""
    attempts = row["finish_attempts"] + 1
    reason = reason[:200]
    if attempts >= svc.settings.tus_finish_attempts:
        message = (f"The server could not store this file after {attempts} tries (last: {reason}); "
                   "please send it again.")
        log.error("tus %s: gave up making its photo after %d tries: %s", row["id"], attempts, reason)
        await _refuse(svc, row, message, 410)
        return Gone(message)
    delay = finish_delay(attempts)
    now = svc.clock()
    await svc.db.write(_record_failure, row["id"], row["upload_id"], attempts, now + delay,
                       now + delay + svc.settings.tus_idle_minutes * 60.0)
    log.warning("tus %s: could not make its photo (try %d, %s); trying again in %.0f s", row["id"], attempts,
                reason, delay)
    return NotFinishedYet(_("Every byte of this file arrived, but the server could not store it yet (%(reason)s); it "
                            "tries again by itself in %(delay)s s.")
                          % {"reason": reason, "delay": format(delay, '.0f')}, delay)


def _record_failure(conn: Connection, tus_id: str, upload_id: str | None, attempts: int, finish_after: float,
                    group_until: float) -> None:
    tus_q.record_finish_failure(conn, tus_id, attempts, finish_after)
    if upload_id is not None:
        tus_q.extend_group(conn, upload_id, group_until)  # the batch waits for its file, not abandoned meanwhile


async def _refuse(svc: Services, row: Row, error: str, status: int) -> None:
    """The file will never be a photo: the row says why (kept as long as a finished one), its bytes go."""
    keep_until = svc.clock() + expiry_seconds(svc)
    completed = await svc.db.write(_refuse_row, svc.settings.webhooks, row["id"], error, status, keep_until,
                                   svc.clock())
    await remove_bytes(svc, row["id"])
    if completed:
        svc.webhooks_bell.ring()


def _refuse_row(conn: Connection, endpoints: tuple[WebhookEndpoint, ...], tus_id: str, error: str, status: int,
                keep_until: float, now: float) -> bool:
    row = tus_q.get(conn, tus_id)
    if row is None or not tus_q.mark_refused(conn, tus_id, error, status, keep_until):
        return False
    return close_group_if_last(conn, endpoints, row["upload_id"], now)


FINISHER_LOOK_SECONDS = 60.0


class Finisher:
    """Makes the photos of complete uploads whose first try failed or never ran (a crash between the last byte
    and the photo, the bucket down, a full disk): at start-up, whenever ``finisher_bell`` rings, and when the
    next try is due. As the webhook sender's outbox: the rows are the queue, the attempts bounded. Safe in
    every process at once: each try is claimed in its row (:func:`complete`)."""

    def __init__(self, svc: Services) -> None:
        self.svc = svc

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        svc = self.svc
        wake = svc.finisher_bell.listen()
        await self.finish_due()  # what a crash left complete is tried before the server says it is ready
        task_status.started()
        while True:
            next_at = await svc.db.read(tus_q.next_finish_at)
            # The bell is how it hears of new work; the look every FINISHER_LOOK_SECONDS is the backstop for a
            # complete upload whose ring was lost (a process that died between its last byte and the ring).
            wait = FINISHER_LOOK_SECONDS if next_at is None else min(FINISHER_LOOK_SECONDS,
                                                                      max(1.0, next_at - svc.clock()))
            with trio.move_on_after(wait):
                await wake.wait()
            wake = svc.finisher_bell.listen()
            await self.finish_due()

    async def finish_due(self) -> int:
        """One pass over the uploads whose try is due; returns how many now have their photo or refusal."""
        svc = self.svc
        settled = 0
        for row in await svc.db.read(tus_q.finishing_due, svc.clock()):
            # Several hosts without a shared data directory, the bytes on local disks (tus_bytes): an upload's
            # bytes are on the host that received them, and only a process there may make its photo; elsewhere
            # the missing file would read as lost bytes. In the bucket, any host makes it.
            if not svc.settings.tus_in_bucket and not await trio.to_thread.run_sync(
                    partial_path(svc.storage, row["id"]).exists, limiter=io_limiter()):
                continue
            try:
                await complete(svc, row["id"], wait=False)  # one another process tries now is left to it
                settled += 1
            except NotFinishedYet:
                pass  # recorded and logged, tried again when due
            except AppError:
                settled += 1  # refused: the row says why
            except Exception as error:  # recorded as a failed try: not tried again at once, and bounded
                log.exception("tus %s: could not make its photo", row["id"])
                await _failed_try(svc, row, type(error).__name__)
        return settled


def _hash_file(path: Path, length: int) -> tuple[str, int]:
    digest = hashlib.sha256()
    with open(path, "r+b") as f:
        f.truncate(length)
        while block := f.read(MB):
            digest.update(block)
    return digest.hexdigest(), length


async def _end(svc: Services, tus_id: str, entry: Any) -> None:
    """The upload has ended, done with its photo (``entry``). Its group closes with its last file."""
    keep_until = svc.clock() + expiry_seconds(svc)
    completed = await svc.db.write(_end_row, svc.settings.webhooks, tus_id, entry, keep_until, svc.clock())
    if completed:
        svc.webhooks_bell.ring()


def _end_row(conn: Connection, endpoints: tuple[WebhookEndpoint, ...], tus_id: str, entry: Any,
             keep_until: float, now: float) -> bool:
    row = tus_q.get(conn, tus_id)
    if row is None:
        return False
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

async def remove_bytes(svc: Services, tus_id: str) -> None:
    """An upload ended: its bytes go, the local file or the bucket's pieces (``tus_bytes``). Pieces the bucket
    keeps now (it is down) are removed by a later expiry pass (:func:`tuspieces.sweep_orphans`)."""
    if not svc.settings.tus_in_bucket:
        await trio.to_thread.run_sync(remove_quietly, partial_path(svc.storage, tus_id), limiter=io_limiter())
        return
    try:
        await trio.to_thread.run_sync(tuspieces.remove_all, svc.storage, tus_id, limiter=io_limiter())
    except StorageUnavailable:
        log.warning("tus %s: the bucket is not reachable; its pieces are removed on a later pass", tus_id)


async def terminate(svc: Services, row: Row) -> None:
    """tus termination (DELETE): stop any request of this process still writing, forget the upload, remove its
    bytes. A request writing it in another process is fenced (the row is gone: it records nothing); a try at
    making its photo, in any process, ends first (then the photo stays)."""
    tus_id = row["id"]
    writer = await _take_over(svc, tus_id)
    try:
        async with _finishing(svc, tus_id):
            while True:
                with trio.CancelScope(shield=True):
                    ended, completed = await svc.db.write(_terminate_row, svc.settings.webhooks, tus_id,
                                                          svc.clock())
                    if ended:
                        await remove_bytes(svc, tus_id)
                        if completed:
                            svc.webhooks_bell.ring()
                if ended:
                    return
                await trio.sleep(FINISH_POLL_SECONDS)  # a try in another process holds its claim
    finally:
        _release(svc, tus_id, writer)


def _terminate_row(conn: Connection, endpoints: tuple[WebhookEndpoint, ...], tus_id: str,
                   now: float) -> tuple[bool, bool]:
    """(whether the upload is gone now, whether ``upload.completed`` was written); not gone while a try holds a
    live claim on it."""
    row = tus_q.delete_unless_finishing(conn, tus_id, now)
    if row is None:
        return tus_q.get(conn, tus_id) is None, False
    return True, close_group_if_last(conn, endpoints, row["upload_id"], now)


async def expire(svc: Services) -> int:
    """The janitor's pass, in any process: unfinished uploads past their expiry lose their bytes (tombstones
    answer 410 for another period) unless a request in any process is writing them (a live writer lease),
    finished rows and tombstones past theirs are forgotten, and files in ``tmp/tus`` that no unfinished upload
    owns (a crash between the file and its row, a deleted gallery) go. Returns how many uploads expired."""
    now = svc.clock()
    rows = await svc.db.write(_expire_rows, svc.settings.webhooks, now, now + expiry_seconds(svc))
    keep = await svc.db.read(tus_q.receiving_ids)
    await trio.to_thread.run_sync(_remove_partials, svc.storage, [r["id"] for r in rows], keep, now,
                                  limiter=io_limiter())
    if svc.settings.tus_in_bucket:
        try:
            for row in rows:
                await trio.to_thread.run_sync(tuspieces.remove_all, svc.storage, row["id"], limiter=io_limiter())
            # Pieces of uploads that ended while the bucket was down (their removal failed), in any process.
            await trio.to_thread.run_sync(tuspieces.sweep_orphans, svc.storage, keep, now, ORPHAN_GRACE_SECONDS,
                                          limiter=io_limiter())
        except StorageUnavailable:
            log.warning("tus: the bucket is not reachable; expired uploads' pieces are removed on a later pass")
    if rows:
        log.info("tus: %d unfinished uploads expired", len(rows))
        svc.webhooks_bell.ring()
    return len(rows)


def _expire_rows(conn: Connection, endpoints: tuple[WebhookEndpoint, ...], now: float,
                 tombstone_until: float) -> list[Row]:
    tus_q.forget_old(conn, now)
    rows = tus_q.expire_due(conn, now, tombstone_until)  # spares uploads a request is writing (a live lease)
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
