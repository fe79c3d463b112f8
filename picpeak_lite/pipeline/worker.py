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
since it was made (``views_stale``, schema 6). That needs no claim: the photo stays ``complete`` and visible, and
the new files replace the old ones only in the transaction that clears the mark, if no newer change marked it since the
settings were read (see :meth:`WorkerPool.refresh_stale_views`).
"""

from __future__ import annotations

import dataclasses
import enum
import logging
import secrets
from typing import Any

import trio

from picpeak_lite.domain import admin_settings
from picpeak_lite.errors import InsufficientStorage, StorageUnavailable
from picpeak_lite.media import images
from picpeak_lite.pipeline import attempts, imagejobs, transitions, video_work
from picpeak_lite.pipeline.imageprocs import ChildCrashed, ImageProcesses
from picpeak_lite.services import Services
from picpeak_lite.store.queries import claims
from picpeak_lite.store.queries import photos as photo_q
from picpeak_lite.store.storage import original_name

log = logging.getLogger(__name__)

SAFETY_POLL_SECONDS = 5.0
BACKOFF_MAX_SECONDS = 60.0
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
                busy = await self.process_one() or await self.refresh_stale_views(index)
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
            backoff = 0.0
            if busy:
                self.svc.trimmer.freed()  # the JPEGs from the child leave pages in this heap (memory.py)
            else:
                with trio.move_on_after(self.poll_seconds):
                    await wakeup.wait()

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
        row = await svc.db.write(claims.claim_next, token, svc.clock(), svc.settings.lease_seconds)
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
            with trio.CancelScope(shield=True):
                await svc.db.write(claims.release, row["id"], token)
            raise
        if outcome is HandBack.DISK_FULL and not claim.lost:
            # Not this photo's fault: hand it back and let the worker pause (_work), so that it is made once
            # space is freed instead of failing for good. Raised here, outside the nursery, as itself.
            await svc.db.write(claims.release, row["id"], token)
            raise InsufficientStorage("The server's disk is full; the thumbnails were not saved.")
        if outcome is HandBack.STORAGE_DOWN and not claim.lost:
            await svc.db.write(claims.release, row["id"], token)
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

    async def refresh_stale_views(self, index: int) -> bool:
        """Make the images (view and grid) of one photo again after its gallery's watermark changed (schema 6;
        the step that marks grids made before issue 35), while it stays complete and visible. Only when no photo
        waits to be processed. False when there was nothing to do.

        No claim: two processes may both make the same photo's images. The files are replaced only in the
        transaction that clears the mark, and only if the mark is still what it was when this render read the
        settings, so a render from older settings can never overwrite one from newer settings.
        """
        svc = self.svc
        row = await svc.db.read(photo_q.next_stale_views, index, self.tasks)
        if row is None:
            return False
        rendered = await self._render(row)
        if rendered is HandBack.STORAGE_DOWN:
            raise StorageUnavailable()
        if rendered is HandBack.DISK_FULL:
            raise InsufficientStorage("The server's disk is full; the images were not made again.")
        if isinstance(rendered, str | Crashed):  # it was made before: the file went (deleted?), keep the old images
            log.warning("photo %s: could not make its images again: %s", row["id"], rendered)
            await svc.db.write(photo_q.views_refreshed, row["id"], row["views_stale"])
            return True
        storage = self.storage

        def replace_if_still_stale(conn: Any) -> bool:
            if not photo_q.views_still_stale(conn, row["id"], row["views_stale"]):
                return False  # changed again (or gone) since we read the settings: made again from the newer ones
            storage.write_derivative(row["storage_key"], "view", rendered.view_jpeg)
            storage.write_derivative(row["storage_key"], "grid", rendered.grid_jpeg)  # made from the marked view
            return photo_q.views_refreshed(conn, row["id"], row["views_stale"])

        try:
            await svc.db.write(replace_if_still_stale)
        except InsufficientStorage:
            raise
        except OSError as error:  # the mark stays: tried again after the worker's pause
            log.error("photo %s: could not save its new images: %s", row["id"], error)
            return False
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
            if not await svc.db.write(claims.renew_lease, claim.photo_id, claim.token, svc.clock() + lease):
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
