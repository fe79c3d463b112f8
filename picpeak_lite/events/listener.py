"""Changes pushed, not polled (PostgreSQL only): the one place that LISTENs.

The change log stays the source of truth; a notification only says "look now". Schema step 27's triggers NOTIFY
at COMMIT (never for a transaction that rolls back), one notification per channel and transaction:

* ``picpeak_changes``: a change was logged. Rings ``Services.changes_bell``: the change feed reads everything
  after its last seq and publishes it, as it does after a commit in this process.
* ``picpeak_work``: a photo became pending (an upload, a retry, a photo handed back). Rings the workers' bell, so
  that ``picpeak-lite worker``, which runs no change feed, starts at once.
* ``picpeak_webhooks`` / ``picpeak_email``: an outbox row was queued. Rings that sender's bell.

Every process hears its own commits too; the bells it rang itself then ring once more, which costs one cheap
query each and loses nothing.

The listener holds one connection of its own (``store/pg.py`` ``Notifications``). It waits for the socket to be
readable in trio itself, so it is cancelled at once at shutdown and holds no thread while idle. When the
connection is lost (the server restarted, an administrator ended it) it logs once, connects again with a growing
pause (up to :data:`RETRY_MAX_SECONDS`) and, once it listens again, rings every bell: a notification sent while
nobody listened is gone, and the fallback polls (the feed's, the senders', the workers') would otherwise be the
ones to find what was committed meanwhile.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING

import trio

from picpeak_lite.errors import DatabaseError
from picpeak_lite.runtime.bell import Bell
from picpeak_lite.services import Services

if TYPE_CHECKING:
    from picpeak_lite.store.pg import Notifications

log = logging.getLogger(__name__)

#: Which bell each channel rings (the channels are named in schema_pg.py's step 27).
CHANNELS: dict[str, Callable[[Services], Bell]] = {
    "picpeak_changes": lambda svc: svc.changes_bell,
    "picpeak_work": lambda svc: svc.workers_bell,
    "picpeak_webhooks": lambda svc: svc.webhooks_bell,
    "picpeak_email": lambda svc: svc.email_bell,
}
RETRY_FIRST_SECONDS = 0.5
RETRY_MAX_SECONDS = 30.0


class DatabaseListener:
    """Rings the bells of this process when another process's commit NOTIFYs. One per process, PostgreSQL only.

    Start it with ``await nursery.start(DatabaseListener(svc).run)``: ``started()`` comes once LISTEN is issued, so a
    commit made after that is heard. A first connection that fails raises (the database was just reached by
    ``first_start``, so that is not a passing blip); later losses are retried forever."""

    def __init__(self, svc: Services, *, retry_max_seconds: float = RETRY_MAX_SECONDS) -> None:
        if svc.db.dialect != "postgresql":
            raise ValueError("only PostgreSQL sends notifications; SQLite's change feed polls")
        self.svc = svc
        self.retry_max_seconds = retry_max_seconds
        # Connecting and LISTEN block (bounded by the connect timeout), in a thread of their own.
        self.connect_limiter = trio.CapacityLimiter(1)
        # The server process of the connection now listening (for tests and logs), None while there is none.
        self.backend_pid: int | None = None
        # Set each time LISTEN has been issued again after a lost connection (tests wait on it).
        self.reconnected = trio.Event()
        self.reconnects = 0

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        from picpeak_lite.store.pg import Notifications  # psycopg only where PostgreSQL is used

        channels = tuple(CHANNELS)
        pause = RETRY_FIRST_SECONDS
        lost_since: float | None = None
        while True:
            try:
                conn = await trio.to_thread.run_sync(Notifications, self.svc.db.target, channels,
                                                     limiter=self.connect_limiter)
            except DatabaseError as error:
                if lost_since is None:  # the first start: the caller learns of it
                    raise
                log.debug("listen: still no connection: %s", error)
                await trio.sleep(pause)
                pause = min(self.retry_max_seconds, pause * 2)
                continue
            try:
                self.backend_pid = conn.backend_pid
                if lost_since is None:
                    task_status.started()
                else:
                    log.warning("listen: listening again after %.1f s; looking for what was committed meanwhile",
                                trio.current_time() - lost_since)
                    self.reconnects += 1
                    self.reconnected.set()
                    self.reconnected = trio.Event()
                self._ring(channels)  # anything committed before LISTEN took effect is looked for now
                pause = RETRY_FIRST_SECONDS
                await self._hear(conn)
            except DatabaseError as error:
                log.warning("listen: %s; changes wait for the fallback poll until it is back",
                            error)
                lost_since = trio.current_time()
            finally:
                self.backend_pid = None
                trio.lowlevel.notify_closing(conn.fileno())
                conn.close()
            await trio.sleep(pause)
            pause = min(self.retry_max_seconds, pause * 2)

    async def _hear(self, conn: Notifications) -> None:
        """Ring the bells of every notification until the connection is lost (DatabaseError) or cancelled."""
        fileno = conn.fileno()
        while True:
            await trio.lowlevel.wait_readable(fileno)
            self._ring(conn.take())

    def _ring(self, channels: Iterable[str]) -> None:
        for channel in channels:
            ring = CHANNELS.get(channel)
            if ring is not None:
                ring(self.svc).ring()
