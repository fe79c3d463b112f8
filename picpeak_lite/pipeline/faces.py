"""The "Find me" lane (issue 36): the faces of complete photos, from their view images, into the face index.

A lane below the photos, as the video previews are (``video_previews.PhotosFirst``): it looks at a photo only
while no photo is pending or processing, one photo at a time, in an image child (the models load there, never
in the server; the child's deadline and address-space limit hold), so a photo or a guest page never waits for
it. The database is its queue: a photo in a gallery with "Find me" on that has no ``face_scans`` row is still to
do (``store/queries/faces.py``), so a crash loses nothing and switching the feature on for a gallery that
already has photos indexes them all. A photo whose faces cannot be read gets its scan row with the reason and
is not tried again; its gallery page counts it.

Started by ``server.start_background`` only when the ``faces`` extra is installed.
"""

from __future__ import annotations

import logging

import trio

from picpeak_lite.media import images
from picpeak_lite.pipeline import imagejobs
from picpeak_lite.pipeline.imageprocs import ChildCrashed, ImageProcesses
from picpeak_lite.pipeline.video_previews import PhotosFirst
from picpeak_lite.services import Services
from picpeak_lite.store.queries import faces as faces_q
from picpeak_lite.store.storage import derived_name

log = logging.getLogger(__name__)

SAFETY_POLL_SECONDS = 15.0
TOO_SLOW = "Looking for faces took too long."
NO_VIEW = "The photo's view image is missing."


class FaceIndexer:
    def __init__(self, svc: Services, *, poll_seconds: float = SAFETY_POLL_SECONDS) -> None:
        self.svc = svc
        self.poll_seconds = poll_seconds
        self.photos_first = PhotosFirst(svc, poll_seconds)
        self.processes = ImageProcesses(nice=svc.settings.image_nice, decode_bytes=svc.decode_budget.total)

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        task_status.started()
        while True:
            wakeup_photos = self.svc.workers_bell.listen()
            wakeup_faces = self.svc.faces_bell.listen()
            if await self.photos_first.photos_waiting():
                await self.photos_first.idle()
                continue
            if not await self.index_one():
                with trio.move_on_after(self.poll_seconds):
                    async with trio.open_nursery() as nursery:
                        for bell in (wakeup_photos, wakeup_faces):
                            nursery.start_soon(_wait_then_cancel, bell, nursery.cancel_scope)

    async def index_one(self) -> bool:
        """Look at the next photo still to index; False when there was none."""
        svc = self.svc
        row = await svc.db.read(faces_q.next_to_index)
        if row is None:
            return False
        found: list[tuple[tuple[int, int, int, int], bytes]] = []
        error: str | None = None
        try:
            with await trio.to_thread.run_sync(svc.storage.local_copy, derived_name(row["storage_key"], "view")
                                               ) as view:
                result = await self.processes.run_by(svc.settings.decode_deadline_seconds,
                                                     imagejobs.photo_faces, view.path)
            if result is None:
                error = TOO_SLOW
            else:
                found = result
        except FileNotFoundError:
            error = NO_VIEW
        except images.InvalidImage as invalid:
            error = invalid.reason
        except (ChildCrashed, MemoryError) as crashed:
            log.warning("photo %s: faces not read: %s", row["id"], crashed)
            error = str(crashed)
        if error is not None:
            log.info("photo %s: no faces indexed: %s", row["id"], error)
        await svc.db.write(faces_q.record, row["id"], found, error, svc.clock())
        return True


async def _wait_then_cancel(wakeup: trio.Event, scope: trio.CancelScope) -> None:
    await wakeup.wait()
    scope.cancel()
