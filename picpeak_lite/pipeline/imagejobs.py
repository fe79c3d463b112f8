"""What an image child runs (``pipeline/imageprocs.py`` sends the jobs): a photo's images, a video poster's.
Plain sync functions of picklable arguments that return bytes and plain values, never a Pillow image: what
crosses the pipe is the two JPEGs and a dict, tens to hundreds of KB. The plan (the header's estimate) is read
in the server, in a thread, as the upload's check was: a round trip to a child for it cost more than the read.

Each job first makes its process what the caller asked (:func:`prepare`): the OS priority below the web server
and the address-space limit (``RLIMIT_AS``) that turns a file that lied about its size into a ``MemoryError``
in this child instead of the box running out. Both are set again only when they differ, so one child serves
pools with other settings (the test suite runs many in one process). On its first job the child also stops
heeding SIGTERM (see imageprocs.py). After a job, every free page goes back to the OS (``memory.trim``), at
most once a second: a child lives for many photos, and what a 45 MP decode left in its heap would otherwise stay
counted against the box, but a trim after every photo cost 10 ms of a 12 MP photo's 90 (measured).

This module must stay light to import: a child imports it (and Pillow) once, when it starts.
"""

from __future__ import annotations

import dataclasses
import functools
import os
import resource
import signal
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

from picpeak_lite.media import exif, images
from picpeak_lite.runtime import memory

T = TypeVar("T")


@dataclasses.dataclass(frozen=True)
class Limits:
    """What a child is held to while it runs a job: its nice value and its address space in bytes (0: none)."""

    nice: int = 0
    address_space: int = 0


_prepared: Limits | None = None


def prepare(limits: Limits) -> None:
    global _prepared
    if _prepared == limits:
        return
    if limits.nice > os.getpriority(os.PRIO_PROCESS, 0):  # only ever lowered: raising it back needs privilege
        os.setpriority(os.PRIO_PROCESS, 0, limits.nice)
    _, hard = resource.getrlimit(resource.RLIMIT_AS)
    soft = limits.address_space or resource.RLIM_INFINITY
    if hard != resource.RLIM_INFINITY:
        soft = hard if soft == resource.RLIM_INFINITY else min(soft, hard)
    resource.setrlimit(resource.RLIMIT_AS, (soft, hard))
    if _prepared is None:
        memory.set_mmap_threshold()
        # A stop is the server's to carry out (imageprocs.py): SIGINT is ignored by trio-parallel already.
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
    _prepared = limits


_trimmed_at = 0.0


def run(limits: Limits, fn: Callable[..., T], *args: Any) -> T:
    """``fn(*args)`` in this child with ``limits`` applied; the heap is trimmed after it, at most once a second."""
    global _trimmed_at
    prepare(limits)
    try:
        return fn(*args)
    finally:
        if time.monotonic() - _trimmed_at >= memory.TRIM_INTERVAL_SECONDS:
            memory.trim()
            _trimmed_at = time.monotonic()


def ready() -> None:
    """The empty job :meth:`ImageProcesses.warm` starts a child with (importing this module loaded Pillow)."""


def photo(path: Path, spec: images.RenderSpec) -> tuple[bytes, bytes, dict[str, Any]]:
    """(view JPEG, grid JPEG, the columns for ``claims.complete``) of a photo."""
    view, view_jpeg, grid_jpeg = images.derivatives(functools.partial(images.decode, path, spec), spec)
    metadata = exif.read_metadata(view.exif)
    return view_jpeg, grid_jpeg, {"width": view.width, "height": view.height, **dataclasses.asdict(metadata)}


def poster(decode: Callable[[], images.Decoded], spec: images.RenderSpec) -> tuple[bytes, bytes]:
    """(view JPEG, grid JPEG) of a video's poster frame (``decode``: a partial of :func:`images.from_rgb`)."""
    _, view_jpeg, grid_jpeg = images.derivatives(decode, spec)
    return view_jpeg, grid_jpeg


def photo_faces(path: Path) -> list[tuple[tuple[int, int, int, int], bytes]]:
    """The faces of a photo's view image ("Find me"; the models load in this child on its first face job)."""
    from picpeak_lite.media import faces

    return faces.find_in_photo(str(path))


def selfie_faces(data: bytes) -> list[bytes]:
    """The embeddings of a selfie's faces; its bytes came through the pipe and are never written anywhere."""
    from picpeak_lite.media import faces

    return faces.find_in_selfie(data)
