"""How this process gives memory back to the operating system (glibc's allocator; elsewhere nothing is done).

A photographer's box is small, and the server's resident size is what the box feels. Python frees an object at
once, but glibc keeps what was freed for reuse, and hands it back only from the top of a heap. Two patterns
made the server stay far larger than what it used:

* **Big buffers.** glibc raises its mmap threshold after the first large free (up to 32 MiB); from then on
  Pillow's 16 MiB image blocks come from per-thread heaps that are seldom given back. One 144 MP decode left a
  server 300-500 MB larger for good (``tests/test_badinput.py`` measures it). A fixed threshold of 1 MiB keeps
  every big block in its own mapping, unmapped when freed.
* **Bursts of small buffers.** 200 guests uploading at once go through some 100 MB of 16-256 KiB buffers
  (socket reads, body chunks, write batches). When the burst is over, those pages are free but scattered
  between live objects, so the heap cannot shrink: the server stayed 110 MB larger while it went on to make
  thumbnails, and that is where the load suite saw its peak. ``malloc_trim(0)`` returns every free page,
  wherever it is, in a few milliseconds.

:class:`MemoryTrimmer` runs the trim in a thread, at most once per ``interval``, while code that has just let go
of a lot (an upload request, a processed photo) says so with :meth:`MemoryTrimmer.freed`.
"""

from __future__ import annotations

import contextlib
import ctypes
import logging

import trio

log = logging.getLogger(__name__)

M_MMAP_THRESHOLD = -3  # glibc's mallopt parameter
MMAP_THRESHOLD_BYTES = 1 << 20
TRIM_INTERVAL_SECONDS = 1.0


def _load_glibc() -> ctypes.CDLL | None:
    with contextlib.suppress(OSError):
        libc = ctypes.CDLL("libc.so.6")
        if hasattr(libc, "mallopt") and hasattr(libc, "malloc_trim"):
            libc.mallopt.argtypes, libc.mallopt.restype = [ctypes.c_int, ctypes.c_int], ctypes.c_int
            libc.malloc_trim.argtypes, libc.malloc_trim.restype = [ctypes.c_size_t], ctypes.c_int
            return libc
    return None  # not glibc (musl, macOS): nothing to tune


_LIBC = _load_glibc()


def keep_big_buffers_in_their_own_mappings() -> None:
    """Every allocation of 1 MiB or more gets its own mapping, unmapped when freed (see the module docstring)."""
    if _LIBC is not None:
        _LIBC.mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD_BYTES)


def trim() -> None:
    """Give every free page of every heap back to the OS. Sync: a few milliseconds, run it in a thread."""
    if _LIBC is not None:
        _LIBC.malloc_trim(0)


class MemoryTrimmer:
    """Trims at most once per ``interval`` while code reports that it freed memory (so once more after a burst
    ends); :meth:`freed` is cheap enough to call per request. A trim costs 3-7 ms of a thread per second."""

    def __init__(self, interval: float = TRIM_INTERVAL_SECONDS) -> None:
        self.interval = interval
        self.trims = 0
        self._wanted = trio.Event()
        self._limiter = trio.CapacityLimiter(1)

    def freed(self) -> None:
        """Say that a lot was just let go of (sync, non-blocking). Before ``run`` starts, it only sets a flag."""
        self._wanted.set()

    @property
    def due(self) -> bool:
        """Something was freed and the next trim has not run yet."""
        return self._wanted.is_set()

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        task_status.started()
        while True:
            await self._wanted.wait()
            self._wanted = trio.Event()
            try:
                await trio.to_thread.run_sync(trim, limiter=self._limiter)
            except Exception:  # e.g. no thread to be had: memory stays as it is, the server must not stop
                log.exception("could not trim the heap")
            else:
                self.trims += 1
            await trio.sleep(self.interval)

