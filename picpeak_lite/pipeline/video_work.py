"""A worker's work on a video: probe and poster in the child (``video_jobs.inspect``), then the photos' path.

The poster frame comes back as RGB at most ``view_px`` on its long edge, with the EXIF orientation that turns it
upright; from there it is a picture like any other (``images.from_rgb``, then ``images.derivatives``: view, turned
upright, grid, watermark, encode, one job in an image child, on the worker's image limiter: ``make_poster``), so a
video's grid and view images are made, watermarked and stripped of metadata exactly as a photo's. The bytes those
steps take are held in the decode budget like an image's (:func:`poster_cost`); the media child's own memory is
bounded by its RLIMIT_AS instead.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

from picpeak_lite.media import images, video
from picpeak_lite.pipeline import video_jobs
from picpeak_lite.pipeline.imageprocs import ChildCrashed
from picpeak_lite.runtime.budget import MemoryBudget

log = logging.getLogger(__name__)
# The worker's way to a poster's view and grid JPEGs: (the decode, the spec) -> (view JPEG, grid JPEG).
MakePoster = Callable[[Callable[[], images.Decoded], images.RenderSpec], Awaitable[tuple[bytes, bytes]]]


def poster_cost(view_px: int) -> int:
    """Peak bytes: the RGB bytes read from the media child, the Pillow image made of them, the view,
    the grid, the watermarked view and the encoders' buffers, each at most view_px square."""
    return 6 * view_px * view_px * 4


async def render(path: Path, row: dict[str, Any], spec: images.RenderSpec, *, budget: MemoryBudget,
                 make_poster: MakePoster, deadline: float, places: int = video_jobs.MEDIA_CHILDREN
                 ) -> tuple[bytes, bytes, dict[str, Any]] | str:
    """(view JPEG, grid JPEG, the columns for ``claims.complete``), or the reason the video failed."""
    try:
        async with budget.hold(min(poster_cost(spec.view_px), budget.total)):
            got = await video_jobs.inspect(path, deadline=deadline, view_px=spec.view_px,
                                           max_pixels=min(spec.max_pixels, video.MAX_FRAME_PIXELS), places=places)
            assert got.poster_size is not None
            info = got.info
            poster = functools.partial(images.from_rgb, got.poster_rgb, got.poster_size, info.width, info.height,
                                       info.container, got.poster_orientation)
            del got
            view_jpeg, grid_jpeg = await make_poster(poster, spec)
    except video.InvalidVideo as error:
        log.info("video %s failed: %s %s", row["id"], error.reason, error.detail)
        return error.reason
    except FileNotFoundError:
        return "The original file is missing from storage."
    except ChildCrashed:
        raise  # the worker's to count (worker.Crashed)
    except MemoryError:
        log.exception("video %s: out of memory", row["id"])
        return "The video's poster needs more memory than this server has."
    except Exception as error:  # a bug: fail this video, keep the worker alive (as for photos)
        log.exception("video %s: unexpected error while processing", row["id"])
        return f"Processing failed unexpectedly ({type(error).__name__})."
    values = {
        "width": info.width, "height": info.height, "taken_at": info.taken_at, "camera_make": info.camera_make,
        "camera_model": info.camera_model, "has_gps": int(info.has_gps), "duration": info.duration,
        "fps": info.fps, "video_codec": info.video_codec, "audio_codec": info.audio_codec,
    }
    return view_jpeg, grid_jpeg, values
