"""What a photo costs PostgreSQL, statement by statement (issue 30: the database under 5 % of a photo's CPU).

    python bench/bench_pg_statements.py [--photos 30] [--megapixels 12] [--top 30]

Starts a PostgreSQL server as the tests do (``tests/pgserver.py``), loads ``pg_stat_statements`` into it (planning
time tracked too), runs one upload through a real server (``picpeak_lite.ops.bench``) and prints, per photo, the
calls, planning and execution milliseconds of each statement, the most costly first. Planning is what
``db.Prepared`` saves; ``BEGIN``/``COMMIT`` pairs are what a write costs beyond its statements (reads run without).
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import psycopg
from psycopg.rows import dict_row

from picpeak_lite.ops import bench
from tests import pgserver


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--photos", type=int, default=30)
    parser.add_argument("--megapixels", type=float, default=12)
    parser.add_argument("--top", type=int, default=30)
    args = parser.parse_args()
    n = args.photos
    pgserver.engine = "postgresql"
    server = pgserver.server()
    server.admin_sql("ALTER SYSTEM SET shared_preload_libraries = 'pg_stat_statements'")
    server._run(str(server.bindir / "pg_ctl"), "-D", str(server.data), "-l", str(server.root / "log"), "-w",
                "restart")
    server.admin_sql("ALTER SYSTEM SET pg_stat_statements.track_planning = on")
    server.admin_sql("SELECT pg_reload_conf()")
    server.admin_sql("CREATE EXTENSION IF NOT EXISTS pg_stat_statements")
    with psycopg.connect(server.url("postgres"), autocommit=True, row_factory=dict_row) as admin, \
            tempfile.TemporaryDirectory() as tmp:
        photos = bench.make_photos(Path(tmp) / "photos", n, args.megapixels)
        url = server.new_database()
        result = bench.run(n, args.megapixels, workdir=Path(tmp), photos=photos, env={"PICPEAK_DATABASE_URL": url},
                           on_server=lambda _: admin.execute("SELECT pg_stat_statements_reset()"))
        print("; ".join(result.lines()))
        rows = admin.execute(
            "SELECT calls, total_plan_time AS plan, total_exec_time AS exec, query FROM pg_stat_statements s "
            "JOIN pg_database d ON d.oid = s.dbid WHERE d.datname = %s "
            "ORDER BY total_plan_time + total_exec_time DESC", (url.rsplit("/", 1)[1],)).fetchall()
    calls = sum(r["calls"] for r in rows)
    commits = sum(r["calls"] for r in rows if r["query"].strip().upper() == "COMMIT")
    print(f"pg_statements: per_photo={calls / n:.1f} transactions_per_photo={commits / n:.1f} "
          f"plan_ms_per_photo={sum(r['plan'] for r in rows) / n:.2f} "
          f"exec_ms_per_photo={sum(r['exec'] for r in rows) / n:.2f}")
    print("calls/photo  plan ms  exec ms  statement")
    for r in rows[:args.top]:
        print(f"{r['calls'] / n:11.2f} {r['plan'] / n:8.3f} {r['exec'] / n:8.3f}  {' '.join(r['query'].split())[:110]}")


if __name__ == "__main__":
    main()
