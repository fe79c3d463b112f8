"""The worker pool: N tasks that claim pending photos and turn each into derivatives and metadata.

A worker claims with one guarded statement, renews its lease while it works, and records the result only
if it still holds the claim (the token). Image work (decode, view, grid, watermark, encode, EXIF) runs in
an image child (``pipeline/imageprocs.py``): a process of its own, at a lower OS priority, so the web server
keeps its GIL and its core while photos are made. The steps have a deadline (``decode_deadline_seconds``): past
it the child is killed and the photo fails with :data:`TOO_SLOW`, so no file holds a worker longer. A bad file
fails that photo with a readable reason; a child that dies under a file fails that attempt (:class:`Crashed`),
and the photo is tried again until ``max_attempts``; the worker goes on. On shutdown a worker hands its photo
back to ``pending``.

How the work shares the cores: there are as many places on the image limiter (children at work) as
``workers``, and one worker task more than that. Reading the original and writing the two JPEGs are file or
bucket I/O, run in trio's own threads; the extra task claims the next photo and reads it while the others
decode, so a child that finishes a photo finds the next one ready instead of waiting for a claim, a read and a
write in turn.

When no photo waits, a worker makes the view and grid images of a photo again whose gallery's watermark changed
since it was made (``views_stale``, schema 6). The photo stays ``complete`` and visible; one process at a time makes
them, under the photo's ``views:<id>`` lease, and the mark is cleared only if no newer change marked it since the
settings were read (see :meth:`WorkerPool.refresh_stale_views`).
"""

from __future__ import annotations

import dataclasses
import enum
import logging
import os
import secrets
import socket
from typing import Any

import trio

from picpeak_lite.domain import admin_settings
from picpeak_lite.errors import DatabaseUnavailable, InsufficientStorage, StorageUnavailable
from picpeak_lite.media import images
from picpeak_lite.pipeline import attempts, imagejobs, transitions, video_work
from picpeak_lite.pipeline.imageprocs import ChildCrashed, ImageProcesses
from picpeak_lite.runtime.lease import Lease, LeaseLost, release_quietly
from picpeak_lite.services import Services
from picpeak_lite.store.queries import claims
from picpeak_lite.store.queries import photos as photo_q
from picpeak_lite.store.storage import original_name

log = logging.getLogger(__name__)


def claimant() -> str:
    """This process as a claim records it (``photos.claimed_by``): with several hosts on one database, which host
    holds a photo, or made it, is then one query away."""
    return f"{socket.gethostname()} pid {os.getpid()}"


SAFETY_POLL_SECONDS = 5.0
BACKOFF_MAX_SECONDS = 60.0
DATABASE_BACKOFF_MAX_SECONDS = 5.0  # the Retry-After that requests are told meanwhile
TOO_SLOW = "Making this photo's images took longer than {seconds:g} seconds and was given up; the file may be damaged."


@dataclasses.dataclass(frozen=True)
class Crashed:
    """What ``_process`` returns when the image child died under the photo: the attempt counts, and the photo
    is tried again (behind the others) until ``max_attempts``, then failed with ``reason``."""

    reason: str


class HandBack(enum.Enum):
    """What ``_process`` returns when the photo is not at fault: it goes back to pending, the attempt is not
    counted, and the worker pauses (an enum, so that no failure reason can ever be taken for one)."""

    DISK_FULL = "the thumbnails did not fit on the disk"
    STORAGE_DOWN = "the bucket did not answer"


class WorkerPool:
    def __init__(self, svc: Services, *, count: int | None = None, poll_seconds: float = SAFETY_POLL_SECONDS
                 ) -> None:
        self.svc = svc
        self.storage = svc.storage
        self.count = count or svc.settings.worker_count
        self.tasks = self.count + 1  # one more, which has its next photo read when an image child comes free
        self.poll_seconds = poll_seconds
        # Image work is CPU-bound: ``count`` children at once, at a lower priority than the web server.
        self.image_limiter = trio.CapacityLimiter(self.count)
        self.plan_limiter = trio.CapacityLimiter(self.tasks)  # header reads, one per worker task at most
        self.image_processes = ImageProcesses(nice=svc.settings.image_nice, decode_bytes=svc.decode_budget.total)

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(self.image_processes.warm, self.count)  # the first photo then finds them ready
            for index in range(self.tasks):
                await nursery.start(self._work, index)
            task_status.started()

    async def _work(self, index: int, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        task_status.started()
        backoff = 0.0
        while True:
            wakeup = self.svc.workers_bell.listen()  # before claiming, so a ring during the claim is not lost
            try:
                busy = await self._turn(index)
            except InsufficientStorage:
                log.error("worker %d: the disk is full; pausing before the next photo", index)
                busy = False
            except StorageUnavailable:
                # Not the photo's fault: it was handed back. Wait longer each time (up to a minute) instead of
                # asking a dead bucket again at every bell.
                backoff = min(BACKOFF_MAX_SECONDS, backoff * 2) if backoff else self.poll_seconds
                log.error("worker %d: the photo storage did not answer; trying again in %.0f s", index, backoff)
                await trio.sleep(backoff)
                continue
            if busy is None:  # the database did not answer: the photo's claim runs out and it is made again
                backoff = min(DATABASE_BACKOFF_MAX_SECONDS, backoff * 2) if backoff else 0.5
                await trio.sleep(backoff)
                continue
            backoff = 0.0
            if busy:
                self.svc.trimmer.freed()  # the JPEGs from the child leave pages in this heap (memory.py)
            else:
                with trio.move_on_after(self.poll_seconds):
                    await wakeup.wait()

    async def _turn(self, index: int) -> bool | None:
        """One photo (or one photo's images made again); None when the database stopped answering under it
        (PostgreSQL restarted, the network to it cut): the worker waits and tries again instead of ending the
        process, and the claim it may have held comes back to the queue when its lease runs out."""
        try:
            return await self.process_one() or await self.refresh_stale_views(index)
        except* DatabaseUnavailable as group:
            log.warning("worker %d: the database did not answer (%s); trying again shortly", index,
                        " ".join(str(group.exceptions[0]).split()))
        return None

    async def process_one(self) -> bool:
        """Claim and process one photo. False when there was nothing to claim."""
        token = secrets.token_hex(16)
        over = attempts.running()[token] = trio.Event()  # before the claim: see pipeline/attempts.py
        try:
            return await self._attempt(token)
        finally:
            del attempts.running()[token]
            over.set()

    async def _attempt(self, token: str) -> bool:
        svc = self.svc
        row = await svc.db.write(claims.claim_next, token, svc.clock(), svc.settings.lease_seconds, claimant())
        if row is None:
            return False
        claim = _Claim(row["id"], token)
        outcome: dict[str, Any] | str | HandBack | Crashed | None = None
        try:
            async with trio.open_nursery() as nursery:
                nursery.start_soon(self._renew_lease, claim, nursery.cancel_scope)
                outcome = await self._process(row)
                nursery.cancel_scope.cancel()
        except BaseException:
            # Cancelled (shutdown) or a bug outside the per-photo handling: hand the photo back so that it is
            # processed again, then let the exception propagate.
            await self._release_shielded(row["id"], token)
            raise
        try:
            return await self._save(row, token, claim, outcome)
        except (InsufficientStorage, StorageUnavailable):
            raise  # _save handed the photo back before it said so
        except BaseException:
            # Cancelled between the end of the work and its result's write (a shutdown's cancellation arriving
            # just then left the photo 'processing' until its lease ran out, after a clean exit): handed back
            # as above. After the write the release changes nothing (its guard wants 'processing').
            await self._release_shielded(row["id"], token)
            raise

    async def _release_shielded(self, photo_id: int, token: str) -> None:
        with trio.CancelScope(shield=True):
            await self.svc.db.write(claims.release, photo_id, token)

    async def _save(self, row: dict[str, Any], token: str, claim: _Claim,
                    outcome: dict[str, Any] | str | HandBack | Crashed | None) -> bool:
        """Write what processing the claimed photo came to: complete, failed, tried again, or handed back."""
        svc = self.svc
        if outcome is HandBack.DISK_FULL and not claim.lost:
            # Not this photo's fault: hand it back and let the worker pause (_work), so that it is made once
            # space is freed instead of failing for good. Raised here, outside the nursery, as itself.
            await self._hand_back(row["id"], token)
            raise InsufficientStorage("The server's disk is full; the thumbnails were not saved.")
        if outcome is HandBack.STORAGE_DOWN and not claim.lost:
            await self._hand_back(row["id"], token)
            raise StorageUnavailable()
        if claim.lost or outcome is None:
            log.warning("photo %s: lost its claim while processing; result discarded", row["id"])
            return True
        endpoints = svc.settings.webhooks
        if isinstance(outcome, Crashed):
            if row["attempts"] < svc.settings.max_attempts:
                await svc.db.write(claims.requeue, row["id"], token)  # the attempt stays counted
                svc.workers_bell.ring()
                return True
            outcome = f"{outcome.reason} (tried {row['attempts']} times)"
        if isinstance(outcome, str):
            result = await svc.db.write(transitions.fail_photo, endpoints, row["id"], token, outcome, svc.clock())
        else:
            result = await svc.db.write(transitions.complete_photo, endpoints, row["id"], token, outcome, svc.clock())
        if result is None:
            log.warning("photo %s: deleted, or its claim expired, before the result was saved; discarded", row["id"])
        else:
            svc.webhooks_bell.ring()
        return True

    async def _hand_back(self, photo_id: int, token: str) -> None:
        """The photo back to pending, this attempt not counted, if ``token`` still holds its claim. A late hand-back
        (this process was cut off longer than the lease, and another took the photo over) changes nothing: said in
        the log, as a late result is."""
        if not await self.svc.db.write(claims.release, photo_id, token):
            log.warning("photo %s: its claim was taken over meanwhile; the hand-back changed nothing", photo_id)

    async def refresh_stale_views(self, index: int) -> bool:
        """Make the images (view and grid) of one photo again after its gallery's watermark changed (schema 6;
        the step that marks grids made before issue 35), while it stays complete and visible. Only when no photo
        waits to be processed. False when there was nothing to do.

        The photo's ``views:<id>`` lease (``runtime/lease.py``) is held meanwhile, so one process at a time makes
        its images again, and no storage call is made inside a transaction. The files are written only while the
        mark is still what it was when this render read the settings and the lease is held; the mark is cleared
        in a transaction that checks both again. A render from older settings whose write lost a race with a
        newer change leaves the photo marked, so it is made again (after this lease is given back) from the
        newer settings: the last images written are always from the settings the mark was cleared for.
        """
        svc = self.svc
        row = await svc.db.read(photo_q.next_stale_views, index, self.tasks, svc.clock())
        if row is None:
            return False
        lease = Lease(svc.db, photo_q.views_lease(row["id"]), holder=svc.instance,
                      seconds=svc.settings.decode_deadline_seconds + svc.settings.lease_seconds, clock=svc.clock)
        if not await lease.take():
            return True  # another process took it just now: look for the next one
        try:
            async with lease.kept():
                return await self._refresh(row, lease)
        except LeaseLost:
            log.warning("photo %s: its images were being made again too slowly; left to another process", row["id"])
            return True
        finally:
            await release_quietly(lease)

    async def _refresh(self, row: dict[str, Any], lease: Lease) -> bool:
        svc = self.svc
        rendered = await self._render(row)
        if rendered is HandBack.STORAGE_DOWN:
            raise StorageUnavailable()
        if rendered is HandBack.DISK_FULL:
            raise InsufficientStorage("The server's disk is full; the images were not made again.")
        if isinstance(rendered, str | Crashed):  # it was made before: the file went (deleted?), keep the old images
            log.warning("photo %s: could not make its images again: %s", row["id"], rendered)
            await svc.db.write(photo_q.views_refreshed, row["id"], row["views_stale"])
            return True
        if not await svc.db.read(photo_q.views_still_stale, row["id"], row["views_stale"]) or not lease.held:
            return True  # changed again (or gone) since we read the settings: made again from the newer ones
        write = self.storage.write_derivative
        try:
            await trio.to_thread.run_sync(write, row["storage_key"], "view", rendered.view_jpeg)
            await trio.to_thread.run_sync(write, row["storage_key"], "grid", rendered.grid_jpeg)  # from the view
        except InsufficientStorage:
            raise
        except OSError as error:  # the mark stays: tried again after the worker's pause
            log.error("photo %s: could not save its new images: %s", row["id"], error)
            return False
        await svc.db.write(photo_q.views_refreshed, row["id"], row["views_stale"], lease.token)
        return True

    async def _process(self, row: dict[str, Any]) -> dict[str, Any] | str | HandBack | Crashed:
        """Metadata values for a complete photo, the reason it failed, or why it goes back (HandBack, Crashed)."""
        rendered = await self._render(row)
        if isinstance(rendered, str | HandBack | Crashed):
            return rendered
        write = self.storage.write_derivative
        try:
            await trio.to_thread.run_sync(write, row["storage_key"], "view", rendered.view_jpeg)
            await trio.to_thread.run_sync(write, row["storage_key"], "grid", rendered.grid_jpeg)
        except InsufficientStorage:
            return HandBack.DISK_FULL
        except StorageUnavailable:
            return HandBack.STORAGE_DOWN
        except OSError as error:
            log.error("photo %s: could not save derivatives: %s", row["id"], error)
            return "Could not save the thumbnails: a storage error."
        return rendered.metadata

    async def _render(self, row: dict[str, Any]) -> _Rendered | str | HandBack | Crashed:
        """The photo's images with its gallery's current settings, or the reason they cannot be made.

        The bytes ``images.plan`` estimates from the header are held in the process's decode budget from
        before the decode until the last encode, so that all workers and downloads together stay within
        ``decode_memory_mb``; a photo that does not fit waits for its turn, one that could never fit fails with
        its size (an upload refuses those, but a lowered setting or an import from an older version may not).

        The original is read from a local copy (the stored file itself, or a temp copy of the bucket's object
        that ``LocalCopy.close`` removes on every way out, cancellation included).
        """
        try:
            copy = await trio.to_thread.run_sync(self.storage.local_copy, original_name(row["storage_key"]))
        except FileNotFoundError:
            return photo_q.ORIGINAL_MISSING
        except StorageUnavailable:
            return HandBack.STORAGE_DOWN
        except InsufficientStorage:  # no room for the temp copy: handed back like thumbnails that did not fit
            return HandBack.DISK_FULL
        with copy:
            return await self._render_from(copy.path, row)

    async def _render_from(self, path: Any, row: dict[str, Any]) -> _Rendered | str | Crashed:
        spec = await self._spec(row["gallery_id"])
        budget = self.svc.decode_budget
        try:
            if row.get("media_type") == "video":  # its poster frame, then the same steps (pipeline/video_work.py)
                made = await video_work.render(path, row, spec, budget=budget, make_poster=self._poster,
                                               deadline=self.svc.settings.video_deadline_seconds,
                                               places=self.svc.settings.media_children)
                return made if isinstance(made, str) else _Rendered(*made)
            return await self._photo(path, row, spec)
        except ChildCrashed as crash:
            log.error("photo %s: the image child died (%s)", row["id"], crash.detail)
            return Crashed(crash.reason)

    async def _photo(self, path: Any, row: dict[str, Any], spec: images.RenderSpec) -> _Rendered | str:
        budget = self.svc.decode_budget
        deadline = self.svc.settings.decode_deadline_seconds
        try:
            # The header only (the upload read it already): in a thread, not a round trip to a child.
            cost = await trio.to_thread.run_sync(images.plan, path, spec, budget.total, limiter=self.plan_limiter)
            async with budget.hold(cost), self.image_limiter:  # the deadline counts from when a child is had
                made = await self.image_processes.run_by(deadline, imagejobs.photo, path, spec)
            if made is None:
                log.warning("photo %s: gave up after %g s", row["id"], deadline)
                return TOO_SLOW.format(seconds=deadline)
        except FileNotFoundError:  # deleted while we worked (its row is gone too), or lost from the disk
            return photo_q.ORIGINAL_MISSING
        except images.InvalidImage as error:
            log.info("photo %s failed: %s %s", row["id"], error.reason, error.detail)
            return error.reason
        except MemoryError:
            log.exception("photo %s: out of memory", row["id"])
            return "The image needs more memory than this server has."
        except ChildCrashed:
            raise
        except Exception as error:  # a bug, raised in the child: fail this photo, keep the worker alive
            log.exception("photo %s: unexpected error while processing", row["id"])
            return f"Processing failed unexpectedly ({type(error).__name__})."
        return _Rendered(*made)

    async def _poster(self, decode: Any, spec: images.RenderSpec) -> tuple[bytes, bytes]:
        async with self.image_limiter:
            return await self.image_processes.run(imagejobs.poster, decode, spec)

    async def _spec(self, gallery_id: int) -> images.RenderSpec:
        s = self.svc.settings
        watermark = await self.svc.db.read(admin_settings.watermark_of_gallery, s, gallery_id)
        return images.RenderSpec(grid_px=s.grid_px, view_px=s.view_px, quality=s.jpeg_quality,
                                 max_pixels=s.max_pixels, watermark=watermark)

    async def _renew_lease(self, claim: _Claim, processing: trio.CancelScope) -> None:
        """Extend the lease every third of its length; if the claim is gone, stop the processing."""
        svc = self.svc
        lease = svc.settings.lease_seconds
        while True:
            await trio.sleep(lease / 3)
            try:
                renewed = await svc.db.write(claims.renew_lease, claim.photo_id, claim.token, svc.clock() + lease)
            except DatabaseUnavailable:  # tried again in a third of the lease; if it ran out, the claim is gone
                log.warning("photo %s: its claim could not be renewed (the database did not answer)",
                            claim.photo_id)
                continue
            if not renewed:
                claim.lost = True
                processing.cancel()
                return


@dataclasses.dataclass(frozen=True)
class _Rendered:
    view_jpeg: bytes
    grid_jpeg: bytes
    metadata: dict[str, Any]


@dataclasses.dataclass
class _Claim:
    photo_id: int
    token: str
    lost: bool = False
