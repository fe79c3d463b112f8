"""The claim race on both engines (issue 30): W workers in P processes claiming R pending photos at once.

    python bench/bench_claims.py [--rows 2000] [--processes 4] [--workers 4]

For SQLite (a file) and for PostgreSQL (a server started for the run, as the tests start one: tests/pgserver.py),
interleaved: R pending photo rows are made, then P processes each run W threads, and every thread claims photos
with ``claims.claim_next`` (each claim its own write transaction, as a worker's is) until none is left. It prints
per engine whether every row was claimed exactly once, and the time of one claim (p50 and p95, milliseconds, from
BEGIN to COMMIT in the claiming thread) with the rows claimed per second overall.
"""

from __future__ import annotations

import argparse
import json
import secrets
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from picpeak_lite.store import db, schema
from tests import pgserver

CLAIMER = """
import json, secrets, sys, threading, time
from picpeak_lite.store import db
from picpeak_lite.store.queries import claims

target, threads = sys.argv[1], int(sys.argv[2])
results = []

def claimer():
    conn = db.connect(target)
    got, took = [], []
    while True:
        start = time.perf_counter()
        with db.transaction(conn):
            row = claims.claim_next(conn, secrets.token_hex(8), time.time(), 600)
        took.append(time.perf_counter() - start)
        if row is None:
            break
        got.append(row["id"])
    conn.close()
    results.append((got, took))

workers = [threading.Thread(target=claimer) for _ in range(threads)]
for w in workers:
    w.start()
for w in workers:
    w.join()
ids = [i for got, _ in results for i in got]
print(json.dumps({"ids": ids, "ms": [t * 1000 for _, took in results for t in took]}))
"""


def seed(target: str, rows: int) -> None:
    conn = db.connect(target)
    try:
        schema.migrate(conn)
        with db.transaction(conn):
            gid = conn.execute("INSERT INTO galleries (slug, share_token, name, created_at, updated_at) "
                               "VALUES (?, ?, 'Race', 0, 0) RETURNING id",
                               (secrets.token_hex(4), secrets.token_hex(8))).fetchall()[0]["id"]
            conn.execute("INSERT INTO uploads (id, gallery_id, uploaded_by, created_at) VALUES (?, ?, 'admin', 0)",
                         ("r" * 32, gid))
            for n in range(rows):
                conn.execute(
                    "INSERT INTO photos (gallery_id, upload_id, storage_key, sha256, display_name, size, format, "
                    "uploaded_by, created_at) VALUES (?, ?, ?, ?, 'p.jpg', 1, 'jpeg', 'admin', 0)",
                    (gid, "r" * 32, f"{n:032x}", f"{n:064x}"))
    finally:
        conn.close()


def race(target: str, rows: int, processes: int, workers: int) -> str:
    seed(target, rows)
    start = time.perf_counter()
    procs = [subprocess.Popen([sys.executable, "-c", CLAIMER, target, str(workers)], stdout=subprocess.PIPE,
                              text=True) for _ in range(processes)]
    outs = [json.loads(p.communicate(timeout=600)[0]) for p in procs]
    wall = time.perf_counter() - start
    ids = [i for out in outs for i in out["ids"]]
    ms = sorted(t for out in outs for t in out["ms"])
    once = len(ids) == len(set(ids)) == rows
    p95 = statistics.quantiles(ms, n=100, method="inclusive")[94]
    return (f"claimed={len(ids)} distinct={len(set(ids))} each_once={once} claim_ms p50={statistics.median(ms):.2f} "
            f"p95={p95:.2f} rows_per_s={rows / wall:.0f}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rows", type=int, default=2000)
    parser.add_argument("--processes", type=int, default=4)
    parser.add_argument("--workers", type=int, default=4, help="threads per process")
    parser.add_argument("--rounds", type=int, default=1)
    args = parser.parse_args()
    pgserver.engine = "postgresql"
    server = pgserver.server()
    for round_ in range(1, args.rounds + 1):
        with tempfile.TemporaryDirectory() as tmp:
            for engine, target in (("sqlite", str(Path(tmp) / "race.sqlite3")),
                                   ("postgresql", server.new_database(empty=True))):
                line = race(target, args.rows, args.processes, args.workers)
                print(f"claims: engine={engine} round={round_} processes={args.processes} "
                      f"workers={args.processes * args.workers} rows={args.rows} {line}", flush=True)
        pgserver.drop_made()


if __name__ == "__main__":
    main()
