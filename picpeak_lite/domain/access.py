"""What a guest may see. Every guest route goes through :func:`guest_gallery` (and, for photos,
:func:`visible_photo`): drafts and unknown slugs are 404, expired galleries 410, password galleries need a grant
for the current password, and only complete, unhidden photos exist for guests. In a gallery whose guest photos
need approval, a guest's photo exists for guests only once the admin approved it; until then its uploader alone
sees it (:func:`own_awaiting_photo`), to be told it is waiting for approval.
"""

from __future__ import annotations

from typing import Any

from picpeak_lite.domain import admin_settings
from picpeak_lite.errors import AppError, Gone, NotFound
from picpeak_lite.i18n import N_, _
from picpeak_lite.store.db import Connection, Row
from picpeak_lite.store.queries import galleries as gallery_q
from picpeak_lite.store.queries import guests as guest_q
from picpeak_lite.store.queries import moderation as moderation_q
from picpeak_lite.store.queries import photos as photo_q
from picpeak_lite.store.queries import replacement as replacement_q


class PasswordRequired(AppError):
    """The gallery exists and is open, but this guest has not entered its password yet (or just entered a wrong
    one): the page is the password form, whatever address the guest asked for."""

    status = 401
    title = N_("This gallery is protected by a password")
    page = "guest/password.html"
    needs_guest_session = True
    WRONG_PASSWORD = N_("That password is not right. Please try again.")

    def __init__(self, gallery: Row, *, wrong_password: bool = False, return_to: str | None = None) -> None:
        super().__init__(_(self.WRONG_PASSWORD) if wrong_password else None)
        self.gallery = gallery
        self.language: str | None = gallery.get("language")
        self.wrong_password = wrong_password
        # The gallery page the guest asked for, to go back to once the password is right (the form sends it
        # along; None: the page this form answers for, e.g. the guest upload page a QR code on a table opens).
        self.return_to = return_to

    def page_context(self) -> dict[str, Any]:
        return {"gallery": self.gallery, "error": self.message if self.wrong_password else None,
                "return_to": self.return_to}


class GalleryExpired(Gone):
    """Shown in the guest look, on the gallery's own page, with the photographer's contact (from the admin
    settings) so that the guest has somewhere to turn."""

    page = "guest/expired.html"
    MESSAGE = N_("This gallery has expired. Please contact your photographer.")

    def __init__(self, contact: dict[str, str] | None = None, language: str | None = None) -> None:
        super().__init__(_(self.MESSAGE))
        self.contact = contact or {}
        self.language = language

    def page_context(self) -> dict[str, Any]:
        return {"error": self, "contact": self.contact}


class GalleryArchived(Gone):
    """An archived gallery (or one being archived or restored): its page says so, with the photographer's
    contact, since the photos can be brought back on request."""

    page = "guest/archived.html"

    def __init__(self, contact: dict[str, str] | None = None, *, restoring: bool = False) -> None:
        super().__init__(_("These photos are being brought back; please try again later.") if restoring else
                         _("This gallery has been archived. Please contact your photographer to see the photos."))
        self.contact = contact or {}
        self.restoring = restoring

    def page_context(self) -> dict[str, Any]:
        return {"error": self, "contact": self.contact, "restoring": self.restoring}


def _check_archived(conn: Connection, gallery: Row) -> None:
    if gallery["archive_state"] != "active":
        raise GalleryArchived(admin_settings.contact(conn), restoring=gallery["archive_state"] == "restoring")


def guest_gallery(conn: Connection, slug: str, guest_session_id: int | None, now: float, *,
                  admin_preview: bool = False) -> Row:
    """The gallery at ``slug`` if this guest may see it; raises otherwise.

    ``admin_preview``: the photographer (a live admin session, checked by the caller) looks at the page as a
    guest would, before publishing or without the client's password; drafts and the password are passed,
    an expired gallery stays gone (that page is what guests see, so it is the preview too).
    """
    gallery = gallery_q.get_by_slug(conn, slug)
    if gallery is None or (gallery["is_draft"] and not admin_preview):
        raise NotFound(_("There is no gallery at this address."))
    _check_archived(conn, gallery)
    if is_expired(gallery, now):
        raise GalleryExpired(admin_settings.contact(conn), gallery["language"])
    if admin_preview:
        return gallery
    if gallery["password_hash"] is not None and not (
        guest_session_id is not None
        and guest_q.has_access(conn, guest_session_id, gallery["id"], gallery["password_version"])
    ):
        raise PasswordRequired(gallery)
    return gallery


def gallery_for_password_form(conn: Connection, slug: str, now: float) -> Row:
    """The gallery a password form posts to: same rules as above, short of the password itself."""
    gallery = gallery_q.get_by_slug(conn, slug)
    if gallery is None or gallery["is_draft"]:
        raise NotFound(_("There is no gallery at this address."))
    _check_archived(conn, gallery)
    if is_expired(gallery, now):
        raise GalleryExpired(admin_settings.contact(conn), gallery["language"])
    return gallery


def is_expired(gallery: Row, now: float) -> bool:
    return gallery["expires_at"] is not None and gallery["expires_at"] <= now


def visible_photo(conn: Connection, gallery: Row, photo_id: int) -> Row:
    photo = photo_q.get_visible(conn, gallery["id"], photo_id)
    if photo is None:
        # Replaced and its new version not made yet: guests keep the previous one meanwhile, never a broken image.
        photo = replacement_q.replacing_visible(conn, gallery["id"], photo_id)
    if photo is None:
        raise NotFound(_("There is no such photo in this gallery."))
    return photo


def own_awaiting_photo(conn: Connection, gallery: Row, photo_id: int, guest_session_id: int | None) -> Row:
    """A photo waiting for the admin's approval, for the guest session that uploaded it (its images only: it
    is in no listing, zip, favourite or feed). Anyone else gets the same 404 as for a photo that does not exist."""
    photo = None
    if guest_session_id is not None:
        photo = moderation_q.own_awaiting(conn, gallery["id"], photo_id, guest_session_id)
    if photo is None:
        raise NotFound(_("There is no such photo in this gallery."))
    return photo
