"""The one home of translation (and of Babel): which language a piece of text is rendered in, the calls that
translate it, and dates, numbers and sizes written the way that language writes them.

Every user-facing string in templates (``{{ _("...") }}``, ``{{ ngettext(...) }}``), in Python (``_()``,
``ngettext()`` from here), in the scripts (through the page's JSON dictionary, :func:`script_messages`) and in
emails goes through these functions, so that a page or a message is rendered in one language chosen once per
request or per recipient. The language in force is a context variable: a request sets it for its own task (trio
copies the context into the threads it starts), and code that renders for someone else (an email to a client)
wraps the rendering in :func:`use_locale`.

The catalogs are ``picpeak_lite/locales/<lang>/LC_MESSAGES/messages.po``, shipped in the wheel as they are and
compiled in memory on first use (no build step to forget; a few milliseconds per language). English is the
source language: its text is the msgid itself. ``messages.pot`` (the extracted template) is shipped too: it says
which strings the scripts use. ``bench/i18n_catalogs.py`` refreshes all of them from the source.
"""

from __future__ import annotations

import contextlib
import contextvars
import datetime as dt
import functools
import gettext as _gettext
import io
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

from babel import Locale, UnknownLocaleError, dates, numbers, units
from babel.core import negotiate_locale
from babel.messages.catalog import Catalog
from babel.messages.mofile import write_mo
from babel.messages.pofile import read_po
from babel.support import Translations

DEFAULT_LOCALE = "en"
#: Every language the pages are translated into, English (the source) first, with its name in itself for the
#: picker. A language is added here and as a catalog (docs/architecture.md, "Languages").
LANGUAGES: dict[str, str] = {
    "en": "English",
    "de": "Deutsch",
    "nl": "Nederlands",
    "pt": "Português",
    "ru": "Русский",
    "fr": "Français",
    "es": "Español",
    "it": "Italiano",
}
LOCALES_DIR = Path(__file__).parent / "locales"
DOMAIN = "messages"

_current: contextvars.ContextVar[str] = contextvars.ContextVar("picpeak_locale", default=DEFAULT_LOCALE)


def N_(message: str) -> str:
    """Marks a string for extraction where it is defined (a class attribute, a module constant) without
    translating it there: it is translated with :func:`gettext` where it is shown, in the reader's language."""
    return message


def catalog_path(locale: str) -> Path:
    return LOCALES_DIR / locale / "LC_MESSAGES" / f"{DOMAIN}.po"


@functools.cache
def _catalog(locale: str) -> Catalog | None:
    path = catalog_path(locale)
    if locale == DEFAULT_LOCALE or not path.is_file():
        return None
    with path.open("rb") as fp:
        return read_po(fp, locale=locale)


@functools.cache
def translations(locale: str) -> _gettext.NullTranslations:
    """The catalog for ``locale``, compiled in memory once. English (the source) and unknown codes read the
    msgids themselves."""
    catalog = _catalog(locale)
    if catalog is None:
        return _gettext.NullTranslations()
    buffer = io.BytesIO()
    write_mo(buffer, catalog, use_fuzzy=False)
    buffer.seek(0)
    return Translations(buffer, domain=DOMAIN)


@functools.cache
def _template() -> Catalog:
    with (LOCALES_DIR / f"{DOMAIN}.pot").open("rb") as fp:
        return read_po(fp)


def current_locale() -> str:
    return _current.get()


def set_locale(locale: str) -> None:
    """The language of the rest of this task (a request's own context): the web layer calls it once it knows."""
    _current.set(locale if locale in LANGUAGES else DEFAULT_LOCALE)


@contextlib.contextmanager
def use_locale(locale: str) -> Iterator[None]:
    """Render everything inside in ``locale``, then restore the language that was in force."""
    token = _current.set(locale if locale in LANGUAGES else DEFAULT_LOCALE)
    try:
        yield
    finally:
        _current.reset(token)


def gettext(message: str) -> str:
    return translations(current_locale()).gettext(message)


def ngettext(singular: str, plural: str, n: int) -> str:
    return translations(current_locale()).ngettext(singular, plural, n)


_ = gettext


# -- choosing the language ---------------------------------------------------------------------------------------

def supported(code: str | None) -> str | None:
    """``code`` if it is one of :data:`LANGUAGES` (after ``pt-BR`` -> ``pt``), else None."""
    if not code:
        return None
    code = code.strip().replace("_", "-").lower()
    if code in LANGUAGES:
        return code
    base = code.split("-", 1)[0]
    return base if base in LANGUAGES else None


def negotiate(accepted: Iterable[str]) -> str | None:
    """The first of the browser's languages (best first, as ``Accept-Language`` ranks them) that we speak, by
    Babel's negotiation (``de-AT`` -> ``de``)."""
    preferred = [code.replace("-", "_") for code in accepted if code and code != "*"]
    found = negotiate_locale(preferred, list(LANGUAGES), sep="_")
    if found is None:
        # Babel matches a region only to a catalog with that region or to the bare language it names first.
        for code in preferred:
            found = supported(code)
            if found:
                break
    return found


def choose(*, picked: str | None, gallery: str | None, accepted: Iterable[str], default: str) -> str:
    """The page's language: the visitor's own choice on the page (remembered in a cookie), else the language the
    photographer set for the gallery, else the browser's ``Accept-Language``, else the install's default."""
    return (supported(picked) or supported(gallery) or negotiate(accepted) or supported(default)
            or DEFAULT_LOCALE)


# -- the scripts' strings ----------------------------------------------------------------------------------------

#: Numbers enough to meet every plural category of our languages (CLDR's "many" of French, Spanish, Italian and
#: Portuguese is for millions).
_PLURAL_SAMPLES = (*range(0, 201), 1_000_000, 2_000_000)


def _form_index(locale: str, n: int) -> int:
    plural = getattr(translations(locale), "plural", None)
    return int(plural(n)) if plural is not None else (0 if n == 1 else 1)


def _plural_categories(locale: str) -> dict[str, int]:
    """For each CLDR plural category (what the browser's ``Intl.PluralRules`` answers) the index of the catalog's
    plural form, found by evaluating both rules over numbers that meet every category."""
    rule = Locale.parse(locale).plural_form
    mapping: dict[str, int] = {}
    for n in _PLURAL_SAMPLES:
        mapping.setdefault(rule(n), _form_index(locale, n))
    return mapping


@functools.cache
def script_messages(locale: str, scripts: tuple[str, ...]) -> dict[str, Any]:
    """What a page's scripts need in ``locale``: the translation of every message the catalog template says
    comes from one of ``scripts`` (``static/<name>``), a plural message as its list of forms (the catalog's
    order), and which form each of the browser's plural categories takes. Rendered as the page's
    ``<script type="application/json" id="i18n">`` and read by ``static/http.js``."""
    wanted = {f"static/{name}" for name in scripts}
    translation = translations(locale)
    samples: dict[int, int] = {}
    for n in _PLURAL_SAMPLES:
        samples.setdefault(_form_index(locale, n), n)
    strings: dict[str, Any] = {}
    for message in _template():
        if not message.id or not any(path in wanted for path, _line in message.locations):
            continue
        if isinstance(message.id, tuple | list):
            singular, plural = message.id[0], message.id[1]
            strings[singular] = [translation.ngettext(singular, plural, samples[index])
                                 for index in range(max(samples) + 1)]
        else:
            strings[message.id] = translation.gettext(message.id)
    return {"lang": locale, "plural": _plural_categories(locale), "strings": strings}


# -- dates, numbers and sizes ------------------------------------------------------------------------------------

#: The CLDR locale each language's dates and numbers follow: our English is British ("favourites", 20 June 2024).
_FORMATS = {"en": "en_GB"}


def _babel_locale() -> Locale:
    code = current_locale()
    try:
        return Locale.parse(_FORMATS.get(code, code))
    except (UnknownLocaleError, ValueError):
        return Locale.parse(DEFAULT_LOCALE)


def format_timestamp(value: float | None) -> str:
    """A moment (Unix seconds) as this language writes a date and time, in UTC, which the server keeps."""
    if value is None:
        return ""
    moment = dt.datetime.fromtimestamp(value, dt.UTC)
    locale = _babel_locale()
    day = dates.format_date(moment.date(), "medium", locale=locale)
    return f"{day}, {dates.format_time(moment, 'HH:mm', tzinfo=dt.UTC, locale=locale)} UTC"


def format_local_moment(moment: dt.datetime) -> str:
    """A moment with no time zone (a camera's clock) as this language writes a date and a time: '20 June 2024,
    14:03', '20. Juni 2024, 14:03'."""
    locale = _babel_locale()
    day = dates.format_date(moment.date(), "long", locale=locale)
    return f"{day}, {dates.format_time(moment.time(), 'HH:mm', locale=locale)}"


def format_date(value: str | dt.date | float | None, style: str = "long") -> str:
    """A day (ISO text, a date or Unix seconds) as this language writes it; text that is no date stays as is."""
    if value is None or value == "":
        return ""
    if isinstance(value, str):
        try:
            day = dt.date.fromisoformat(value)
        except ValueError:
            return value
    elif isinstance(value, int | float):
        day = dt.datetime.fromtimestamp(value, dt.UTC).date()
    else:
        day = value
    return dates.format_date(day, style, locale=_babel_locale())


def format_number(value: float | int | None) -> str:
    if value is None:
        return ""
    return numbers.format_decimal(value, locale=_babel_locale())


def format_size(size: float | int | None, *, base: int = 1024) -> str:
    """Bytes as this language writes them, in the largest unit that keeps the number below ``base`` (1024 for
    disk space, 1000 where the pages always said decimal megabytes), one decimal below 10, with CLDR's unit names
    ("12,5 MB", "12,5 МБ", "12,5 Mo")."""
    if size is None:
        return ""
    value = float(size)
    unit = "byte"
    for bigger in ("kilobyte", "megabyte", "gigabyte", "terabyte"):
        if abs(value) < base:
            break
        value /= base
        unit = bigger
    pattern = "#,##0" if unit == "byte" or abs(value) >= 10 else "#,##0.#"
    text = units.format_unit(value, f"digital-{unit}", "short", format=pattern, locale=_babel_locale())
    return text.replace(" ", "\u00a0")  # "468 kB" never breaks between the number and its unit
