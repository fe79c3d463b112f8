"""The header check of a received video, for ``pipeline/intake.py`` (admin and guest uploads, the importer).

A file is a video when its first bytes are an MP4, MOV/M4V or WebM container's (``video.sniff_container``), never
because of its name. Its probe (``video_jobs.probe``: a child process with a deadline) gives duration, size and
codecs; what the header already shows to be refused (no video track, an unreadable or unknown codec, no frame,
over the guest's size or duration limit) is refused here with a sentence, before a worker sees it. The rest
becomes an :class:`images.ImageHeader` (container as format, displayed size), so intake's commit path stays the
photos' path.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from picpeak_lite.config import Settings
from picpeak_lite.i18n import _
from picpeak_lite.media import images, video
from picpeak_lite.pipeline import video_jobs

MB = 1024 * 1024


@dataclass(frozen=True)
class Refused(Exception):
    reason: str
    status: int  # 413 over a limit, 415 not a video we take, 400 broken


def container_of(path: Path) -> str | None:
    """Sync, for a thread: the container the file's first bytes show, or None (then it is not a video)."""
    with open(path, "rb") as fp:
        return video.sniff_container(fp.read(64))


async def check(path: Path, size: int, *, settings: Settings, max_bytes: int, max_seconds: int | None,
                max_pixels: int) -> tuple[images.ImageHeader, video.VideoInfo]:
    """Probe a received video and apply the limits its header can show; raises :class:`Refused`."""
    if size > max_bytes:
        raise Refused(f"The video is larger than the limit of {max_bytes // MB} MB for videos.", 413)
    try:
        info = await video_jobs.probe(path, deadline=settings.video_deadline_seconds, max_pixels=max_pixels,
                                      places=settings.media_children)
    except video.InvalidVideo as error:
        status = 413 if error.too_large else 415 if error.reason in (video.UNSUPPORTED, video.NO_VIDEO) else 400
        raise Refused(_(error.reason), status) from error
    if max_seconds is not None and info.duration > max_seconds:
        raise Refused(f"The video is {_minutes(info.duration)} long; guests may upload videos of at most "
                      f"{_minutes(max_seconds)}.", 413)
    return images.ImageHeader(info.container, info.mime, info.width, info.height), info


def _minutes(seconds: float) -> str:
    whole = round(seconds)
    return f"{whole // 60}:{whole % 60:02d} min" if whole >= 60 else f"{whole} s"
