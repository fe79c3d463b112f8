"""The child processes image work runs in (issue 29), and the one home of trio-parallel.

Why processes and not threads: image threads shared the event loop's GIL, and the GIL knows no priorities, so
while photos were processed a guest's listing waited for decodes (p95 260-300 ms on two cores). A child has a
GIL of its own and an OS priority (``image_nice``) the kernel does honour, so the web server gets a core the
moment it wants one. And a child is a wall: a decoder that crashes, or a file that lies about its size, ends
or fails that child's job (the attempt counts, and the photo is tried again until ``max_attempts``), never the
server; a photo past its deadline is stopped by killing its child, at once, not at its next checkpoint.

That wall is what lets the janitor treat the server's own death (``kill -9``, a power cut, a loaded machine
restarted) as nobody's fault (``transitions.requeue_expired``): nothing a photo contains runs in the server.

The children are trio-parallel's default context: started with the worker pool (:meth:`ImageProcesses.warm`, in
the background) and when work comes, kept for ten idle minutes and reused (a start costs 0.3-0.7 s of a core:
Python and Pillow), and ended with this process (their pipe closes). How many run at once is the caller's
limiter (the worker pool's ``workers``); each job carries the child's limits (``imagejobs.Limits``). SIGINT and
SIGTERM are ignored in the children: a stop is the server's to carry out (it drains, then cancels, which kills a
child still working), so a signal to the whole process group never fails a photo as a crash.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable
from typing import Any, TypeVar

import trio
import trio_parallel

from picpeak_lite.pipeline import imagejobs

log = logging.getLogger(__name__)
T = TypeVar("T")
MB = 1024 * 1024
# What a child maps before any photo: Python, Pillow, libheif and their libraries (76 MB measured), with room.
CHILD_BASE_ADDRESS_SPACE = 384 * MB
# The caller bounds how many jobs run at once; trio-parallel's own default limiter (one per core) must not.
_UNBOUNDED = trio.CapacityLimiter(math.inf)


class ChildCrashed(Exception):
    """The child died while it worked on a job (a signal or an exit of its own): that job's file is the
    likeliest cause, so its attempt counts. ``reason`` is for the uploader."""

    def __init__(self, reason: str, detail: str) -> None:
        super().__init__(reason)
        self.reason = reason
        self.detail = detail


class ImageProcesses:
    """Jobs in image children, at ``nice`` and with ``decode_bytes`` (the decode budget) of address space each,
    above what a child maps before its first job."""

    def __init__(self, *, nice: int, decode_bytes: int) -> None:
        self.limits = imagejobs.Limits(nice=nice, address_space=CHILD_BASE_ADDRESS_SPACE + decode_bytes)

    async def run(self, fn: Callable[..., T], *args: Any) -> T:
        """``fn(*args)`` in a child. Cancelled, the child is killed (and waited for: the memory it held is back
        when this returns). Its death raises :class:`ChildCrashed`; any exception of ``fn`` is raised here."""
        try:
            return await trio_parallel.run_sync(imagejobs.run, self.limits, fn, *args,
                                                kill_on_cancel=True, limiter=_UNBOUNDED)
        except trio_parallel.BrokenWorkerError as error:
            raise ChildCrashed("The image decoder stopped while reading this file; it may be damaged.",
                               _describe(error)) from None

    async def warm(self, count: int) -> None:
        """Start ``count`` children now (each runs one empty job), so that the first photo does not wait for a
        start (0.3-0.7 s of a core each: Python and Pillow). Run in the background by the worker pool; a child
        that fails to start is only logged, and started again by the first photo that needs it."""
        try:
            async with trio.open_nursery() as nursery:
                for _ in range(count):
                    nursery.start_soon(self.run, imagejobs.ready)
        except* ChildCrashed as crashed:
            log.warning("an image child did not start: %s", crashed.exceptions[0])

    async def run_by(self, deadline: float, fn: Callable[..., T], *args: Any) -> T | None:
        """:meth:`run`, or None when it took longer than ``deadline`` seconds (the child was killed)."""
        with trio.move_on_after(deadline):
            return await self.run(fn, *args)
        return None


def _describe(error: BaseException) -> str:
    """"killed by signal 9", "exit status 3", or what trio-parallel said, for the log."""
    process = error.args[1] if len(error.args) > 1 else None
    code = getattr(process, "exitcode", None)
    if code is None:
        return str(error)
    return f"killed by signal {-code}" if code < 0 else f"exit status {code}"
