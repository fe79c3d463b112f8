"""The preview lane: a playable H.264/AAC MP4 (at most 1080p) for videos Chromium cannot play as they are (HEVC).

One task per process (``video_previews`` setting, on by default), started with the workers. It is the lower
lane in three ways, so that videos never delay photos: it starts a transcode only when no photo is pending or
processing; the transcode runs in a child process at the lowest CPU priority (``nice 19``); and when photos
arrive while it runs, the child is stopped until they are done (:class:`PhotosFirst`), because nice 19 alone
still cost a photo processed meanwhile about a quarter of its speed on two cores (``bench/bench_video.py``
measures the latency of photos uploaded during a transcode through the real server).
The child (``python -m picpeak_lite.media.video transcode``) has a deadline that grows with the clip's length and
a memory limit, like the probe's (``pipeline/video_jobs.py``): a crash or a hang fails the preview with a
sentence, and the lightbox then offers the download instead.

No claim: the row's ``preview_status`` stays 'pending' while a copy is made, so two processes on one data
directory could both make the same copy (same bytes; the second rename wins). The result is recorded only if
the video is still there and still pending, and the file is removed otherwise.
"""

from __future__ import annotations

import logging

import trio

from picpeak_lite.media import video
from picpeak_lite.pipeline import video_jobs
from picpeak_lite.services import Services
from picpeak_lite.store.queries import photos as photo_q
from picpeak_lite.store.storage import original_name, preview_name, remove_quietly

log = logging.getLogger(__name__)

SAFETY_POLL_SECONDS = 15.0
# While a transcode is stopped for photos: how often to look whether they are done (a cheap count, and only
# while photos are being processed anyway).
IDLE_CHECK_SECONDS = 0.5


def transcode_deadline(duration: float | None, floor: float) -> float:
    """Generous on purpose (nice 19 on a busy box can be slow): 20 s per second of video, plus two minutes."""
    return max(floor, 20 * (duration or 0) + 120)


async def settle() -> None:
    """The pause of a lane below the photos between a bell and its next look. The workers' bell rings for every
    photo that becomes pending, several times each (the upload, the change feed, another process's notification),
    and a lane gives way to such a photo anyway: looking once per burst of rings, not once per ring, spares the
    database a query for each, and a preview or a face index is not waited for by the half second."""
    await trio.sleep(IDLE_CHECK_SECONDS)


class PhotosFirst:
    """The lane's :class:`video_jobs.GiveWay`: busy while any photo is pending or processing. The workers' bell
    (rung for every new photo) wakes :meth:`busy` at once; the safety poll covers photos queued elsewhere."""

    def __init__(self, svc: Services, poll_seconds: float) -> None:
        self.svc = svc
        self.poll_seconds = poll_seconds

    async def photos_waiting(self) -> bool:
        counts = await self.svc.db.read(photo_q.queue_counts)
        return bool(counts["pending"] or counts["processing"])

    async def busy(self) -> None:
        while True:
            wakeup = self.svc.workers_bell.listen()
            if await self.photos_waiting():
                return
            with trio.move_on_after(self.poll_seconds):
                await wakeup.wait()

    async def idle(self) -> None:
        # A count, not an event: photos may be processed by a `picpeak-lite worker` process, which rings no bell
        # here, and the queue being empty is a fact of the database, not of this process.
        while await self.photos_waiting():  # noqa: ASYNC110
            await trio.sleep(IDLE_CHECK_SECONDS)


class PreviewLane:
    def __init__(self, svc: Services, *, poll_seconds: float = SAFETY_POLL_SECONDS) -> None:
        self.svc = svc
        self.poll_seconds = poll_seconds
        self.photos_first = PhotosFirst(svc, poll_seconds)

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        task_status.started()
        while True:
            wakeup = self.svc.workers_bell.listen()
            if not await self.make_one():
                with trio.move_on_after(self.poll_seconds):
                    await wakeup.wait()
                await settle()

    async def make_one(self) -> bool:
        """Make one pending preview if no photo waits. False when there was nothing to do (or photos first)."""
        svc = self.svc
        if await self.photos_first.photos_waiting():
            return False
        row = await svc.db.read(photo_q.next_preview)
        if row is None:
            return False
        storage, key = svc.storage, row["storage_key"]
        temp = storage.new_temp_path().with_suffix(".mp4")
        try:
            try:
                # The original as a local file for the decoder: itself, or a temp copy of the bucket's object.
                with await trio.to_thread.run_sync(storage.local_copy, original_name(key)) as source:
                    await video_jobs.transcode(source.path, temp, deadline=transcode_deadline(
                        row["duration"], svc.settings.video_deadline_seconds), give_way=self.photos_first,
                        places=svc.settings.media_children)
                await trio.to_thread.run_sync(storage.put_file, temp, preview_name(key))
            except FileNotFoundError:
                await svc.db.write(photo_q.preview_failed, row["id"], photo_q.ORIGINAL_MISSING)
                return True
            except video.InvalidVideo as error:
                log.info("video %s: no playable preview: %s %s", row["id"], error.reason, error.detail)
                await svc.db.write(photo_q.preview_failed, row["id"], error.reason)
                return True
            except OSError as error:
                log.error("video %s: could not save its preview: %s", row["id"], error)
                await svc.db.write(photo_q.preview_failed, row["id"], "Could not save the playable copy.")
                return True
        finally:
            remove_quietly(temp)
        if not await svc.db.write(photo_q.preview_done, row["id"]):
            await trio.to_thread.run_sync(storage.remove, preview_name(key))
        return True


