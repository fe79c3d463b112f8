"""End to end through the real server: issue 18's table for picpeak-lite, optionally against another build.

    python bench/bench_e2e.py --photos 50 --megapixels 24 [--pairs 3] [--before-python /tmp/before/.venv/bin/python]
                              [--py-spy OUT_PREFIX]

Makes camera-like photos once (picpeak_lite.media.samples: smooth field, gradient, blotches, Gaussian noise
sigma 13, q90, EXIF with GPS, every 4th Orientation 6), then per pair runs a fresh server of each build on a
fresh data directory (``picpeak_lite.ops.bench``, the code behind ``picpeak-lite bench``), interleaved
(before, after, before, after, ...) so that load from other users of the machine falls on both. Uploads go
as PicPeak's UI sends them: at most 50 files and 500 MiB per request, one request at a time. Prints every
run's figures, then the table rows as median [min-max].

``--engines sqlite postgresql`` runs this checkout once per engine instead (interleaved, as builds are): SQLite in
the data directory, PostgreSQL on a fresh database of a server started for the run as the tests start one
(``tests/pgserver.py``). It adds the database server's own CPU per photo (PostgreSQL's processes are not below the
server; SQLite's work is inside the server's figure) and the database's share of a photo's CPU: over the
server's own window (first request to last photo done), and from the server's start to its stop.

``--py-spy OUT`` records each server with ``py-spy record --nonblocking`` (root, or ptrace allowed) into
``OUT-<build>-<n>.txt`` in raw (collapsed stack) form, with idle frames left out.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from picpeak_lite.ops import bench

ROWS = [
    ("all photos complete, s after the first byte", lambda r: r.all_complete_s),
    ("photos/s end to end", lambda r: r.photos_per_s),
    ("202 for the first request, s", lambda r: r.first_202_s),
    ("last 202 -> all complete, s", lambda r: r.last_202_to_complete_s),
    ("per photo, 202 -> complete, p50, s", lambda r: r.per_photo_202_p50),
    ("per photo, 202 -> complete, p95, s", lambda r: r.per_photo_202_p95),
    ("first photo complete after its own bytes, s", lambda r: r.first_complete_after_own_bytes_s),
    ("per photo, own bytes -> complete, p95, s", lambda r: r.own_bytes_p95),
    ("server CPU per photo (upload + processing), s", lambda r: r.cpu_per_photo_s),
    ("peak RSS, MB", lambda r: r.peak_rss_mb),
]


def _db(r: Any) -> float:
    """The database server's CPU per photo over the server's own window (first request to last photo done)."""
    return float(r.extra["companion_cpu_per_photo_s"])


ENGINE_ROWS = [
    ("database server CPU per photo, ms", lambda r: 1000 * _db(r)),
    ("all CPU per photo (server + database server), s", lambda r: r.cpu_per_photo_s + _db(r)),
    ("database server's share of a photo's CPU, %", lambda r: 100 * _db(r) / (r.cpu_per_photo_s + _db(r))),
    # From the server's start to its stop: also its start-up, its shutdown and the bench's own read of the rows.
    ("database server CPU per photo, start to stop, ms", lambda r: 1000 * r.extra["database_cpu_per_photo_s"]),
    ("database server's share, start to stop, %",
     lambda r: 100 * r.extra["database_cpu_per_photo_s"] / (r.cpu_per_photo_s + r.extra["database_cpu_per_photo_s"])),
]


def _engine(engine: str) -> Any:
    """For one engine: a function giving the environment of a fresh run and a reader of the database server's
    CPU seconds (0 for SQLite, which runs inside the server)."""
    if engine == "sqlite":
        return lambda: ({}, lambda: 0.0)
    from tests import pgserver

    pgserver.engine = "postgresql"
    server = pgserver.server()
    postmaster = int((server.data / "postmaster.pid").read_text().split()[0])

    def fresh() -> tuple[dict[str, str], Any]:
        pgserver.drop_made()
        return ({"PICPEAK_DATABASE_URL": server.new_database()}, lambda: bench.tree_cpu_seconds(postmaster))
    return fresh


def spy(out: Path) -> Any:
    def attach(server: bench.Server) -> None:
        exe = shutil.which("py-spy") or str(Path(sys.executable).with_name("py-spy"))
        subprocess.Popen([exe, "record", "--nonblocking", "--format", "raw", "--rate", "50", "--threads",
                          "-o", str(out), "--pid", str(server.pid)],
                         stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        time.sleep(1.0)  # let it attach before the first byte
    return attach


def cell(values: list[float]) -> str:
    return f"{statistics.median(values):.2f} [{min(values):.2f}-{max(values):.2f}]"


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--photos", type=int, default=50)
    parser.add_argument("--megapixels", type=float, default=24)
    parser.add_argument("--pairs", type=int, default=1)
    parser.add_argument("--before-python", help="the Python of another checkout's venv, run as 'before'")
    parser.add_argument("--build", action="append", default=[], metavar="NAME=PYTHON",
                        help="instead of before/after: the builds to run, each a name and its venv's Python")
    parser.add_argument("--engines", nargs="+", choices=["sqlite", "postgresql"],
                        help="instead of builds: this checkout on each engine")
    parser.add_argument("--py-spy", help="record each server with py-spy into <this>-<build>-<n>.txt")
    args = parser.parse_args()
    builds = [("after", sys.executable)]
    if args.before_python:
        builds.insert(0, ("before", args.before_python))
    if args.build:
        builds = [(b.split("=", 1)[0], b.split("=", 1)[1]) for b in args.build]
    engines: dict[str, Any] = {}
    if args.engines:
        builds = [(engine, sys.executable) for engine in args.engines]
        engines = {engine: _engine(engine) for engine in args.engines}
    # Absolute, as the server starts in its data directory's parent (not resolved: a venv's python is a link).
    builds = [(name, os.path.abspath(python)) for name, python in builds]
    results: dict[str, list[bench.Result]] = {name: [] for name, _ in builds}
    with tempfile.TemporaryDirectory() as tmp:
        print(f"making {args.photos} photos of {args.megapixels:g} MP ...", flush=True)
        photos = bench.make_photos(Path(tmp) / "photos", args.photos, args.megapixels)
        for pair in range(args.pairs):
            for name, python in builds:
                hook = spy(Path(f"{args.py_spy}-{name}-{pair}.txt")) if args.py_spy else None
                env, database_cpu = engines[name]() if name in engines else ({}, lambda: 0.0)
                before: list[float] = []

                def started(server: bench.Server, hook: Any = hook, database_cpu: Any = database_cpu,
                            before: list[float] = before) -> None:
                    if hook is not None:
                        hook(server)
                    server.companion_cpu = database_cpu
                    before.append(database_cpu())  # from here on: the uploads and their processing
                result = bench.run(args.photos, args.megapixels, workdir=Path(tmp), python=python, photos=photos,
                                   on_server=started, env=env)
                result.extra["database_cpu_per_photo_s"] = (database_cpu() - before[0]) / args.photos
                results[name].append(result)
                print(f"--- {name} run {pair + 1}: " + "; ".join(result.lines()) +
                      f"; complete before their 202: {result.extra['complete_before_202']}", flush=True)
    pair_table = [n for n, _ in builds] == ["before", "after"]
    print(f"\n| {args.photos} x {args.megapixels:g} MP | " + " | ".join(n for n, _ in builds) +
          (" | after / before |" if pair_table else " |"))
    print("|---" * (len(builds) + 1 + pair_table) + "|")
    for label, get in ROWS:
        values = {name: [get(r) for r in rs] for name, rs in results.items()}
        line = f"| {label} | " + " | ".join(cell(values[n]) for n, _ in builds)
        if [n for n, _ in builds] == ["before", "after"]:
            before, after = statistics.median(values["before"]), statistics.median(values["after"])
            line += f" | {after / before:.2f}" if before else " | -"
        print(line + " |")
    if engines:
        for label, get in ENGINE_ROWS:
            print(f"| {label} | " + " | ".join(cell([get(r) for r in results[n]]) for n, _ in builds) + " |")


if __name__ == "__main__":
    main()
