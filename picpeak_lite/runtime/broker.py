"""Publish / subscribe of photo changes with bounded channels.

``publish`` never blocks and never allocates without bound: each subscriber has a channel of fixed size, and a
subscriber that falls behind is marked ``overflowed`` and gets nothing more until it has resynchronised from
the database (the WebSocket handler sends the client a ``resync`` and a fresh snapshot). A slow browser is
dropped to a snapshot; a worker is never stalled.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import trio

SUBSCRIBER_BUFFER = 256


@dataclass(frozen=True)
class Change:
    """One row of the change log, with the photo's details as they were when the change was read."""

    seq: int
    photo_id: int
    gallery_id: int
    upload_id: str
    status: str  # pending, processing, complete, failed, deleted
    hidden: bool
    filename: str | None = None
    error: str | None = None
    width: int | None = None
    height: int | None = None
    # Held back for the admin's review (moderation); guests are told nothing of it until it is approved.
    awaiting_approval: bool = False
    guest_name: str | None = None
    media_type: str = "photo"  # or 'video'
    duration: float | None = None  # a video's seconds
    # A like, rating or comment on this photo changed (its state is copied, not changed): the gallery feeds
    # tell of it; an upload's feed and the backlog ignore it.
    feedback: bool = False

    @classmethod
    def from_row(cls, row: dict[str, Any]) -> Change:
        return cls(
            seq=row["seq"], photo_id=row["photo_id"], gallery_id=row["gallery_id"], upload_id=row["upload_id"],
            status=row["status"], hidden=bool(row["hidden"]), filename=row.get("display_name"),
            error=row.get("error"), width=row.get("width"), height=row.get("height"),
            awaiting_approval=bool(row.get("awaiting_approval")), guest_name=row.get("guest_name"),
            media_type=row.get("media_type") or "photo", duration=row.get("duration"),
            feedback=bool(row.get("feedback")),
        )


@dataclass(eq=False)
class Subscription:
    wants: Callable[[Change], bool]
    send: trio.MemorySendChannel[Change]
    receive: trio.MemoryReceiveChannel[Change]
    overflowed: bool = False

    def drain(self) -> None:
        """Forget what is queued (after an overflow, before the resync)."""
        while True:
            try:
                self.receive.receive_nowait()
            except trio.WouldBlock:
                break
        self.overflowed = False


@dataclass
class Broker:
    buffer: int = SUBSCRIBER_BUFFER
    _subscriptions: set[Subscription] = field(default_factory=set)
    last_seq: int = 0

    @contextmanager
    def subscribe(self, wants: Callable[[Change], bool]) -> Iterator[Subscription]:
        send, receive = trio.open_memory_channel[Change](self.buffer)
        subscription = Subscription(wants, send, receive)
        self._subscriptions.add(subscription)
        try:
            yield subscription
        finally:
            self._subscriptions.discard(subscription)
            send.close()
            receive.close()

    def publish(self, change: Change) -> None:
        """Hand ``change`` to every interested subscriber without waiting for any of them."""
        self.last_seq = max(self.last_seq, change.seq)
        for sub in self._subscriptions:
            if sub.overflowed or not sub.wants(change):
                continue
            try:
                sub.send.send_nowait(change)
            except trio.WouldBlock:
                sub.overflowed = True

    @property
    def subscriber_count(self) -> int:
        return len(self._subscriptions)
