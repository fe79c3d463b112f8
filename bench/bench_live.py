"""Live progress: commit-to-receipt latency with 100 subscribers, and the memory of 500 idle WebSockets.

    python bench/bench_live.py --clients 100 --changes 50 --idle 500

Starts `picpeak-lite serve` as a subprocess (processing off, so only our own changes happen), opens N
WebSocket clients on one gallery with trio-websocket, then makes state changes from this process (another
process, as `picpeak-lite worker` would) and measures, per change, the time from its commit to its receipt by
every client. Then opens idle connections and reports the server's RSS growth per connection.
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from pathlib import Path

import trio
from serve import start_server  # bench/serve.py: run as a script, its folder is on sys.path
from trio_websocket import open_websocket_url

from picpeak_lite.store import db


def rss_kb(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    return 0




def seed(database: Path, count: int) -> tuple[int, list[int]]:
    conn = db.connect(database)
    with db.transaction(conn):
        conn.execute("INSERT INTO galleries (slug, share_token, name, is_draft, created_at, updated_at) "
                     "VALUES ('bench-aaaaaaaa', 'tok', 'Bench', 0, 0, 0)")
        gid = conn.last_insert_rowid()
        conn.execute("INSERT INTO uploads (id, gallery_id, uploaded_by, created_at) VALUES (?, ?, 'admin', 0)",
                     ("b" * 32, gid))
        ids = []
        for i in range(count):
            conn.execute(
                "INSERT INTO photos (gallery_id, upload_id, storage_key, sha256, display_name, size, format, "
                "uploaded_by, width, height, created_at) VALUES (?, ?, ?, ?, ?, 1, 'jpeg', 'admin', 1, 1, 0)",
                (gid, "b" * 32, f"{i:032x}", f"{i:064x}", f"p{i}.jpg"),
            )
            ids.append(conn.last_insert_rowid())
    conn.close()
    return gid, ids


async def latency(url: str, token: str, database: Path, gid: int, ids: list[int], clients: int) -> None:
    ws_url = url.replace("http://", "ws://") + f"/ws/admin/galleries/{gid}"
    headers = [("Authorization", f"Bearer {token}")]
    received: dict[int, list[float]] = {}
    ready = trio.Event()
    connected = 0

    async def client(task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        nonlocal connected
        async with open_websocket_url(ws_url, extra_headers=headers) as ws:
            assert json.loads(await ws.get_message())["type"] == "snapshot"
            connected += 1
            task_status.started()
            while True:
                message = json.loads(await ws.get_message())
                if message["type"] == "photo":
                    received.setdefault(message["id"], []).append(time.time())

    conn = db.connect(database)
    latencies: list[float] = []
    async with trio.open_nursery() as nursery:
        for _ in range(clients):
            await nursery.start(client)
        ready.set()
        for photo_id in ids:
            with db.transaction(conn):
                conn.execute("UPDATE photos SET hidden = 1 - hidden WHERE id = ?", (photo_id,))
            committed = time.time()
            with trio.fail_after(10):
                while len(received.get(photo_id, [])) < clients:
                    await trio.sleep(0.001)
            latencies.append(max(received[photo_id]) - committed)
            await trio.sleep(0.02)
        nursery.cancel_scope.cancel()
    conn.close()
    ms = sorted(x * 1000 for x in latencies)
    p95 = ms[int(len(ms) * 0.95) - 1]
    print(f"live: clients={clients} changes={len(ms)} latency_to_all_clients p50={statistics.median(ms):.1f}ms "
          f"p95={p95:.1f}ms max={ms[-1]:.1f}ms (target p95 < 50 ms: {'ok' if p95 < 50 else 'MISSED'})", flush=True)


async def idle_memory(url: str, token: str, gid: int, pid: int, count: int) -> None:
    ws_url = url.replace("http://", "ws://") + f"/ws/admin/galleries/{gid}"
    headers = [("Authorization", f"Bearer {token}")]
    before = rss_kb(pid)
    opened = 0

    async def client(task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        nonlocal opened
        async with open_websocket_url(ws_url, extra_headers=headers) as ws:
            await ws.get_message()
            opened += 1
            task_status.started()
            await trio.sleep_forever()

    async with trio.open_nursery() as nursery:
        for _ in range(count):
            await nursery.start(client)
        await trio.sleep(1)
        after = rss_kb(pid)
        nursery.cancel_scope.cancel()
    grown = (after - before) / 1024
    print(f"live: idle_connections={opened} server_rss_before={before / 1024:.0f}MB after={after / 1024:.0f}MB "
          f"growth={grown:.1f}MB ({grown * 1024 / max(opened, 1):.0f} KB each; target < 100 MB: "
          f"{'ok' if grown < 100 else 'MISSED'})", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--clients", type=int, default=100)
    parser.add_argument("--changes", type=int, default=50)
    parser.add_argument("--idle", type=int, default=500)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        data = Path(tmp) / "data"
        proc, url, token = start_server(data, {"PICPEAK_PROCESSING_ENABLED": "false"})
        try:
            gid, ids = seed(data / "picpeak.sqlite3", args.changes)
            trio.run(latency, url, token, data / "picpeak.sqlite3", gid, ids, args.clients)
            trio.run(idle_memory, url, token, gid, proc.pid, args.idle)
        finally:
            proc.terminate()
            proc.wait(timeout=30)


if __name__ == "__main__":
    main()
