"""The steps every picture takes to its two images, a photo's decode and a video's poster alike.

Decode, view, grid, watermark and the two JPEG encodes run as one job in an image thread
(``ImageThreads.run_steps``, on the worker's image limiter), with a ``checkpoint`` between steps, so that a
cancellation lands between them. ``decode`` is a call without arguments that makes the decoded picture in the
first step: this function then holds the only reference to it, and it is freed as soon as the view exists (a
144 MP PNG decodes to hundreds of MB; the view is a few).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

from picpeak_lite.media import images
from picpeak_lite.pipeline.imagethreads import Checkpoint

RunSteps = Callable[[Callable[[Checkpoint], Any]], Awaitable[Any]]  # the worker's way to run one job of steps


def derivatives(decode: Callable[[], images.Decoded], spec: images.RenderSpec, checkpoint: Checkpoint
                ) -> tuple[images.Decoded, bytes, bytes]:
    """(the view, its JPEG, the grid's JPEG), watermarked when ``spec`` says so, without metadata."""
    decoded = decode()
    checkpoint()
    view = images.make_view(decoded, spec)
    del decoded
    checkpoint()
    grid = images.make_grid(view, spec)
    checkpoint()
    if spec.watermark is not None:
        view = images.add_watermark(view, spec.watermark)
        checkpoint()
    view_jpeg = images.encode(view, spec)
    checkpoint()
    grid_jpeg = images.encode(grid, spec)
    return view, view_jpeg, grid_jpeg
