"""The language of a request: the visitor's pick on the page (a cookie), else the gallery's language, else
``Accept-Language``, else the install's ``default_language`` (the order is :func:`picpeak_lite.i18n.choose`).

``app.py`` sets it before every request from what the request alone says; a guest view that has loaded its
gallery (``views/common.py`` ``load_gallery``) and the error handler (the password and expired pages) set it
again with the gallery's language. The scripts' strings reach the page as a JSON block (:func:`script_strings`)
because the pages' policy runs no inline script.
"""

from __future__ import annotations

import json

from markupsafe import Markup
from quart import has_request_context, request, websocket

from picpeak_lite import i18n
from picpeak_lite.web.auth import services

#: The visitor's own choice from the page's language picker (``/lang/<code>``), for 400 days.
LANG_COOKIE = "picpeak_lang"


def apply(gallery_language: str | None = None) -> str:
    """Choose this request's language and put it in force for the rest of the request; returns it."""
    asking = request if has_request_context() else websocket  # the live feeds' messages are a page's too
    locale = i18n.choose(picked=asking.cookies.get(LANG_COOKIE), gallery=gallery_language,
                         accepted=asking.accept_languages.values(), default=services().settings.default_language)
    i18n.set_locale(locale)
    return locale


def safe_next(value: str | None) -> str:
    """A path on this site to go back to after a language change (never another site: ``//host`` or ``/\\``)."""
    if not value or not value.startswith("/") or value.startswith(("//", "/\\")) or any(
            ord(c) < 32 for c in value):
        return "/"
    return value


def script_strings(*scripts: str) -> Markup:
    """``<script type="application/json" id="i18n">``: the strings the named ``static/`` scripts use, in the
    page's language, for ``PicpeakHttp.t`` / ``PicpeakHttp.nt`` (static/http.js). Data, not code: the pages'
    content security policy runs no inline script, and ``<``, ``>`` and ``&`` are escaped so that no string can
    close the element."""
    data = json.dumps(i18n.script_messages(i18n.current_locale(), tuple(sorted(scripts))), ensure_ascii=False,
                      separators=(",", ":"))
    data = data.replace("<", "\\u003c").replace(">", "\\u003e").replace("&", "\\u0026")
    return Markup(f'<script type="application/json" id="i18n">{data}</script>')
