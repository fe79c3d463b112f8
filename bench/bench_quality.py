"""How close the view image is to the ideal one, and what it costs: issue 18's quality figure.

    python bench/bench_quality.py [--megapixels 24 12] [--out test-artifacts]

For camera-like photos (``picpeak_lite.media.samples``: noise sigma 13, q90), compares the view image that
``images.render`` makes (a DCT-scaled decode, bilinear only for what is left) with a reference made the
expensive way: a full-resolution decode and Lanczos straight to the same size. Prints the PSNR of the raw
pixels against the reference, and the PSNR that reaches the guest: both images JPEG-encoded with the same
settings, each compared with the unencoded reference. The goal is a delivered PSNR within 1 dB of the
reference's own. Also prints the CPU seconds of each path, and saves a 1:1 crop of both side by side as
``quality-<mp>mp.png`` in ``--out``.
"""

from __future__ import annotations

import argparse
import io
import math
import sys
import time
from pathlib import Path

from PIL import Image, ImageChops, ImageStat

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from picpeak_lite.media import images, samples

SPEC = images.RenderSpec()


def psnr(a: Image.Image, b: Image.Image) -> float:
    sums = ImageStat.Stat(ImageChops.difference(a, b)).sum2
    mse = sum(sums) / (a.width * a.height * len(sums))
    return math.inf if mse == 0 else 10 * math.log10(255 * 255 / mse)


def delivered(image: Image.Image) -> Image.Image:
    return Image.open(io.BytesIO(images.encode(images.Decoded(image, "jpeg", *image.size, None, None, 1),
                                               SPEC))).convert("RGB")


def cpu(fn):  # type: ignore[no-untyped-def]
    started = time.process_time()
    result = fn()
    return result, time.process_time() - started


def measure(megapixels: float, out: Path) -> None:
    _, data = next(samples.camera_photos(1, megapixels, seed=7))
    rendered, ours_s = cpu(lambda: images.render(data, SPEC))
    ours = Image.open(io.BytesIO(rendered.view_jpeg)).convert("RGB")

    def reference_path() -> Image.Image:
        full = Image.open(io.BytesIO(data))
        full.load()
        return full.convert("RGB").resize(ours.size, Image.Resampling.LANCZOS)

    reference, reference_s = cpu(reference_path)
    ours_raw = images.make_view(images.decode(data, SPEC), SPEC).image
    ideal = delivered(reference)
    print(f"{megapixels:g} MP ({len(data) / 1e6:.1f} MB) -> view {ours.size[0]}x{ours.size[1]}: "
          f"raw PSNR against the full-resolution Lanczos reference {psnr(ours_raw, reference):.2f} dB; "
          f"delivered PSNR {psnr(ours, reference):.2f} dB against the reference's own {psnr(ideal, reference):.2f} dB "
          f"(difference {psnr(ideal, reference) - psnr(ours, reference):.2f} dB); "
          f"CPU render (view + grid + both encodes) {ours_s * 1000:.0f} ms, "
          f"reference decode + resize {reference_s * 1000:.0f} ms")
    box = (ours.width // 2 - 200, ours.height // 2 - 150, ours.width // 2 + 200, ours.height // 2 + 150)
    side = Image.new("RGB", (820, 300), (255, 255, 255))
    side.paste(ideal.crop(box), (0, 0))
    side.paste(ours.crop(box), (420, 0))
    out.mkdir(parents=True, exist_ok=True)
    side.save(out / f"quality-{megapixels:g}mp.png")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--megapixels", type=float, nargs="+", default=[24, 12])
    parser.add_argument("--out", type=Path, default=Path("test-artifacts"))
    args = parser.parse_args()
    for megapixels in args.megapixels:
        measure(megapixels, args.out)
    print(f"crops (left: reference, right: ours) in {args.out}/")


if __name__ == "__main__":
    main()
