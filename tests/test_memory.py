"""memory.py: freed heap pages really go back to the OS, and the trimmer trims once per burst, not per call."""

from __future__ import annotations

import subprocess
import sys

import pytest
import trio

from picpeak_lite.runtime import memory
from picpeak_lite.runtime.memory import MemoryTrimmer

# In a fresh process: buffers with a small long-lived object after each, as a burst of uploads (64 KiB) or an
# image thread's photos (16 MiB, Pillow's block size) leave them, made in the main thread or in a thread of its
# own (another heap); free the buffers, then trim. Prints RSS in MB at each step.
FRAGMENTED_HEAP = """
import re
import sys
import threading
from pathlib import Path
from picpeak_lite.runtime import memory

def rss_mb():
    status = Path("/proc/self/status").read_text()
    return int(re.search(r"^VmRSS:\\s+(\\d+) kB", status, re.MULTILINE).group(1)) / 1024

size, count, in_thread = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3] == "thread"
memory.set_mmap_threshold()
before = rss_mb()
buffers, keep, steps = [], [], []

def burst():
    for i in range(count):
        buffers.append(bytearray(b"x") * size)
        keep.append(bytes(600) + i.to_bytes(4, "big"))  # above pymalloc's 512 bytes: malloc'd between the buffers
    steps.append(rss_mb())
    buffers.clear()
    steps.append(rss_mb())

if in_thread:
    worker = threading.Thread(target=burst)
    worker.start()
    worker.join()
else:
    burst()
memory.trim()
print(before, *steps, rss_mb())
"""


@pytest.mark.skipif(not sys.platform.startswith("linux") or memory._LIBC is None, reason="glibc only")
@pytest.mark.parametrize(("size", "count", "where"), [(64 << 10, 1600, "main"), (16 << 20, 7, "thread")],
                         ids=["upload-buffers", "image-blocks-in-a-thread"])
def test_trim_gives_scattered_free_pages_back(size: int, count: int, where: str) -> None:
    done = subprocess.run([sys.executable, "-c", FRAGMENTED_HEAP, str(size), str(count), where],
                          capture_output=True, text=True, check=True)
    before, full, freed, trimmed = (float(v) for v in done.stdout.split())
    burst = full - before
    assert burst > 90  # 100-112 MB of buffers were resident
    assert freed - before > 0.8 * burst  # freeing them gave nothing back: the heap keeps them (for reuse)
    assert trimmed - before < 0.2 * burst, (before, full, freed, trimmed)


async def trims_reach(trimmer: MemoryTrimmer, count: int) -> float:
    while trimmer.trims < count:
        await trio.sleep(0.001)
    return trio.current_time()


async def test_trimmer_trims_once_per_interval(autojump_clock: trio.abc.Clock) -> None:
    trimmer = MemoryTrimmer(interval=1.0)
    trimmer.freed()  # said before the task runs: remembered
    async with trio.open_nursery() as nursery:
        await nursery.start(trimmer.run)
        first = await trims_reach(trimmer, 1)
        for _ in range(50):  # a burst of uploads ending
            trimmer.freed()
        second = await trims_reach(trimmer, 2)
        assert second - first > 0.999
        await trio.sleep(30)
        assert trimmer.trims == 2  # the 50 calls made one trim; nothing freed since, nothing done
        trimmer.freed()
        await trims_reach(trimmer, 3)
        nursery.cancel_scope.cancel()
