"""memory.py: freed heap pages really go back to the OS, and the trimmer trims once per burst, not per call."""

from __future__ import annotations

import subprocess
import sys

import pytest
import trio

from picpeak_lite.pipeline import memory
from picpeak_lite.pipeline.memory import MemoryTrimmer

# In a fresh process: 64 KiB buffers (under the mmap threshold, so from the heap) with a small long-lived object
# after each, as a burst of uploads leaves them; free the buffers, then trim. Prints RSS in MB at each step.
FRAGMENTED_HEAP = """
import re
from pathlib import Path
from picpeak_lite.pipeline import memory

def rss_mb():
    status = Path("/proc/self/status").read_text()
    return int(re.search(r"^VmRSS:\\s+(\\d+) kB", status, re.MULTILINE).group(1)) / 1024

memory.keep_big_buffers_in_their_own_mappings()
before = rss_mb()
buffers, keep = [], []
for i in range(1600):
    buffers.append(bytearray(b"x" * (64 * 1024)))
    keep.append(bytes(600) + i.to_bytes(4, "big"))  # above pymalloc's 512 bytes: malloc'd between the buffers
full = rss_mb()
del buffers
freed = rss_mb()
memory.trim()
print(before, full, freed, rss_mb())
"""


@pytest.mark.skipif(not sys.platform.startswith("linux") or memory._LIBC is None, reason="glibc only")
def test_trim_gives_scattered_free_pages_back() -> None:
    done = subprocess.run([sys.executable, "-c", FRAGMENTED_HEAP], capture_output=True, text=True, check=True)
    before, full, freed, trimmed = (float(v) for v in done.stdout.split())
    burst = full - before
    assert burst > 90  # 100 MB of buffers were resident
    assert freed - before > 0.8 * burst  # freeing them gave nothing back: the small objects pin the heap
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
