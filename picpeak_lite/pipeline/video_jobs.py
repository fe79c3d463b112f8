"""Running the video probe and poster in a child process, with a deadline and a memory limit.

``media/video.py`` does the work; this module starts it as ``python -m picpeak_lite.media.video`` and reads
its answer. Why a child and not a thread: FFmpeg is C code fed with strangers' files. A segfault or abort in a
thread would end the server with every upload in flight; in a child it ends the child, and the video fails
with :data:`CRASHED` (tests/test_video.py shows one). The child sets itself an address-space limit
(``RLIMIT_AS``, :data:`CHILD_MEMORY`; :data:`PROBE_MEMORY` for the probe) before it loads FFmpeg (not in a
``preexec_fn``: unsafe in a threaded server), so a runaway allocation fails there, not in the server; and it
has a deadline: trio kills the child when the deadline passes (:data:`TOO_SLOW`), so a file that makes the
decoder spin never holds a worker.
A crash or a deadline is the file's doing or the machine's: the worker fails the video with the sentence, and
an admin's retry runs it again.

How many children run at once is bounded too: probe, inspect and transcode take a place in one limiter per
process (:func:`media_limiter`, ``media_children`` places). Without it each upload started its own probe:
eight guests sending a 2 KB file whose index claims ten million samples made eight children of 700 MB each. A
child waits for its place before it starts, and its deadline counts from its start, so a probe waits its turn
and never fails because others are busy.

No SQL and no Quart here; callers are ``pipeline/intake.py`` (the header check at upload: ``probe``) and
``pipeline/video_work.py`` (the worker: ``inspect``, probe and poster in one child).
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
from dataclasses import dataclass
from os import fspath
from pathlib import Path
from typing import Any, Protocol

import trio

from picpeak_lite.media import video
from picpeak_lite.media.video import InvalidVideo, VideoInfo
from picpeak_lite.perrun import PerRun

MB = 1024 * 1024
# FFmpeg maps its libraries and a few decoder threads (virtual memory, mostly never touched): 1 GB of address
# space leaves a 4K HEVC poster room and stops a header that asks for gigabytes.
CHILD_MEMORY = 1024 * MB
# The probe decodes one frame, with two decoder threads: measured with RLIMIT_AS, a 4K HEVC phone clip needs
# 192 MB of address space and an 8K HEVC frame (the largest MAX_FRAME_PIXELS lets through) 288 MB; 384 MB
# leaves that headroom, and a probe can no longer take a gigabyte.
PROBE_MEMORY = 384 * MB
MEDIA_CHILDREN = 2  # config.Settings.media_children's default
_LIMITER = PerRun("picpeak_media_children", lambda: trio.CapacityLimiter(MEDIA_CHILDREN))
CRASHED = "The video could not be read: the decoder stopped with an error ({how}). The file may be damaged."
TOO_SLOW = "Reading the video took longer than {seconds:g} seconds and was given up; the file may be damaged."


@dataclass(frozen=True)
class Inspected:
    info: VideoInfo
    poster_size: tuple[int, int] | None = None  # as stored in the stream: turn it by poster_orientation
    poster_rgb: bytes = b""
    poster_orientation: int = 1


async def _kill(process: trio.Process) -> None:
    """At the deadline: SIGKILL at once. The child holds nothing to clean up (its output is a temp file the
    caller removes), and a decoder stuck in a loop or a blocking read need not be asked twice."""
    process.kill()


def media_limiter(places: int = MEDIA_CHILDREN) -> trio.CapacityLimiter:
    """This process's one limiter of media children (one per trio run, which is one per process outside the
    tests), with ``places`` places (``settings.media_children``; every caller passes the same setting)."""
    limiter = _LIMITER.get()
    if limiter.total_tokens != places:
        limiter.total_tokens = places
    return limiter


async def probe(path: Path, *, deadline: float, max_pixels: int, places: int = MEDIA_CHILDREN) -> VideoInfo:
    """The header facts of a video (and proof that its first frame decodes). Raises InvalidVideo."""
    return (await _run("probe", path, deadline=deadline, view_px=0, max_pixels=max_pixels, places=places,
                       memory=PROBE_MEMORY)).info


async def inspect(path: Path, *, deadline: float, view_px: int, max_pixels: int, places: int = MEDIA_CHILDREN
                  ) -> Inspected:
    """Probe and poster frame (RGB, at most ``view_px`` on its long edge, with the EXIF orientation that turns
    it upright) in one child."""
    return await _run("inspect", path, deadline=deadline, view_px=view_px, max_pixels=max_pixels, places=places,
                      memory=CHILD_MEMORY)


class GiveWay(Protocol):
    """When a long child must stand aside for more urgent work (the transcode, for photos): :meth:`busy` returns
    once that work is waiting, :meth:`idle` once none is left."""

    async def busy(self) -> None: ...

    async def idle(self) -> None: ...


async def transcode(source: Path, target: Path, *, deadline: float, give_way: GiveWay | None = None,
                    places: int = MEDIA_CHILDREN) -> None:
    """The playable H.264/AAC preview (media/video.py ``transcode``), at nice 19, twice the probe's memory.
    With ``give_way`` the child is stopped (SIGSTOP) while :meth:`GiveWay.busy` says other work waits and
    continued (SIGCONT) once it is :meth:`GiveWay.idle`: nice 19 alone still left it a share of both cores and
    of their caches, which made a photo processed meanwhile about a quarter slower. The deadline counts only
    the time the child was running. A stopped child keeps its place in :func:`media_limiter` (it keeps its
    memory too), which is why ``media_children`` is at least 2."""
    command = [sys.executable, "-m", "picpeak_lite.media.video", "transcode", fspath(source), fspath(target),
               str(video.MAX_FRAME_PIXELS), str(2 * CHILD_MEMORY)]
    async with media_limiter(places):
        await _child(command, deadline, give_way)


async def _child(command: list[str], deadline: float, give_way: GiveWay | None = None
                 ) -> tuple[dict[str, Any], bytes]:
    """Run one child to its end or its deadline (then SIGKILL): its first output line as JSON, and the rest.
    A crash, a kill, no answer or the error it reports becomes InvalidVideo with a sentence."""
    outcome: dict[str, subprocess.CompletedProcess[bytes]] = {}
    timed_out = False
    async with trio.open_nursery() as nursery:

        async def run(task_status: trio.TaskStatus[trio.Process] = trio.TASK_STATUS_IGNORED) -> None:
            outcome["done"] = await trio.run_process(command, capture_stdout=True, capture_stderr=True,
                                                     check=False, deliver_cancel=_kill, task_status=task_status)
            nursery.cancel_scope.cancel()  # the watch below ends with the child

        process = await nursery.start(run)
        timed_out = not await _watch(process, deadline, give_way)
        nursery.cancel_scope.cancel()  # the deadline passed: cancelling run_process kills the child
    if timed_out or "done" not in outcome:
        raise InvalidVideo(TOO_SLOW.format(seconds=deadline))
    done = outcome["done"]
    _check_exit(done)
    line, _, rest = done.stdout.partition(b"\n")
    try:
        head = json.loads(line)
    except ValueError as exc:
        raise InvalidVideo(CRASHED.format(how="no answer"), repr(done.stdout[:200])) from exc
    if "error" in head:
        raise InvalidVideo(head["error"], head.get("detail", ""), too_large=bool(head.get("too_large")))
    return head, rest


async def _watch(process: trio.Process, deadline: float, give_way: GiveWay | None) -> bool:
    """Until the child has run for ``deadline`` seconds (False then; the caller's cancel ends it when it exits
    first): stop it whenever ``give_way`` is busy, continue it when idle. A stopped child is still killed by a
    cancellation (SIGKILL needs no SIGCONT), so a server shutting down never waits for a paused transcode."""
    spent = 0.0
    while True:
        began = trio.current_time()
        with trio.move_on_after(deadline - spent) as scope:
            if give_way is None:
                await trio.sleep_forever()
            else:
                await give_way.busy()
        spent += trio.current_time() - began
        if scope.cancelled_caught:
            return False
        process.send_signal(signal.SIGSTOP)
        try:
            assert give_way is not None
            await give_way.idle()
        finally:
            process.send_signal(signal.SIGCONT)


def _check_exit(done: subprocess.CompletedProcess[bytes]) -> None:
    if done.returncode != 0:
        how = (f"signal {signal.Signals(-done.returncode).name}" if done.returncode < 0
               else f"exit status {done.returncode}")
        raise InvalidVideo(CRASHED.format(how=how), done.stderr[-500:].decode(errors="replace"))


async def _run(mode: str, path: Path, *, deadline: float, view_px: int, max_pixels: int, places: int,
               memory: int) -> Inspected:
    command = [sys.executable, "-m", "picpeak_lite.media.video", mode, fspath(path), str(view_px), str(max_pixels),
               str(memory)]
    async with media_limiter(places):
        head, rest = await _child(command, deadline)
    info = VideoInfo.from_json(head["info"])
    poster = head.get("poster")
    if poster is None:
        return Inspected(info)
    size = (int(poster["width"]), int(poster["height"]))
    if len(rest) != size[0] * size[1] * 3:
        raise InvalidVideo(CRASHED.format(how="a short poster"), f"{len(rest)} bytes for {size}")
    return Inspected(info, size, rest, int(poster.get("orientation", 1)))
