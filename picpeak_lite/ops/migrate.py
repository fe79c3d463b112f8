"""``picpeak-lite storage migrate --to s3|local``: move a library's files between local storage and a bucket.

Object by object, under the same names (``store/storage.py``): each is read from the storage in force, written
to the other (a bucket verifies it by its checksums, ``store/s3.py``), and every original's sha256 is checked
against its row on the way. Resumable: an object the target already holds with the same size is kept (an
original only after its sha256 there is checked too), so a run that was interrupted (Ctrl-C, a lost
connection) is simply started again. An object that cannot be copied stops the run with one sentence
(``CommandFailed``; an unreachable bucket is ``StorageUnavailable``), the setting unchanged. Only when every
photo's original is in the target is the ``storage`` setting switched in the config file; the source's copies
are left where they are (remove them once the server runs happily from the target).

The server must be stopped meanwhile, and the command refuses to start while it answers on its address: the
server reads ``storage`` only when it starts, so every photo uploaded and every thumbnail made during the copy
would go to the old storage after it was listed and be missing once the setting is switched.
"""

from __future__ import annotations

import dataclasses
import hashlib
import os
import re
import socket
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from picpeak_lite.config import Settings
from picpeak_lite.errors import AppError, CommandFailed, ConfigError, StorageUnavailable
from picpeak_lite.store import db, packing
from picpeak_lite.store.queries import photos as photo_q
from picpeak_lite.store.storage import COPY_CHUNK, Storage, disk_errors, key_of, open_storage, remove_quietly

Progress = Callable[[int, int, str], None]
SERVER_RUNNING = ("the server is answering at {address}: stop it (and any `picpeak-lite worker`) first. It reads "
                  "the storage setting only when it starts, so photos uploaded and thumbnails made during the copy "
                  "would go to the old storage and be missing after the switch.")


@dataclass
class MigrateSummary:
    source: str = ""
    target: str = ""
    objects: int = 0
    copied: int = 0
    kept: int = 0  # already in the target (a resumed run)
    bytes_copied: int = 0
    orphans_skipped: int = 0  # originals without a row: not carried over
    missing_originals: list[int] = field(default_factory=list)  # rows whose original is in neither storage
    sha_mismatch: list[int] = field(default_factory=list)  # the stored bytes differ from the row's sha256
    switched: str | None = None  # the config file whose storage setting was changed

    @property
    def problems(self) -> int:
        return len(self.missing_originals) + len(self.sha_mismatch)


def migrate(settings: Settings, to: str, config_file: Path | None, progress: Progress | None = None,
            *, check_server: bool = True) -> MigrateSummary:
    if to not in ("local", "s3"):
        raise ConfigError(f"--to must be local or s3 (got {to!r})")
    if settings.storage == to:
        raise ConfigError(f"the storage setting is already {to!r}; nothing to migrate")
    if not settings.database_url and not settings.database_path.exists():
        raise ConfigError(f"no database in {str(settings.data_path)!r}; is --data-dir right?")
    if to == "s3" and not settings.s3_bucket:
        raise ConfigError("set s3_bucket (and s3_endpoint_url, s3_region, credentials) in the config file first; "
                          "the command then copies into that bucket")
    if check_server:
        refuse_if_serving(settings)
    source = open_storage(settings)
    target = open_storage(dataclasses.replace(settings, storage=to))
    source.check_access()
    target.check_access()
    source.create_dirs()
    target.create_dirs()
    summary = MigrateSummary(source=source.describe(), target=target.describe())
    conn = db.connect(settings.database)
    try:
        with db.transaction(conn, immediate=False):
            rows = photo_q.rows_for_check(conn)
    finally:
        conn.close()
    sha_of = {r["storage_key"]: r["sha256"] for r in rows}
    ids = {r["storage_key"]: r["id"] for r in rows}
    names = [name for prefix in ("originals/", "derived/") for name, _ in source.list_objects(prefix)]
    summary.objects = len(names)
    copied_originals = set()
    for done, name in enumerate(names, 1):
        if progress is not None:
            progress(done, len(names), name)
        key = key_of(name)
        if key is None:
            continue
        is_original = name.startswith("originals/")
        if key not in sha_of:
            summary.orphans_skipped += is_original
            continue
        expected = sha_of[key] if is_original else None
        try:
            copied = _copy_one(source, target, name, expected)
        except FileNotFoundError:  # removed since the listing (a cached watermark replaced): nothing to move
            continue
        except _Mismatch:
            summary.sha_mismatch.append(ids[key])
            continue
        except StorageUnavailable:
            raise  # the CLI's one line and EX_TEMPFAIL: the same command goes on once the bucket answers
        except (OSError, AppError) as error:
            reason = error.message if isinstance(error, AppError) else (error.strerror or str(error))
            raise CommandFailed(f"could not copy {name} from {summary.source} to {summary.target} ({reason}); "
                                "the storage setting was not changed: run the command again to go on from "
                                "there") from error
        if copied is None:
            summary.kept += 1
        else:
            summary.copied += 1
            summary.bytes_copied += copied
        if is_original:
            copied_originals.add(key)
    copied_originals |= _copy_archives(source, target, rows, summary)
    for row in rows:
        if row["storage_key"] not in copied_originals and row["status"] != "failed" \
                and row["id"] not in summary.sha_mismatch:
            summary.missing_originals.append(row["id"])
    if summary.problems == 0:
        summary.switched = switch_setting(config_file, to)
    return summary


class _Mismatch(Exception):
    pass


def _copy_archives(source: Storage, target: Storage, rows: list[Any], summary: MigrateSummary) -> set[str]:
    """Copy each archived gallery's archive object (pipeline/archive.py) and read the copy back against its
    manifest and the rows. Returns the keys of the originals it holds that are not loose (moved with it)."""
    packed: dict[str, dict[str, str]] = {}
    for row in rows:
        if row["archived"] and row["archive_object"] is not None:
            packed.setdefault(row["archive_object"], {})[row["storage_key"]] = row["sha256"]
    moved: set[str] = set()
    for name, shas in sorted(packed.items()):
        loose = {key for key in shas if source.has_original(key)}  # copied above already, or missing
        inside = {key: sha for key, sha in shas.items() if key not in loose}
        try:
            copied = _copy_one(source, target, name, None)
            packing.read_back(target, name, inside)
        except FileNotFoundError:
            continue  # its photos are reported missing
        except packing.ArchiveMismatch:
            summary.sha_mismatch.extend(r["id"] for r in rows if r["storage_key"] in inside)
            continue
        except StorageUnavailable:
            raise
        except (OSError, AppError) as error:
            reason = error.message if isinstance(error, AppError) else (error.strerror or str(error))
            raise CommandFailed(f"could not copy {name} from {summary.source} to {summary.target} ({reason}); "
                                "the storage setting was not changed: run the command again to go on from "
                                "there") from error
        summary.objects += 1
        if copied is None:
            summary.kept += 1
        else:
            summary.copied += 1
            summary.bytes_copied += copied
        moved |= set(inside)
    return moved


def _copy_one(source: Storage, target: Storage, name: str, sha256: str | None) -> int | None:
    """Copy one object unless the target has it already (None); returns the bytes copied."""
    size = source.stat(name).size
    try:
        there = target.stat(name)
    except FileNotFoundError:
        there = None
    if there is not None and there.size == size and (sha256 is None or target.sha256_of(name) == sha256):
        return None
    temp = target.new_temp_path()
    digest = hashlib.sha256()
    try:
        target.ensure_space(size)
        with disk_errors(), source.open(name) as src, open(temp, "xb") as out:
            while chunk := src.read(COPY_CHUNK):
                digest.update(chunk)
                out.write(chunk)
            out.flush()
            os.fsync(out.fileno())
        if sha256 is not None and digest.hexdigest() != sha256:
            raise _Mismatch(name)
        target.put_file(temp, name, digest.hexdigest())
    finally:
        remove_quietly(temp)
    return size


def switch_setting(config_file: Path | None, to: str) -> str:
    """Set ``storage = "<to>"`` in the config file (replacing the line, or adding it before any table)."""
    if config_file is None:
        raise ConfigError(f"every file is copied, but there is no config file to switch: set storage = \"{to}\" "
                          "in picpeak.toml (or PICPEAK_STORAGE) before starting the server")
    return set_setting(config_file, "storage", f'"{to}"')


def set_setting(config_file: Path, key: str, value: str) -> str:
    """Set the top-level ``key = value`` (``value`` already in TOML, e.g. a quoted string) in the config file,
    replacing its line or adding it before any table; written to a new file that then replaces the old one."""
    text = config_file.read_text()
    line = f"{key} = {value}"
    pattern = re.compile(rf"^{re.escape(key)}\s*=.*$", re.MULTILINE)
    table = re.search(r"^\[", text, re.MULTILINE)
    head = text[:table.start()] if table else text
    replaced = pattern.sub(lambda _: line, head, count=1)  # a function: a backslash in the value is kept
    text = replaced + text[len(head):] if replaced != head or pattern.search(head) else f"{line}\n" + text
    temp = config_file.with_name(config_file.name + ".partial")
    temp.write_text(text)
    os.replace(temp, config_file)
    return str(config_file)


def refuse_if_serving(settings: Settings, message: str = SERVER_RUNNING) -> None:
    """Refuse (``message`` with the address) while something answers on the server's configured address."""
    if settings.port == 0:
        return
    host = "127.0.0.1" if settings.host in ("0.0.0.0", "::", "") else settings.host
    try:
        with socket.create_connection((host, settings.port), timeout=1):
            pass
    except OSError:
        return
    raise ConfigError(message.format(address=settings.listen_address))
