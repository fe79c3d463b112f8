"""End to end through the real server with S3 storage (moto's S3 server on 127.0.0.1) against local storage.

    python bench/bench_s3.py [--photos 30] [--megapixels 12] [--pairs 2]

Makes camera-like photos once (``picpeak_lite.media.samples``), starts moto's standalone S3 server as its own
process, then per pair runs a fresh ``picpeak-lite serve`` on local storage and one on a fresh bucket,
interleaved (local, s3, local, s3, ...) so that load from other users of the machine falls on both. The upload
and the measurements are those of ``picpeak-lite bench`` (``picpeak_lite.ops.bench``): photos/s from the first
byte sent to the last photo complete, and the server's CPU per photo and peak RSS. Prints one line per run and
the medians.

With S3 every original is uploaded to the bucket before its 202 and read back by a worker, and each thumbnail
is a PUT, all over loopback HTTP to a Python server: the figure is the cost of our S3 path plus moto's, not of
a real object store's network.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from picpeak_lite.ops import bench  # noqa: E402
from tests.s3server import CREDENTIALS, MotoServer  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--photos", type=int, default=30)
    parser.add_argument("--megapixels", type=float, default=12)
    parser.add_argument("--pairs", type=int, default=2)
    args = parser.parse_args()
    figures: dict[str, list[float]] = {"local": [], "s3": []}
    with tempfile.TemporaryDirectory() as tmp, MotoServer() as moto:
        photos = bench.make_photos(Path(tmp) / "photos", args.photos, args.megapixels)
        for pair in range(args.pairs):
            for kind in ("local", "s3"):
                env = {}
                if kind == "s3":
                    env = {"PICPEAK_STORAGE": "s3", "PICPEAK_S3_ENDPOINT_URL": moto.url,
                           "PICPEAK_S3_BUCKET": moto.new_bucket(), "PICPEAK_S3_REGION": "us-east-1",
                           "AWS_ACCESS_KEY_ID": CREDENTIALS["aws_access_key_id"],
                           "AWS_SECRET_ACCESS_KEY": CREDENTIALS["aws_secret_access_key"]}
                result = bench.run(len(photos), args.megapixels, workdir=Path(tmp), photos=photos, env=env)
                figures[kind].append(result.photos_per_s)
                print(f"bench_s3: run={pair + 1} storage={kind} photos={result.photos} complete={result.complete} "
                      f"failed={result.failed} megabytes={result.megabytes:.0f} "
                      f"photos_per_s={result.photos_per_s:.2f} all_complete_s={result.all_complete_s:.1f} "
                      f"peak_rss_mb={result.peak_rss_mb:.0f}", flush=True)
    local, s3 = statistics.median(figures["local"]), statistics.median(figures["s3"])
    print(f"bench_s3: photos={args.photos} megapixels={args.megapixels} pairs={args.pairs} "
          f"local_photos_per_s={local:.2f} s3_photos_per_s={s3:.2f} s3_vs_local={s3 / local:.2f}")


if __name__ == "__main__":
    main()
