"""``picpeak-lite serve --processes N``: N serving processes on one listening socket, kept running.

One process answers with one event loop, and one event loop receives uploads at about one core's worth (issue
29: ~150 MB/s, a 16-core box at 5 cores busy). N processes each run the whole server (``server.run``: HTTP,
workers, change feed, ...) on the same data directory and database, and accept from one socket that this
supervisor bound once and handed down (``--listen-fd``): the kernel gives each new connection to a process
waiting in ``accept``, so a process busy with a big upload takes fewer. Everything they must agree on is in the
database: claims, limits, sessions, the change log, and the leases of the few tasks that run in one process at
a time (``runtime/lease.py``).

The supervisor does the first-start work itself (data directory, schema, the admin account), so that the
generated password is printed once and the children never race to make the schema. It reports the service as
running when every child has said so (a byte on ``--ready-fd``), restarts a child that dies (after 1 s, doubling
to 30 s while it keeps dying young), and on SIGINT/SIGTERM passes SIGTERM on to every child, which drains as a
single server does, and waits for them. A child that fails before it is ready (a bad setting, the database
refused) stops the whole start: it has printed its one line, and the supervisor exits with its status.
"""

from __future__ import annotations

import logging
import os
import signal
import socket
import subprocess
import sys
from collections.abc import Sequence
from dataclasses import dataclass

import trio

from picpeak_lite.config import Settings
from picpeak_lite.errors import ConfigError
from picpeak_lite.ops import bootstrap

log = logging.getLogger(__name__)

RESTART_FIRST = 1.0
RESTART_MOST = 30.0
YOUNG_SECONDS = 60.0  # a child that ran this long before it died starts again after RESTART_FIRST


@dataclass(frozen=True)
class Running:
    """What :func:`supervise` reports once every child serves."""

    url: str
    admin_password: str | None


def default_workers(settings: Settings, processes: int) -> int | None:
    """Image children per process when the setting is left at 0 (one per core): the cores shared out, so that
    N processes make as many image children in all as one would. None when the user chose a number."""
    if settings.workers:
        return None
    return max(1, (os.cpu_count() or 1) // processes)


def bound_url(fd: int) -> str:
    """The address a listening socket is bound to, as a URL (port 0 resolved)."""
    sock = socket.socket(fileno=os.dup(fd))
    try:
        host, port = sock.getsockname()[:2]
    finally:
        sock.close()
    return f"http://[{host}]:{port}" if ":" in host else f"http://{host}:{port}"


async def supervise(settings: Settings, listen_fd: int, child_args: Sequence[str], processes: int, *,
                    task_status: trio.TaskStatus[Running] = trio.TASK_STATUS_IGNORED) -> None:
    """Run ``processes`` children (``python -m picpeak_lite serve <child_args> --listen-fd ... --ready-fd ...``)
    until a signal, then stop them and return. ``child_args`` are the user's own settings flags."""
    password = await trio.to_thread.run_sync(_first_start, settings)
    env = dict(os.environ)
    workers = default_workers(settings, processes)
    if workers is not None:
        env["PICPEAK_WORKERS"] = str(workers)
    read_fd, write_fd = os.pipe()
    command = [sys.executable, "-m", "picpeak_lite", "serve", *child_args, "--processes", "1",
               "--listen-fd", str(listen_fd), "--ready-fd", str(write_fd)]
    children: dict[int, trio.Process] = {}
    stopping = trio.Event()
    all_ready = trio.Event()
    failed_start: list[int] = []
    try:
        async with trio.open_nursery() as nursery:
            ready = trio.lowlevel.FdStream(read_fd)
            read_fd = -1  # the stream owns it now
            nursery.start_soon(_stop_on_signals, stopping)
            for index in range(processes):
                nursery.start_soon(_keep_child, index, command, env, write_fd, children, stopping, all_ready,
                                   failed_start)
            if not await _wait_ready(ready, processes, stopping):
                stopping.set()
            else:
                all_ready.set()
                task_status.started(Running(url=bound_url(listen_fd), admin_password=password))
                log.info("serving with %d processes (pids %s)", processes,
                         ", ".join(str(p.pid) for p in children.values()))
            nursery.start_soon(_drain_ready, ready)
            await stopping.wait()
            for process in children.values():
                if process.returncode is None:
                    process.send_signal(signal.SIGTERM)
            # _keep_child returns once its child has exited; then the nursery ends.
            nursery.start_soon(_cancel_when_children_exit, children, nursery.cancel_scope)
    finally:
        os.close(write_fd)
        if read_fd >= 0:
            os.close(read_fd)
    if failed_start:
        raise ChildFailed(failed_start[0])
    if not all_ready.is_set():
        raise ConfigError("stopped before every serving process was ready")


def _first_start(settings: Settings) -> str | None:
    """The data directory, the schema and, on the very first start, the admin account (its password returned),
    once, before any child starts."""
    bootstrap.prepare(settings)
    return bootstrap.ensure_admin(settings)


class ChildFailed(ConfigError):
    """A serving process ended before it was ready; it printed why."""

    def __init__(self, status: int) -> None:
        super().__init__(f"a serving process ended before it was ready (exit status {status}); see above")
        self.status = status


async def _wait_ready(ready: trio.lowlevel.FdStream, processes: int, stopping: trio.Event) -> bool:
    """Read one byte per child; False when the start is called off (a child failed, or a signal) first."""
    got = 0
    async with trio.open_nursery() as nursery:
        async def called_off() -> None:
            await stopping.wait()
            nursery.cancel_scope.cancel()

        nursery.start_soon(called_off)
        while got < processes:
            data = await ready.receive_some(64)
            if not data:
                break
            got += len(data)
        nursery.cancel_scope.cancel()
    return got >= processes and not stopping.is_set()


async def _drain_ready(ready: trio.lowlevel.FdStream) -> None:
    """Restarted children say they are ready too: read and log."""
    while data := await ready.receive_some(64):
        log.info("%d restarted serving process(es) ready", len(data))


async def _keep_child(index: int, command: list[str], env: dict[str, str], write_fd: int,
                      children: dict[int, trio.Process], stopping: trio.Event, all_ready: trio.Event,
                      failed_start: list[int]) -> None:
    delay = RESTART_FIRST
    while not stopping.is_set():
        began = trio.current_time()
        process = await trio.lowlevel.open_process(command, env=env, pass_fds=_fds(command, write_fd),
                                                   stdin=subprocess.DEVNULL)
        children[index] = process
        if stopping.is_set():  # the stop came while it was being started: it gets its SIGTERM too
            process.send_signal(signal.SIGTERM)
        with trio.CancelScope(shield=True):  # a child is always waited for, never left behind
            status = await process.wait()
        if stopping.is_set():
            return
        if not all_ready.is_set():  # the service never started: this is a problem to show, not to retry
            failed_start.append(status)
            stopping.set()
            return
        if trio.current_time() - began >= YOUNG_SECONDS:
            delay = RESTART_FIRST
        log.error("serving process %d (pid %d) ended with status %d; starting it again in %g s",
                  index, process.pid, status, delay)
        with trio.move_on_after(delay):
            await stopping.wait()
        delay = min(RESTART_MOST, delay * 2)


def _fds(command: list[str], write_fd: int) -> tuple[int, ...]:
    listen_fd = int(command[command.index("--listen-fd") + 1])
    return (listen_fd, write_fd)


async def _cancel_when_children_exit(children: dict[int, trio.Process], scope: trio.CancelScope) -> None:
    for process in list(children.values()):
        with trio.CancelScope(shield=True):
            await process.wait()
    scope.cancel()


async def _stop_on_signals(stopping: trio.Event) -> None:
    with trio.open_signal_receiver(signal.SIGINT, signal.SIGTERM) as signals:
        async for signum in signals:  # held open while stopping: a second Ctrl-C does not cut the drain short
            if not stopping.is_set():
                log.info("received %s, stopping the serving processes", signal.Signals(signum).name)
            stopping.set()
