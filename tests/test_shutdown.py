"""Issue 35 #19: stopping the server with live pages open. Their WebSockets never end by themselves, so the drain
used to wait the whole shutdown grace period for them. Now they are closed first with 1001 (going away, which
live.js reads as "reconnect later"), and the drain has nothing left to wait for.

A real server process and real WebSocket clients. No wall-clock bound is asserted (CI runs at a load of 13): the
server's own shutdown log says whether the drain ended by itself or the grace period ran out; the time the stop
took is printed."""

from __future__ import annotations

import json
import signal
import time
from pathlib import Path

import httpx
import pytest
import trio
from trio_websocket import ConnectionClosed, open_websocket_url

from .harness import ServerProcess, create_token, write_config

GRACE = 60  # far longer than any stop should take, so that waiting it out is unmistakable in the log


@pytest.mark.system
async def test_sigterm_closes_live_feeds_with_1001_before_the_drain(tmp_path: Path) -> None:
    data_dir = tmp_path / "data"
    config = write_config(tmp_path / "picpeak.toml", shutdown_grace_seconds=GRACE)
    server = ServerProcess(data_dir, config)
    url = await trio.to_thread.run_sync(server.start)
    try:
        token = await trio.to_thread.run_sync(create_token, data_dir, config)
        headers = {"Authorization": f"Bearer {token}"}
        async with httpx.AsyncClient(base_url=url, headers=headers, timeout=60) as api:
            created = await api.post("/api/admin/galleries", json={"name": "Open house"})
            gallery = created.json()
            assert (await api.post(f"/api/admin/galleries/{gallery['id']}/publish")).status_code == 200
        ws_base = url.replace("http://", "ws://")
        closes: list[int | None] = []
        with trio.fail_after(120):  # a hung-test stop only
            async with open_websocket_url(f"{ws_base}/ws/admin/galleries/{gallery['id']}",
                                          extra_headers=list(headers.items())) as admin_feed, \
                    open_websocket_url(f"{ws_base}/ws/g/{gallery['slug']}") as guest_feed:
                for feed in (admin_feed, guest_feed):
                    assert json.loads(await feed.get_message())["type"] == "snapshot"
                assert server.proc is not None
                stop_started = time.monotonic()
                server.proc.send_signal(signal.SIGTERM)
                for feed in (admin_feed, guest_feed):
                    with pytest.raises(ConnectionClosed) as closed:
                        while True:
                            await feed.get_message()
                    closes.append(closed.value.reason.code)
            code = await trio.to_thread.run_sync(lambda: server.proc.wait(timeout=GRACE + 60))  # type: ignore
        print(f"\nstop with 2 live feeds open took {time.monotonic() - stop_started:.2f} s (grace {GRACE} s)")
        server.proc = None
        assert closes == [1001, 1001]
        assert code == 0, server.log_tail()
        log = "".join(server.output)
        assert "shutdown: closed 2 live feed(s) with 1001 going away" in log, log
        assert "within the 60 s grace period" in log, log
        assert "grace period ran out" not in log, log
    finally:
        if server.proc is not None:
            server.kill()
