"""How photos/s grows with processes, workers and uploaders, against what the cores could do (issue 29).

    python bench/bench_scaling.py [--photos 60] [--megapixels 12] [--processes 1 2] [--workers 0]
                                  [--uploaders 1 2] [--rounds 1]

For each combination of N processes x W workers x C uploaders (interleaved over ``--rounds``): a fresh
``picpeak-lite serve --processes N`` (``picpeak_lite.ops.bench.Server``) with ``workers = W`` image children in
each process (0: the default, the cores shared out between the processes), and C clients each uploading its
share of the camera-like photos (``picpeak_lite.media.samples``) as the bulk uploader does (batches of at most
50 files, one request at a time per client). It prints, per run:

* photos/s end to end (first byte -> every photo complete);
* cores busy: the CPU seconds of every process (servers, workers, their image children) over the wall time;
* the share of the decode floor: the same photos decoded at 1/4 scale (libjpeg's DCT scaling, the least a view
  image needs) by one process per core doing nothing else, measured in the same run before the servers. That
  is what the cores could do if intake, EXIF, the views' encodes and the database cost nothing.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import itertools
import json
import os
import sys
import tempfile
import threading
import time
from pathlib import Path

from PIL import Image

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from picpeak_lite.ops import bench


def _decode_quarter(path: Path) -> None:
    with Image.open(path) as im:
        im.draft("RGB", (im.width // 4, im.height // 4))
        im.load()


def decode_floor(paths: list[Path], cores: int, repeat: int = 3) -> float:
    """Photos/s when ``cores`` processes do nothing but decode them at 1/4 scale."""
    with concurrent.futures.ProcessPoolExecutor(cores) as pool:
        list(pool.map(_decode_quarter, paths[:cores]))  # start the processes and import Pillow first
        began = time.perf_counter()
        list(pool.map(_decode_quarter, paths * repeat, chunksize=2))
        return len(paths) * repeat / (time.perf_counter() - began)


def one_run(root: Path, paths: list[Path], processes: int, workers: int, uploaders: int) -> dict[str, float]:
    env = {"PICPEAK_WORKERS": str(workers)} if workers else {}
    server = bench.Server(root / "data", env=env, args=("--processes", str(processes)))
    server.start()
    try:
        pids = [server.pid]
        admin = bench._Client(server.url, server.token)
        _, gallery = admin.call("POST", "/api/admin/galleries", json.dumps({"name": "Scaling"}).encode(),
                                {"Content-Type": "application/json"})
        shares = [paths[i::uploaders] for i in range(uploaders)]
        answered: list[str] = []
        errors: list[str] = []

        def upload(share: list[Path]) -> None:
            client = bench._Client(server.url, server.token)
            try:
                for group in bench.batches(share):
                    status, answer = client.upload(gallery["id"], group)
                    if status != 202:
                        errors.append(f"{status}: {str(answer)[:200]}")
                        return
                    answered.append(answer["upload_id"])
            finally:
                client.close()

        cpu_before = bench.tree_cpu_seconds(*pids)
        began = time.perf_counter()
        threads = [threading.Thread(target=upload, args=(share,)) for share in shares]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        if errors:
            raise RuntimeError(errors[0])
        while True:
            done = 0
            for upload_id in answered:
                _, progress = admin.call("GET", f"/api/admin/uploads/{upload_id}")
                done += progress["complete"] + progress["failed"]
            if done >= len(paths):
                break
            time.sleep(0.05)
        wall = time.perf_counter() - began
        cpu = bench.tree_cpu_seconds(*pids) - cpu_before
        admin.close()
        return {"photos_per_s": len(paths) / wall, "cores_busy": cpu / wall, "cpu_per_photo": cpu / len(paths)}
    finally:
        server.stop()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--photos", type=int, default=60)
    parser.add_argument("--megapixels", type=float, default=12.0)
    parser.add_argument("--processes", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--workers", type=int, nargs="+", default=[0])
    parser.add_argument("--uploaders", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--rounds", type=int, default=1)
    args = parser.parse_args()
    cores = os.cpu_count() or 1
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        paths = bench.make_photos(root / "photos", args.photos, args.megapixels)
        floor = decode_floor(paths, cores)
        print(f"scaling: cores={cores} photos={args.photos} megapixels={args.megapixels:g} "
              f"decode_floor_photos_per_s={floor:.1f}", flush=True)
        combos = list(itertools.product(args.processes, args.workers, args.uploaders))
        for round_ in range(args.rounds):
            for n, w, c in combos:
                run_root = root / f"run-{round_}-{n}-{w}-{c}"
                run_root.mkdir()
                got = one_run(run_root, paths, n, w, c)
                print(f"scaling: processes={n} workers_per_process={w or max(1, cores // n)} uploaders={c} "
                      f"photos_per_s={got['photos_per_s']:.2f} cores_busy={got['cores_busy']:.2f} "
                      f"cpu_per_photo_s={got['cpu_per_photo']:.3f} "
                      f"share_of_decode_floor={got['photos_per_s'] / floor:.0%}", flush=True)


if __name__ == "__main__":
    main()
