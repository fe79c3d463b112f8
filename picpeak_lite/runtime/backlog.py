"""How far uploads may run ahead of the workers (``upload_lead``, issue 18).

Over a fast link an upload arrives faster than two cores can make its images: 200 x 12 MP photos arrive over
loopback in about 9 s and take about 18 s to process. Read at full speed, the last request's photos are
acknowledged (202) and then wait behind a queue of a hundred others, and a guest who uploads meanwhile waits
behind all of them too. Reading faster than the workers take photos makes no photo complete sooner.

So the upload routes call :meth:`Backlog.wait_for_room` before they store a file (multipart) or read a
piece (tus): once ``upload_lead`` photos wait for a worker (``pending``), the next file waits until a worker
takes one. The socket is not read meanwhile, so the client is held back by TCP instead of the server holding
its bytes. On a real uplink, which is slower than the workers, the queue never reaches the lead and nothing
waits. The 202 still means what it meant (the files are durable, and no photo's own processing is awaited).

Holding an upload back only helps while workers are taking photos. When none has been taken for
``STALL_SECONDS`` (processing is off and no ``picpeak-lite worker`` runs, the workers paused on a full disk or a
bucket that does not answer, every worker busy with a long video), the gate stays open and uploads are read as
fast as they come, as if there were no lead.

And no file is held longer than ``HOLD_SECONDS``: after that it is let in even though the lead is reached. Room
goes to whichever upload asks first once a worker takes a photo, in any process, and nothing orders the waiters:
with several uploads at once (over several hosts, each with its own backlog), one could lose every race while
the others went on, its socket unread for as long as that lasted. The lead is a goal for how far uploads run
ahead, not a promise; a client whose bytes are not read for long is one that a proxy or the client itself gives
up on (nginx's ``client_body_timeout`` is 60 s), so the wait has a deadline of half that.

The change feed tells the backlog of every change (:meth:`saw`): a claim (``processing``) is a worker taking a
photo, whether in this process or in ``picpeak-lite worker``; any change away from ``pending`` may have made room.
"""

from __future__ import annotations

import math

import trio

from picpeak_lite.runtime.bell import Bell
from picpeak_lite.runtime.broker import Change
from picpeak_lite.store.db import Database
from picpeak_lite.store.queries import photos as photo_q
from picpeak_lite.store.queries.photos import PhotoStatus

STALL_SECONDS = 5.0
HOLD_SECONDS = 30.0  # the longest one file is held back, whatever the lead


class Backlog:
    def __init__(self, db: Database, lead: int) -> None:
        self.db = db
        self.lead = lead  # 0: uploads are never held back
        self._moved = Bell()  # rung when a photo left pending: there may be room
        self._last_claim = -math.inf  # trio.current_time() of the last claim seen; none yet: no worker is known
        self.waiting = 0  # uploads held back now (for figures and tests)
        self.let_in_late = 0  # files let in after HOLD_SECONDS with the lead still reached (for figures and tests)

    def saw(self, change: Change) -> None:
        """Called by the change feed for every change it publishes. Sync and non-blocking."""
        if change.status == PhotoStatus.PENDING:
            return
        if change.status == PhotoStatus.PROCESSING:
            self._last_claim = trio.current_time()
        self._moved.ring()

    def workers_taking(self) -> bool:
        """Whether a worker took a photo in the last ``STALL_SECONDS``: holding uploads back helps only then."""
        return trio.current_time() - self._last_claim < STALL_SECONDS

    async def wait_for_room(self) -> None:
        """Return once fewer than ``lead`` photos wait for a worker, at once if no worker is taking any, and after
        ``HOLD_SECONDS`` at the latest."""
        if self.lead <= 0:
            return
        deadline = trio.current_time() + HOLD_SECONDS
        while self.workers_taking():
            moved = self._moved.listen()  # before counting, so a claim during the count is not missed
            if await self.db.read(photo_q.count_pending) < self.lead:
                return
            if trio.current_time() >= deadline:
                self.let_in_late += 1
                return
            self.waiting += 1
            try:
                with trio.move_on_at(min(deadline, trio.current_time() + STALL_SECONDS)):
                    await moved.wait()
            finally:
                self.waiting -= 1
