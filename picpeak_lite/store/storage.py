"""Where photo bytes live on disk, and the only code that writes them.

Layout under the data directory::

    tmp/                      uploads in flight (removed on every error path; swept after an hour)
    tmp/tus/<id>              unfinished resumable uploads (pipeline/resumable.py; they expire after a day)
    originals/ab/<key>        the uploaded bytes, byte-exact, under a key we generate (never a client name)
    derived/ab/<key>.grid.jpg
    derived/ab/<key>.view.jpg
    derived/ab/<key>.wm-<tag>.jpg  a full-size watermarked download, cached; <tag> names the watermark it carries

Durability rule: a file is written to ``tmp/``, fsynced, renamed into place atomically, and its directory is
fsynced, all before the database row that points at it is committed. A crash between the rename and the commit
leaves a file without a row, which the reconciler removes after a grace period; never a row without a file.

Sync on purpose: async code calls these through ``trio.to_thread.run_sync``.
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import os
import secrets
import shutil
import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

from picpeak_lite.errors import InsufficientStorage

DERIVATIVES = ("grid", "view")
WATERMARK_TAG_CHARS = 16  # hex characters of a hash of the watermark's parameters
TEMP_PREFIX = "up-"
# Uploads and thumbnails stop this far short of a full disk, so that the database can still commit the
# deletes that free space again: at 0 bytes free even a DELETE fails, and SQLite's WAL grows to about 4 MB
# (1000 pages) between checkpoints. min(64 MiB, a quarter of the filesystem).
RESERVE_MAX_BYTES = 64 * 1024 * 1024
RESERVE_SHARE = 0.25
DISK_FULL = "The server's disk is full; the photo was not saved."


def new_key() -> str:
    """A storage key: 32 random hex characters. Not derived from anything a client sent."""
    return secrets.token_hex(16)


@dataclass(frozen=True)
class Storage:
    root: Path

    @property
    def tmp_dir(self) -> Path:
        return self.root / "tmp"

    def create_dirs(self) -> None:
        for sub in ("tmp", "originals", "derived"):
            (self.root / sub).mkdir(parents=True, exist_ok=True)

    def original_path(self, key: str) -> Path:
        _check_key(key)
        return self.root / "originals" / key[:2] / key

    def derived_path(self, key: str, kind: str) -> Path:
        _check_key(key)
        if kind not in DERIVATIVES:
            raise ValueError(f"unknown derivative {kind!r}")
        return self.root / "derived" / key[:2] / f"{key}.{kind}.jpg"

    def watermarked_path(self, key: str, tag: str) -> Path:
        """The cached watermarked download of ``key`` for the watermark ``tag`` names (see WATERMARK_TAG_CHARS)."""
        _check_key(key)
        if len(tag) != WATERMARK_TAG_CHARS or any(c not in "0123456789abcdef" for c in tag):
            raise ValueError(f"not a watermark tag: {tag!r}")
        return self.root / "derived" / key[:2] / f"{key}.wm-{tag}.jpg"

    def new_temp_path(self) -> Path:
        return self.tmp_dir / f"{TEMP_PREFIX}{secrets.token_hex(12)}"

    def commit_original(self, temp: Path, key: str) -> Path:
        """fsync ``temp``, rename it to the original's place, fsync the directory. Returns the final path."""
        target = self.original_path(key)
        with disk_errors():
            fsync_file(temp)
            target.parent.mkdir(exist_ok=True)
            os.replace(temp, target)
            fsync_dir(target.parent)
        return target

    def ensure_space(self, incoming: int) -> None:
        """Refuse (507) to write ``incoming`` more bytes into the reserve (see RESERVE_MAX_BYTES)."""
        stat = os.statvfs(self.root)
        reserve = min(RESERVE_MAX_BYTES, int(stat.f_blocks * stat.f_frsize * RESERVE_SHARE))
        if stat.f_bavail * stat.f_frsize - incoming < reserve:
            raise InsufficientStorage(DISK_FULL)

    def write_derivative(self, key: str, kind: str, data: bytes) -> Path:
        """Write a derivative atomically (temp file, fsync, rename, fsync dir)."""
        return self._write_atomic(self.derived_path(key, kind), data)

    def write_watermarked(self, key: str, tag: str, data: bytes) -> Path:
        """Write the cached watermarked download atomically, and remove the copies made for earlier watermarks."""
        target = self._write_atomic(self.watermarked_path(key, tag), data)
        for stale in self._watermarked_files(key):
            if stale != target:
                remove_quietly(stale)
        return target

    def _write_atomic(self, target: Path, data: bytes) -> Path:
        self.ensure_space(len(data))
        temp = self.new_temp_path()
        with disk_errors():
            try:
                with open(temp, "wb") as f:
                    f.write(data)
                    f.flush()
                    os.fsync(f.fileno())
                target.parent.mkdir(exist_ok=True)
                os.replace(temp, target)
                fsync_dir(target.parent)
            finally:
                remove_quietly(temp)
        return target

    def remove_photo_files(self, key: str) -> None:
        """Remove an original, its derivatives and its cached watermarked downloads; missing files are fine."""
        remove_quietly(self.original_path(key))
        for kind in DERIVATIVES:
            remove_quietly(self.derived_path(key, kind))
        for path in self._watermarked_files(key):
            remove_quietly(path)

    def remove_files_of(self, keys: Iterable[str]) -> None:
        """:meth:`remove_photo_files` for each key: one thread hop for a gallery or a selection."""
        for key in keys:
            self.remove_photo_files(key)

    def _watermarked_files(self, key: str) -> list[Path]:
        _check_key(key)
        return list((self.root / "derived" / key[:2]).glob(f"{key}.wm-*.jpg"))

    def iter_original_keys(self) -> Iterator[tuple[str, float]]:
        """Every stored original as (key, mtime)."""
        for entry in _shard_files(self.root / "originals"):
            if _is_key(entry.name):
                yield entry.name, entry.stat().st_mtime

    def iter_derived(self) -> Iterator[tuple[str, Path, float]]:
        """Every derivative file as (key, path, mtime)."""
        for entry in _shard_files(self.root / "derived"):
            key = entry.name.split(".", 1)[0]
            if _is_key(key):
                yield key, Path(entry.path), entry.stat().st_mtime

    def sweep_temp(self, max_age: float, now: float | None = None) -> int:
        """Remove temp files older than ``max_age`` seconds (left by a crash mid-upload). Returns the count."""
        now = time.time() if now is None else now
        removed = 0
        if not self.tmp_dir.exists():
            return 0
        for entry in os.scandir(self.tmp_dir):
            try:
                if entry.is_file() and now - entry.stat().st_mtime > max_age:
                    os.unlink(entry.path)
                    removed += 1
            except FileNotFoundError:
                pass
        return removed

    def disk_usage(self) -> shutil._ntuple_diskusage:
        return shutil.disk_usage(self.root)


def file_sha256(path: Path, chunk: int = 1024 * 1024) -> str:
    """The sha256 of a stored file, read in steps (originals may be gigabytes)."""
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(chunk):
            digest.update(block)
    return digest.hexdigest()


def fsync_file(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def remove_quietly(path: Path) -> None:
    with contextlib.suppress(FileNotFoundError):
        os.unlink(path)


@contextlib.contextmanager
def disk_errors() -> Iterator[None]:
    """Turn 'no space left' into a 507 with a clear message; let every other OSError through."""
    try:
        yield
    except OSError as error:
        if error.errno in (errno.ENOSPC, errno.EDQUOT):
            raise InsufficientStorage(DISK_FULL) from error
        raise


def _shard_files(base: Path) -> Iterator[os.DirEntry[str]]:
    """The files in the two-character shard folders under ``base``."""
    if not base.exists():
        return
    for shard in base.iterdir():
        if shard.is_dir():
            yield from (entry for entry in os.scandir(shard) if entry.is_file())


def _is_key(name: str) -> bool:
    return len(name) == 32 and all(c in "0123456789abcdef" for c in name)


def _check_key(key: str) -> None:
    if not _is_key(key):
        raise ValueError(f"not a storage key: {key!r}")
