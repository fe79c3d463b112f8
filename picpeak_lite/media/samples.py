"""Camera-like test photos made in code, for ``picpeak-lite bench`` and ``bench/bench_e2e.py``.

Flat fills and pure noise both lie about cost: a flat JPEG is tiny and decodes in no time, white noise is huge
and compresses like nothing a camera makes. These are made the way issue 18's driver made them: a smooth
random field, a gradient, soft blotches, Gaussian noise of sigma ~13 (sensor grain at ISO 800 or so), saved at
quality 90 with an EXIF block carrying camera, date and GPS; every 4th photo says Orientation 6 (a portrait
taken with the camera turned), so the server's rotation is paid for as it is on real uploads. At 24 MP one
is about 11 MB, as a camera's JPEG is.

Making the noise is the slow part, so :func:`camera_photos` draws a few base images and derives each photo from
one of them (a shifted crop of the grain and a changed pixel row), so that every file differs in bytes.
"""

from __future__ import annotations

import io
import random
from collections.abc import Iterator

from PIL import Image, ImageChops, ImageDraw, ImageFilter

NOISE_SIGMA = 13
QUALITY = 90
BASES = 3  # distinct base images per run; more only costs time


def size_for(megapixels: float) -> tuple[int, int]:
    """A 3:2 frame of about ``megapixels`` million pixels (24 MP -> 6000 x 4000)."""
    width = max(16, round((megapixels * 1e6 * 1.5) ** 0.5))
    return width, max(16, round(width / 1.5))


def _base(width: int, height: int, seed: int) -> Image.Image:
    """Smooth field + gradient + blotches, no noise yet."""
    rng = random.Random(seed)
    field = Image.new("RGB", (8, 6))
    field.putdata([(rng.randrange(40, 216), rng.randrange(40, 216), rng.randrange(40, 216)) for _ in range(48)])
    image = field.resize((width, height), Image.Resampling.BICUBIC)
    ramp = Image.linear_gradient("L").resize((width, height), Image.Resampling.BILINEAR)
    image = Image.blend(image, Image.merge("RGB", (ramp, ramp, ramp.transpose(Image.Transpose.ROTATE_180))), 0.3)
    blotches = Image.new("L", (width, height), 0)
    draw = ImageDraw.Draw(blotches)
    for _ in range(25):
        x, y, r = rng.randrange(width), rng.randrange(height), rng.randrange(max(2, width // 30), max(3, width // 8))
        draw.ellipse((x - r, y - r, x + r, y + r), fill=rng.randrange(60, 200))
    blotches = blotches.resize((max(1, width // 16), max(1, height // 16)), Image.Resampling.BILINEAR)
    blotches = blotches.filter(ImageFilter.GaussianBlur(2)).resize((width, height), Image.Resampling.BICUBIC)
    tint = Image.new("RGB", (width, height), (rng.randrange(256), rng.randrange(256), rng.randrange(256)))
    return Image.composite(tint, image, blotches)


def _grain(width: int, height: int) -> Image.Image:
    """Gaussian noise around 128 with sigma NOISE_SIGMA per channel, a little larger than the frame so that
    photos can take shifted crops of it."""
    size = (width + 64, height + 64)
    return Image.merge("RGB", [Image.effect_noise(size, NOISE_SIGMA) for _ in range(3)])


def exif_block(index: int, *, orientation: int) -> bytes:
    exif = Image.Exif()
    exif[0x010F] = "Canon"
    exif[0x0110] = "EOS R6"
    exif[0x0112] = orientation
    exif[0x0132] = "2026:06:20 15:00:00"
    sub = exif.get_ifd(0x8769)
    sub[0x9003] = f"2026:06:20 15:{index // 60 % 60:02d}:{index % 60:02d}"
    sub[0x8827] = 800
    gps = exif.get_ifd(0x8825)
    gps[1], gps[2] = "N", (52.0, 31.0, 12.5)
    gps[3], gps[4] = "E", (13.0, 24.0, 18.25)
    return exif.tobytes()


def camera_photos(count: int, megapixels: float, *, seed: int = 1) -> Iterator[tuple[str, bytes]]:
    """``count`` distinct camera-like JPEGs as (file name, bytes), made one at a time."""
    width, height = size_for(megapixels)
    bases: list[Image.Image] = []
    grain = _grain(width, height)
    for index in range(count):
        if len(bases) < BASES and index == len(bases):
            bases.append(_base(width, height, seed + index))
        dx, dy = (index * 7) % 64, (index * 13) % 64
        noise = grain.crop((dx, dy, dx + width, dy + height))
        image = ImageChops.add(bases[index % len(bases)], noise, scale=1.0, offset=-128)
        image.putpixel((index % width, 0), (index % 256, (index // 256) % 256, 7))  # every file differs
        orientation = 6 if index % 4 == 3 else 1
        out = io.BytesIO()
        image.save(out, "JPEG", quality=QUALITY, exif=exif_block(index, orientation=orientation))
        yield f"IMG_{index:04d}.JPG", out.getvalue()
