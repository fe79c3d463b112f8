"""The one home of translation: which language a piece of text is rendered in, and the calls that translate it.

Every user-facing string in templates (``{{ _("...") }}``, ``{{ ngettext(...) }}``), in Python (``_()``,
``ngettext()`` from here) and in emails goes through these functions, so that a page or a message is rendered in
one language chosen once per request or per recipient. The language in force is a context variable: a request
sets it for its own task (trio copies the context into the threads it starts), and code that renders for someone
else (an email to a client) wraps the rendering in :func:`use_locale`.
"""

from __future__ import annotations

import contextlib
import contextvars
import gettext as _gettext
from collections.abc import Iterator

DEFAULT_LOCALE = "en"

_current: contextvars.ContextVar[str] = contextvars.ContextVar("picpeak_locale", default=DEFAULT_LOCALE)


def translations(locale: str) -> _gettext.NullTranslations:
    """The catalog for ``locale``. Until catalogs ship, every language reads the source (English) strings."""
    return _gettext.NullTranslations()


def current_locale() -> str:
    return _current.get()


@contextlib.contextmanager
def use_locale(locale: str) -> Iterator[None]:
    """Render everything inside in ``locale``, then restore the language that was in force."""
    token = _current.set(locale)
    try:
        yield
    finally:
        _current.reset(token)


def gettext(message: str) -> str:
    return translations(current_locale()).gettext(message)


def ngettext(singular: str, plural: str, n: int) -> str:
    return translations(current_locale()).ngettext(singular, plural, n)


_ = gettext
