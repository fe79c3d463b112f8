"""The language picker's one route: remember the visitor's choice and go back to the page they were on."""

from __future__ import annotations

from quart import Blueprint, redirect, request
from werkzeug.wrappers import Response

from picpeak_lite import i18n
from picpeak_lite.errors import NotFound
from picpeak_lite.i18n import _
from picpeak_lite.web.auth import services
from picpeak_lite.web.locale import LANG_COOKIE, safe_next

blueprint = Blueprint("language", __name__)


@blueprint.get("/lang/<code>")
async def choose(code: str) -> Response:
    """A plain link (no script, no form) so the picker works everywhere; the cookie holds nothing but the code,
    so a link that sets it for someone else can do no more than change their pages' language."""
    if code not in i18n.LANGUAGES:
        raise NotFound(_("There is no such language."))
    response = redirect(safe_next(request.args.get("next")))
    response.set_cookie(LANG_COOKIE, code, max_age=400 * 86400, httponly=True, samesite="Lax",
                        secure=services().settings.secure_cookies, path="/")
    return response
