"""Who may open a gallery's live wall, and what it shows.

The wall is a slideshow for a projector or TV in the hall: the admin opens it from the gallery page, or gives
the machine that runs it a wall link, ``/g/<slug>/wall?key=<token>``, whose token is the wall's alone (not the
share link, not the password: a wall link opens the wall and nothing else) and is revoked by making a new one or
removing it. With the admin's session the wall opens whatever the gallery's state; with a link only while
guests could open the gallery (published, not expired), but without its password: the wall is in the hall.

It shows what guests see (``GUEST_VISIBLE_PHOTO``: complete, not hidden, approved), as preview images only.
"""

from __future__ import annotations

import secrets

from picpeak_lite.domain import access
from picpeak_lite.errors import Forbidden, NotFound
from picpeak_lite.i18n import N_, _
from picpeak_lite.store.db import Connection, Row
from picpeak_lite.store.queries import galleries as gallery_q

BAD_LINK = N_("This wall link is not valid (it may have been replaced or removed). Ask the photographer for the new "
              "one.")


def new_token() -> str:
    """128 random bits, URL-safe."""
    return secrets.token_urlsafe(16)


def wall_gallery(conn: Connection, slug: str, key: str | None, is_admin: bool, now: float) -> Row:
    """The gallery whose wall this visitor may open; raises otherwise.

    Without the admin's session the wall tells no more than the gallery page tells a stranger: an unknown slug
    and a draft are both 404, an expired gallery 410 (with the photographer's contact), whatever the key
    (issue 27: a 403 for a draft told that its slug exists). Only for a gallery guests could open is a missing
    or wrong key 403."""
    if is_admin:
        gallery = gallery_q.get_by_slug(conn, slug)
        if gallery is None:
            raise NotFound(_("There is no gallery at this address."))
        return gallery
    gallery = access.gallery_for_password_form(conn, slug, now)  # the page's rules short of the password
    token = gallery["wall_token"]
    if not key or token is None or not secrets.compare_digest(key.encode(), token.encode()):
        raise Forbidden(_(BAD_LINK))
    return gallery
