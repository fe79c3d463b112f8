"""The same photos through 1, 2 and 3 hosts of the multi-host harness (issue 31): what more hosts cost and give.

    python bench/bench_hosts.py [--photos 60] [--megapixels 2] [--hosts 1 2 3] [--rounds 1] [--workers 0]

Needs root (network namespaces), PostgreSQL and s3rver, as ``tests/test_multihost.py`` does: one
``tests/multihost.py`` cluster of the most hosts asked for (each ``picpeak-lite serve`` in its own namespace, one
PostgreSQL, one s3rver bucket) is started once; for each run, the first N hosts are running and the others
stopped (SIGTERM), so every run meets the same database and bucket. Runs are interleaved over ``--rounds``
(1, 2, 3, 1, 2, 3, ...) so that a machine's changing load falls on every count alike.

Per run: a new gallery; N uploaders, one per running host, each sending its share of the camera-like photos
(``picpeak_lite.media.samples``) as the bulk uploader does (batches of at most 50 files, one request at a time);
then the wait until every photo is complete. Printed per run:

* photos/s end to end (first byte -> every photo complete, from the database);
* CPU seconds per photo of the hosts (servers and their image children), of PostgreSQL (the postmaster and its
  backends) and of s3rver, from /proc; and all of them over the wall time (cores busy).
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from picpeak_lite.ops import bench
from tests import multihost, pgserver


def postmaster_pid(cluster: multihost.Cluster) -> int:
    return int((cluster.postgres.data / "postmaster.pid").read_text().split()[0])


def s3rver_pid(cluster: multihost.Cluster) -> int:
    assert cluster.s3.proc is not None
    return cluster.s3.proc.pid


def with_hosts(cluster: multihost.Cluster, count: int) -> None:
    """The first ``count`` hosts running, the others stopped."""
    for i, host in enumerate(cluster.hosts):
        if i < count and host.proc is None:
            cluster.restart(i)
        elif i >= count and host.proc is not None:
            host.stop(timeout=120)


def one_run(cluster: multihost.Cluster, paths: list[Path], count: int, tag: str) -> dict[str, float]:
    with_hosts(cluster, count)
    urls = cluster.urls[:count]
    admin = bench._Client(urls[0], cluster.token)
    _, gallery = admin.call("POST", "/api/admin/galleries", json.dumps({"name": f"Hosts {tag}"}).encode(),
                            {"Content-Type": "application/json"})
    admin.close()
    shares = [paths[i::count] for i in range(count)]
    errors: list[str] = []

    def upload(url: str, share: list[Path]) -> None:
        client = bench._Client(url, cluster.token)
        try:
            for group in bench.batches(share):
                status, answer = client.upload(gallery["id"], group)
                if status != 202:
                    errors.append(f"{status}: {str(answer)[:200]}")
                    return
        finally:
            client.close()

    hosts = [host.pid for host in cluster.hosts[:count]]
    postgres, s3 = postmaster_pid(cluster), s3rver_pid(cluster)
    before = [bench.tree_cpu_seconds(*hosts), bench.tree_cpu_seconds(postgres), bench.tree_cpu_seconds(s3)]
    began = time.perf_counter()
    threads = [threading.Thread(target=upload, args=(url, share)) for url, share in zip(urls, shares, strict=True)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    if errors:
        raise RuntimeError(errors[0])
    while True:
        left = cluster.query("SELECT count(*) AS n FROM photos WHERE gallery_id = ? AND status NOT IN "
                             "('complete', 'failed')", gallery["id"])[0]["n"]
        if not left:
            break
        time.sleep(0.05)
    wall = time.perf_counter() - began
    after = [bench.tree_cpu_seconds(*hosts), bench.tree_cpu_seconds(postgres), bench.tree_cpu_seconds(s3)]
    done = cluster.query("SELECT count(*) AS n FROM photos WHERE gallery_id = ? AND status = 'complete'",
                         gallery["id"])[0]["n"]
    if done != len(paths):
        raise RuntimeError(f"{done} of {len(paths)} photos complete")
    spent = [b - a for a, b in zip(before, after, strict=True)]
    return {"photos_per_s": len(paths) / wall, "hosts_cpu": spent[0] / len(paths),
            "postgres_cpu": spent[1] / len(paths), "s3rver_cpu": spent[2] / len(paths),
            "cores_busy": sum(spent) / wall}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--photos", type=int, default=60)
    parser.add_argument("--megapixels", type=float, default=2.0)
    parser.add_argument("--hosts", type=int, nargs="+", default=[1, 2, 3])
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--workers", type=int, default=0, help="image workers per host (0: the default)")
    args = parser.parse_args()
    reason = multihost.refused()
    if reason:
        sys.exit(reason)
    pgserver.engine = "postgresql"
    settings = {"workers": args.workers} if args.workers else {}
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        paths = bench.make_photos(root / "photos", args.photos, args.megapixels)
        with multihost.Cluster(root / "cluster", hosts=max(args.hosts), settings=settings) as cluster:
            print(f"bench_hosts: photos={args.photos} megapixels={args.megapixels:g} hosts={args.hosts} "
                  f"rounds={args.rounds} workers_per_host={args.workers or 'default'}", flush=True)
            for round_ in range(args.rounds):
                for count in args.hosts:
                    got = one_run(cluster, paths, count, f"{round_}-{count}")
                    print(f"bench_hosts: hosts={count} round={round_} photos_per_s={got['photos_per_s']:.2f} "
                          f"cpu_per_photo_s hosts={got['hosts_cpu']:.3f} postgres={got['postgres_cpu']:.3f} "
                          f"s3rver={got['s3rver_cpu']:.3f} cores_busy={got['cores_busy']:.2f}", flush=True)


if __name__ == "__main__":
    main()
