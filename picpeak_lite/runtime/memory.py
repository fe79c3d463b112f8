"""How this process gives memory back to the operating system (glibc's allocator; elsewhere nothing is done).

A photographer's box is small, and the server's resident size is what the box feels. Python frees an object at
once, but glibc keeps what was freed for reuse, and hands it back only from the top of a heap. Two patterns
made the server stay far larger than what it used:

* **Big buffers.** glibc raises its mmap threshold after the first large free (up to 32 MiB), and until the
  trimmer below existed, Pillow's image blocks then stayed in per-thread heaps that were seldom given back: one
  144 MP decode left a server 300-500 MB larger for good (``tests/test_badinput.py`` measures it). A fixed
  threshold of 1 MiB cured that by giving every big block its own mapping, but a fresh mapping is paid for again
  in page faults each time: a 24 MP photo's decode and derivatives touched 28 MB of new pages (7,200 faults).
  So the threshold is fixed at 32 MiB, glibc's own ceiling: a photo's buffers (the decoder's reads, Pillow's
  blocks of up to 16 MiB) come from the heap, and the trim gives back what is free once the work stops, as it
  does for the small buffers. In the main thread that took one render from 140 to 115-120 ms of CPU. In an
  image thread most of the faults stay (5,800 of 6,900 per 24 MP render): it frees a photo's buffers at the top
  of its heap, and glibc gives a free top back at once (its trim threshold, 128 KiB). A 16 MiB trim threshold
  removed those faults too (15-20 ms of CPU per render) but was taken back: ``malloc_trim`` never gives back a
  thread heap's top, so every thread that makes big buffers, a guest's download included, could keep 16 MiB
  (the decompression-bomb suite peaked at 268-320 MB with it, 229-267 without).
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
MMAP_THRESHOLD_BYTES = 32 << 20
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


def set_mmap_threshold() -> None:
    """Only allocations of 32 MiB or more get a mapping of their own; the rest is reused from the heap and
    given back by :func:`trim` (see the module docstring). Fixed, so glibc does not move it."""
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

