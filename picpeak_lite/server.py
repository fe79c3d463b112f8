"""``run(settings, *, listener, task_status)``: the one place that wires up all concurrency.

The listening socket is bound first (``bind``: the CLI does it before any first-start work, so a port in use is
one line and not a traceback printed after the new admin password). ``run`` then does the first-start work in a
thread (``first_start``: data directory, schema, admin account, database connections), opens our own nursery
for the long-lived tasks (memory trimmer, PostgreSQL's listener, webhook sender, janitor, worker pool, change
feed, activity counters, galleries' hot folders),
starts each with ``nursery.start`` so that it is really ready, then serves HTTP on the bound socket with
hypercorn's serve loop (``_serve_gated``: the same, with the connection gate of ``web/gate.py`` on the listener).
On SIGINT/SIGTERM (or ``RunningServer.stop()``) the live pages' WebSockets are closed first (1001 going away:
``web/limits.py`` ``LiveFeeds``; the pages reconnect later), then hypercorn stops accepting, in-flight requests get
``shutdown_grace_seconds`` to finish, then the background tasks are cancelled (workers hand their photos back)
and the database is closed cleanly.
"""

from __future__ import annotations

import errno
import functools
import logging
import os
import signal
import socket
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

import trio
from hypercorn.config import Config as HypercornConfig
from hypercorn.trio.lifespan import Lifespan
from hypercorn.trio.tcp_server import TCPServer
from hypercorn.trio.worker_context import WorkerContext
from hypercorn.typing import ConnectionState
from hypercorn.utils import ShutdownError, raise_shutdown, repr_socket_addr, wrap_app

from picpeak_lite.config import Settings
from picpeak_lite.domain import email
from picpeak_lite.errors import ConfigError, DatabaseUnavailable
from picpeak_lite.events.email import EmailScheduler, EmailSender
from picpeak_lite.events.feed import ChangeFeed
from picpeak_lite.events.listener import DatabaseListener
from picpeak_lite.events.webhooks import WebhookSender
from picpeak_lite.media import faces
from picpeak_lite.ops import bootstrap
from picpeak_lite.ops.hotfolder import HotFolders
from picpeak_lite.pipeline.archive import Archiver
from picpeak_lite.pipeline.faces import FaceIndexer
from picpeak_lite.pipeline.janitor import Janitor
from picpeak_lite.pipeline.resumable import Finisher
from picpeak_lite.pipeline.video_previews import PreviewLane
from picpeak_lite.pipeline.worker import WorkerPool
from picpeak_lite.runtime import memory
from picpeak_lite.runtime.lease import run_while_held
from picpeak_lite.services import Services
from picpeak_lite.store.db import Database
from picpeak_lite.web import gate
from picpeak_lite.web.app import create_app
from picpeak_lite.web.views.common import describe_links, trusted_set

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class RunningServer:
    """What ``run`` reports once it is serving: the real bound URL (port 0 resolved) and a way to stop it."""

    url: str
    services: Services
    _shutdown: trio.Event
    # The admin password made on the very first start, to be shown once (None on every later start, or when it
    # came from PICPEAK_ADMIN_PASSWORD).
    admin_password: str | None = None

    def stop(self) -> None:
        self._shutdown.set()


@dataclass
class Listener:
    """Bound, listening sockets not yet served, held as file descriptors that ``_serve`` hands to hypercorn
    (``fd://`` binds). Whoever holds a Listener that is not served calls ``close``."""

    address: str
    fds: list[int] = field(default_factory=list)

    def take(self) -> list[int]:
        fds, self.fds = self.fds, []
        return fds

    def close(self) -> None:
        for fd in self.take():
            os.close(fd)


def bind(settings: Settings) -> Listener:
    """Bind ``host:port`` now, with hypercorn's own socket options. A problem (the port in use, a privileged
    port, an address this machine does not have) is a ConfigError of one line that says what to change."""
    address = settings.listen_address
    config = HypercornConfig()
    config.bind = [address]
    try:
        sockets = config.create_sockets()
    except OSError as error:
        raise ConfigError(_bind_problem(address, error)) from None
    listener = Listener(address=address)
    for sock in sockets.insecure_sockets:
        sock.listen(config.backlog)
        listener.fds.append(sock.detach())
    return listener


def _bind_problem(address: str, error: OSError) -> str:
    if error.errno == errno.EADDRINUSE:
        return (f"cannot listen on {address}: the address is already in use (is picpeak-lite already running?); "
                "choose another port with --port")
    if error.errno == errno.EACCES:
        return f"cannot listen on {address}: permission denied (ports below 1024 need privileges); use --port"
    if error.errno == errno.EADDRNOTAVAIL or isinstance(error, socket.gaierror):
        return f"cannot listen on {address}: this machine has no such address; check --host"
    return f"cannot listen on {address}: {error.strerror or error}; check --host and --port"


def first_start(settings: Settings) -> tuple[Services, str | None]:
    """The blocking work before serving, done once and in a thread: the data directory and schema, the admin
    account on the very first start (its generated password is returned), and the database connections."""
    bootstrap.prepare(settings)
    password = bootstrap.ensure_admin(settings)
    svc = Services(settings=settings, db=Database(settings.database))
    svc.storage.check_access()  # a wrong bucket or refused credentials: one sentence now, not a traceback later
    return svc, password


async def run(
    settings: Settings,
    *,
    listener: Listener | None = None,
    task_status: trio.TaskStatus[RunningServer] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Serve until stopped. The socket is bound first (``listener``, bound by ``bind``; the CLI binds before it
    starts trio, so that a port in use is its only line of output), then :func:`first_start` runs in a thread."""
    listener = listener or bind(settings)
    try:
        svc, password = await trio.to_thread.run_sync(first_start, settings)
    except BaseException:
        listener.close()
        raise
    db = svc.db
    shutdown = trio.Event()
    try:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(_stop_on_signals, shutdown)
            if os.environ.get(LAG_LOG_ENV):
                nursery.start_soon(_record_loop_lag, os.environ[LAG_LOG_ENV])
            await start_background_tasks(nursery, svc, workers=settings.processing_enabled, serving=True)
            # On PostgreSQL the listener (started above) rings the feed for every commit that logged a change.
            await nursery.start(outlasting_the_database,
                                ChangeFeed(svc, svc.broker, notified=db.dialect == "postgresql").run)
            await nursery.start(outlasting_the_database, svc.activity.run)  # stores the last counts at the end
            # Galleries' hot folders (ops/hotfolder.py), watched by one process of the service at a time.
            await nursery.start(outlasting_the_database,
                                functools.partial(run_while_held, svc.lease("hot_folders"), HotFolders(svc).run))
            binds = await nursery.start(_serve, svc, listener, shutdown, nursery.cancel_scope)
            task_status.started(RunningServer(url=binds[0], services=svc, _shutdown=shutdown,
                                              admin_password=password))
    finally:
        listener.close()
        db.close()


async def start_background_tasks(nursery: trio.Nursery, svc: Services, *, workers: bool, serving: bool) -> None:
    """Start the memory trimmer, on PostgreSQL the listener (``events/listener.py``: other processes' commits
    ring this one's bells), the webhook sender, the email sender and scheduler (when email is set up), the
    janitor and (unless processing is off) the worker pool, each ready before the next. Shared by ``run`` and
    by ``picpeak-lite worker``.

    ``serving``: this process answers HTTP; only it runs the archiver. The tus uploads' janitor pass and the
    :class:`Finisher` run in every process: who writes an upload and who makes its photo are held in its row
    (``pipeline/resumable.py``)."""
    svc.storage.create_dirs()
    memory.set_mmap_threshold()
    start = functools.partial(nursery.start, outlasting_the_database)  # each outlives the database's absence
    await start(svc.trimmer.run)
    if svc.db.dialect == "postgresql":  # other processes' commits ring this one's bells (SQLite: the polls)
        await start(DatabaseListener(svc).run)
    await start(WebhookSender(svc.db, svc.settings, bell=svc.webhooks_bell, clock=svc.clock).run)
    if email.enabled(svc.settings):
        await start(EmailSender(svc.db, svc.settings, bell=svc.email_bell, clock=svc.clock).run)
        await start(EmailScheduler(svc.db, svc.settings, bell=svc.email_bell, clock=svc.clock,
                                   base_url=lambda: svc.settings.public_url or svc.bind_url).run)
    await start(Janitor(svc).run)
    await start(Finisher(svc).run)
    if serving:
        await start(Archiver(svc).run)
    if workers:
        await start(WorkerPool(svc).run)
        if svc.settings.video_previews:
            await start(PreviewLane(svc).run)
        if faces.available():
            await start(FaceIndexer(svc).run)


DATABASE_RETRY_SECONDS = 5.0  # as long as the Retry-After that requests are told meanwhile


class _StartedOnce:
    """A task status that passes on only the first ``started()``: a task run again after the database came back
    was already reported ready."""

    def __init__(self, status: trio.TaskStatus[Any]) -> None:
        self.status: trio.TaskStatus[Any] | None = status

    def started(self, value: Any = None) -> None:
        if self.status is not None:
            status, self.status = self.status, None
            status.started(value)


async def outlasting_the_database(run: Callable[..., Awaitable[None]], *,
                                  task_status: trio.TaskStatus[Any] = trio.TASK_STATUS_IGNORED) -> None:
    """Run a background task (``run(*, task_status)``), and run it again when the database stopped answering
    under it (``DatabaseUnavailable``: PostgreSQL restarted or failed over, the network to it cut), every
    :data:`DATABASE_RETRY_SECONDS` until it answers, instead of ending the process: a host of the service goes
    on by itself once the database is back (issue 31), as its requests do (503 with Retry-After meanwhile, a
    dropped connection opened again: ``store/db.py``). Each task starts from what the database holds, so running
    it again loses nothing; what it had claimed is taken back by its lease."""
    once = _StartedOnce(task_status)
    while True:
        failed: DatabaseUnavailable | None = None
        try:
            await run(task_status=once)
            return
        except* DatabaseUnavailable as group:
            failed = group.exceptions[0]  # type: ignore[assignment]  # split by type: each is one
        name = getattr(run, "__qualname__", None) or repr(run)
        log.warning("%s: the database did not answer (%s); started again in %.0f s", name,
                    " ".join(str(failed).split()), DATABASE_RETRY_SECONDS)
        await trio.sleep(DATABASE_RETRY_SECONDS)


async def run_workers(settings: Settings, *, task_status: trio.TaskStatus[Services] = trio.TASK_STATUS_IGNORED
                      ) -> None:
    """``picpeak-lite worker``: the workers, janitor and webhook sender without the web server, until a signal."""
    svc, _ = await trio.to_thread.run_sync(first_start, settings)
    db = svc.db
    shutdown = trio.Event()
    try:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(_stop_on_signals, shutdown)
            await start_background_tasks(nursery, svc, workers=True, serving=False)
            task_status.started(svc)
            await shutdown.wait()
            nursery.cancel_scope.cancel()
    finally:
        db.close()


async def _serve(
    svc: Services,
    listener: Listener,
    shutdown: trio.Event,
    cancel_when_done: trio.CancelScope,
    *,
    task_status: trio.TaskStatus[list[str]] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Serve until ``shutdown`` is set and in-flight requests have drained, then stop the other tasks."""
    app = create_app(svc)
    config = HypercornConfig()
    # The sockets bound by ``bind``; from here hypercorn owns (and closes) them.
    config.bind = [f"fd://{fd}" for fd in listener.take()]
    config.graceful_timeout = svc.settings.shutdown_grace_seconds
    # The request log is ours (web/accesslog.py): it knows the client behind a trusted proxy, redacts query
    # strings and counts the bytes of streamed bodies and the whole life of a WebSocket.
    config.accesslog = None
    config.errorlog = logging.getLogger("hypercorn.error")
    # Phones upload slowly; the read timeout only applies between bytes, keep it generous.
    config.read_timeout = 120
    config.h11_max_incomplete_size = 64 * 1024
    # At most one received chunk (up to 64 KiB) waits in hypercorn's queue per connection, one more in the hand
    # of its reader; with the bounded request body (web/asgi.py) each of 200 concurrent uploads holds a few hundred
    # KiB. A deeper queue made no upload faster (tests/test_load.py), only the server larger.
    config.max_app_queue_size = 1
    # Clients of our WebSockets only send keep-alives.
    config.websocket_max_message_size = 4096
    settings = svc.settings
    connection_plan = gate.plan(gate.raise_fd_limit(), total=settings.max_connections,
                                per_client=settings.connections_per_client)
    log.info("%s", connection_plan.describe())
    connections = gate.Gate(connection_plan, uncapped=trusted_set(settings.trusted_proxies))
    async with trio.open_nursery() as nursery:
        feeds = app.extensions["picpeak_limits"].feeds

        async def close_feeds_then_drain() -> None:
            # The live pages' WebSockets never end by themselves: closed first (1001, live.js reconnects later),
            # the drain that follows waits only for real requests (issue 35 #19).
            await shutdown.wait()
            started = trio.current_time()
            was_open, still_open = await feeds.close_all(config.graceful_timeout)
            log.info("shutdown: closed %d live feed(s) with 1001 going away in %.3f s%s", was_open - still_open,
                     trio.current_time() - started, f"; {still_open} did not end" if still_open else "")

        binds = await nursery.start(functools.partial(_serve_gated, app, config, connections,
                                                      shutdown_trigger=close_feeds_then_drain))
        # The real bind URL (port 0 resolved) is the fallback of share links; say once how they are made.
        if binds:
            svc.bind_url = binds[0]
        log.info("%s", describe_links(svc.settings, svc.bind_url))
        task_status.started(binds)
    cancel_when_done.cancel()


async def _serve_gated(
    app: object,
    config: HypercornConfig,
    connections: gate.Gate,
    *,
    shutdown_trigger: Callable[[], Awaitable[None]],
    task_status: trio.TaskStatus[list[str]] = trio.TASK_STATUS_IGNORED,
) -> None:
    """hypercorn's ``trio.serve`` (``worker_serve``) for plain HTTP on our bound sockets, with one change: the
    listeners are :class:`gate.GatedListener`, which cap open connections and refuse past the caps with one
    summary line instead of trio's traceback per failed ``accept``. hypercorn has no setting for its
    listeners; the lifespan, the graceful shutdown and each connection's ``TCPServer`` are its own."""
    wrapped = wrap_app(app, config.wsgi_max_body_size, "asgi")  # type: ignore[arg-type]
    lifespan_state: dict[str, object] = {}
    lifespan = Lifespan(wrapped, config, lifespan_state)
    context = WorkerContext(None)
    async with trio.open_nursery() as lifespan_nursery:
        await lifespan_nursery.start(lifespan.handle_lifespan)
        await lifespan.wait_for_startup()
        async with trio.open_nursery() as server_nursery:
            listeners, binds = [], []
            for sock in config.create_sockets().insecure_sockets:
                listeners.append(gate.GatedListener(trio.socket.from_stdlib_socket(sock), connections))
                binds.append(f"http://{repr_socket_addr(sock.family, sock.getsockname())}")
            task_status.started(binds)
            try:
                async with trio.open_nursery(strict_exception_groups=True) as nursery:
                    nursery.start_soon(raise_shutdown, shutdown_trigger)
                    nursery.start_soon(raise_shutdown, context.terminate.wait)
                    nursery.start_soon(_report_refusals, connections)
                    handler = functools.partial(TCPServer, wrapped, config, context,
                                                ConnectionState(lifespan_state.copy()))
                    nursery.start_soon(functools.partial(trio.serve_listeners, handler, listeners,
                                                         handler_nursery=server_nursery))
                    await trio.sleep_forever()
            except BaseExceptionGroup as error:
                _, others = error.split((ShutdownError, KeyboardInterrupt))
                if others is not None:
                    raise others from None
            finally:
                await context.terminated.set()
                drain_started = trio.current_time()
                server_nursery.cancel_scope.deadline = drain_started + config.graceful_timeout
        if server_nursery.cancel_scope.cancel_called:
            log.warning("shutdown: the %g s grace period ran out; the connections still open were cut",
                        config.graceful_timeout)
        else:
            log.info("shutdown: every connection ended in %.3f s, within the %g s grace period",
                     trio.current_time() - drain_started, config.graceful_timeout)
        await lifespan.wait_for_shutdown()
        lifespan_nursery.cancel_scope.cancel()


async def _report_refusals(connections: gate.Gate) -> None:
    """The last refusals of a burst are reported too, not only when the next one comes."""
    while True:
        await trio.sleep(gate.REPORT_EVERY)
        connections.report()


# Debugging aid for the load suite, off unless set: the path of a file that receives the worst event-loop lag.
LAG_LOG_ENV = "PICPEAK_DEBUG_LAG_LOG"
LAG_TICK = 0.01


async def _record_loop_lag(path: str) -> None:
    """Sleep 10 ms at a time and append, once a second, ``<unix time> <worst overshoot in ms>`` to ``path``:
    how long the event loop was kept from running a ready task (e.g. by blocking work done on it)."""
    async with await trio.open_file(path, "a") as log_file:
        while True:
            worst, window_end = 0.0, trio.current_time() + 1.0
            while trio.current_time() < window_end:
                before = trio.current_time()
                await trio.sleep(LAG_TICK)
                worst = max(worst, trio.current_time() - before - LAG_TICK)
            await log_file.write(f"{time.time():.3f} {worst * 1000:.1f}\n")
            await log_file.flush()


async def _stop_on_signals(shutdown: trio.Event) -> None:
    try:
        receiver = trio.open_signal_receiver(signal.SIGINT, signal.SIGTERM)
    except RuntimeError:
        # Not in the main thread (an embedding test harness): rely on RunningServer.stop().
        await trio.sleep_forever()
        return
    with receiver as signals:
        async for signum in signals:
            log.info("received %s, shutting down", signal.Signals(signum).name)
            shutdown.set()
            break
    await trio.sleep_forever()

