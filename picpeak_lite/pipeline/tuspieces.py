"""The bytes of unfinished tus uploads as pieces in the bucket (``tus_bytes``: bucket), so that any host may take
any PATCH of an upload and any host may make its photo (issue 31: no sticky sessions).

Each piece a PATCH delivers is one object, ``tus/<id>/<start>-<end>`` (offsets as 20 zero-padded digits, at
most :data:`PIECE_BYTES`), stored with ``Storage.put_file`` before the row's ``upload_offset`` moves past it
(``resumable._record_offset``, fenced by the writer lease). The row's offset is the truth; the bucket may hold
more: pieces PUT and never recorded (a crash, a lost lease, a request whose checksum failed is never PUT at all).
Such pieces are harmless, because the upload is read back only over the recorded range ``[0, upload_offset)``
(:func:`chain`: pieces that meet end to start, from 0 to exactly that offset) and every piece holds the bytes
its name says, of the one file the client sends. The end is in the name so that a late PUT of a fenced writer
(its lease ran out while the PUT was on the wire) can never replace a recorded piece by one of another length:
it lands under its own name, or under the same name with the same bytes.

Pieces go when the upload ends (its photo made, refused, terminated, expired: :func:`remove_all`, any host), and
those of an upload that no longer receives (a removal that met the bucket down) by :func:`sweep_orphans`.

Sync on purpose: every call is a network request; async code calls these through ``trio.to_thread.run_sync``.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Iterator
from pathlib import Path

from picpeak_lite.store.storage import Storage, disk_errors, remove_quietly

MB = 1024 * 1024
PIECE_BYTES = 8 * MB  # a PATCH's body is cut into pieces of at most this: one PUT each, one local temp file each
PREFIX = "tus/"
_PIECE = re.compile(r"tus/([0-9a-f]{32})/([0-9]{20})-([0-9]{20})")
READ_CHUNK = MB


class Lost(Exception):
    """The recorded range of an upload is not covered by its pieces (the bucket lost them, or they were removed)."""


def piece_name(tus_id: str, start: int, end: int) -> str:
    return f"{PREFIX}{tus_id}/{start:020d}-{end:020d}"


def _folder(tus_id: str) -> str:
    return f"{PREFIX}{tus_id}/"


def _pieces(storage: Storage, prefix: str) -> Iterator[tuple[str, str, int, int, float]]:
    """(name, upload id, start, end, mtime) of each whole piece under ``prefix``."""
    for name, info in storage.list_objects(prefix):
        match = _PIECE.fullmatch(name)
        if match is None:
            continue
        start, end = int(match[2]), int(match[3])
        if end > start and info.size == end - start:
            yield name, match[1], start, end, info.mtime


def chain(storage: Storage, tus_id: str, length: int) -> list[tuple[str, int, int]]:
    """The pieces that cover ``[0, length)`` one after the other, in order; :class:`Lost` if none do. Depth
    first, the longest piece first, dead ends remembered (pieces never recorded may start anywhere)."""
    ends: dict[int, list[tuple[int, str]]] = {}
    for name, _id, start, end, _mtime in _pieces(storage, _folder(tus_id)):
        if end <= length:
            ends.setdefault(start, []).append((end, name))
    for listed in ends.values():
        listed.sort(reverse=True)
    if length == 0:
        return []
    dead: set[int] = set()
    stack: list[tuple[int, str, Iterator[tuple[int, str]]]] = [(0, "", iter(ends.get(0, ())))]
    while stack:
        position, _name, choices = stack[-1]
        if position == length:
            return [(stack[i + 1][1], stack[i][0], stack[i + 1][0]) for i in range(len(stack) - 1)]
        step = next(choices, None)
        if step is None:
            dead.add(position)
            stack.pop()
            continue
        end, name = step
        if end not in dead:
            stack.append((end, name, iter(ends.get(end, ()))))
    raise Lost(f"the pieces of tus upload {tus_id} in the bucket do not cover its {length} recorded bytes")


def assemble(storage: Storage, tus_id: str, length: int, target: Path) -> str:
    """Read the recorded range ``[0, length)`` into the local file ``target``, in order; returns its sha256. The
    disk reserve applies; :class:`Lost` when the pieces do not cover it."""
    pieces = chain(storage, tus_id, length)
    storage.ensure_space(length)
    digest = hashlib.sha256()
    written = 0
    try:
        with disk_errors():
            target.parent.mkdir(parents=True, exist_ok=True)
            with open(target, "xb") as out:
                for name, start, end in pieces:
                    with storage.open(name) as source:
                        while block := source.read(READ_CHUNK):
                            digest.update(block)
                            out.write(block)
                            written += len(block)
                    if written != end:
                        raise OSError(f"the piece {name} of {start}-{end} read back as {written - start} bytes")
    except BaseException:
        remove_quietly(target)
        raise
    return digest.hexdigest()


def head_bytes(storage: Storage, tus_id: str, recorded: int, most: int) -> bytes:
    """The first ``most`` bytes (at most ``recorded``) of the recorded range: what tells a video from a photo."""
    data = b""
    for name, _start, end in chain(storage, tus_id, recorded):
        data += storage.read_range(name, 0, min(most - len(data), end - _start))
        if len(data) >= most:
            break
    return data


def remove_all(storage: Storage, tus_id: str) -> int:
    """Remove every piece of an upload (it ended); returns how many were listed."""
    names = [name for name, _id, _s, _e, _m in _pieces(storage, _folder(tus_id))]
    for name in names:
        storage.remove(name)
    return len(names)


def count(storage: Storage, tus_id: str | None = None) -> int:
    """Pieces in the bucket (of one upload, or of all): for ``check``-like questions and tests."""
    return sum(1 for _ in _pieces(storage, PREFIX if tus_id is None else _folder(tus_id)))


def sweep_orphans(storage: Storage, receiving: set[str], now: float, grace: float) -> int:
    """Remove the pieces of uploads that receive no more (their removal met the bucket down) and are older than
    ``grace`` (a new upload's first piece may be PUT before its row is read here). Returns how many went."""
    removed = 0
    for name, tus_id, _start, _end, mtime in list(_pieces(storage, PREFIX)):
        if tus_id not in receiving and now - mtime > grace:
            storage.remove(name)
            removed += 1
    return removed
