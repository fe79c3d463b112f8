"""A gallery's originals packed into one archive object, and back (pipeline/archive.py drives the steps).

The archive is a POSIX tar (``archives/gallery-<id>.tar`` in the same storage as the photos: a local file or an
object in the bucket): first ``manifest.json`` (every packed original's photo id, storage key, size and sha256,
from the rows), then each original as ``originals/<key>``. Tar rather than zip: it is written and read strictly
in order (``w|`` / ``r|``), so neither packing nor reading back holds more than a block in memory, and nothing
needs to seek in a bucket object. Originals are JPEGs and videos, already compressed: the tar is not.

Packing streams each original from the storage into a temp file (hashing it on the way: an original that no
longer matches its row stops the packing, and nothing is removed), then makes the temp file durable under the
archive's name (``Storage.put_file``: verified checksums in a bucket). :func:`read_back` reads the stored object
again and checks every member against the manifest and the rows before the caller removes anything.

Sync on purpose: async code calls these through ``trio.to_thread.run_sync``.
"""

from __future__ import annotations

import hashlib
import io
import json
import tarfile
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import BinaryIO

from picpeak_lite.store.storage import Storage, original_name, remove_quietly

MANIFEST = "manifest.json"
READ_CHUNK = 1024 * 1024
FORMAT_VERSION = 1


class ArchiveMismatch(Exception):
    """What was read does not match what was recorded; the message says which photo and how."""


@dataclass(frozen=True)
class Packed:
    photo_id: int
    key: str
    sha256: str
    size: int


def archive_name(gallery_id: int) -> str:
    return f"archives/gallery-{int(gallery_id)}.tar"


def stored_bytes(storage: Storage, keys: Iterable[str]) -> int:
    """Bytes the storage holds for these photos: originals, images, previews, cached watermarked downloads."""
    total = 0
    for key in keys:
        for prefix in (original_name(key), f"derived/{key[:2]}/{key}."):
            total += sum(info.size for _, info in storage.list_objects(prefix))
    return total


class _Hashing(io.RawIOBase):
    """A reader that hashes what passes through it (tarfile copies exactly the member's size from it)."""

    def __init__(self, source: BinaryIO) -> None:
        super().__init__()
        self._source = source
        self.digest = hashlib.sha256()

    def readable(self) -> bool:
        return True

    def read(self, size: int = -1) -> bytes:
        data = self._source.read(size)
        self.digest.update(data)
        return data


def pack(storage: Storage, photos: list[Packed], name: str) -> int:
    """Write the archive of ``photos`` and store it as ``name``. Returns its size in bytes. Raises
    :class:`ArchiveMismatch` when an original does not match its row (nothing is stored then)."""
    manifest = json.dumps({"version": FORMAT_VERSION, "originals": [
        {"photo_id": p.photo_id, "key": p.key, "sha256": p.sha256, "size": p.size} for p in photos]}).encode()
    storage.create_dirs()  # cheap; a tidied data directory must not fail the packing
    storage.ensure_space(len(manifest) + sum(p.size + 1024 for p in photos))
    temp = storage.new_temp_path()
    try:
        with open(temp, "xb") as out:
            with tarfile.open(fileobj=out, mode="w|", format=tarfile.PAX_FORMAT) as tar:
                info = tarfile.TarInfo(MANIFEST)
                info.size = len(manifest)
                tar.addfile(info, io.BytesIO(manifest))
                for photo in photos:
                    info = tarfile.TarInfo(original_name(photo.key))
                    info.size = photo.size
                    with storage.open(original_name(photo.key)) as source:
                        reader = _Hashing(source)
                        try:
                            tar.addfile(info, reader)
                        except OSError as error:  # tarfile: "unexpected end of data"
                            raise ArchiveMismatch(f"photo {photo.photo_id}: the original is shorter than "
                                                  f"{photo.size} bytes ({error})") from None
                    if reader.digest.hexdigest() != photo.sha256:
                        raise ArchiveMismatch(f"photo {photo.photo_id}: the original no longer matches its "
                                              "sha256; it was not archived")
            out.flush()
        size = temp.stat().st_size
        storage.put_file(temp, name)
    finally:
        remove_quietly(temp)
    return size


def read_back(storage: Storage, name: str, expected: Mapping[str, str]) -> dict[str, str]:
    """Read the stored archive from start to end: every member's sha256 must equal the manifest's, and every key
    of ``expected`` (key -> the row's sha256) must be in it with that sha256. Returns the manifest (key -> sha256).
    """
    manifest: dict[str, str] = {}
    seen: set[str] = set()
    with storage.open(name) as raw, tarfile.open(fileobj=raw, mode="r|") as tar:
        for member in tar:
            if member.name == MANIFEST:
                manifest = _read_manifest(tar, member)
                continue
            key = _member_key(member, manifest)
            digest = _hash_member(tar, member)
            if digest != manifest[key]:
                raise ArchiveMismatch(f"the archive's copy of {key} does not match its sha256")
            seen.add(key)
    for key, sha256 in expected.items():
        if key not in seen or manifest.get(key) != sha256:
            raise ArchiveMismatch(f"the archive {name} does not hold a matching copy of {key}")
    return manifest


def read_manifest(storage: Storage, name: str) -> dict[str, str]:
    """The archive's manifest (key -> sha256), read from its first member without reading the rest."""
    with storage.open(name) as raw, tarfile.open(fileobj=raw, mode="r|") as tar:
        member = tar.next()
        if member is None or member.name != MANIFEST:
            raise ArchiveMismatch(f"the archive {name} does not begin with its manifest")
        return _read_manifest(tar, member)


def unpack(storage: Storage, name: str, wanted: Mapping[str, str]) -> int:
    """Put back the originals of ``wanted`` (key -> the row's sha256) from the archive, each written to a temp file
    while hashed, compared with the manifest and the row, and only then made durable under its name. Originals
    already back are skipped, so an interrupted restore is simply run again. Returns how many were written."""
    manifest: dict[str, str] = {}
    written = 0
    storage.create_dirs()
    with storage.open(name) as raw, tarfile.open(fileobj=raw, mode="r|") as tar:
        for member in tar:
            if member.name == MANIFEST:
                manifest = _read_manifest(tar, member)
                continue
            key = _member_key(member, manifest)
            if key not in wanted or storage.has_original(key):
                continue
            if manifest[key] != wanted[key]:
                raise ArchiveMismatch(f"the archive's manifest records another sha256 for {key} than its photo")
            storage.ensure_space(member.size)
            temp = storage.new_temp_path()
            try:
                digest = hashlib.sha256()
                source = tar.extractfile(member)
                assert source is not None  # a regular file (checked by _member_key)
                with open(temp, "xb") as out:
                    while chunk := source.read(READ_CHUNK):
                        digest.update(chunk)
                        out.write(chunk)
                if digest.hexdigest() != wanted[key]:
                    raise ArchiveMismatch(f"the archive's copy of {key} does not match its sha256")
                storage.put_file(temp, original_name(key), wanted[key])
                written += 1
            finally:
                remove_quietly(temp)
    return written


def _read_manifest(tar: tarfile.TarFile, member: tarfile.TarInfo) -> dict[str, str]:
    source = tar.extractfile(member)
    if source is None:
        raise ArchiveMismatch("the archive's manifest is not a file")
    data = json.loads(source.read())
    return {entry["key"]: entry["sha256"] for entry in data["originals"]}


def _member_key(member: tarfile.TarInfo, manifest: Mapping[str, str]) -> str:
    key = member.name.rsplit("/", 1)[-1]
    if not member.isfile() or key not in manifest or member.name != original_name(key):
        raise ArchiveMismatch(f"the archive holds {member.name!r}, which its manifest does not list")
    return key


def _hash_member(tar: tarfile.TarFile, member: tarfile.TarInfo) -> str:
    source = tar.extractfile(member)
    assert source is not None
    digest = hashlib.sha256()
    while chunk := source.read(READ_CHUNK):
        digest.update(chunk)
    return digest.hexdigest()
