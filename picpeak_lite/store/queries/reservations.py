"""SQL for key reservations (schema 28): how an upload and the orphan reconciler agree on a stored file.

An upload reserves its new storage key in a short transaction before it writes the original, and takes (deletes)
the reservation in the transaction that inserts the photo's row. The reconciler removes the files of a key only
after a transaction in which the key had no row and either no reservation or an expired one that it deleted.
Both sides delete the same reservation row, so on PostgreSQL the row lock decides between them (the second
delete waits for the first to commit, then finds nothing), as SQLite's single writer does; neither needs to ask
the storage whether a file is there while it holds a write transaction.
"""

from __future__ import annotations

from picpeak_lite.store.db import Connection


def reserve(conn: Connection, storage_keys: list[str], now: float) -> None:
    """Reserve freshly generated keys before their files are written (keys are random: never reserved twice)."""
    if storage_keys:
        values = ", ".join(["(?, ?)"] * len(storage_keys))
        conn.execute(f"INSERT INTO key_reservations (storage_key, reserved_at) VALUES {values}",
                     [v for key in storage_keys for v in (key, now)])


def release(conn: Connection, storage_keys: list[str]) -> None:
    """Give back reserved keys no file was written under (an upload that ended with keys to spare)."""
    if storage_keys:
        marks = ", ".join("?" * len(storage_keys))
        conn.execute(f"DELETE FROM key_reservations WHERE storage_key IN ({marks})", storage_keys)


def take(conn: Connection, storage_key: str) -> bool:
    """Consume the key's reservation in the transaction that decides the key's fate (its row, or none). False:
    the reconciler deleted it as expired first, and has removed or will remove the file."""
    conn.execute("DELETE FROM key_reservations WHERE storage_key = ?", (storage_key,))
    return conn.changes() == 1


def release_expired(conn: Connection, storage_key: str, reserved_before: float) -> bool:
    """Delete the key's reservation if it was made before ``reserved_before``; True if this deleted it (its files
    are then the caller's to remove, once this transaction has committed)."""
    conn.execute("DELETE FROM key_reservations WHERE storage_key = ? AND reserved_at < ?",
                 (storage_key, reserved_before))
    return conn.changes() == 1


def is_reserved(conn: Connection, storage_key: str) -> bool:
    rows = conn.execute("SELECT 1 FROM key_reservations WHERE storage_key = ?", (storage_key,)).fetchall()
    return bool(rows)


def reserved(conn: Connection) -> dict[str, float]:
    """Every reserved key with the time it was reserved (the reconciler's and ``check``'s view)."""
    rows = conn.execute("SELECT storage_key, reserved_at FROM key_reservations").fetchall()
    return {r["storage_key"]: r["reserved_at"] for r in rows}

