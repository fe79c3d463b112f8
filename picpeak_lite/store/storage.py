"""Where photo bytes live, behind one interface, and the only code that writes them.

:class:`Storage` is the interface every caller uses; ``settings.storage`` picks the implementation
(:func:`open_storage`): :class:`LocalStorage` (the default, files under the data directory) or
``store/s3.py``'s ``S3Storage`` (objects in an S3-compatible bucket). Callers name stored things by their
*object name*, the same in both: ``originals/ab/<key>``, ``derived/ab/<key>.grid.jpg`` and so on, so that
backup, check and ``storage migrate`` copy between them name by name.

Layout (under the data directory, or under ``s3_prefix`` in the bucket)::

    tmp/                      uploads in flight (removed on every error path; swept after an hour); always local
    originals/ab/<key> -> /hot/folder/IMG_1.JPG   an original referenced in place (a hot folder's, local only)
    tmp/tus/<id>              unfinished resumable uploads (pipeline/resumable.py; they expire after a day)
    tus/<id>/<start>-<end>    the same as pieces in the bucket, with tus_bytes bucket (pipeline/tuspieces.py)
    originals/ab/<key>        the uploaded bytes, byte-exact, under a key we generate (never a client name)
    derived/ab/<key>.grid.jpg
    derived/ab/<key>.view.jpg
    derived/ab/<key>.wm-<tag>.jpg  a full-size watermarked download, cached; <tag> names the watermark it carries
    derived/ab/<key>.play.mp4  a video's playable H.264 preview, when browsers cannot play its original (HEVC)

Durability rule: a file is written to ``tmp/``, fsynced, then made durable under its key (locally: renamed into
place atomically and its directory fsynced; in a bucket: uploaded and its checksums verified), all before the
database row that points at it is committed. A crash between the two leaves a file without a row, which the
reconciler removes after a grace period; never a row without a file.

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
from pathlib import Path, PurePath
from typing import TYPE_CHECKING, BinaryIO, Protocol

from picpeak_lite.errors import InsufficientStorage
from picpeak_lite.i18n import N_, _

if TYPE_CHECKING:
    from picpeak_lite.config import Settings

DERIVATIVES = ("grid", "view")
WATERMARK_TAG_CHARS = 16  # hex characters of a hash of the watermark's parameters
TEMP_PREFIX = "up-"
COPY_CHUNK = 1024 * 1024
# Uploads and thumbnails stop this far short of a full disk, so that the database can still commit the
# deletes that free space again: at 0 bytes free even a DELETE fails, and SQLite's WAL grows to about 4 MB
# (1000 pages) between checkpoints. min(64 MiB, a quarter of the filesystem).
RESERVE_MAX_BYTES = 64 * 1024 * 1024
RESERVE_SHARE = 0.25
DISK_FULL = N_("The server's disk is full; the photo was not saved.")


def new_key() -> str:
    """A storage key: 32 random hex characters. Not derived from anything a client sent."""
    return secrets.token_hex(16)


def original_name(key: str) -> str:
    _check_key(key)
    return f"originals/{key[:2]}/{key}"


def derived_name(key: str, kind: str) -> str:
    _check_key(key)
    if kind not in DERIVATIVES:
        raise ValueError(f"unknown derivative {kind!r}")
    return f"derived/{key[:2]}/{key}.{kind}.jpg"


def watermarked_name(key: str, tag: str) -> str:
    """The cached watermarked download of ``key`` for the watermark ``tag`` names (see WATERMARK_TAG_CHARS)."""
    _check_key(key)
    if len(tag) != WATERMARK_TAG_CHARS or any(c not in "0123456789abcdef" for c in tag):
        raise ValueError(f"not a watermark tag: {tag!r}")
    return f"derived/{key[:2]}/{key}.wm-{tag}.jpg"


def preview_name(key: str) -> str:
    """A video's playable H.264 preview, when browsers cannot play its original."""
    _check_key(key)
    return f"derived/{key[:2]}/{key}.play.mp4"


def key_of(name: str) -> str | None:
    """The storage key an object name belongs to, or None for a name that is not one of ours."""
    key = name.rsplit("/", 1)[-1].split(".", 1)[0]
    return key if _is_key(key) and name.startswith(("originals/", "derived/")) else None


@dataclass(frozen=True)
class ObjectInfo:
    """What serving and copying need to know of a stored object without reading it."""

    size: int
    mtime: float
    etag: str  # quoted, as HTTP sends it


class LocalCopy:
    """An original as a local file for code that needs a path (Pillow, the watermark): the stored file itself
    with local storage, a temp copy with a bucket. ``close()`` (or leaving the ``with``) removes a temp copy;
    it is sync, so a cancellation cannot skip it."""

    def __init__(self, path: Path, *, temporary: bool) -> None:
        self.path = path
        self.temporary = temporary

    def close(self) -> None:
        if self.temporary:
            remove_quietly(self.path)

    def __enter__(self) -> LocalCopy:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class Storage(Protocol):
    """Stored photo files, wherever they live. Every method is sync and may block: call them in a thread.

    Missing objects raise FileNotFoundError (as files do); an unreachable store raises
    ``errors.StorageUnavailable`` (503 with Retry-After), never half-records anything.
    """

    @property
    def root(self) -> Path:
        """The data directory: the database, and tmp/ for files in flight, are always local."""
    @property
    def kind(self) -> str:
        """"local" or "s3"."""

    @property
    def tmp_dir(self) -> Path: ...
    def create_dirs(self) -> None: ...
    def check_access(self) -> None:
        """Raise ConfigError with a sentence a person can act on when the store cannot be used (at start)."""
    def describe(self) -> str: ...
    def new_temp_path(self) -> Path: ...
    def ensure_space(self, incoming: int) -> None: ...
    def sweep_temp(self, max_age: float, now: float | None = None) -> int: ...
    def disk_usage(self) -> shutil._ntuple_diskusage: ...
    # Objects by name
    def local_path(self, name: str) -> Path | None:
        """The file itself when it is a local file (served with ``send_file`` as ever); None in a bucket."""
    def location(self, name: str) -> PurePath: ...
    def exists(self, name: str) -> bool: ...
    def stat(self, name: str) -> ObjectInfo: ...
    def open(self, name: str, start: int = 0, end: int | None = None) -> BinaryIO: ...
    def read_range(self, name: str, start: int, length: int) -> bytes: ...
    def read_bytes(self, name: str) -> bytes: ...
    def local_copy(self, name: str) -> LocalCopy: ...
    def put_file(self, temp: Path, name: str, sha256: str | None = None) -> None: ...
    def put_bytes(self, name: str, data: bytes) -> None: ...
    def remove(self, name: str) -> None: ...
    def list_objects(self, prefix: str) -> Iterator[tuple[str, ObjectInfo]]: ...
    def sha256_of(self, name: str) -> str: ...
    def presigned_url(self, name: str, *, content_type: str, disposition: str | None = None) -> str | None: ...
    def presigned_origin(self) -> str | None:
        """The origin (scheme://host[:port]) of presigned URLs, None without them: the pages' CSP names it."""
    # Photo files
    def commit_original(self, temp: Path, key: str, sha256: str | None = None) -> None:
        """Make a received temp file durable as the original of ``key`` (``sha256``: what the row will say)."""
    def link_original(self, source: Path, key: str) -> None:
        """Make ``source`` (a file in a hot folder, never modified) the original of ``key``, referenced in place.
        Local storage only (a link); a bucket raises ConfigError."""
    def referenced_source(self, key: str) -> Path | None:
        """Where the original of ``key`` is referenced in place (see link_original); None for a stored copy."""
    def has_original(self, key: str) -> bool: ...
    def has_derivative(self, key: str, kind: str) -> bool: ...
    def write_derivative(self, key: str, kind: str, data: bytes) -> None: ...
    def write_watermarked(self, key: str, tag: str, data: bytes) -> str: ...
    def remove_original(self, key: str) -> None: ...
    def forget_original(self, key: str) -> None:
        """Remove an original from code that must not block (a synchronous exit on the event loop): locally an
        unlink; in a bucket a DELETE queued to a thread, whose failure leaves an orphan for the reconciler."""
    def remove_photo_files(self, key: str) -> None: ...
    def remove_files_of(self, keys: Iterable[str]) -> None: ...
    def iter_original_keys(self) -> Iterator[tuple[str, float]]: ...
    def iter_derived(self) -> Iterator[tuple[str, PurePath, float]]: ...
    def used_bytes(self, prefix: str) -> int: ...


class PhotoFiles:
    """The photo-level operations, written once over the object operations of either implementation."""

    def exists(self, name: str) -> bool:
        raise NotImplementedError

    def put_bytes(self, name: str, data: bytes) -> None:
        raise NotImplementedError

    def remove(self, name: str) -> None:
        raise NotImplementedError

    def location(self, name: str) -> PurePath:
        raise NotImplementedError

    def list_objects(self, prefix: str) -> Iterator[tuple[str, ObjectInfo]]:
        raise NotImplementedError

    def has_original(self, key: str) -> bool:
        return self.exists(original_name(key))

    def has_derivative(self, key: str, kind: str) -> bool:
        return self.exists(derived_name(key, kind))

    def write_derivative(self, key: str, kind: str, data: bytes) -> None:
        """Write a derivative atomically (a reader sees the old file or the new one, never half)."""
        self.put_bytes(derived_name(key, kind), data)

    def write_watermarked(self, key: str, tag: str, data: bytes) -> str:
        """Write the cached watermarked download atomically, and remove the copies made for earlier watermarks.
        Returns its name."""
        target = watermarked_name(key, tag)
        self.put_bytes(target, data)
        for stale in self._watermarked_names(key):
            if stale != target:
                self.remove(stale)
        return target

    def remove_original(self, key: str) -> None:
        self.remove(original_name(key))

    def forget_original(self, key: str) -> None:
        self.remove(original_name(key))

    def remove_photo_files(self, key: str) -> None:
        """Remove an original, its derivatives and its cached watermarked downloads; missing files are fine."""
        self.remove(original_name(key))
        for kind in DERIVATIVES:
            self.remove(derived_name(key, kind))
        for name in self._watermarked_names(key):
            self.remove(name)
        self.remove(preview_name(key))

    def remove_files_of(self, keys: Iterable[str]) -> None:
        """:meth:`remove_photo_files` for each key: one thread hop for a gallery or a selection."""
        for key in keys:
            self.remove_photo_files(key)

    def _watermarked_names(self, key: str) -> list[str]:
        _check_key(key)
        return [name for name, _ in self.list_objects(f"derived/{key[:2]}/{key}.wm-")]

    def iter_original_keys(self) -> Iterator[tuple[str, float]]:
        """Every stored original as (key, mtime)."""
        for name, info in self.list_objects("originals/"):
            key = name.rsplit("/", 1)[-1]
            if _is_key(key):
                yield key, info.mtime

    def iter_derived(self) -> Iterator[tuple[str, PurePath, float]]:
        """Every derivative as (key, location, mtime)."""
        for name, info in self.list_objects("derived/"):
            key = name.rsplit("/", 1)[-1].split(".", 1)[0]
            if _is_key(key):
                yield key, self.location(name), info.mtime

    def used_bytes(self, prefix: str) -> int:
        return sum(info.size for _, info in self.list_objects(prefix))


@dataclass(frozen=True)
class LocalStorage(PhotoFiles):
    """Files under the data directory: the default, and exactly how picpeak-lite always stored them."""

    root: Path
    kind = "local"

    @property
    def tmp_dir(self) -> Path:
        return self.root / "tmp"

    def create_dirs(self) -> None:
        for sub in ("tmp", "originals", "derived"):
            (self.root / sub).mkdir(parents=True, exist_ok=True)

    def check_access(self) -> None:
        """Nothing to check: the data directory is created and written at start anyway."""

    def preview_path(self, key: str) -> Path:
        """A video's playable preview as a local file (pipeline/video_previews.py makes it)."""
        return self.root / preview_name(key)

    def describe(self) -> str:
        return f"local files in {self.root}"

    def original_path(self, key: str) -> Path:
        return self.root / original_name(key)

    def derived_path(self, key: str, kind: str) -> Path:
        return self.root / derived_name(key, kind)

    def watermarked_path(self, key: str, tag: str) -> Path:
        return self.root / watermarked_name(key, tag)


    def new_temp_path(self) -> Path:
        return self.tmp_dir / f"{TEMP_PREFIX}{secrets.token_hex(12)}"

    def local_path(self, name: str) -> Path | None:
        return self.root / name

    def location(self, name: str) -> PurePath:
        return self.root / name

    def exists(self, name: str) -> bool:
        return (self.root / name).exists()

    def stat(self, name: str) -> ObjectInfo:
        st = (self.root / name).stat()
        return ObjectInfo(st.st_size, st.st_mtime, f'"{st.st_mtime_ns:x}-{st.st_size:x}"')

    def open(self, name: str, start: int = 0, end: int | None = None) -> BinaryIO:
        """The file, from ``start`` (``end`` is for the bucket's ranged reads; a reader here stops itself)."""
        f = open(self.root / name, "rb")  # noqa: SIM115 -- the caller closes it
        if start:
            f.seek(start)
        return f

    def read_range(self, name: str, start: int, length: int) -> bytes:
        with open(self.root / name, "rb") as f:
            f.seek(start)
            return f.read(length)

    def read_bytes(self, name: str) -> bytes:
        return (self.root / name).read_bytes()

    def local_copy(self, name: str) -> LocalCopy:
        path = self.root / name
        if not path.exists():
            raise FileNotFoundError(name)
        return LocalCopy(path, temporary=False)

    def sha256_of(self, name: str) -> str:
        return file_sha256(self.root / name)

    def presigned_url(self, name: str, *, content_type: str, disposition: str | None = None) -> str | None:
        return None

    def presigned_origin(self) -> str | None:
        return None

    def commit_original(self, temp: Path, key: str, sha256: str | None = None) -> None:
        """fsync ``temp``, rename it to the original's place, fsync the directory (the bytes are the ones the
        intake hashed: nothing read them since)."""
        self.put_file(temp, original_name(key))

    def put_file(self, temp: Path, name: str, sha256: str | None = None) -> None:
        target = self.root / name
        with disk_errors():
            fsync_file(temp)
            target.parent.mkdir(parents=True, exist_ok=True)
            os.replace(temp, target)
            fsync_dir(target.parent)

    def ensure_space(self, incoming: int) -> None:
        """Refuse (507) to write ``incoming`` more bytes into the reserve (see RESERVE_MAX_BYTES)."""
        ensure_space(self.root, incoming)

    def link_original(self, source: Path, key: str) -> None:
        """A symbolic link at the original's place to ``source`` (absolute), made under a temp name and renamed
        (atomic), its directory fsynced. Every read of the original (workers, downloads, zips, check, backup,
        migrate) follows it; removing the photo removes the link, never the file it points at. A file that
        vanishes from its folder is a missing original: ``check`` names it, the janitor fails its photo."""
        target = self.root / original_name(key)
        temp = self.new_temp_path()
        with disk_errors():
            try:
                temp.parent.mkdir(parents=True, exist_ok=True)
                os.symlink(Path(source).resolve(), temp)
                target.parent.mkdir(parents=True, exist_ok=True)
                os.replace(temp, target)
                fsync_dir(target.parent)
            finally:
                remove_quietly(temp)

    def referenced_source(self, key: str) -> Path | None:
        path = self.root / original_name(key)
        return Path(os.readlink(path)) if path.is_symlink() else None

    def put_bytes(self, name: str, data: bytes) -> None:
        """Write atomically (temp file, fsync, rename, fsync dir)."""
        target = self.root / name
        self.ensure_space(len(data))
        temp = self.new_temp_path()
        with disk_errors():
            try:
                with open(temp, "wb") as f:
                    f.write(data)
                    f.flush()
                    os.fsync(f.fileno())
                target.parent.mkdir(parents=True, exist_ok=True)
                os.replace(temp, target)
                fsync_dir(target.parent)
            finally:
                remove_quietly(temp)

    def remove(self, name: str) -> None:
        remove_quietly(self.root / name)

    def list_objects(self, prefix: str) -> Iterator[tuple[str, ObjectInfo]]:
        """The files whose names start with ``prefix`` (``originals/``, ``derived/``, or a file-name start)."""
        top, _, rest = prefix.partition("/")
        if top not in ("originals", "derived"):
            raise ValueError(f"not a storage prefix: {prefix!r}")
        shard, _, start = rest.partition("/")
        if shard:
            base = self.root / top / shard
            entries: Iterator[os.DirEntry[str]] = (
                (e for e in os.scandir(base) if e.is_file() and e.name.startswith(start)) if base.is_dir()
                else iter(()))
        else:
            entries = _shard_files(self.root / top)
        for entry in entries:
            try:
                st = entry.stat()
            except FileNotFoundError:
                continue
            name = f"{top}/{Path(entry.path).parent.name}/{entry.name}"
            yield name, ObjectInfo(st.st_size, st.st_mtime, "")

    def sweep_temp(self, max_age: float, now: float | None = None) -> int:
        """Remove temp files older than ``max_age`` seconds (left by a crash mid-upload). Returns the count."""
        return sweep_temp(self.tmp_dir, max_age, now)

    def disk_usage(self) -> shutil._ntuple_diskusage:
        return shutil.disk_usage(self.root)


def open_storage(settings: Settings) -> Storage:
    """The storage ``settings.storage`` names. The S3 client library is imported only when it is chosen."""
    if settings.storage == "s3":
        from picpeak_lite.store.s3 import S3Storage

        return S3Storage.from_settings(settings)
    return LocalStorage(settings.data_path)


def ensure_space(root: Path, incoming: int) -> None:
    """Refuse (507) to write ``incoming`` more bytes into the reserve (see RESERVE_MAX_BYTES)."""
    stat = os.statvfs(root)
    reserve = min(RESERVE_MAX_BYTES, int(stat.f_blocks * stat.f_frsize * RESERVE_SHARE))
    if stat.f_bavail * stat.f_frsize - incoming < reserve:
        raise InsufficientStorage(_(DISK_FULL))


def sweep_temp(tmp_dir: Path, max_age: float, now: float | None = None) -> int:
    now = time.time() if now is None else now
    removed = 0
    if not tmp_dir.exists():
        return 0
    for entry in os.scandir(tmp_dir):
        try:
            if entry.is_file() and now - entry.stat().st_mtime > max_age:
                os.unlink(entry.path)
                removed += 1
        except FileNotFoundError:
            pass
    return removed


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
            raise InsufficientStorage(_(DISK_FULL)) from error
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
