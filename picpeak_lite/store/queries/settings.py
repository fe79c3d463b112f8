"""SQL for ``app_settings`` (key -> JSON text) and the admin-managed ``webhook_endpoints``."""

from __future__ import annotations

import json

from picpeak_lite.store.db import Connection, Row


def get_all(conn: Connection) -> dict[str, str]:
    return {r["key"]: r["value"] for r in conn.execute("SELECT key, value FROM app_settings").fetchall()}


def set_many(conn: Connection, values: dict[str, str]) -> None:
    for key, value in values.items():
        conn.execute(
            "INSERT INTO app_settings (key, value) VALUES (?, ?) "
            "ON CONFLICT (key) DO UPDATE SET value = excluded.value",
            (key, value),
        )


def delete_keys(conn: Connection, keys: list[str]) -> None:
    for key in keys:
        conn.execute("DELETE FROM app_settings WHERE key = ?", (key,))


def list_endpoints(conn: Connection) -> list[Row]:
    rows = conn.execute(
        "SELECT id, url, events, active, created_at FROM webhook_endpoints ORDER BY id"
    ).fetchall()
    return [dict(r, events=json.loads(r["events"])) for r in rows]


def get_endpoint(conn: Connection, endpoint_id: int) -> Row | None:
    rows = conn.execute("SELECT * FROM webhook_endpoints WHERE id = ?", (endpoint_id,)).fetchall()
    return dict(rows[0], events=json.loads(rows[0]["events"])) if rows else None


def endpoint_url_taken(conn: Connection, url: str) -> bool:
    return bool(conn.execute("SELECT 1 FROM webhook_endpoints WHERE url = ?", (url,)).fetchall())


def create_endpoint(conn: Connection, url: str, secret: str, events: list[str], now: float) -> int:
    return int(conn.execute(
        "INSERT INTO webhook_endpoints (url, secret, events, created_at) VALUES (?, ?, ?, ?) RETURNING id",
        (url, secret, json.dumps(events), now),
    ).fetchall()[0]["id"])


def delete_endpoint(conn: Connection, endpoint_id: int) -> bool:
    conn.execute("DELETE FROM webhook_endpoints WHERE id = ?", (endpoint_id,))
    return conn.changes() == 1


def set_endpoint_active(conn: Connection, endpoint_id: int, active: bool) -> bool:
    conn.execute("UPDATE webhook_endpoints SET active = ? WHERE id = ?", (int(active), endpoint_id))
    return conn.changes() == 1
