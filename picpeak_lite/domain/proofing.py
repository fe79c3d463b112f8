"""Proofing: the client's favourites, limited per guest if the photographer wants ("choose up to 40"), and
exported for the editing software.

The exports are plain text made here from the rows of ``queries.proofing``:

* ``txt``: the original file names, one a line (each once, whoever chose it);
* ``lightroom``: the file names without their extensions, joined by ", ": pasted into Lightroom Classic's
  Library Filter (Text, Filename, Contains) it finds the RAW files behind the delivered JPEGs;
* ``captureone``: the same names joined by spaces, for Capture One's Filters search;
* ``csv``: one row per favourite: file name, who (the guest's name, empty if none was given), when (UTC, ISO).
"""

from __future__ import annotations

import csv
import datetime as dt
import io
from collections.abc import Iterable
from pathlib import PurePath

from picpeak_lite.errors import Conflict
from picpeak_lite.i18n import ngettext
from picpeak_lite.store.db import Connection, Row
from picpeak_lite.store.queries import favourites as favourite_q
from picpeak_lite.store.queries import proofing as proofing_q

FORMATS = {"txt": "text/plain", "lightroom": "text/plain", "captureone": "text/plain", "csv": "text/csv"}
CSV_HEADER = ("file name", "who", "when")


class FavouriteLimitReached(Conflict):
    pass


def limit_sentence(limit: int) -> str:
    return ngettext("You can choose up to %(num)d favourite in this gallery. Remove it to choose another.",
                    "You can choose up to %(num)d favourites in this gallery. Remove one of your favourites to "
                    "choose another.", limit) % {"num": limit}


def check_favourite_limit(conn: Connection, gallery: Row, guest_session_id: int, photo_id: int) -> None:
    """Raises with a sentence when this heart would be one more than the gallery allows (a heart already given
    is no new one)."""
    limit = gallery.get("favourite_limit")
    if not limit or proofing_q.is_favourite(conn, guest_session_id, photo_id):
        return
    if favourite_q.count_for_guest(conn, guest_session_id, gallery["id"]) >= limit:
        raise FavouriteLimitReached(limit_sentence(limit))


def file_names(rows: Iterable[Row]) -> list[str]:
    """Each chosen photo's file name once, in order."""
    seen: dict[int, str] = {}
    for row in rows:
        seen.setdefault(row["photo_id"], row["display_name"])
    return list(seen.values())


def stems(names: Iterable[str]) -> list[str]:
    """The names without their extensions, each once ("DSC_0001.jpg" -> "DSC_0001")."""
    return list(dict.fromkeys(PurePath(name).stem or name for name in names))


def render(fmt: str, rows: list[Row]) -> str:
    if fmt == "txt":
        return "".join(f"{name}\n" for name in file_names(rows))
    if fmt == "lightroom":
        return ", ".join(stems(file_names(rows))) + "\n"
    if fmt == "captureone":
        return " ".join(stems(file_names(rows))) + "\n"
    if fmt == "csv":
        out = io.StringIO()
        writer = csv.writer(out, lineterminator="\r\n")
        writer.writerow(CSV_HEADER)
        for row in rows:
            when = dt.datetime.fromtimestamp(row["created_at"], dt.UTC).isoformat(timespec="seconds")
            writer.writerow((_cell(row["display_name"]), _cell(row["guest_name"]), when.replace("+00:00", "Z")))
        return out.getvalue()
    raise ValueError(f"unknown proofing format {fmt!r}")


def _cell(text: str) -> str:
    """A cell a spreadsheet will not run as a formula (a guest chose the name; file names come from guests too)."""
    return "'" + text if text[:1] in ("=", "+", "-", "@", "\t", "\r") else text
