"""Other processes seen through /proc (Linux): a process's children by their command line, and a process's
state. For the video tests and bench/bench_video.py, which watch the transcode child that the server starts."""

from __future__ import annotations

from pathlib import Path


def children_running(pid: int | str, word: bytes) -> list[int]:
    """The children of process ``pid`` (every thread's) whose command line contains ``word``."""
    found = []
    for task in Path(f"/proc/{pid}/task").iterdir():
        for child in (task / "children").read_text().split():
            try:
                if word in Path(f"/proc/{child}/cmdline").read_bytes():
                    found.append(int(child))
            except FileNotFoundError:
                pass  # it ended meanwhile
    return found


def state(pid: int) -> str:
    """The kernel's one-letter state of a process ('T' when stopped), or 'gone'."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return "gone"
    return stat[stat.rindex(")") + 2]
