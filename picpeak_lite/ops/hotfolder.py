"""Hot folders: a folder (and its subfolders: a camera card's ``DCIM/100CANON``) that is watched during an event,
each photo written into it becoming a photo of a gallery within a second or two, on the live wall.

Two ways to run one: ``picpeak-lite watch FOLDER --gallery SLUG`` (a process next to the server, like
``worker`` and ``import``: :func:`run_watch`), and a gallery's own folder (``hot_folder`` on its form, under
``hot_folder_root``), watched by the server itself (:class:`HotFolders`, started in ``server.run``).

Every file goes through the importer's path (``ops/importer.py`` :func:`~.importer.receive_file`, so
:mod:`~picpeak_lite.pipeline.intake`): streamed to a temp file with its sha256, the same duplicate check, header
check, durable move and ``pending`` row as an upload; the workers (here, or in the server: its change feed sees
the rows) make its images, and the wall's feed shows it when it is complete.

Watching: ``watchfiles`` (Rust ``notify``: inotify on Linux, FSEvents, ReadDirectoryChangesW), whose ``awatch``
runs under trio through anyio. Where the platform cannot (an NFS or SMB mount, a container without inotify, the
inotify watch limit reached) it falls back to notify's polling of the folder tree (``force_polling``; also
``WATCHFILES_FORCE_POLLING=1``).

When a file is complete (never taken half, e.g. from an FTP upload that takes ten seconds or stalls): three
rules together, since none alone is enough:

1. Names that senders use while writing are never looked at: anything without an image extension
   (``IMG_1.JPG.part``, ``.filepart``, ``.tmp``) and anything with a leading dot (rsync, ProFTPD's
   ``HiddenStores``) (:func:`~.importer.wanted`). A sender that renames when done is taken after the rename.
2. A quiet period: its size and modification time have not changed for ``hot_folder_settle_seconds``.
3. Its bytes end where its format says (:func:`picpeak_lite.media.wholefile.looks_whole`: a JPEG's EOI, a PNG's
   IEND, a WebP's RIFF length, ISO boxes adding up), so a stalled sender's half file is not taken, however long
   it is quiet.

And after reading it, its size and time are compared again: a file that changed while it was read is not kept
(nothing of that batch is committed) and is taken again once it is quiet. inotify's ``IN_CLOSE_WRITE`` would
say "closed" directly, but only on Linux, only for local writers, and a sender may close and reopen (resumed
FTP); the rules above hold on every platform and mount, and polling too.

In place (``--in-place``, or the gallery's "reference originals in place"): instead of a copy, the original in
storage is a link to the file in the folder (``Storage.link_original``, local storage only), which is only ever
read: the folder is never modified (no file renamed, moved or deleted, not even when the photo is deleted). A
file that vanishes from the folder is a missing original: ``picpeak-lite check`` lists it with its path.

Each file becomes exactly one photo: taken files are remembered by relative path, size and modification time
(``hot_folder_files``), so a restart (of the server or of ``watch``) does not read them again; and the intake
finds the same bytes in the gallery by sha256 whatever happens, so no path can make a second photo.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

import trio
from watchfiles import Change, awatch

from picpeak_lite.config import Settings
from picpeak_lite.domain import gallery_fields
from picpeak_lite.errors import ConfigError, NotFound
from picpeak_lite.media.wholefile import looks_whole
from picpeak_lite.ops import bootstrap, importer
from picpeak_lite.pipeline.intake import MB, Intake, Limits
from picpeak_lite.store.db import Connection, Database
from picpeak_lite.store.queries import galleries as gallery_q
from picpeak_lite.store.queries import hotfolder as hot_q
from picpeak_lite.store.storage import Storage, open_storage

log = logging.getLogger(__name__)

TICK_SECONDS = 0.1  # how often files waiting for their quiet period are looked at again
WATCH_STEP_MS = 50  # watchfiles: changes are handed over once none came for this long ...
WATCH_DEBOUNCE_MS = 200  # ... or after this long at most, while a file keeps growing
WATCH_TIMEOUT_MS = 500  # its thread comes back this often, so that a cancellation lands within it
BATCH_FILES = 50  # files taken in one upload group (a full card found at start goes in several)
INCOMPLETE_RETRY_SECONDS = 1.0  # a quiet file that does not end yet is read again this often (a write resets it)
INCOMPLETE_WARN_SECONDS = 60.0  # a file quiet this long but still not whole is logged (once)
RESTART_SECONDS = 10.0  # a gallery's watcher that failed (folder missing, disk full) starts again after this
GALLERIES_POLL_SECONDS = 2.0  # the server notices a gallery's new or changed hot folder within this


@dataclass
class _Seen:
    size: int
    mtime_ns: int
    since: float  # trio time of the last change seen
    warned: bool = False
    retry_at: float = 0.0  # quiet but not whole yet: looked at again from then on (not at every tick)


@dataclass
class Taken:
    """One file taken: the photo it became (None when refused: ``error``), ``duplicate`` when those bytes were
    already in the gallery."""

    path: Path
    photo_id: int | None
    duplicate: bool
    error: str | None


@dataclass
class HotFolderCounts:
    files: int = 0
    photos: int = 0
    duplicates: int = 0
    errors: int = 0
    restarted_reads: int = 0  # files that changed while they were read (taken again later)
    polling: bool = False  # the watcher polls (asked to, or fell back to it)
    taken: list[Taken] = field(default_factory=list)


def _stat(path: Path) -> tuple[int, int] | None:
    try:
        st = os.stat(path)
    except (FileNotFoundError, NotADirectoryError):
        return None
    return st.st_size, st.st_mtime_ns


def _stat_all(paths: list[Path]) -> list[tuple[int, int] | None]:
    return [_stat(p) for p in paths]


def _check_due(paths: list[Path]) -> list[tuple[tuple[int, int] | None, bool]]:
    """Each file's (size, mtime) after the check (None for one that went) and whether it looks whole."""
    out: list[tuple[tuple[int, int] | None, bool]] = []
    for path in paths:
        before = _stat(path)
        whole = False
        if before is not None:
            try:
                whole = looks_whole(path)
            except OSError:
                whole = False
        after = _stat(path)
        out.append((after, whole and after == before))  # a write during the check: not whole yet
    return out


def _look(folder: Path, paths: list[Path]) -> list[tuple[str, tuple[int, int] | None]]:
    """What reported paths are now: a file's (relative path, (size, mtime_ns)), None for one that went. A new
    folder is walked: files written into it before its own watch was added (inotify adds it only once the
    folder's creation is seen) would otherwise never be reported."""
    out: list[tuple[str, tuple[int, int] | None]] = []
    for path in paths:
        if path.is_dir() and not path.is_symlink():
            out.extend((rel, (size, mtime_ns)) for rel, size, mtime_ns in _scan(folder, path))
        elif importer.wanted(folder, path):
            out.append((path.relative_to(folder).as_posix(), _stat(path)))
    return out


def _scan(folder: Path, under: Path | None = None) -> list[tuple[str, int, int]]:
    """Every wanted file under ``folder`` (or its subfolder ``under``) now: (relative path, size, mtime_ns)."""
    if under is not None and not importer.wanted(folder, under / "x.jpg"):
        return []  # a hidden or system folder
    try:
        images, _, _ = importer.find_images(under or folder)
    except ConfigError:
        return []  # gone again
    except OSError:
        return []
    found = []
    for path in images:
        st = _stat(path)
        if st is not None:
            found.append((path.relative_to(folder).as_posix(), *st))
    return found


class HotFolder:
    """One gallery's folder, watched until cancelled. ``on_commit`` is called after new photos' rows are
    committed (the server rings its workers' bell), ``on_taken`` with each batch taken (the CLI prints it)."""

    def __init__(self, *, db: Database, storage: Storage, settings: Settings, gallery_id: int, folder: Path,
                 clock: Callable[[], float] = time.time, on_commit: Callable[[], None] = lambda: None,
                 on_taken: Callable[[list[Taken]], None] = lambda _: None, polling: bool | None = None,
                 in_place: bool = False) -> None:
        self.db = db
        self.storage = storage
        self.settings = settings
        self.gallery_id = gallery_id
        self.folder = folder
        self.clock = clock
        self.on_commit = on_commit
        self.on_taken = on_taken
        self.polling = polling
        self.in_place = in_place
        self.counts = HotFolderCounts()
        self._seen: dict[str, _Seen] = {}
        self._taken: dict[str, tuple[int, int]] = {}
        self._changed = trio.Event()

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Ready once the watcher runs and the files already there (written while nothing watched) are known."""
        if not await trio.to_thread.run_sync(self.folder.is_dir):
            raise ConfigError(f"{str(self.folder)!r} is not a folder")
        if self.in_place and self.storage.kind != "local":
            raise ConfigError("originals can be referenced in place only with local storage (this server uses a "
                              "bucket); watch without --in-place to copy them")
        self._taken = await self.db.read(hot_q.taken, self.gallery_id)
        async with trio.open_nursery() as nursery:
            await nursery.start(self._watch)
            # After the watcher started, so that a file written in between is seen by one or the other.
            for rel, size, mtime_ns in await trio.to_thread.run_sync(_scan, self.folder):
                self._note(rel, (size, mtime_ns))
            task_status.started()
            await self._settle()

    def _note(self, rel: str, st: tuple[int, int] | None) -> None:
        """A file was reported (created, written, renamed here) or found: it waits for its quiet period."""
        if st is None:
            self._seen.pop(rel, None)
            return
        if self._taken.get(rel) == st:
            return  # taken before (this run or an earlier one), unchanged since
        seen = self._seen.get(rel)
        if seen is None or (seen.size, seen.mtime_ns) != st:
            self._seen[rel] = _Seen(st[0], st[1], trio.current_time())
            self._changed.set()

    async def _watch(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        polling = self.polling
        self.counts.polling = bool(polling)
        started = False
        while True:
            try:
                async for changes in awatch(self.folder, watch_filter=self._wanted, debounce=WATCH_DEBOUNCE_MS,
                                            step=WATCH_STEP_MS, rust_timeout=WATCH_TIMEOUT_MS,
                                            yield_on_timeout=True, force_polling=polling,
                                            ignore_permission_denied=True):
                    if not started:
                        started = True
                        task_status.started()
                    paths = sorted({p for change, p in changes})
                    if paths:
                        found = await trio.to_thread.run_sync(_look, self.folder, [Path(p) for p in paths])
                        for rel, st in found:
                            self._note(rel, st)
                # The watcher ended by itself: the folder went (deleted, unmounted). Said, so that the server's
                # HotFolders starts it again once the folder is back, and `watch` stops with the reason.
                raise ConfigError(f"{str(self.folder)!r} can no longer be watched (removed or unmounted?)")
            except (OSError, RuntimeError) as error:
                if polling:
                    raise
                # No inotify here (a network mount, a container) or its watch limit is reached: poll instead.
                log.warning("hot folder %s: watching by events failed (%s); polling the folder instead",
                            self.folder, error)
                polling = True
                self.counts.polling = True

    def _wanted(self, change: Change, path: str) -> bool:
        """Files we take, and folders (a card's new ``DCIM/101CANON``: see :func:`_look`)."""
        return importer.wanted(self.folder, Path(path)) or importer.wanted(self.folder, Path(path) / "x.jpg")

    async def _settle(self) -> None:
        settle = self.settings.hot_folder_settle_seconds
        while True:
            if not self._seen:
                self._changed = trio.Event()
                await self._changed.wait()
            await trio.sleep(TICK_SECONDS)
            now = trio.current_time()
            due = sorted(rel for rel, seen in self._seen.items()
                         if now - seen.since >= settle and now >= seen.retry_at)[:BATCH_FILES]
            if not due:
                continue
            checked = await trio.to_thread.run_sync(_check_due, [self.folder / rel for rel in due])
            ready: list[tuple[str, int, int]] = []
            for rel, (st, whole) in zip(due, checked, strict=True):
                seen = self._seen.get(rel)
                if seen is None:
                    continue
                if st is None or (seen.size, seen.mtime_ns) != st:
                    self._note(rel, st)  # written again (or gone): its quiet period starts over
                    continue
                if whole:
                    ready.append((rel, *st))
                    continue
                seen.retry_at = now + INCOMPLETE_RETRY_SECONDS
                if not seen.warned and now - seen.since >= INCOMPLETE_WARN_SECONDS:
                    seen.warned = True
                    log.warning("hot folder %s: %s has not changed for %.0f s but does not end like a whole file "
                                "yet; it is taken once it does", self.folder, rel, now - seen.since)
            if ready:
                await self._take(ready)

    async def _take(self, ready: list[tuple[str, int, int]]) -> None:
        """Read the files through the intake and commit their rows in one upload group, unless one of them
        changed while it was read (then nothing is kept, and they are taken again once quiet)."""
        gallery = await self.db.read(gallery_q.get, self.gallery_id)
        if gallery is None:
            raise NotFound("The gallery of this hot folder was deleted.")
        limits = Limits(self.settings.admin_max_file_mb * MB, None)
        with Intake(db=self.db, storage=self.storage, settings=self.settings, gallery=gallery, limits=limits,
                    clock=self.clock) as intake:
            take = importer.refer_file if self.in_place else importer.receive_file
            entries = [await take(intake, self.folder / rel) for rel, _, _ in ready]
            after = await trio.to_thread.run_sync(_stat_all, [self.folder / rel for rel, _, _ in ready])
            moved = [(rel, st) for (rel, size, mtime_ns), st in zip(ready, after, strict=True)
                     if st != (size, mtime_ns)]
            if moved:
                for rel, st in moved:
                    log.info("hot folder %s: %s changed while it was read; taken again once it is quiet",
                             self.folder, rel)
                    self._seen.pop(rel, None)
                    self._note(rel, st)
                self.counts.restarted_reads += len(moved)
                return  # the intake's exit removes what it stored: no row points at it
            await intake.commit(partial(_authorize, gallery_id=self.gallery_id), uploaded_by="admin")
        records = []
        taken = []
        for (rel, size, mtime_ns), entry in zip(ready, entries, strict=True):
            records.append((rel, size, mtime_ns, entry.photo_id, entry.error))
            taken.append(Taken(self.folder / rel, entry.photo_id, entry.duplicate, entry.error))
            if entry.error is not None:
                log.warning("hot folder %s: %s refused: %s", self.folder, rel, entry.error)
        await self.db.write(hot_q.record, self.gallery_id, records, self.clock())
        for rel, size, mtime_ns in ready:
            self._taken[rel] = (size, mtime_ns)
            seen = self._seen.get(rel)
            if seen is not None and (seen.size, seen.mtime_ns) == (size, mtime_ns):
                del self._seen[rel]
        c = self.counts
        c.files += len(taken)
        c.photos += sum(1 for t in taken if t.photo_id is not None and not t.duplicate)
        c.duplicates += sum(1 for t in taken if t.duplicate)
        c.errors += sum(1 for t in taken if t.error is not None)
        c.taken.extend(taken)
        self.on_commit()
        self.on_taken(taken)


def _authorize(conn: Connection, *, gallery_id: int) -> dict[str, Any]:
    row = gallery_q.get(conn, gallery_id)
    if row is None:
        raise NotFound("The gallery of this hot folder was deleted.")
    return row


class HotFolders:
    """The server's watchers: one :class:`HotFolder` per gallery with a ``hot_folder``, started, changed and
    stopped as galleries are edited (looked up every :data:`GALLERIES_POLL_SECONDS`). A watcher that fails
    (the folder is not there yet, a full disk) is logged and started again after :data:`RESTART_SECONDS`; the
    server goes on."""

    def __init__(self, svc: Any, *, poll_seconds: float = GALLERIES_POLL_SECONDS) -> None:
        self.svc = svc
        self.poll_seconds = poll_seconds
        self.running: dict[int, tuple[tuple[str, bool], trio.CancelScope]] = {}

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        async with trio.open_nursery() as nursery:
            await self._sync(nursery)
            task_status.started()
            while True:
                await trio.sleep(self.poll_seconds)
                await self._sync(nursery)

    async def _sync(self, nursery: trio.Nursery) -> None:
        rows = await self.svc.db.read(hot_q.watched_galleries)
        wanted = {r["id"]: (r["hot_folder"], bool(r["hot_folder_in_place"])) for r in rows}
        for gallery_id, (folder, scope) in list(self.running.items()):
            if wanted.get(gallery_id) != folder:
                scope.cancel()
                del self.running[gallery_id]
        for gallery_id, (folder, in_place) in wanted.items():
            if gallery_id not in self.running:
                scope = trio.CancelScope()
                self.running[gallery_id] = ((folder, in_place), scope)
                nursery.start_soon(self._keep, gallery_id, folder, in_place, scope)

    async def _keep(self, gallery_id: int, folder: str, in_place: bool, scope: trio.CancelScope) -> None:
        svc = self.svc
        with scope:
            while True:
                try:
                    path = gallery_fields.hot_folder_path(svc.settings.hot_folder_root, folder)
                    watcher = HotFolder(db=svc.db, storage=svc.storage, settings=svc.settings,
                                        gallery_id=gallery_id, folder=path, clock=svc.clock,
                                        on_commit=svc.workers_bell.ring, in_place=in_place)
                    log.info("hot folder %s: watching for gallery %d", path, gallery_id)
                    await watcher.run()
                except (ConfigError, gallery_fields.Invalid) as problem:
                    log.warning("hot folder of gallery %d: %s; trying again in %.0f s", gallery_id, problem,
                                RESTART_SECONDS)
                except Exception:
                    log.exception("hot folder of gallery %d failed; starting again in %.0f s", gallery_id,
                                  RESTART_SECONDS)
                await trio.sleep(RESTART_SECONDS)


async def watch_folder(settings: Settings, folder: Path, slug: str, *, polling: bool | None = None,
                       in_place: bool = False,
                       on_taken: Callable[[list[Taken]], None] = lambda _: None,
                       task_status: trio.TaskStatus[HotFolder] = trio.TASK_STATUS_IGNORED) -> None:
    """``picpeak-lite watch``: watch ``folder`` for the gallery ``slug`` on the data directory directly (as
    ``import`` does); the server or ``picpeak-lite worker`` processes the photos (its change feed sees the rows)."""
    await trio.to_thread.run_sync(bootstrap.prepare, settings)
    storage = open_storage(settings)
    await trio.to_thread.run_sync(storage.check_access)
    await trio.to_thread.run_sync(storage.create_dirs)
    db = Database(settings.database_path, readers=1)
    try:
        gallery = await db.read(gallery_q.get_by_slug, slug)
        if gallery is None:
            raise ConfigError(f"there is no gallery with the slug {slug!r}")
        watcher = HotFolder(db=db, storage=storage, settings=settings, gallery_id=gallery["id"], folder=folder,
                            on_taken=on_taken, polling=polling, in_place=in_place)
        async with trio.open_nursery() as nursery:
            await nursery.start(watcher.run)
            task_status.started(watcher)
    finally:
        db.close()
