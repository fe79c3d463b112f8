"""Guests' feedback on photos: likes, 1-5 star ratings and comments, their moderation, and how the photographer
takes them away (the proofing CSV and XMP sidecars for Lightroom Classic).

The rules, in one place:

* A guest may like a photo once and rate it once (1-5 stars); both can be changed or taken back. Neither needs a
  name (as hearts do not); a comment does, since it is shown to others with its author: the guest gives a name
  once per session (``POST /api/g/<slug>/guest``, as for uploads), or with its first comment.
* A comment is plain text of at most :data:`COMMENT_MAX` characters (control and bidi characters removed, runs
  of blank lines collapsed). It is stored as typed and escaped wherever it is shown (Jinja, ``textContent``, XML
  escaping in the sidecar), so no HTML from a guest ever reaches a page.
* In a gallery with ``hold_comments`` a new comment is ``held``: its author and the photographer see it, other
  guests do not, until the photographer approves it (``approved``) or rejects it (``rejected``: kept for the
  photographer's record, shown to nobody else). Without the switch a comment is ``approved`` at once.

The sidecars (:func:`xmp_sidecar`): Lightroom Classic reads ``<stem>.xmp`` next to a RAW (Metadata > Read
Metadata from Files). picpeak-lite has no rating of the photographer's own (they rate in Lightroom), so
``xmp:Rating`` is the guests' mean rating rounded half up (2.5 -> 3), absent when nobody rated; ``xmp:Label`` is
``Green`` for a photo a guest chose as a favourite (the client's pick) and ``Yellow`` for one only liked; the
approved comments, one ``Name: text`` line each, are the ``dc:description`` (Lightroom's Caption field).
"""

from __future__ import annotations

import csv
import datetime as dt
import io
import math
import re
import unicodedata
from collections import defaultdict
from collections.abc import Iterable, Sequence
from pathlib import PurePath
from xml.sax.saxutils import escape, quoteattr

from picpeak_lite.errors import BadRequest
from picpeak_lite.i18n import _
from picpeak_lite.store.db import Connection, Row
from picpeak_lite.store.queries import feedback as feedback_q

COMMENT_MAX = 1000
ACTIONS = ("approve", "reject", "delete")
LABEL_FAVOURITE = "Green"
LABEL_LIKED = "Yellow"


# Control, surrogate, unassigned and line/paragraph separator characters go, and format characters (bidi
# overrides and marks among them) except the zero-width joiner that emoji sequences need.
_DROP = frozenset(("Cc", "Cs", "Cn", "Cf", "Zl", "Zp"))
_KEEP = frozenset("\n\u200d")


def clean_comment(raw: object) -> str:
    """The comment as it is stored: text, without control or bidi characters (newlines kept, at most one blank
    line in a row), trimmed; raises with a sentence when it is missing, empty or too long."""
    if not isinstance(raw, str):
        raise BadRequest(_("Write a comment first."))
    text = unicodedata.normalize("NFC", raw.replace("\r\n", "\n").replace("\r", "\n"))
    text = "".join(c for c in text if c in _KEEP or unicodedata.category(c) not in _DROP)
    text = re.sub(r"\n{3,}", "\n\n", "\n".join(line.rstrip() for line in text.split("\n"))).strip()
    if not text:
        raise BadRequest(_("Write a comment first."))
    if len(text) > COMMENT_MAX:
        raise BadRequest(_("A comment may be at most %(max)d characters long.") % {"max": COMMENT_MAX})
    return text


def parse_stars(raw: object) -> int:
    if isinstance(raw, bool) or not isinstance(raw, int) or not 1 <= raw <= 5:
        raise BadRequest(_("A rating is 1 to 5 stars."))
    return raw


def add_comment(conn: Connection, gallery: Row, photo_id: int, guest_session_id: int, guest_name: str, body: str,
                now: float) -> Row:
    """Store a guest's comment, held or approved as the gallery says; returns it as its author sees it."""
    status = "held" if gallery["hold_comments"] else "approved"
    comment_id = feedback_q.add_comment(conn, photo_id, guest_session_id, guest_name, body, status, now)
    return {"id": comment_id, "photo_id": photo_id, "guest_name": guest_name, "body": body, "status": status,
            "created_at": now, "guest_session_id": guest_session_id}


def review(conn: Connection, gallery_id: int, action: str, ids: Iterable[int], now: float) -> list[int]:
    """Approve, reject or delete the gallery's comments of ``ids`` (approve and reject only held ones, once);
    returns the ids acted on."""
    if action not in ACTIONS:
        raise ValueError(f"unknown comment action {action!r}")
    if action == "delete":
        return [i for i in feedback_q.in_gallery(conn, gallery_id, ids) if feedback_q.delete_comment(conn, i)]
    status = "approved" if action == "approve" else "rejected"
    return [i for i in feedback_q.held_in_gallery(conn, gallery_id, ids) if feedback_q.review(conn, i, status, now)]


def summary_json(row: Row) -> dict[str, object]:
    mean = row["rating_mean"]
    return {"likes": row["likes"], "ratings": row["ratings"],
            "rating": round(mean, 2) if mean is not None else None, "comments": row["comments"],
            "liked": bool(row["liked"]), "my_rating": row["my_rating"]}


def comment_json(row: Row, *, guest_session_id: int | None = None) -> dict[str, object]:
    """A comment as JSON: the text is data (pages put it in with ``textContent``), never markup."""
    data: dict[str, object] = {"id": row["id"], "photo_id": row["photo_id"], "name": row["guest_name"],
                               "text": row["body"], "status": row["status"], "created_at": row["created_at"],
                               "mine": guest_session_id is not None and row["guest_session_id"] == guest_session_id}
    return data


def xmp_rating(mean: float | None) -> int | None:
    """The guests' mean rating as Lightroom's whole stars, rounded half up; None when nobody rated."""
    return None if mean is None else min(5, max(1, math.floor(mean + 0.5)))


def label_of(favourites: int, likes: int) -> str | None:
    return LABEL_FAVOURITE if favourites else LABEL_LIKED if likes else None


_NOT_XML = re.compile("[^\u0009\u000a\u000d\u0020-\ud7ff\ue000-\ufffd\U00010000-\U0010ffff]")


def _xml_text(text: str) -> str:
    return escape(_NOT_XML.sub("", text))


def xmp_sidecar(*, rating: int | None, label: str | None, comments: Sequence[tuple[str, str]]) -> bytes:
    """An XMP sidecar (UTF-8) with the rating, colour label and comments (name, text) of one photo."""
    attributes = ""
    if rating is not None:
        attributes += f"\n   xmp:Rating={quoteattr(str(rating))}"
    if label is not None:
        attributes += f"\n   xmp:Label={quoteattr(label)}"
    description = ""
    if comments:
        text = "\n".join(f"{name}: {body}" for name, body in comments)
        description = ("\n   <dc:description>\n    <rdf:Alt>\n     <rdf:li xml:lang=\"x-default\">"
                       f"{_xml_text(text)}</rdf:li>\n    </rdf:Alt>\n   </dc:description>")
    return (
        '<?xpacket begin="\ufeff" id="W5M0MpCehiHzreSzNTczkc9d"?>\n'
        '<x:xmpmeta xmlns:x="adobe:ns:meta/" x:xmptk="picpeak-lite">\n'
        ' <rdf:RDF xmlns:rdf="http://www.w3.org/1999/02/22-rdf-syntax-ns#">\n'
        '  <rdf:Description rdf:about=""\n'
        '   xmlns:xmp="http://ns.adobe.com/xap/1.0/"\n'
        f'   xmlns:dc="http://purl.org/dc/elements/1.1/"{attributes}>{description}\n'
        '  </rdf:Description>\n'
        ' </rdf:RDF>\n'
        '</x:xmpmeta>\n'
        '<?xpacket end="w"?>\n'
    ).encode()


_UNSAFE_NAME = re.compile(r'[\x00-\x1f\x7f<>:"/\\|?*]')


def sidecar_name(display_name: str, taken: set[str]) -> str:
    """``<original stem>.xmp``; a second original with the same stem gets ``<stem>-2.xmp`` and so on, so no
    sidecar overwrites another in the zip (Lightroom then matches only the first: say so in the export page)."""
    stem = _UNSAFE_NAME.sub("_", PurePath(display_name.replace("\\", "/")).stem).strip(" .") or "photo"
    name, n = f"{stem}.xmp", 1
    while name.lower() in taken:
        n += 1
        name = f"{stem}-{n}.xmp"
    taken.add(name.lower())
    return name


def sidecars(photos: Sequence[Row], comments: Sequence[Row]) -> list[tuple[str, bytes]]:
    """(file name, XMP bytes) for every photo with feedback, from ``feedback_q.per_photo`` and
    ``feedback_q.approved_comments``."""
    by_photo: dict[int, list[tuple[str, str]]] = defaultdict(list)
    for c in comments:
        by_photo[c["photo_id"]].append((c["guest_name"], c["body"]))
    taken: set[str] = set()
    return [(sidecar_name(p["display_name"], taken),
             xmp_sidecar(rating=xmp_rating(p["rating_mean"]), label=label_of(p["favourites"], p["likes"]),
                         comments=by_photo.get(p["photo_id"], [])))
            for p in photos]


CSV_HEADER = ("file name", "favourites", "likes", "rating", "ratings", "ratings by guest", "label", "comments")


def feedback_csv(photos: Sequence[Row], comments: Sequence[Row], ratings: Sequence[Row]) -> str:
    """One row per photo with feedback: counts, the mean rating, each guest's stars, the label the sidecar
    gets, and the approved comments ("Name: text", one a line in the cell)."""
    by_photo: dict[int, list[str]] = defaultdict(list)
    for c in comments:
        by_photo[c["photo_id"]].append(f"{c['guest_name']}: {c['body']}")
    stars: dict[int, list[str]] = defaultdict(list)
    for r in ratings:
        stars[r["photo_id"]].append(f"{r['guest_name'] or '-'}: {r['stars']}")
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\r\n")
    writer.writerow(CSV_HEADER)
    for p in photos:
        mean = p["rating_mean"]
        writer.writerow((_cell(p["display_name"]), p["favourites"], p["likes"],
                         f"{mean:.2f}" if mean is not None else "", p["ratings"],
                         _cell("; ".join(stars.get(p["photo_id"], []))), label_of(p["favourites"], p["likes"]) or "",
                         _cell("\n".join(by_photo.get(p["photo_id"], [])))))
    return out.getvalue()


def feedback_text(photos: Sequence[Row], comments: Sequence[Row]) -> str:
    """A readable list: each photo's file name, its likes and stars, then its comments indented."""
    by_photo: dict[int, list[Row]] = defaultdict(list)
    for c in comments:
        by_photo[c["photo_id"]].append(c)
    lines: list[str] = []
    for p in photos:
        mean = p["rating_mean"]
        rating = f", {mean:.1f} stars from {p['ratings']}" if mean is not None else ""
        lines.append(f"{p['display_name']}: {p['likes']} likes, {p['favourites']} favourites{rating}")
        for c in by_photo.get(p["photo_id"], []):
            when = dt.datetime.fromtimestamp(c["created_at"], dt.UTC).strftime("%Y-%m-%d %H:%M")
            body = c["body"].replace("\n", "\n      ")
            lines.append(f"    {c['guest_name']} ({when} UTC): {body}")
    return "".join(f"{line}\n" for line in lines)


def _cell(text: str) -> str:
    """A cell a spreadsheet will not run as a formula (guests wrote it)."""
    return "'" + text if text[:1] in ("=", "+", "-", "@", "\t", "\r") else text
