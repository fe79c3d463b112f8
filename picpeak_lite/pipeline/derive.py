"""The steps every picture takes to its two images, a photo's decode and a video's poster alike.

View, grid, watermark and the two JPEG encodes, one thread hop each (``run``: the worker's image limiter and
threads), so that a cancellation lands between steps. ``decode`` is a call without arguments that makes the
decoded picture in the first hop: this function then holds the only reference to it, and it is freed as soon
as the view exists (a 144 MP PNG decodes to hundreds of MB; the view is a few).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

from picpeak_lite.media import images

Run = Callable[..., Awaitable[Any]]


async def derivatives(decode: Callable[[], images.Decoded], spec: images.RenderSpec, run: Run
                      ) -> tuple[images.Decoded, bytes, bytes]:
    """(the view, its JPEG, the grid's JPEG), watermarked when ``spec`` says so, without metadata."""
    decoded = await run(decode)
    view = await run(images.make_view, decoded, spec)
    del decoded
    grid = await run(images.make_grid, view, spec)
    if spec.watermark is not None:
        view = await run(images.add_watermark, view, spec.watermark)
    view_jpeg = await run(images.encode, view, spec)
    grid_jpeg = await run(images.encode, grid, spec)
    return view, view_jpeg, grid_jpeg
