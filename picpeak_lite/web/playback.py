"""What the pages say about a video: where it plays, its length for the tile's badge, or why it cannot play yet.

Shared by the guest page (``views/guest.py``), the admin's pages and the play route (``views/video.py``); views
never import each other, so it lives here. The badge is drawn by the page over the poster (``guest.css``
``.play-badge``), not burned into the grid image: the poster stays a clean frame (also the gallery's cover, the
og:image) and the length is text a screen reader reads.
"""

from __future__ import annotations

from typing import Any

from picpeak_lite.i18n import N_, _
from picpeak_lite.store.queries.photos import BROWSER_CODECS

# Marked here, translated where they are shown (video_fields and the play route), in the reader's language.
NO_PREVIEW = N_("This video's format does not play in every browser; a playable copy is being made. "
                "Until then you can download it.")
PREVIEW_FAILED = N_("This video's format does not play in this browser, and no playable copy could be made.")
# Downloads off: guests play a copy made for watching (H.264, at most 1080p), never the original file.
PREPARING = N_("This video is being prepared for playback; it will play here in a few minutes.")
NO_PLAYBACK = N_("This video could not be prepared for playback here.")


def duration_label(seconds: float | None) -> str:
    whole = round(seconds or 0)
    return f"{whole // 60}:{whole % 60:02d}"


def video_fields(photo: dict[str, Any], play_url: str, *, originals: bool = True) -> dict[str, Any]:
    """``play_url`` (None for a photo, or while a video waits for its playable copy), ``duration`` ('m:ss') and
    ``play_note`` (the sentence shown instead of the player). ``originals``: whether this viewer may have the
    original file (a guest in a gallery with downloads off may not: only the made copy plays)."""
    if photo.get("media_type") != "video":
        return {"play_url": None, "duration": "", "play_note": ""}
    preview = photo.get("preview_status") or ""
    if originals:
        playable = not preview or preview == "complete" or photo.get("video_codec") in BROWSER_CODECS
        note = "" if playable else {"pending": NO_PREVIEW, "failed": PREVIEW_FAILED}.get(preview, "")
    else:
        note = {"complete": "", "failed": NO_PLAYBACK}.get(preview, PREPARING)
    return {"play_url": None if note else play_url, "duration": duration_label(photo.get("duration")),
            "play_note": _(note) if note else ""}
