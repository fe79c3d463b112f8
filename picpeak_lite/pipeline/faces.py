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
from dataclasses import dataclass

import trio

from picpeak_lite.i18n import _
from picpeak_lite.media import faces as media_faces
from picpeak_lite.media import images
from picpeak_lite.pipeline import imagejobs
from picpeak_lite.pipeline.imageprocs import ChildCrashed, ImageProcesses
from picpeak_lite.pipeline.video_previews import PhotosFirst, settle
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
            if await self.svc.db.read(faces_q.next_to_index) is not None:
                # Work to do, but photos first: wait (a count every half second) while any is being processed.
                if await self.photos_first.photos_waiting():
                    await self.photos_first.idle()
                    continue
                if await self.index_one():
                    continue
            with trio.move_on_after(self.poll_seconds):
                async with trio.open_nursery() as nursery:
                    for bell in (wakeup_photos, wakeup_faces):
                        nursery.start_soon(_wait_then_cancel, bell, nursery.cancel_scope)
            await settle()

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


@dataclass(frozen=True)
class Match:
    photo_id: int
    face_id: int
    distance: float


class SelfieProblem(Exception):
    """The selfie cannot be searched with; ``kind`` says why (no_face, several_faces, unreadable, too_slow), and
    the caller words it for the guest."""

    def __init__(self, kind: str) -> None:
        super().__init__(kind)
        self.kind = kind


async def selfie_embedding(svc: Services, data: bytes) -> bytes:
    """The embedding of the one face in a selfie. Its bytes go to an image child through the pipe and are
    dropped there after the job: never a file, never a row (the caller reads the request body into memory)."""
    processes = ImageProcesses(nice=svc.settings.image_nice, decode_bytes=svc.decode_budget.total)
    try:
        found = await processes.run_by(svc.settings.decode_deadline_seconds, imagejobs.selfie_faces, data)
    except images.InvalidImage:
        raise SelfieProblem("unreadable") from None
    except (ChildCrashed, MemoryError):
        raise SelfieProblem("unreadable") from None
    if found is None:
        raise SelfieProblem("too_slow")
    if not found:
        raise SelfieProblem("no_face")
    if len(found) > 1:
        raise SelfieProblem("several_faces")
    return found[0]


async def search(svc: Services, gallery_id: int, query: bytes, excluded: set[int], *,
                 limiter: trio.CapacityLimiter) -> list[Match]:
    """The photos of the gallery that every guest may see with a face near ``query``, best first, one entry per
    photo (its nearest face); faces in ``excluded`` (the guest's "not me") are left out."""
    rows = await svc.db.read(faces_q.candidates, gallery_id)
    rows = [row for row in rows if row["id"] not in excluded]
    near = await trio.to_thread.run_sync(media_faces.nearest, query, [row["embedding"] for row in rows],
                                         limiter=limiter)
    seen: set[int] = set()
    matches = []
    for index, distance in near:
        row = rows[index]
        if row["photo_id"] not in seen:
            seen.add(row["photo_id"])
            matches.append(Match(row["photo_id"], row["id"], distance))
    return matches


async def like_refused(svc: Services, gallery_id: int, refused: int, shown: dict[int, float]) -> list[int]:
    """The "not me" refinement: the refused face, and of the faces ``shown`` to the guest (face id -> its
    distance from the selfie, as the search answered) those more like the refused face than like the selfie,
    and like it as the same person is: the look-alike's other photos go, the guest's own stay. Only faces of
    this gallery count; none when the refused face is not one of them."""
    rows = await svc.db.read(faces_q.embeddings_of, gallery_id, [refused, *shown])
    by_id = {row["id"]: row["embedding"] for row in rows}
    if refused not in by_id:
        return []
    others = [face_id for face_id in shown if face_id in by_id and face_id != refused]
    near = media_faces.nearest(by_id[refused], [by_id[face_id] for face_id in others],
                               limit=media_faces.SAME_PERSON_DISTANCE)
    return [refused, *(others[index] for index, distance in near if distance < shown[others[index]])]


def how_to_enable() -> str:
    """What the pages say while the ``faces`` extra is not installed."""
    return _("\"Find me\" needs the faces extra on the server: pip install 'picpeak-lite[faces]', then restart.")


async def progress(svc: Services, gallery_id: int) -> dict[str, int | bool]:
    """The gallery page's "Find me" part: whether the extra is installed, and the index's progress."""
    row = await svc.db.read(faces_q.progress, gallery_id)
    return {"available": media_faces.available(), "photos": row["photos"], "scanned": row["scanned"],
            "failed": row["failed"], "faces": row["faces"]}
