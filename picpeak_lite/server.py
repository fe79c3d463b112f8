"""``run(settings, *, task_status)``: the one place that wires up all concurrency.

It opens the database, opens our own nursery for the long-lived tasks (memory trimmer, webhook sender, janitor,
worker pool, change feed), starts each with ``nursery.start`` so that it is really ready, then serves HTTP with
``hypercorn.trio.serve``. On SIGINT/SIGTERM (or ``RunningServer.stop()``) hypercorn stops accepting, in-flight
requests get ``shutdown_grace_seconds`` to finish, then the background tasks are cancelled (workers hand their
photos back) and the database is closed cleanly.
"""

from __future__ import annotations

import logging
import os
import signal
import time
from dataclasses import dataclass

import trio
from hypercorn.config import Config as HypercornConfig
from hypercorn.trio import serve

from picpeak_lite.config import Settings
from picpeak_lite.events.feed import ChangeFeed
from picpeak_lite.events.webhooks import WebhookSender
from picpeak_lite.ops import bootstrap
from picpeak_lite.pipeline import memory
from picpeak_lite.pipeline.janitor import Janitor
from picpeak_lite.pipeline.worker import WorkerPool
from picpeak_lite.services import Services
from picpeak_lite.store.db import Database
from picpeak_lite.web.app import create_app
from picpeak_lite.web.views.common import describe_links

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class RunningServer:
    """What ``run`` reports once it is serving: the real bound URL (port 0 resolved) and a way to stop it."""

    url: str
    services: Services
    _shutdown: trio.Event

    def stop(self) -> None:
        self._shutdown.set()


async def run(
    settings: Settings,
    *,
    services: Services | None = None,
    task_status: trio.TaskStatus[RunningServer] = trio.TASK_STATUS_IGNORED,
) -> None:
    bootstrap.prepare(settings)
    db = services.db if services is not None else Database(settings.database_path)
    svc = services or Services(settings=settings, db=db)
    shutdown = trio.Event()
    try:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(_stop_on_signals, shutdown)
            if os.environ.get(LAG_LOG_ENV):
                nursery.start_soon(_record_loop_lag, os.environ[LAG_LOG_ENV])
            await start_background_tasks(nursery, svc, workers=settings.processing_enabled)
            await nursery.start(ChangeFeed(svc, svc.broker).run)
            binds = await nursery.start(_serve, svc, shutdown, nursery.cancel_scope)
            task_status.started(RunningServer(url=binds[0], services=svc, _shutdown=shutdown))
    finally:
        db.close()


async def start_background_tasks(nursery: trio.Nursery, svc: Services, *, workers: bool) -> None:
    """Start the memory trimmer, the webhook sender, the janitor and (unless processing is off) the worker
    pool, each ready before the next. Shared by ``run`` and by ``picpeak-lite worker``."""
    svc.storage.create_dirs()
    memory.keep_big_buffers_in_their_own_mappings()
    await nursery.start(svc.trimmer.run)
    sender = WebhookSender(svc.db, svc.settings, clock=svc.clock)
    await nursery.start(sender.run)
    svc.wake_webhooks = sender.wake
    await nursery.start(Janitor(svc, svc.storage).run)
    if workers:
        pool = WorkerPool(svc, svc.storage)
        await nursery.start(pool.run)
        svc.wake_workers = pool.wake


async def run_workers(settings: Settings, *, task_status: trio.TaskStatus[Services] = trio.TASK_STATUS_IGNORED
                      ) -> None:
    """``picpeak-lite worker``: the workers, janitor and webhook sender without the web server, until a signal."""
    bootstrap.prepare(settings)
    db = Database(settings.database_path)
    svc = Services(settings=settings, db=db)
    shutdown = trio.Event()
    try:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(_stop_on_signals, shutdown)
            await start_background_tasks(nursery, svc, workers=True)
            task_status.started(svc)
            await shutdown.wait()
            nursery.cancel_scope.cancel()
    finally:
        db.close()


async def _serve(
    svc: Services,
    shutdown: trio.Event,
    cancel_when_done: trio.CancelScope,
    *,
    task_status: trio.TaskStatus[list[str]] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Serve until ``shutdown`` is set and in-flight requests have drained, then stop the other tasks."""
    app = create_app(svc)
    config = HypercornConfig()
    host = svc.settings.host
    config.bind = [f"[{host}]:{svc.settings.port}" if ":" in host else f"{host}:{svc.settings.port}"]
    config.graceful_timeout = svc.settings.shutdown_grace_seconds
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
    await serve(app, config, shutdown_trigger=shutdown.wait, task_status=_BoundStatus(svc, task_status))
    cancel_when_done.cancel()


class _BoundStatus:
    """Hypercorn's ``task_status``, seen on the way: the real bind URL (port 0 resolved) becomes
    ``Services.bind_url``, the fallback of share links, and the log says once how share links are made."""

    def __init__(self, svc: Services, outer: trio.TaskStatus[list[str]]) -> None:
        self.svc = svc
        self.outer = outer

    def started(self, binds: list[str]) -> None:
        if binds:
            self.svc.bind_url = binds[0]
        log.info("%s", describe_links(self.svc.settings, self.svc.bind_url))
        self.outer.started(binds)


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

