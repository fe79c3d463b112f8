"""Validation of gallery fields, shared by the admin form and the JSON API.

Both send the same field names; the form sends strings and checkboxes, JSON sends typed values. The result is
a dict of column values ready for ``queries.galleries``; problems are collected per field and raised together
as one ValidationError, so the form can show each next to its field and keep what the user typed.
"""

from __future__ import annotations

import datetime as dt
import re
from collections.abc import Mapping
from typing import Any

from picpeak_lite.errors import ValidationError
from picpeak_lite.security import MIN_GALLERY_PASSWORD_LENGTH
from picpeak_lite.store.db import fits_integer

EVENT_TYPES = ("wedding", "birthday", "party", "corporate", "portrait", "family", "other")
TEXT_LIMITS = {"name": 200, "customer_name": 200, "customer_email": 254, "welcome_message": 5000}
BOOL_FIELDS = ("allow_guest_uploads", "allow_downloads", "watermark")
_EMAIL = re.compile(r"^[^@\s]+@[^@\s]+\.[^@\s]+$")
_CONTROL = re.compile(r"[\x00-\x08\x0b\x0c\x0e-\x1f\x7f]")


def parse_gallery_input(
    data: Mapping[str, Any], *, partial: bool, today: dt.date, default_expiry_days: int
) -> dict[str, Any]:
    """Validate ``data``. With ``partial`` (an update), only the fields present are checked and returned.

    The password is returned as ``password`` (plain, for the caller to hash) or ``clear_password: True``.
    """
    errors: dict[str, str] = {}
    out: dict[str, Any] = {}

    def present(key: str) -> bool:
        return key in data or not partial

    if present("name"):
        name = _text(data.get("name"))
        if not name:
            errors["name"] = "Please give the gallery a name."
        out["name"] = name
    for key in ("customer_name", "customer_email", "welcome_message"):
        if present(key):
            out[key] = _text(data.get(key), keep_newlines=key == "welcome_message")
    for key, limit in TEXT_LIMITS.items():
        if key in out and len(out[key]) > limit:
            errors[key] = f"At most {limit} characters, please."
    if out.get("customer_email") and not _EMAIL.match(out["customer_email"]):
        errors["customer_email"] = "This does not look like an email address."
    if present("event_type"):
        event_type = _text(data.get("event_type")) or "other"
        if event_type not in EVENT_TYPES:
            errors["event_type"] = "Choose one of: " + ", ".join(EVENT_TYPES) + "."
        out["event_type"] = event_type
    if present("event_date"):
        raw = _text(data.get("event_date"))
        out["event_date"] = None
        if raw:
            try:
                out["event_date"] = dt.date.fromisoformat(raw).isoformat()
            except ValueError:
                errors["event_date"] = "Use a date like 2026-06-20."
    if present("expires_on"):
        raw = _text(data.get("expires_on"))
        if raw:
            try:
                expires_on = dt.date.fromisoformat(raw)
            except ValueError:
                errors["expires_on"] = "Use a date like 2026-06-20."
            else:
                if not partial and expires_on < today:
                    errors["expires_on"] = "The expiry date is in the past."
                elif expires_on > today + dt.timedelta(days=3650):
                    errors["expires_on"] = "At most ten years ahead."
                out["expires_at"] = _end_of_day(expires_on)
        elif "expires_on" in data:
            out["expires_at"] = None  # explicitly cleared: never expires
        else:
            out["expires_at"] = _end_of_day(today + dt.timedelta(days=default_expiry_days))
    for key in BOOL_FIELDS:
        if key in data or (not partial and not _is_form(data)):
            default = key == "allow_downloads"
            out[key] = _bool(data.get(key), default=default)
        elif not partial:
            out[key] = False  # an unchecked checkbox is simply absent from a form
    if present("photo_cap"):
        raw = data.get("photo_cap")
        out["photo_cap"] = None
        if raw not in (None, ""):
            try:
                cap = int(raw)
                if cap < 1 or isinstance(raw, bool) or not fits_integer(cap):
                    raise ValueError
                out["photo_cap"] = cap
            except (TypeError, ValueError):
                errors["photo_cap"] = "A whole number of photos, at least 1, or empty for the default."
    password = data.get("password")
    if password not in (None, ""):
        if not isinstance(password, str) or len(password) < MIN_GALLERY_PASSWORD_LENGTH:
            errors["password"] = f"At least {MIN_GALLERY_PASSWORD_LENGTH} characters."
        elif len(password) > 200:
            errors["password"] = "At most 200 characters."
        else:
            out["password"] = password
    if _bool(data.get("clear_password"), default=False):
        out["clear_password"] = True
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
