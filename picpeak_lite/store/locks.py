"""Named locks: where correctness needs one writer at a time, it says so here, by name.

On SQLite every write transaction (``BEGIN IMMEDIATE``) already holds the database's one write lock, across
threads and processes, so :func:`hold` does nothing there. On PostgreSQL writers run side by side, and each
place that relied on the single writer takes a transaction-scoped advisory lock of its own name, released at
COMMIT or ROLLBACK. Keys are fixed numbers (never derived at run time) so that every process and every version
agrees on them; the high bytes spell "PPKL", our schema's application id.

* :data:`SCHEMA`: migrations, so that two processes starting on one empty database do not both create it.
* :data:`CHANGE_LOG`: every transaction that changes a photo row takes it in the change-log trigger (see
  ``schema_pg.py``) and keeps it until it commits, so change sequence numbers become visible in their own order
  and the feed's ``seq > last`` can never step over a change that commits late.
* :data:`PHOTO_ROWS`: an upload's commit (``pipeline/intake.py`` ``_record``: the gallery's cap counted then
  filled, the gallery still active) and the first step of archiving (``pipeline/archive.py``
  ``request_archive``). Each reads and then writes on what the other changes: without one lock between them,
  an upload could count the cap with another's rows uncommitted. (Whether an upload's file is still there is
  not decided under a lock but by its key reservation's row, which the upload's commit and the reconciler both
  delete: the row lock decides; see ``store/queries/reservations.py``.)
* :data:`PASSWORD_ATTEMPTS`: a password attempt's reservation (``web/throttle.py``): it counts the key's failures
  and attempts in flight, then adds its own; two processes must not both count before either adds. One lock for
  every key: it is held for a few statements, never over a password hash.
"""

from __future__ import annotations

from picpeak_lite.store.db import Connection

_BASE = 0x50504B4C << 16

SCHEMA = _BASE + 1
CHANGE_LOG = _BASE + 2
PHOTO_ROWS = _BASE + 3
PASSWORD_ATTEMPTS = _BASE + 4


def hold(conn: Connection, key: int) -> None:
    """Take the named lock ``key`` until the current transaction ends (PostgreSQL); SQLite's write transaction
    already excludes every other writer."""
    if conn.dialect == "postgresql":
        conn.execute("SELECT pg_advisory_xact_lock(?)", (key,))
