"""``picpeak-lite gallery archive|restore SLUG``: the same steps as the server's archiver (pipeline/archive.py),
run to their end from the command line, for scripts and for a server that is stopped.

A gallery already in the middle of archiving or restoring (the server's archiver, or a crash) is taken where it
stands: the command then finishes that step instead of asking for it again.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import trio

from picpeak_lite.config import Settings
from picpeak_lite.errors import Conflict, NotFound
from picpeak_lite.ops import bootstrap
from picpeak_lite.pipeline import archive
from picpeak_lite.store.db import Database
from picpeak_lite.store.queries import archive as archive_q
from picpeak_lite.store.queries import galleries as gallery_q
from picpeak_lite.store.storage import open_storage


@dataclass(frozen=True)
class Result:
    slug: str
    photos: int
    outcome: archive.Outcome


def run(settings: Settings, slug: str, action: str) -> Result:
    """``action``: "archive" or "restore". Raises NotFound / Conflict with a sentence."""
    return trio.run(_run, settings, slug, action)


async def _run(settings: Settings, slug: str, action: str) -> Result:
    await trio.to_thread.run_sync(bootstrap.prepare, settings)
    storage = open_storage(settings)
    await trio.to_thread.run_sync(storage.check_access)
    await trio.to_thread.run_sync(storage.create_dirs)
    db = Database(settings.database_path, readers=1)
    try:
        gallery = await db.read(gallery_q.get_by_slug, slug)
        if gallery is None:
            raise NotFound(f"there is no gallery with the slug {slug!r}")
        resuming = archive_q.ARCHIVING if action == "archive" else archive_q.RESTORING
        if gallery["archive_state"] != resuming:
            step = archive.request_archive if action == "archive" else archive.request_restore
            await db.write(step, gallery["id"])
        outcome = await archive.advance(db, storage, settings.webhooks, gallery["id"], time.time)
        photos = len(await db.read(archive_q.photos_of, gallery["id"]))
    finally:
        db.close()
    if outcome.error is not None:
        raise Conflict(f"{action} of {slug!r} stopped: {outcome.error}")
    return Result(slug, photos, outcome)
