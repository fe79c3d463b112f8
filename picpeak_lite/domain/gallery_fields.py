"""Validation of gallery fields, shared by the admin form and the JSON API.

Both send the same field names; the form sends strings and checkboxes, JSON sends typed values. Each field is
declared once in :data:`FIELDS` with its parser and a line of help. The result is a dict of column values ready
for ``store/queries/galleries.py``; problems are collected per field and raised together as one ValidationError,
so the form can show each next to its field and keep what the user typed.
"""

from __future__ import annotations

import datetime as dt
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from picpeak_lite.domain.brand import COVER_LAYOUTS, THEMES
from picpeak_lite.errors import ValidationError
from picpeak_lite.i18n import LANGUAGES, N_, _, ngettext
from picpeak_lite.security import MIN_GALLERY_PASSWORD_LENGTH
from picpeak_lite.store.db import fits_integer

EVENT_TYPES = ("wedding", "birthday", "party", "corporate", "portrait", "family", "other")
#: What each type is called on the pages (translated where shown: the ``event_type`` template filter).
EVENT_TYPE_LABELS = {"wedding": N_("Wedding"), "birthday": N_("Birthday"), "party": N_("Party"),
                     "corporate": N_("Corporate"), "portrait": N_("Portrait"), "family": N_("Family"),
                     "other": N_("Other")}
_EMAIL = re.compile(r"^[^@\s]+@[^@\s]+\.[^@\s]+$")
_CONTROL = re.compile(r"[\x00-\x08\x0b\x0c\x0e-\x1f\x7f]")
_DATE_HINT = N_("Use a date like 2026-06-20.")
# The one rule for the admin form and the JSON API (POST, PUT and PATCH alike): a gallery is not given a last day
# that has already gone by. The date an expired gallery already has is kept as it is, so its other fields can
# still be edited (the form sends every field back) without the admin having to revive it.
PAST_EXPIRY = N_("The expiry date is in the past: choose today or a later day, or leave it empty for never.")


class Invalid(Exception):
    """A field's value cannot be used; the message is shown next to that field."""


class Omit:
    """A field's parser returns :data:`OMIT` when the field leaves its column as it is (e.g. no new password)."""


OMIT = Omit()


@dataclass(frozen=True)
class Context:
    partial: bool  # an update: fields that are absent are left alone
    today: dt.date
    default_expiry_days: int
    is_form: bool  # the admin form, where an unchecked checkbox is simply absent
    current_expiry: dt.date | None = None  # an update: the last day the gallery has now (None: never, or new)
    default_on_expiry: str = "keep"  # settings.archive_on_expiry, for a new gallery that does not say


@dataclass(frozen=True)
class Field:
    """One gallery field: its key in forms and JSON, the column it fills, and how a value is read.

    ``parse(value, missing, context)`` gets the sent value (None when the key is absent, with ``missing`` set),
    returns the column value (or :data:`OMIT`) and raises :class:`Invalid` with a sentence for the person.
    An absent key is parsed only when a whole gallery is given (not ``partial``), or always for fields that are
    only ever acted on when sent (``always``: the password and its removal).
    """

    key: str
    parse: Callable[[Any, bool, Context], Any]
    help: str
    column: str | None = None
    always: bool = False


def _text_field(limit: int, *, keep_newlines: bool = False, required: str | None = None,
                pattern: tuple[re.Pattern[str], str] | None = None) -> Callable[[Any, bool, Context], Any]:
    def parse(value: Any, missing: bool, context: Context) -> str:
        text = _text(value, keep_newlines=keep_newlines)
        if required and not text:
            raise Invalid(_(required))
        if pattern and text and not pattern[0].match(text):
            raise Invalid(_(pattern[1]))
        if len(text) > limit:
            raise Invalid(ngettext("At most %(num)d character, please.", "At most %(num)d characters, please.", limit)
                          % {"num": limit})
        return text

    return parse


def _event_type(value: Any, missing: bool, context: Context) -> str:
    event_type = _text(value) or "other"
    if event_type not in EVENT_TYPES:
        raise Invalid(_("Choose one of: %(choices)s.") % {"choices": ", ".join(EVENT_TYPES)})
    return event_type


def _event_date(value: Any, missing: bool, context: Context) -> str | None:
    raw = _text(value)
    if not raw:
        return None
    try:
        return dt.date.fromisoformat(raw).isoformat()
    except ValueError:
        raise Invalid(_(_DATE_HINT)) from None


def _expiry(value: Any, missing: bool, context: Context) -> float | None:
    """Absent from a new gallery: the default expiry. Sent empty: never expires. A date: the end of that day."""
    if missing:
        return _end_of_day(context.today + dt.timedelta(days=context.default_expiry_days))
    raw = _text(value)
    if not raw:
        return None
    try:
        expires_on = dt.date.fromisoformat(raw)
    except ValueError:
        raise Invalid(_(_DATE_HINT)) from None
    if expires_on < context.today and expires_on != context.current_expiry:
        raise Invalid(_(PAST_EXPIRY))
    if expires_on > context.today + dt.timedelta(days=3650):
        raise Invalid(_("At most ten years ahead."))
    return _end_of_day(expires_on)


def _switch(default: bool) -> Callable[[Any, bool, Context], Any]:
    def parse(value: Any, missing: bool, context: Context) -> bool:
        if missing:
            return False if context.is_form else default
        return _bool(value, default=default)

    return parse


def _photo_cap(value: Any, missing: bool, context: Context) -> int | None:
    if value in (None, ""):
        return None
    try:
        cap = int(value)
    except (TypeError, ValueError):
        cap = 0
    if cap < 1 or isinstance(value, bool) or not fits_integer(cap):
        raise Invalid(_("A whole number of photos, at least 1, or empty for the default."))
    return cap


def _favourite_limit(value: Any, missing: bool, context: Context) -> int | None:
    if value in (None, ""):
        return None
    try:
        limit = int(value)
    except (TypeError, ValueError):
        limit = 0
    if limit < 1 or isinstance(value, bool) or not fits_integer(limit):
        raise Invalid(_("A whole number of favourites, at least 1, or empty for no limit."))
    return limit


def _look(choices: tuple[str, ...]) -> Callable[[Any, bool, Context], Any]:
    """A theme or cover layout: one of ``choices``, or empty for the install's default (the brand's)."""

    def parse(value: Any, missing: bool, context: Context) -> str:
        text = _text(value)
        if text not in ("", *choices):
            raise Invalid(_("Choose one of: %(choices)s, or empty for the default.") % {"choices": ", ".join(choices)})
        return text

    return parse


ON_EXPIRY = ("keep", "archive")


def _on_expiry(value: Any, missing: bool, context: Context) -> str:
    """keep: every file stays; archive: pipeline/archive.py archives the gallery when it expires."""
    choice = _text(value) or context.default_on_expiry
    if choice not in ON_EXPIRY:
        raise Invalid(_("Choose keep or archive."))
    return choice


def _password(value: Any, missing: bool, context: Context) -> str | Omit:
    """Returned plain, for the caller to hash; empty or absent keeps the current password."""
    if value in (None, ""):
        return OMIT
    if not isinstance(value, str) or len(value) < MIN_GALLERY_PASSWORD_LENGTH:
        raise Invalid(ngettext("At least %(num)d character.", "At least %(num)d characters.",
                               MIN_GALLERY_PASSWORD_LENGTH) % {"num": MIN_GALLERY_PASSWORD_LENGTH})
    if len(value) > 200:
        raise Invalid(ngettext("At most %(num)d character.", "At most %(num)d characters.", 200) % {"num": 200})
    return value


def _language(value: Any, missing: bool, context: Context) -> str | None:
    """Empty: each guest's browser decides. Otherwise one of the languages the pages are translated into."""
    code = _text(value)
    if not code:
        return None
    if code not in LANGUAGES:
        raise Invalid(_("Choose one of: %(choices)s.") % {"choices": ", ".join(LANGUAGES)})
    return code


def _clear_password(value: Any, missing: bool, context: Context) -> bool | Omit:
    return True if _bool(value, default=False) else OMIT


FIELDS: tuple[Field, ...] = (
    Field("name", _text_field(200, required=N_("Please give the gallery a name.")),
          "The gallery's title, shown to guests."),
    Field("customer_name", _text_field(200), "Who the photos are for; shown on the admin pages only."),
    Field("customer_email", _text_field(254, pattern=(_EMAIL, N_("This does not look like an email address."))),
          "The client's address, for the photographer's records."),
    Field("welcome_message", _text_field(5000, keep_newlines=True), "Shown above the photos; line breaks are kept."),
    Field("event_type", _event_type, "One of " + ", ".join(EVENT_TYPES) + "; empty means other."),
    Field("event_date", _event_date, "The day of the event (YYYY-MM-DD), or empty."),
    Field("expires_on", _expiry, "The last day guests can open the gallery (YYYY-MM-DD); empty: never.",
          column="expires_at"),
    Field("allow_guest_uploads", _switch(False), "Guests may add their own photos."),
    Field("allow_downloads", _switch(True), "Guests may download originals and zips."),
    Field("watermark", _switch(False), "Guests see watermarked photos."),
    Field("guest_photos_need_approval", _switch(False),
          "Guests' photos wait for the admin's approval before other guests (and the wall) see them."),
    Field("photo_cap", _photo_cap, "Most photos in this gallery, guests' included; empty: the server's limit."),
    Field("wall_captions", _switch(False), "The live wall shows guests' names under their photos."),
    Field("hold_comments", _switch(False),
          "Guests' comments wait for the admin's approval before other guests see them."),
    Field("on_expiry", _on_expiry, "When the gallery expires: keep (every file stays) or archive (thumbnails "
          "removed, originals packed away; restorable)."),
    Field("favourite_limit", _favourite_limit, "Most favourites each guest may choose; empty: no limit."),
    Field("theme", _look(THEMES), "The guest pages' theme: " + ", ".join(THEMES) + "; empty: the default."),
    Field("cover_layout", _look(COVER_LAYOUTS),
          "The cover's layout: " + ", ".join(COVER_LAYOUTS) + "; empty: the default."),
    Field("hot_folder", _text_field(1000),
          "A folder watched during the event (and its subfolders): each photo written into it joins the gallery. "
          "Inside the server's hot_folder_root; empty: none."),
    Field("hot_folder_in_place", _switch(False),
          "The hot folder's originals are referenced where they are (never modified) instead of copied; local "
          "storage only."),
    Field("password", _password, f"Guests must enter it (at least {MIN_GALLERY_PASSWORD_LENGTH} characters).",
          always=True),
    Field("clear_password", _clear_password, "Remove the password.", always=True),
    Field("language", _language, "The guests' pages' language (" + ", ".join(LANGUAGES) + "), unless a guest "
          "picks another; empty: each guest's browser decides."),
)


def hot_folder_path(root: str, value: str) -> Path:
    """A gallery's hot folder as the form may set it: inside ``root`` (the server's ``hot_folder_root``),
    resolved, so that ``..`` and links cannot lead out of it; a relative path is taken inside ``root``.
    Raises :class:`Invalid` with a sentence for the form (also when ``root`` is empty: hot folders are off)."""
    if not root:
        raise Invalid(_("Hot folders are off on this server: set hot_folder_root in its configuration first."))
    base = Path(root).resolve()
    resolved = (base / value).resolve()  # an absolute value replaces base
    if resolved != base and base not in resolved.parents:
        raise Invalid(_("The folder must be inside %(root)s.") % {"root": base})
    return resolved


def check_hot_folder(values: dict[str, Any], root: str) -> None:
    """After :func:`parse_gallery_input`: an empty hot folder is none (NULL), a set one is checked against
    ``root`` and stored resolved. Raises ValidationError for the form's field."""
    if "hot_folder" not in values:
        return
    if not values["hot_folder"]:
        values["hot_folder"] = None
        return
    try:
        values["hot_folder"] = str(hot_folder_path(root, values["hot_folder"]))
    except Invalid as problem:
        raise ValidationError({"hot_folder": str(problem)}) from None


def parse_gallery_input(
    data: Mapping[str, Any], *, partial: bool, today: dt.date, default_expiry_days: int,
    current_expiry: dt.date | None = None, default_on_expiry: str = "keep",
) -> dict[str, Any]:
    """Validate ``data`` against :data:`FIELDS`. With ``partial`` (an update), only the fields present are
    checked and returned. ``current_expiry`` is the updated gallery's last day now: sent back unchanged it is
    kept even when it has passed (see :data:`PAST_EXPIRY`).

    The password is returned as ``password`` (plain, for the caller to hash) or ``clear_password: True``.
    """
    context = Context(partial=partial, today=today, default_expiry_days=default_expiry_days, is_form=_is_form(data),
                      current_expiry=current_expiry, default_on_expiry=default_on_expiry)
    errors: dict[str, str] = {}
    out: dict[str, Any] = {}
    for field in FIELDS:
        missing = field.key not in data
        if missing and partial and not field.always:
            continue
        try:
            value = field.parse(data.get(field.key), missing, context)
        except Invalid as problem:
            errors[field.key] = str(problem)
            continue
        if value is not OMIT:
            out[field.column or field.key] = value
    if errors:
        raise ValidationError(errors)
    return out


def _is_form(data: Mapping[str, Any]) -> bool:
    return bool(data.get("_form"))


def _text(value: Any, *, keep_newlines: bool = False) -> str:
    if value is None:
        return ""
    text = str(value).replace("\r\n", "\n").strip()
    text = _CONTROL.sub("", text)
    return text if keep_newlines else text.replace("\n", " ")


def _bool(value: Any, *, default: bool) -> bool:
    if value is None:
        return default
    if isinstance(value, bool):
        return value
    return str(value).lower() in ("1", "true", "on", "yes")


def _end_of_day(day: dt.date) -> float:
    return dt.datetime.combine(day, dt.time(23, 59, 59), tzinfo=dt.UTC).timestamp()
