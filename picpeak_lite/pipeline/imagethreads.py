"""The threads image work runs in: a small set of its own, at a lower OS priority than the event loop.

Why not ``trio.to_thread.run_sync``: trio's threads are shared by every blocking call (SQLite, file writes,
hashing of incoming bytes), so a priority cannot be given to one kind of work. Here each thread lowers its
own priority once, when it starts (Linux gives each thread its own nice value), and runs nothing but image
work. On a box with two cores, the decodes then take every cycle the event loop does not want, and the loop,
which receives uploads and answers guests, gets a core the moment it has something to do, instead of waiting
for a decode's time slice to end: processing does not starve uploads, and uploads leave nothing idle.

The semantics are those of ``trio.to_thread.run_sync`` without ``abandon_on_cancel``: a cancelled caller
waits for its job to end (an image step takes well under a second, and the memory it holds must be back
before the caller releases its share of the decode budget), then sees the cancellation.

``run_steps`` runs several steps as one job, so that a photo's decode, resizes and encodes cost one hop
instead of six (each hop is a wake-up of the event loop and a wait for the thread, and between hops the
decoded picture sat idle while the loop served others): a cancellation then lands at the job's next
``checkpoint``, between two steps, as it did between hops.
"""

from __future__ import annotations

import collections
import contextlib
import functools
import logging
import os
import sys
import threading
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

import trio

log = logging.getLogger(__name__)

T = TypeVar("T")
IDLE_SECONDS = 10.0  # a thread with no job for this long ends
Checkpoint = Callable[[], None]
RunSteps = Callable[[Callable[[Checkpoint], Any]], Awaitable[Any]]  # a caller's way to its run_steps


class Stopped(BaseException):
    """Raised inside a job by its checkpoint once its caller is cancelled: the steps left are not run. A
    BaseException, so that a step's ``except Exception`` cannot take it for the step's own failure."""


class _Job:
    """One call, and where its result goes: the thread fills ``value`` or ``error``, then wakes ``task``.
    ``stop`` is set (from the event loop) when the caller is cancelled; the job's checkpoint reads it."""

    __slots__ = ("error", "fn", "stop", "task", "token", "value")

    def __init__(self, fn: Callable[[], Any] | None, token: trio.lowlevel.TrioToken, task: trio.lowlevel.Task
                 ) -> None:
        self.fn = fn
        self.token = token
        self.task = task
        self.value: Any = None
        self.error: BaseException | None = None
        self.stop = False

    def checkpoint(self) -> None:
        if self.stop:
            raise Stopped()


class ImageThreads:
    """At most ``count`` threads at ``nice`` (0: the process's own priority), started when work comes and
    ended after IDLE_SECONDS without any, like trio's own thread cache: nothing to start or stop, and a pool
    made for a test leaves no thread behind. The caller bounds how many jobs run at once (the worker pool's
    limiter); a job beyond ``count`` waits in the queue."""

    def __init__(self, count: int, *, nice: int = 0, name: str = "picpeak image",
                 idle_seconds: float = IDLE_SECONDS) -> None:
        self.count = count
        self.nice = nice
        self.name = name
        self.idle_seconds = idle_seconds
        self._jobs: collections.deque[_Job] = collections.deque()
        # One lock for the queue and both counts: a thread takes a job and stops counting as idle in one step,
        # so a job submitted meanwhile never counts on a thread that is already busy (with a separate queue, a
        # job could wait behind another while a thread it was owed was never started).
        self._lock = threading.Condition()
        self._alive = 0
        self._idle = 0

    @property
    def alive(self) -> int:
        """How many threads exist now."""
        return self._alive

    async def run_sync(self, fn: Callable[..., T], *args: Any) -> T:
        """``fn(*args)`` in an image thread; a cancelled caller waits for it to end."""
        return await self._call(lambda job: fn(*args))

    async def run_steps(self, fn: Callable[[Checkpoint], T]) -> T:
        """``fn(checkpoint)`` in an image thread, as one job. ``fn`` calls ``checkpoint()`` between its steps;
        once the caller is cancelled that raises :class:`Stopped`, the job ends there, and the caller sees the
        cancellation when it has."""
        return await self._call(lambda job: fn(job.checkpoint))

    async def _call(self, fn: Callable[[_Job], T]) -> T:
        await trio.lowlevel.checkpoint_if_cancelled()
        job = _Job(None, trio.lowlevel.current_trio_token(), trio.lowlevel.current_task())
        job.fn = functools.partial(fn, job)
        self._submit(job)

        def abort(_: Any) -> trio.lowlevel.Abort:
            job.stop = True  # read by the job's next checkpoint, if it has any
            return trio.lowlevel.Abort.FAILED  # the job runs on (to its checkpoint); we are woken when it ends

        await trio.lowlevel.wait_task_rescheduled(abort)
        if job.error is not None:
            error, job.error = job.error, None
            if isinstance(error, Stopped):
                await trio.lowlevel.checkpoint()  # the cancellation that stopped the job: raised here
            raise error
        result: T = job.value
        return result

    def _submit(self, job: _Job) -> None:
        with self._lock:
            self._jobs.append(job)
            if len(self._jobs) > self._idle and self._alive < self.count:
                self._alive += 1
                threading.Thread(target=self._serve, name=f"{self.name} {self._alive}", daemon=True).start()
            self._lock.notify()

    def _serve(self) -> None:
        self._lower_priority()
        while True:
            with self._lock:
                self._idle += 1
                if not self._lock.wait_for(lambda: self._jobs, timeout=self.idle_seconds):
                    self._idle -= 1
                    self._alive -= 1
                    return
                job = self._jobs.popleft()
                self._idle -= 1
            self._run(job)

    @staticmethod
    def _run(job: _Job) -> None:
        assert job.fn is not None
        try:
            job.value = job.fn()
        except BaseException as exc:  # handed to the caller, as to_thread does
            job.error = exc
        job.fn = None
        with contextlib.suppress(trio.RunFinishedError):  # the run ended while the job ran: nobody waits
            job.token.run_sync_soon(trio.lowlevel.reschedule, job.task)

    def _lower_priority(self) -> None:
        if self.nice <= 0 or not sys.platform.startswith("linux"):
            return  # elsewhere PRIO_PROCESS with a thread id would change the whole process, or fail
        try:
            os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), self.nice)
        except OSError as exc:
            log.warning("could not lower the priority of the image threads: %s", exc)
