"""``picpeak-lite import <folder> --gallery <slug>``: add a folder of photos, with its subfolders (a camera
card's ``DCIM/100CANON``), to a gallery.

Every file goes through the same code as an upload (:mod:`.intake`): streamed to a temp file with its sha256,
the same duplicate check, the same header check, the same durable move into storage, the same rows
(``uploaded_by='admin'``, ``pending``, for the workers). So a second run finds everything by sha256 and adds
nothing. The import works on the data directory directly and does not need the server; if the server is
running it simply sees new pending rows (WAL and the busy timeout let both write).

Rows are committed in batches (:data:`BATCH_FILES` files or :data:`BATCH_BYTES` bytes), all under one upload
group per run, so an interrupted import keeps what was committed, and a re-run adds the rest.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

import trio

from picpeak_lite.config import Settings
from picpeak_lite.errors import ConfigError, NotFound
from picpeak_lite.ops import bootstrap
from picpeak_lite.pipeline.intake import MB, Entry, Intake, Limits, io_limiter
from picpeak_lite.store.db import Connection, Database
from picpeak_lite.store.queries import galleries as gallery_q
from picpeak_lite.store.storage import file_sha256, open_storage

EXTENSIONS = frozenset({".jpg", ".jpeg", ".jpe", ".png", ".webp", ".heic", ".heif", ".mp4", ".mov", ".m4v", ".webm"})
BATCH_FILES = 50
BATCH_BYTES = 512 * MB
READ_SIZE = MB


@dataclass(frozen=True)
class ImportProgress:
    """One file handled. ``status`` is 'added' (stored; its row is committed with its batch), 'duplicate'
    or 'error' (then ``error`` says why). The summary has the final word."""

    done: int
    total: int
    path: Path
    status: str
    error: str | None = None


@dataclass
class ImportSummary:
    added: int = 0
    duplicates: int = 0
    errors: list[tuple[Path, str]] = field(default_factory=list)
    ignored: int = 0  # files without an image extension, or hidden: not looked at
    skipped_folders: list[Path] = field(default_factory=list)  # hidden or system folders, relative to the folder
    upload_id: str | None = None


Progress = Callable[[ImportProgress], None]


def run_import(settings: Settings, folder: str | os.PathLike[str], slug: str,
               progress: Progress = lambda _: None) -> ImportSummary:
    """The CLI's entry point: sync, runs its own event loop. Raises ConfigError for a bad folder or slug."""
    return trio.run(import_folder, settings, Path(folder), slug, progress)


# Folders a card, a Mac, Windows or a NAS adds that hold no photos of the shoot: the camera's print orders
# (DCF's MISC), the Trash, the search index, the recycle bin, archive leftovers, thumbnails. Hidden folders
# (a leading dot) are skipped too. Compared without case: cards are FAT.
SYSTEM_FOLDERS = frozenset({"misc", "system volume information", "$recycle.bin", "__macosx", "@eadir"})


def wanted(folder: Path, path: Path) -> bool:
    """Whether :func:`find_images` would list ``path`` (a file under ``folder``): an image's extension, no
    leading dot in its name or any folder on the way, no system folder. So temporaries such as ``IMG_1.JPG.part``,
    FileZilla's ``.filepart``, rsync's ``.IMG_1.JPG.x7Gq`` and ProFTPD's ``.in.IMG_1.JPG.`` are never taken."""
    try:
        parts = path.relative_to(folder).parts
    except ValueError:
        return False
    if not parts or any(p.startswith(".") for p in parts) or any(p.lower() in SYSTEM_FOLDERS for p in parts[:-1]):
        return False
    return Path(parts[-1]).suffix.lower() in EXTENSIONS


def find_images(folder: Path) -> tuple[list[Path], int, list[Path]]:
    """The images in ``folder`` and its subfolders (by extension; the content is checked later), a camera
    card's ``DCIM/100CANON/...`` as much as a flat folder, in a stable order: each folder's files by name, then
    its subfolders by name. Returns them, how many other files were ignored, and the hidden or system folders
    skipped (relative to ``folder``), so that the summary can say so. Links to folders are not followed."""
    if not folder.is_dir():
        raise ConfigError(f"{str(folder)!r} is not a folder")
    images: list[Path] = []
    ignored = 0
    skipped: list[Path] = []
    pending = [folder]
    while pending:
        current = pending.pop()
        entries = sorted(os.scandir(current), key=lambda e: e.name)
        subfolders = []
        for entry in entries:
            if entry.is_dir(follow_symlinks=False):
                if entry.name.startswith(".") or entry.name.lower() in SYSTEM_FOLDERS:
                    skipped.append(Path(entry.path).relative_to(folder))
                else:
                    subfolders.append(Path(entry.path))
            elif not entry.is_file():
                continue
            elif entry.name.startswith(".") or Path(entry.name).suffix.lower() not in EXTENSIONS:
                ignored += 1
            else:
                images.append(Path(entry.path))
        pending.extend(reversed(subfolders))  # the first by name is walked next
    return images, ignored, skipped


async def import_folder(settings: Settings, folder: Path, slug: str, progress: Progress) -> ImportSummary:
    paths, ignored, skipped = find_images(folder)
    summary = ImportSummary(ignored=ignored, skipped_folders=skipped)
    await trio.to_thread.run_sync(bootstrap.prepare, settings)
    storage = open_storage(settings)
    await trio.to_thread.run_sync(storage.check_access)
    await trio.to_thread.run_sync(storage.create_dirs)
    db = Database(settings.database_path, readers=1)
    try:
        gallery = await db.read(gallery_q.get_by_slug, slug)
        if gallery is None:
            raise ConfigError(f"there is no gallery with the slug {slug!r}")
        authorize = partial(_gallery, gallery_id=gallery["id"])
        limits = Limits(settings.admin_max_file_mb * MB, None)
        with Intake(db=db, storage=storage, settings=settings, gallery=gallery, limits=limits,
                    clock=time.time) as intake:
            batch: list[tuple[Path, Entry]] = []
            batch_bytes = 0
            for done, path in enumerate(paths, 1):
                entry = await receive_file(intake, path)
                batch.append((path, entry))
                batch_bytes += entry.size
                status = "error" if entry.error else "duplicate" if entry.duplicate else "added"
                progress(ImportProgress(done, len(paths), path, status, entry.error))
                if len(batch) >= BATCH_FILES or batch_bytes >= BATCH_BYTES:
                    await _commit(intake, authorize, batch, summary)
                    batch, batch_bytes = [], 0
            await _commit(intake, authorize, batch, summary)
            summary.upload_id = intake.upload_id
    finally:
        db.close()
    return summary


def _gallery(conn: Connection, *, gallery_id: int) -> dict[str, Any]:
    row = gallery_q.get(conn, gallery_id)
    if row is None:
        raise NotFound("The gallery was deleted during the import.")
    return row


async def receive_file(intake: Intake, path: Path) -> Entry:
    """One file on disk through the intake (streamed, hashed, checked, stored); shared with ``ops/hotfolder.py``."""
    sink = intake.start_file(path.name)
    try:
        f = await trio.to_thread.run_sync(open, path, "rb", limiter=io_limiter())
        try:
            while chunk := await trio.to_thread.run_sync(f.read, READ_SIZE, limiter=io_limiter()):
                await sink.write(chunk)
        finally:
            f.close()
    except OSError as error:  # reading the source only: writes raise InsufficientStorage or propagate
        sink.discard()
        return intake.add_error(path.name, f"Could not read the file: {error.strerror or error}", 400)
    entry = await intake.finish_file(sink)
    assert entry is not None  # only a nameless empty form part yields None
    return entry


async def refer_file(intake: Intake, path: Path) -> Entry:
    """One file on disk through the intake's checks, referenced where it is instead of copied (a hot folder in
    place, ``ops/hotfolder.py``): hashed by reading it, then linked; the file itself is never written."""
    try:
        size = (await trio.to_thread.run_sync(path.stat, limiter=io_limiter())).st_size
        sha256 = await trio.to_thread.run_sync(file_sha256, path, limiter=io_limiter())
    except OSError as error:
        return intake.add_error(path.name, f"Could not read the file: {error.strerror or error}", 400)
    sink = intake.refer_file(path.name, path, size, sha256)
    entry = await intake.finish_file(sink)
    assert entry is not None
    return entry


async def _commit(intake: Intake, authorize: Any, batch: list[tuple[Path, Entry]], summary: ImportSummary) -> None:
    """Write the batch's rows; the summary counts what the transaction decided (it re-checks duplicates)."""
    await intake.commit(authorize, uploaded_by="admin")
    for path, entry in batch:
        if entry.error is not None:
            summary.errors.append((path, entry.error))
        elif entry.duplicate:
            summary.duplicates += 1
        else:
            summary.added += 1
