"""What the pages say about a video: where it plays, its length for the tile's badge, or why it cannot play yet.

Shared by the guest page (``views/guest.py``), the admin's pages and the play route (``views/video.py``); views
never import each other, so it lives here. The badge is drawn by the page over the poster (``guest.css``
``.play-badge``), not burned into the grid image: the poster stays a clean frame (also the gallery's cover, the
og:image) and the length is text a screen reader reads.
"""

from __future__ import annotations

from typing import Any

NO_PREVIEW = ("This video's format does not play in every browser; a playable copy is being made. "
              "Until then you can download it.")
PREVIEW_FAILED = "This video's format does not play in this browser, and no playable copy could be made."


def duration_label(seconds: float | None) -> str:
    whole = round(seconds or 0)
    return f"{whole // 60}:{whole % 60:02d}"


def video_fields(photo: dict[str, Any], play_url: str) -> dict[str, Any]:
    """``play_url`` (None for a photo, or while a video waits for its playable copy), ``duration`` ('m:ss') and
    ``play_note`` (the sentence shown instead of the player)."""
    if photo.get("media_type") != "video":
        return {"play_url": None, "duration": "", "play_note": ""}
    note = {"pending": NO_PREVIEW, "failed": PREVIEW_FAILED}.get(photo.get("preview_status") or "", "")
    return {"play_url": None if note else play_url, "duration": duration_label(photo.get("duration")),
            "play_note": note}
