"""Admin settings changed from the settings page, stored in ``app_settings`` over the config file's defaults.

The config file (``config.Settings``) says how the server runs; these are the photographer's choices that may
change while it runs: the watermark, the defaults for new galleries, the low-disk warning. Each key is declared
once below with its kind, where its default comes from and a line of help; the stored value (JSON text) wins
over the default. A key that is no longer declared is ignored, so an old row can never break a page.

Sync and free of trio and quart, like ``config``: the worker reads these through ``db.read(load, settings)``.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import json
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from picpeak_lite.config import WATERMARK_POSITIONS, Settings
from picpeak_lite.i18n import _, ngettext
from picpeak_lite.media import images
from picpeak_lite.store.db import Connection
from picpeak_lite.store.queries import galleries as gallery_q
from picpeak_lite.store.queries import photos as photo_q
from picpeak_lite.store.queries import settings as settings_q

LOGO_FILE = "watermark-logo.png"
LOGO_MAX_BYTES = 5 * 1024 * 1024
# One '@', something on each side, a dot in the domain, no spaces: enough to catch a typo; the guest's mail
# program is the real judge.
EMAIL = re.compile(r"[^@\s]+@[^@\s]+\.[^@\s]+")


@dataclass(frozen=True)
class Key:
    kind: str  # 'str', 'email', 'bool', 'int', 'float', 'choice', 'optional_int'
    default_from: str | None  # the Settings field that gives the default, or None for ``literal``
    help: str
    literal: Any = None
    low: float | None = None
    high: float | None = None
    choices: tuple[str, ...] = ()
    max_length: int = 200


KEYS: dict[str, Key] = {
    "watermark_text": Key("str", "watermark_text", "Text of the watermark; empty uses the gallery's name.",
                          max_length=100),
    "watermark_use_logo": Key("bool", None, "Use the uploaded logo instead of the text.", literal=False),
    "watermark_position": Key("choice", "watermark_position", "Where the watermark goes.",
                              choices=WATERMARK_POSITIONS),
    "watermark_opacity": Key("float", "watermark_opacity", "Opacity, 0.05-1.", low=0.05, high=1.0),
    "watermark_size": Key("float", "watermark_size", "Width as a share of the photo's width, 0.02-1.",
                          low=0.02, high=1.0),
    "default_expiry_days": Key("int", "default_expiry_days", "Days until a new gallery expires (1-365).",
                               low=1, high=365),
    "default_allow_downloads": Key("bool", None, "New galleries allow downloads.", literal=True),
    "default_allow_guest_uploads": Key("bool", None, "New galleries accept guest uploads.", literal=False),
    "default_watermark": Key("bool", None, "New galleries show watermarked photos.", literal=False),
    "default_photo_cap": Key("optional_int", None, "Most photos in a new gallery (guests included); empty: "
                             "the server's limit.", literal=None, low=1, high=1_000_000),
    "low_disk_mb": Key("int", "low_disk_mb", "Warn on the dashboard below this much free disk space, in MB.",
                       low=0, high=10_000_000),
    # Shown to guests where a gallery is closed to them (the expired page), so they can reach the photographer.
    "contact_name": Key("str", None, "Your name or studio, as guests should read it.", literal="", max_length=100),
    "contact_email": Key("email", None, "An email address guests may write to.", literal="", max_length=200),
    "contact_phone": Key("str", None, "A phone number guests may call.", literal="", max_length=40),
}

SECTIONS = {
    "watermark": ("watermark_text", "watermark_use_logo", "watermark_position", "watermark_opacity",
                  "watermark_size"),
    "defaults": ("default_expiry_days", "default_allow_downloads", "default_allow_guest_uploads",
                 "default_watermark", "default_photo_cap", "low_disk_mb"),
    "contact": ("contact_name", "contact_email", "contact_phone"),
}
CONTACT_KEYS = SECTIONS["contact"]


@dataclass(frozen=True)
class AdminSettings:
    watermark_text: str
    watermark_use_logo: bool
    watermark_position: str
    watermark_opacity: float
    watermark_size: float
    default_expiry_days: int
    default_allow_downloads: bool
    default_allow_guest_uploads: bool
    default_watermark: bool
    default_photo_cap: int | None
    low_disk_mb: int
    contact_name: str = ""
    contact_email: str = ""
    contact_phone: str = ""
    logo_path: str = ""  # the logo in use when watermark_use_logo: the uploaded one, else the config's

    def watermark(self, gallery_name: str) -> images.Watermark:
        """The watermark for a gallery: the logo when chosen and present, else the text (or the name)."""
        logo = self.logo_path if self.watermark_use_logo and self.logo_path else None
        return images.Watermark(
            text=self.watermark_text or gallery_name, logo_path=logo, position=self.watermark_position,
            opacity=self.watermark_opacity, size=self.watermark_size,
        )

    def as_form(self) -> dict[str, Any]:
        return {k: getattr(self, k) for k in KEYS}


def logo_path(settings: Settings) -> Path:
    return settings.data_path / "branding" / LOGO_FILE


def defaults(settings: Settings) -> dict[str, Any]:
    values = {name: getattr(settings, key.default_from) if key.default_from else key.literal
              for name, key in KEYS.items()}
    values["watermark_use_logo"] = bool(settings.watermark_logo)  # a logo in the config file is meant to be used
    return values


def load(conn: Connection, settings: Settings) -> AdminSettings:
    """The settings in force: stored values over the config's defaults."""
    values = defaults(settings)
    for name, raw in settings_q.get_all(conn).items():
        if name in KEYS:
            # A value we can no longer read falls back to the default rather than breaking pages.
            with contextlib.suppress(ValueError, TypeError):
                values[name] = _coerce(KEYS[name], json.loads(raw))
    uploaded = logo_path(settings)
    logo = str(uploaded) if uploaded.exists() else settings.watermark_logo
    return AdminSettings(**values, logo_path=logo)


def contact(conn: Connection) -> dict[str, str]:
    """The photographer's contact for guest pages ({} when none is set). Needs no ``Settings``: these keys
    have no default in the config file, so the guest-access rules can read them inside their own transaction."""
    stored = settings_q.get_all(conn)
    found: dict[str, str] = {}
    for name in CONTACT_KEYS:
        with contextlib.suppress(ValueError, TypeError, KeyError):
            value = _coerce(KEYS[name], json.loads(stored[name]))
            if value:
                found[name.removeprefix("contact_")] = value
    return found


def gallery_watermark(conn: Connection, settings: Settings, gallery: Mapping[str, Any]) -> images.Watermark | None:
    """The one answer to "what watermark does this gallery get": for its view images and its downloads alike.
    The admin's settings are read only for a gallery that has its watermark on."""
    return _watermark_of(load(conn, settings), gallery) if gallery["watermark"] else None


def watermark_of_gallery(conn: Connection, settings: Settings, gallery_id: int) -> images.Watermark | None:
    """:func:`gallery_watermark` from the gallery's id, in one read (the worker asks it for every photo, and
    needs none of the gallery's other fields or counts); None for a gallery that is gone."""
    rows = gallery_q.watermark_fields(conn, gallery_id)
    return gallery_watermark(conn, settings, rows[0]) if rows else None


def _watermark_of(chosen: AdminSettings, gallery: Mapping[str, Any]) -> images.Watermark | None:
    return chosen.watermark(gallery["name"]) if gallery["watermark"] else None


def watermark_fingerprint(watermark: images.Watermark | None, logos: dict[str, Any] | None = None) -> str:
    """What images made with ``watermark`` depend on besides the photo: its parameters, and the logo file's size
    and mtime (an uploaded logo replaces the file at the same path). "" for no watermark. ``logos`` caches the
    logo's state across the galleries of one call."""
    if watermark is None:
        return ""
    logo: Any = None
    if watermark.logo_path:
        logos = {} if logos is None else logos
        if watermark.logo_path not in logos:
            try:
                stat = os.stat(watermark.logo_path)
                logos[watermark.logo_path] = [stat.st_size, stat.st_mtime_ns]
            except OSError:
                logos[watermark.logo_path] = "missing"
        logo = logos[watermark.logo_path]
    text = json.dumps([dataclasses.asdict(watermark), logo], sort_keys=True)
    return hashlib.sha256(text.encode()).hexdigest()


def watermark_fingerprints(conn: Connection, settings: Settings, gallery_id: int | None = None) -> dict[int, str]:
    """Each gallery's (or one gallery's) :func:`watermark_fingerprint`: compared before and after a change to
    find the galleries whose view images must be made again."""
    chosen = load(conn, settings)
    logos: dict[str, Any] = {}
    return {row["id"]: watermark_fingerprint(_watermark_of(chosen, row), logos)
            for row in gallery_q.watermark_fields(conn, gallery_id)}


def mark_changed_watermarks(conn: Connection, settings: Settings, before: Mapping[int, str],
                            gallery_id: int | None = None) -> int:
    """Mark the photos of every gallery (or of ``gallery_id``) whose watermark is no longer what ``before`` (the
    fingerprints from before a change) says, so that idle workers make their view images again. Returns how
    many photos were marked."""
    after = watermark_fingerprints(conn, settings, gallery_id)
    changed = [key for key, now in after.items() if key in before and before[key] != now]
    return photo_q.mark_views_stale(conn, changed)


def save(conn: Connection, values: Mapping[str, Any]) -> None:
    settings_q.set_many(conn, {k: json.dumps(v) for k, v in values.items() if k in KEYS})


def parse_section(section: str, form: Mapping[str, Any]) -> tuple[dict[str, Any], dict[str, str]]:
    """Validate one section of the settings form. Returns (values, per-field errors); unchecked boxes are False.

    Raises KeyError for an unknown section.
    """
    values: dict[str, Any] = {}
    errors: dict[str, str] = {}
    for name in SECTIONS[section]:
        key = KEYS[name]
        raw = form.get(name)
        try:
            values[name] = _parse(key, raw)
        except ValueError as error:
            errors[name] = str(error)
            values[name] = raw if raw is not None else ""
    return values, errors


def _bounds(key: Key) -> dict[str, str]:
    return {"low": f"{key.low:g}", "high": f"{key.high:g}"}


def _parse(key: Key, raw: Any) -> Any:
    if key.kind == "bool":
        return raw is not None and str(raw).lower() in ("1", "on", "true", "yes")
    text = "" if raw is None else str(raw).strip()
    if key.kind in ("str", "email"):
        text = " ".join(text.split())
        if len(text) > key.max_length:
            raise ValueError(ngettext("At most %(num)d character.", "At most %(num)d characters.", key.max_length)
                             % {"num": key.max_length})
        if key.kind == "email" and text and not EMAIL.fullmatch(text):
            raise ValueError(_("An email address like name@example.com, or empty."))
        return text
    if key.kind == "choice":
        if text not in key.choices:
            raise ValueError(_("Choose one of: %(choices)s.") % {"choices": ", ".join(key.choices)})
        return text
    if key.kind == "optional_int" and text == "":
        return None
    if key.kind in ("int", "optional_int"):
        try:
            number: float = int(text)
        except ValueError:
            raise ValueError(_("A whole number from %(low)s to %(high)s.") % _bounds(key)) from None
    else:
        try:
            number = float(text)
        except ValueError:
            raise ValueError(_("A number from %(low)s to %(high)s.") % _bounds(key)) from None
        if number != number:  # NaN
            raise ValueError(_("A number from %(low)s to %(high)s.") % _bounds(key))
    assert key.low is not None and key.high is not None
    if not key.low <= number <= key.high:
        raise ValueError(_("From %(low)s to %(high)s, please.") % _bounds(key))
    return number


def _coerce(key: Key, value: Any) -> Any:
    """A stored value checked against its declaration (stored rows were validated, but schemas move on)."""
    if key.kind == "bool":
        if not isinstance(value, bool):
            raise ValueError
        return value
    if key.kind == "email":
        if not isinstance(value, str):
            raise ValueError
        return _parse(key, value)
    if key.kind in ("str", "choice"):
        if not isinstance(value, str) or (key.kind == "choice" and value not in key.choices):
            raise ValueError
        return value
    if value is None and key.kind == "optional_int":
        return None
    return _parse(key, value)
