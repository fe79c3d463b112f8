"""Creating and changing galleries: the steps around the SQL (slugs, tokens, password hashes) that the admin
pages and the JSON API share."""

from __future__ import annotations

import datetime as dt
import re
import secrets
import unicodedata
from typing import Any

import trio

from picpeak_lite.domain import admin_settings
from picpeak_lite.domain.accounts import CLI, Actor
from picpeak_lite.domain.gallery_fields import check_hot_folder, parse_gallery_input
from picpeak_lite.errors import NotFound
from picpeak_lite.i18n import _
from picpeak_lite.services import Services
from picpeak_lite.store.db import Row
from picpeak_lite.store.queries import galleries as gallery_q
from picpeak_lite.store.queries import photos as photo_q

_SLUG_ALPHABET = "abcdefghijkmnpqrstuvwxyz23456789"


def make_slug(name: str) -> str:
    """Readable and unguessable: ``anna-and-ben-k7x2m9qp`` (40 random bits in the suffix)."""
    ascii_name = unicodedata.normalize("NFKD", name).encode("ascii", "ignore").decode()
    words = re.sub(r"[^a-z0-9]+", "-", ascii_name.lower()).strip("-")[:48].strip("-")
    suffix = "".join(secrets.choice(_SLUG_ALPHABET) for _ in range(8))
    return f"{words}-{suffix}" if words else f"gallery-{suffix}"


def _today(svc: Services) -> dt.date:
    return dt.datetime.fromtimestamp(svc.clock(), dt.UTC).date()


def default_expiry(svc: Services) -> dt.date:
    return _today(svc) + dt.timedelta(days=svc.settings.default_expiry_days)


async def create_gallery(svc: Services, data: dict[str, Any], actor: Actor = CLI) -> Row:
    """A new draft gallery. Fields a JSON request leaves out take the settings page's defaults for new galleries
    (the admin form is prefilled with them and sends every field; an unchecked box there is simply absent)."""
    chosen = await svc.db.read(admin_settings.load, svc.settings)
    values = parse_gallery_input(
        _with_defaults(data, chosen), partial=False, today=_today(svc),
        default_expiry_days=chosen.default_expiry_days, default_on_expiry=svc.settings.archive_on_expiry,
    )
    check_hot_folder(values, svc.settings.hot_folder_root)
    password_hash = await svc.hash_password(values["password"]) if "password" in values else None

    def insert(conn: Any) -> Row:
        while True:
            slug = make_slug(values["name"])
            if not gallery_q.slug_taken(conn, slug):
                break
        gallery_id = gallery_q.create(
            conn, values, slug=slug, share_token=secrets.token_hex(16), password_hash=password_hash,
            now=svc.clock(),
        )
        row = gallery_q.get(conn, gallery_id)
        assert row is not None
        actor.record(conn, svc.clock(), "gallery.created", gallery_id=gallery_id)
        return row

    return await svc.db.write(insert)


def _with_defaults(data: dict[str, Any], chosen: admin_settings.AdminSettings) -> dict[str, Any]:
    if data.get("_form"):
        return data
    defaults = {"allow_downloads": chosen.default_allow_downloads,
                "allow_guest_uploads": chosen.default_allow_guest_uploads,
                "watermark": chosen.default_watermark, "photo_cap": chosen.default_photo_cap}
    return {**{k: v for k, v in defaults.items() if k not in data}, **data}


async def update_gallery(svc: Services, gallery_id: int, data: dict[str, Any], *, partial: bool,
                         actor: Actor = CLI) -> Row:
    current = expires_on(await get_gallery(svc, gallery_id))
    values = parse_gallery_input(
        data, partial=partial, today=_today(svc), default_expiry_days=svc.settings.default_expiry_days,
        current_expiry=dt.date.fromisoformat(current) if current else None,
        default_on_expiry=svc.settings.archive_on_expiry,
    )
    check_hot_folder(values, svc.settings.hot_folder_root)
    if "password" in values:
        values["password_hash"] = await svc.hash_password(values["password"])
    elif values.get("clear_password"):
        values["password_hash"] = None

    def change(conn: Any) -> Row:
        before = admin_settings.watermark_fingerprints(conn, svc.settings, gallery_id)
        row = _row_if(gallery_q.update(conn, gallery_id, values, svc.clock()), conn, gallery_id)
        # Watermark on or off, or a new name in it: the view images are made again.
        admin_settings.mark_changed_watermarks(conn, svc.settings, before, gallery_id)
        # Downloads off: guests play a made copy of each video, never the original (web/views/video.py).
        if not row["allow_downloads"]:
            photo_q.want_previews(conn, gallery_id)
        changed = sorted(k for k in values if k not in ("password", "password_hash", "clear_password"))
        if "password_hash" in values:
            changed.append("password" if values["password_hash"] else "password removed")
        actor.record(conn, svc.clock(), "gallery.updated", gallery_id=gallery_id, detail=", ".join(changed))
        return row

    row = await svc.db.write(change)
    svc.workers_bell.ring()
    return row


def _row_if(changed: bool, conn: Any, gallery_id: int) -> Row:
    """The gallery as it is now, after a change that found it; NotFound when the change found nothing."""
    if not changed:
        raise NotFound(_("There is no such gallery."))
    row = gallery_q.get(conn, gallery_id)
    assert row is not None
    return row


async def get_gallery(svc: Services, gallery_id: int) -> Row:
    row = await svc.db.read(gallery_q.get, gallery_id)
    if row is None:
        raise NotFound(_("There is no such gallery."))
    return row


async def set_published(svc: Services, gallery_id: int, published: bool, actor: Actor = CLI) -> Row:
    def change(conn: Any) -> Row:
        row = _row_if(gallery_q.set_draft(conn, gallery_id, not published, svc.clock()), conn, gallery_id)
        actor.record(conn, svc.clock(), "gallery.published" if published else "gallery.unpublished",
                     gallery_id=gallery_id)
        return row

    return await svc.db.write(change)


async def delete_gallery(svc: Services, gallery_id: int, actor: Actor = CLI) -> None:
    """Delete the gallery and, through the foreign keys, its photos, uploads and grants; then the files.

    Rows go first: a crash before the files are gone leaves orphans for the reconciler, never rows without files.
    """

    def delete(conn: Any) -> tuple[list[str], str | None] | None:
        keys = photo_q.keys_of_gallery(conn, gallery_id)
        row = gallery_q.get(conn, gallery_id)
        if row is None:
            return None
        actor.record(conn, svc.clock(), "gallery.deleted", gallery_id=gallery_id, detail=f"{len(keys)} files")
        return (keys, row["archive_object"]) if gallery_q.delete(conn, gallery_id) else None

    deleted = await svc.db.write(delete)
    if deleted is None:
        raise NotFound(_("There is no such gallery."))
    keys, archive = deleted
    await trio.to_thread.run_sync(svc.storage.remove_files_of, keys)
    if archive is not None:  # an archived gallery's originals: deleting the gallery is the photographer's choice
        await trio.to_thread.run_sync(svc.storage.remove, archive)


def expires_on(row: Row) -> str | None:
    if row["expires_at"] is None:
        return None
    return dt.datetime.fromtimestamp(row["expires_at"], dt.UTC).date().isoformat()


def archive_json(row: Row) -> dict[str, Any]:
    """Where the gallery stands in archiving (pipeline/archive.py), with the bytes it freed."""
    before, after = row["archive_bytes_before"], row["archive_bytes_after"]
    return {"state": row["archive_state"], "bytes_before": before, "bytes_after": after,
            "bytes_freed": None if before is None or after is None else before - after,
            "archived_at": row["archived_at"], "error": row["archive_error"]}


def to_json(row: Row, share_url: str) -> dict[str, Any]:
    """The API shape of a gallery. Never includes the password hash."""
    return {
        "id": row["id"],
        "slug": row["slug"],
        "name": row["name"],
        "event_type": row["event_type"],
        "event_date": row["event_date"],
        "customer_name": row["customer_name"],
        "customer_email": row["customer_email"],
        "welcome_message": row["welcome_message"],
        "has_password": row["password_hash"] is not None,
        "expires_on": expires_on(row),
        "is_draft": bool(row["is_draft"]),
        "allow_guest_uploads": bool(row["allow_guest_uploads"]),
        "allow_downloads": bool(row["allow_downloads"]),
        "watermark": bool(row["watermark"]),
        "photo_cap": row["photo_cap"],
        "guest_photos_need_approval": bool(row["guest_photos_need_approval"]),
        "favourite_limit": row["favourite_limit"],
        "wall_captions": bool(row["wall_captions"]),
        "hold_comments": bool(row["hold_comments"]),
        "on_expiry": row["on_expiry"],
        "archive": archive_json(row),
        "language": row["language"],
        "share_url": share_url,
        "counts": {
            "complete": row.get("complete_count", 0),
            "waiting": row.get("waiting_count", 0),
            "failed": row.get("failed_count", 0),
            "guest": row.get("guest_count", 0),
        },
        "created_at": row["created_at"],
        "updated_at": row["updated_at"],
    }
