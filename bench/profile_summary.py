"""Sum a py-spy raw (collapsed) profile of the server by where the time goes.

    python bench/profile_summary.py /tmp/prof/p30-before-0.txt

Reads what ``bench_e2e.py --py-spy`` records. Each stack is put in the first category whose pattern it
matches (so "decode" wins over "trio" for a worker thread inside ``images.decode``), split by the event loop
thread and the other threads. With ``--nonblocking`` idle waits still show (epoll on the loop, idle
thread-cache threads): the rows are for comparing with each other, not absolute CPU.
"""

from __future__ import annotations

import re
import sys
from collections import Counter

RULES = [
    ("idle: epoll / idle thread", r"get_events \(trio|_thread_cache\.py:211\)$"),
    ("multipart parse (werkzeug)", r"sansio/multipart|_Receiver\.feed"),
    ("hash + temp write", r"_write_batch|FileSink"),
    ("sniff / commit_original", r"sniff|commit_original"),
    ("sqlite", r"_write_in_thread|_read_in_thread|apsw|store/db\.py"),
    ("decode", r"\bdecode \(picpeak_lite/media"),
    ("view resize", r"make_view"),
    ("grid", r"make_grid"),
    ("encode", r"\bencode \(picpeak_lite/media"),
    ("write derivative", r"write_derivative"),
    ("hypercorn / h11", r"hypercorn|h11"),
    ("quart", r"quart"),
    ("trio, other", r"trio"),
]


def main(path: str) -> None:
    categories: Counter[str] = Counter()
    leaves: Counter[str] = Counter()
    total = 0
    with open(path) as profile:
        for line in profile:
            stack, _, count = line.rstrip().rpartition(" ")
            n = int(count)
            total += n
            where = "loop" if "MainThread" in stack.split(";")[0] else "thread"
            name = next((label for label, pattern in RULES if re.search(pattern, stack)), "other")
            categories[f"{where:6s} {name}"] += n
            leaves[stack.split(";")[-1]] += n
    print(f"samples: {total}")
    for name, n in categories.most_common():
        print(f"{n:7d} {100 * n / total:5.1f}%  {name}")
    print("top leaf frames:")
    for name, n in leaves.most_common(15):
        print(f"{n:7d} {100 * n / total:5.1f}%  {name}")


if __name__ == "__main__":
    main(sys.argv[1])
