"""Activity counters: views, downloads (one photo, a zip) and favourites per gallery and day, kept cheaply.

Counting is a dictionary increment in the request (:meth:`Activity.count`: sync, never waits, never writes).
The long-lived task :meth:`Activity.run` adds what was counted to ``gallery_activity`` in one transaction
every ``flush_seconds`` (sooner when ``max_pending`` keys pile up), and once more when the server stops, so a
thousand views of a gallery in ten seconds are one row updated once, not a thousand writes competing with
uploads for SQLite's one writer. A count not flushed yet is read by :meth:`pending` (the dashboard adds it), and
a flush that fails keeps its counts for the next one. A crash loses at most the last interval's counts: these
are statistics, not records.

Guest uploads over time need no counter: each upload writes its photo rows anyway
(``queries.activity.guest_uploads_since``).
"""

from __future__ import annotations

import datetime as dt
import logging
from collections import Counter
from collections.abc import Callable
from typing import Any

import trio

from picpeak_lite.runtime.bell import Bell
from picpeak_lite.store.db import Connection, Database
from picpeak_lite.store.queries import activity as activity_q

log = logging.getLogger(__name__)

FLUSH_SECONDS = 10.0
MAX_PENDING = 5000

Key = tuple[int, str, str]  # gallery id, UTC day, kind


def day_of(timestamp: float) -> str:
    return dt.datetime.fromtimestamp(timestamp, dt.UTC).date().isoformat()


class Activity:
    def __init__(self, db: Database, clock: Callable[[], float], *, flush_seconds: float = FLUSH_SECONDS,
                 max_pending: int = MAX_PENDING) -> None:
        self.db = db
        self.clock = clock
        self.flush_seconds = flush_seconds
        self.max_pending = max_pending
        self._pending: Counter[Key] = Counter()
        self._full = Bell()
        self.flushes = 0  # transactions written
        self.flushed = Bell()  # rung after each one (tests wait on it)
        self.counted = 0

    def count(self, gallery_id: int, kind: str, n: int = 1) -> None:
        if kind not in activity_q.KINDS:
            raise ValueError(f"unknown activity {kind!r}")
        self._pending[(gallery_id, day_of(self.clock()), kind)] += n
        self.counted += n
        if len(self._pending) >= self.max_pending:
            self._full.ring()

    def pending(self) -> dict[Key, int]:
        """What is counted but not stored yet."""
        return dict(self._pending)

    async def flush(self) -> int:
        """Store what is pending in one transaction; returns how many keys were written."""
        if not self._pending:
            return 0
        batch, self._pending = self._pending, Counter()
        try:
            await self.db.write(activity_q.add, [(g, day, kind, n) for (g, day, kind), n in batch.items()])
        except BaseException:
            self._pending.update(batch)  # kept for the next flush
            raise
        self.flushes += 1
        self.flushed.ring()
        return len(batch)

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        task_status.started()
        try:
            while True:
                full = self._full.listen()
                with trio.move_on_after(self.flush_seconds):
                    await full.wait()
                try:
                    await self.flush()
                except Exception:
                    log.exception("could not store the activity counts; keeping them for the next try")
        finally:
            with trio.CancelScope(shield=True):  # the server is stopping: store the last counts
                try:
                    await self.flush()
                except Exception:
                    log.exception("could not store the last activity counts")


SERIES_DAYS = 14


def summary(conn: Connection, pending: dict[Key, int], today: dt.date,
            days: int = SERIES_DAYS) -> dict[int, dict[str, Any]]:
    """Per gallery: totals of each kind (stored and pending), and the last ``days`` days, each with its views,
    downloads (both kinds), favourites and guest uploads, oldest first. For the dashboard."""
    first = (today - dt.timedelta(days=days - 1)).isoformat()
    day_list = [(today - dt.timedelta(days=days - 1 - i)).isoformat() for i in range(days)]
    out: dict[int, dict[str, Any]] = {}

    def entry(gallery_id: int) -> dict[str, Any]:
        if gallery_id not in out:
            out[gallery_id] = {"totals": dict.fromkeys(activity_q.KINDS, 0),
                               "days": {d: dict.fromkeys(("views", "downloads", "favourites", "guest_uploads"), 0)
                                        for d in day_list}}
        return out[gallery_id]

    def add_day(gallery_id: int, day: str, kind: str, n: int) -> None:
        bucket = entry(gallery_id)["days"].get(day)
        if bucket is not None:
            bucket["downloads" if kind.startswith("downloads") else kind] += n

    for row in activity_q.totals(conn):
        entry(row["gallery_id"])["totals"][row["kind"]] += row["count"]
    for row in activity_q.since(conn, first):
        add_day(row["gallery_id"], row["day"], row["kind"], row["count"])
    for (gallery_id, day, kind), n in pending.items():
        entry(gallery_id)["totals"][kind] += n
        add_day(gallery_id, day, kind, n)
    for row in activity_q.guest_uploads_since(conn, first):
        add_day(row["gallery_id"], row["day"], "guest_uploads", row["count"])
    for value in out.values():
        series = [{"day": d, **v} for d, v in value["days"].items()]
        value["days"] = series
        value["peak"] = max([1] + [max(s["views"], s["downloads"], s["favourites"], s["guest_uploads"])
                                   for s in series])
    return out
