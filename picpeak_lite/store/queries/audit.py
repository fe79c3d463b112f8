"""SQL for the audit trail: who did what and when (domain/audit.py says what is recorded)."""

from __future__ import annotations

from typing import Any

from picpeak_lite.store.db import Connection, Row

PAGE = 200


def record(conn: Connection, now: float, account_id: int | None, account_name: str, action: str, *,
           gallery_id: int | None = None, ip: str = "", detail: str = "") -> None:
    """One row, in the caller's transaction: the change and its record land together or not at all. The
    gallery's name is copied now, so the row still reads after the gallery is deleted."""
    conn.execute(
        "INSERT INTO audit_log (at, account_id, account_name, action, gallery_id, gallery_name, ip, detail) "
        "VALUES (?, ?, ?, ?, ?, (SELECT name FROM galleries WHERE id = ?), ?, ?)",
        (now, account_id, account_name, action, gallery_id, gallery_id, ip, detail),
    )


def search(conn: Connection, *, account: str = "", action: str = "", gallery_id: int | None = None,
           since: float | None = None, until: float | None = None, limit: int = PAGE) -> list[Row]:
    """The newest rows first that match every filter given."""
    where: list[str] = ["1 = 1"]
    args: list[Any] = []
    if account:
        where.append("account_name = ?")
        args.append(account)
    if action:
        where.append("action = ?")
        args.append(action)
    if gallery_id is not None:
        where.append("gallery_id = ?")
        args.append(gallery_id)
    if since is not None:
        where.append("at >= ?")
        args.append(since)
    if until is not None:
        where.append("at < ?")
        args.append(until)
    return conn.execute(
        f"SELECT * FROM audit_log WHERE {' AND '.join(where)} ORDER BY at DESC, id DESC LIMIT ?", (*args, limit)
    ).fetchall()


def actions(conn: Connection) -> list[str]:
    return [r["action"] for r in conn.execute("SELECT DISTINCT action FROM audit_log ORDER BY action")]


def prune(conn: Connection, before: float) -> int:
    conn.execute("DELETE FROM audit_log WHERE at < ?", (before,))
    return conn.changes()
