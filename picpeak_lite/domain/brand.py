"""A studio's brand: its name, logo, accent colours, fonts, themes, custom CSS and white label.

Guests should see the photographer's studio, not us. Everything here is the photographer's choice, kept in
``app_settings`` under one key (``brand``, a JSON object) and the logo as a file in ``data/branding``. What the
pages do with it is said once: :func:`stylesheet` writes the CSS custom properties (colours, fonts) that the
built-in themes (``static/app.css``) define, so a theme and a brand override the same variables; the custom CSS
is served as a stylesheet of its own from our origin (never inline: the CSP allows no inline style), after the
checks in :func:`check_css`; :func:`page_context` and :func:`email_context` are the one answer to "what name,
logo, colours and footer does a guest see", for pages and for emails alike.

Sync and free of trio and quart: views read it through ``db.read(load, settings)``.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import re
from collections.abc import Mapping
from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import Any

from picpeak_lite.config import Settings
from picpeak_lite.i18n import _
from picpeak_lite.store.db import Connection
from picpeak_lite.store.queries import settings as settings_q

SETTING_KEY = "brand"
LOGO_FILE = "studio-logo.png"
LOGO_MAX_BYTES = 5 * 1024 * 1024
LOGO_MAX_SIDE = 800  # the re-encoded logo's long edge: enough for a 2x screen at 400 px, the largest we show
CSS_MAX_BYTES = 20_000
OUR_NAME = "PicPeak"  # what a page says when the photographer has not given a studio name (and no white label)

THEMES = ("auto", "light", "dark")  # auto: the visitor's system setting (prefers-color-scheme)
COVER_LAYOUTS = ("full", "split", "minimal")
# The built-in themes' colours (static/app.css): the contrast of an accent is judged against these.
THEME_COLOURS = {"light": {"background": "#fafaf8", "text": "#1c1c1e"},
                 "dark": {"background": "#121214", "text": "#ececef"}}
DEFAULT_ACCENT = {"light": "#2f6f5e", "dark": "#6fc2a8"}
AA_TEXT = 4.5  # WCAG 2 AA for normal text: links in the accent colour are text on the background

COLOUR = re.compile(r"#[0-9a-f]{6}")


@dataclass(frozen=True)
class Font:
    family: str  # the CSS font-family stack
    files: tuple[tuple[str, int], ...] = ()  # (file under static/fonts, weight) for @font-face


# Self-hosted only (static/fonts, OFL 1.1, see its LICENSE.txt): no page asks a font CDN for anything.
FONTS: dict[str, Font] = {
    "system": Font('system-ui, -apple-system, "Segoe UI", Roboto, sans-serif'),
    "inter": Font('"Inter", system-ui, sans-serif', (("inter-regular.woff2", 400), ("inter-semibold.woff2", 600))),
    "garamond": Font('"EB Garamond", Georgia, "Times New Roman", serif',
                     (("ebgaramond-regular.woff2", 400), ("ebgaramond-bold.woff2", 700))),
}


def font_labels() -> dict[str, str]:
    """The fonts as the settings page names them (translated at render time)."""
    return {"system": _("The visitor's system font"), "inter": _("Inter (modern sans-serif)"),
            "garamond": _("EB Garamond (classic serif)")}


def theme_labels() -> dict[str, str]:
    return {"auto": _("Follow the visitor's device (light or dark)"), "light": _("Light"), "dark": _("Dark")}


def layout_labels() -> dict[str, str]:
    return {"full": _("Full-bleed cover photo"), "split": _("Split: photo beside the title"),
            "minimal": _("Minimal: title only, no cover photo")}


@dataclass(frozen=True)
class Brand:
    studio_name: str = ""
    accent: str = ""  # the accent on light pages, "#rrggbb"; "" is the built-in one
    accent_dark: str = ""  # the accent on dark pages
    font_body: str = "system"
    font_heading: str = "system"
    theme: str = "auto"  # the install's default theme; a gallery may choose its own
    cover_layout: str = "full"  # the install's default cover layout; a gallery may choose its own
    white_label: bool = False  # no "PicPeak" anywhere a guest looks
    custom_css: str = ""
    logo_version: str = ""  # set by load() from the logo file: "" means no logo

    def accent_of(self, theme: str) -> str:
        return (self.accent_dark if theme == "dark" else self.accent) or DEFAULT_ACCENT[theme]

    @property
    def site_name(self) -> str:
        """What titles and footers call the site: the studio, else our name, else (white label) nothing."""
        return self.studio_name or ("" if self.white_label else OUR_NAME)

    @property
    def version(self) -> str:
        """Changes whenever anything a stylesheet or logo URL depends on changes (their ``?v=`` cache key)."""
        return hashlib.sha256(json.dumps(asdict(self), sort_keys=True).encode()).hexdigest()[:12]

    def form(self) -> dict[str, Any]:
        return {f.name: getattr(self, f.name) for f in fields(self) if f.name != "logo_version"}


class Invalid(ValueError):
    """A brand field's value cannot be used; the message is one sentence for the photographer."""


def logo_path(settings: Settings) -> Path:
    return settings.data_path / "branding" / LOGO_FILE


def load(conn: Connection, settings: Settings) -> Brand:
    """The brand in force. A stored field that no longer passes its check falls back to its default rather than
    breaking every guest page."""
    raw = settings_q.get_all(conn).get(SETTING_KEY)
    stored: dict[str, Any] = {}
    with contextlib.suppress(ValueError, TypeError):
        value = json.loads(raw) if raw else {}
        stored = value if isinstance(value, dict) else {}
    values: dict[str, Any] = {}
    for name, parse in PARSERS.items():
        if name in stored:
            with contextlib.suppress(Invalid, TypeError, ValueError):
                values[name] = parse(stored[name])
    try:
        stat = logo_path(settings).stat()
        values["logo_version"] = f"{stat.st_size:x}{stat.st_mtime_ns:x}"
    except OSError:
        values["logo_version"] = ""
    return Brand(**values)


def save(conn: Connection, brand: Brand) -> None:
    settings_q.set_many(conn, {SETTING_KEY: json.dumps(brand.form(), sort_keys=True)})


def parse_form(form: Mapping[str, Any]) -> tuple[Brand, dict[str, str], dict[str, Any]]:
    """Validate the settings page's brand form. Returns (brand, per-field errors, the values as typed, to show
    again next to their errors). An unchecked box is False."""
    values: dict[str, Any] = {}
    typed: dict[str, Any] = {}
    errors: dict[str, str] = {}
    for name, parse in PARSERS.items():
        raw = form.get(name)
        if name == "white_label":
            raw = raw is not None and str(raw).lower() in ("1", "on", "true", "yes")
        typed[name] = raw if raw is not None else ""
        try:
            values[name] = parse(raw if raw is not None else "")
        except Invalid as error:
            errors[name] = str(error)
    brand = Brand(**values) if not errors else Brand()
    return brand, errors, typed


def _studio_name(value: Any) -> str:
    text = " ".join(str(value).split())
    if len(text) > 100:
        raise Invalid(_("The studio name may be at most 100 characters."))
    return text


def parse_colour(value: Any) -> str:
    """``#rrggbb`` (any case; stored lower case), or "" for the built-in colour."""
    text = str(value).strip().lower()
    if text and not COLOUR.fullmatch(text):
        raise Invalid(_("A colour like #2f6f5e (a hash and six hexadecimal digits), or empty for the built-in one."))
    return text


def _choice(choices: tuple[str, ...] | dict[str, Any]) -> Any:
    def parse(value: Any) -> str:
        text = str(value).strip()
        if text not in choices:
            raise Invalid(_("Choose one of: %(choices)s.") % {"choices": ", ".join(choices)})
        return text

    return parse


def _flag(value: Any) -> bool:
    if isinstance(value, bool):
        return value
    return str(value).lower() in ("1", "on", "true", "yes")


def check_css(value: Any) -> str:
    """The custom CSS if it can do nothing but style: refused (with the reason) when it could load anything
    from another site or run script, in any browser we know of, or is too large.

    The checks run on the text as a browser reads it: comments removed and CSS escapes (``\\69mport``) decoded,
    so that nothing can be hidden from them. What they refuse: ``@import``; ``url()`` with anything but a path
    on this site (no scheme, no ``//``), and any other ``//`` (``image-set("https://...")``); ``expression(``
    (old Internet Explorer's script in CSS), ``behavior:`` and ``-moz-binding`` (script components);
    ``javascript:`` and ``vbscript:``; ``</style`` and ``<`` (the text must stay CSS if it is ever put in a page);
    control characters. The CSP (style-src and img-src 'self') would block most of these anyway: the check
    makes the answer a sentence on the settings page instead of a silently broken gallery.
    """
    text = str(value).replace("\r\n", "\n")
    if not text.strip():
        return ""
    if len(text.encode("utf-8")) > CSS_MAX_BYTES:
        raise Invalid(_("The custom CSS may be at most %(size)d bytes.") % {"size": CSS_MAX_BYTES})
    if re.search(r"[\x00-\x08\x0b\x0e-\x1f\x7f]", text):
        raise Invalid(_("The custom CSS contains control characters."))
    readable = _as_read(text)
    for pattern, message in _css_refusals():
        if re.search(pattern, readable):
            raise Invalid(message)
    for target in re.findall(r"url\(\s*(['\"]?)(.*?)\1\s*\)", readable, flags=re.S):
        address = target[1].strip()
        if re.match(r"[a-z][a-z0-9+.\-]*:", address) or address.startswith(("//", "\\")):
            raise Invalid(_("url() may only point to a path on this site (like /static/...), not to %(address)s.")
                          % {"address": address[:60]})
    if "//" in readable:
        raise Invalid(_("The custom CSS may not name another site (it contains “//”)."))
    return text


def _css_refusals() -> list[tuple[str, str]]:
    return [
        (r"@import", _("@import is not allowed in the custom CSS: put the rules themselves here.")),
        (r"expression\s*\(", _("expression() is not allowed in the custom CSS: it runs script.")),
        (r"javascript\s*:|vbscript\s*:", _("javascript: and vbscript: addresses are not allowed in the custom CSS.")),
        (r"behaviou?r\s*:|-moz-binding", _("behavior and -moz-binding are not allowed in the custom CSS: they "
                                            "load script.")),
        (r"<", _("The custom CSS may not contain “<” (such as </style>).")),
    ]


def _as_read(text: str) -> str:
    """The CSS as a browser tokenises it, lower case: escapes decoded, comments removed."""

    def unescape(match: re.Match[str]) -> str:
        digits = match.group(1)
        if digits:
            code = int(digits, 16)
            return chr(code) if 0 < code <= 0x10FFFF and not 0xD800 <= code <= 0xDFFF else "\ufffd"
        return match.group(2)

    decoded = re.sub(r"\\(?:([0-9a-fA-F]{1,6})[ \t\n\f]?|(.))", unescape, text, flags=re.S)
    without_comments = re.sub(r"/\*.*?(\*/|$)", " ", decoded, flags=re.S)  # a comment separates tokens
    return without_comments.lower()


PARSERS: dict[str, Any] = {
    "studio_name": _studio_name,
    "accent": parse_colour,
    "accent_dark": parse_colour,
    "font_body": _choice(FONTS),
    "font_heading": _choice(FONTS),
    "theme": _choice(THEMES),
    "cover_layout": _choice(COVER_LAYOUTS),
    "white_label": _flag,
    "custom_css": check_css,
}


# Contrast (WCAG 2.x relative luminance and contrast ratio).

def luminance(colour: str) -> float:
    def channel(value: int) -> float:
        c = value / 255
        return c / 12.92 if c <= 0.04045 else ((c + 0.055) / 1.055) ** 2.4

    r, g, b = (int(colour[i : i + 2], 16) for i in (1, 3, 5))
    return 0.2126 * channel(r) + 0.7152 * channel(g) + 0.0722 * channel(b)


def contrast(a: str, b: str) -> float:
    high, low = sorted((luminance(a), luminance(b)), reverse=True)
    return (high + 0.05) / (low + 0.05)


def text_on(background: str) -> str:
    """The readable text colour on ``background`` (an accent button): white or black, whichever contrasts
    more. One of the two always reaches at least 4.58:1."""
    return "#ffffff" if contrast(background, "#ffffff") >= contrast(background, "#000000") else "#000000"


@dataclass(frozen=True)
class ContrastCheck:
    theme: str
    accent: str
    on_background: float  # links and focus rings: accent text on the theme's background
    against_text: float  # the accent next to the theme's text colour
    button_text: str  # the text colour chosen for accent buttons
    on_button: float

    @property
    def fails(self) -> bool:
        return self.on_background < AA_TEXT


def contrast_checks(brand: Brand) -> list[ContrastCheck]:
    """The accent of each theme against that theme's background and text, for the settings page."""
    checks = []
    for theme, colours in THEME_COLOURS.items():
        accent = brand.accent_of(theme)
        button_text = text_on(accent)
        checks.append(ContrastCheck(theme, accent, round(contrast(accent, colours["background"]), 2),
                                    round(contrast(accent, colours["text"]), 2), button_text,
                                    round(contrast(accent, button_text), 2)))
    return checks


def stylesheet(brand: Brand, font_url: Any) -> str:
    """The brand's CSS custom properties and @font-face rules, with the same selectors as the built-in themes
    in static/app.css, served after it (``/brand/brand.css``), so it overrides the same variables and nothing
    else. ``font_url(file)`` gives the URL of a file under static/fonts."""
    lines = ["/* The studio's brand (admin settings). Generated: change it on the settings page. */"]
    used = {brand.font_body, brand.font_heading}
    for name in sorted(used):
        for file, weight in FONTS[name].files:
            family = FONTS[name].family.split(",")[0]
            lines.append(f"@font-face {{ font-family: {family}; src: url({font_url(file)}) format(\"woff2\"); "
                         f"font-weight: {weight}; font-style: normal; font-display: swap; }}")
    lines.append(f":root {{ --font-body: {FONTS[brand.font_body].family}; "
                 f"--font-heading: {FONTS[brand.font_heading].family}; }}")
    light, dark = brand.accent_of("light"), brand.accent_of("dark")
    light_vars = f"--accent: {light}; --accent-fg: {text_on(light)};"
    dark_vars = f"--accent: {dark}; --accent-fg: {text_on(dark)};"
    lines.append(f":root, :root.theme-light {{ {light_vars} }}")
    lines.append(f"@media (prefers-color-scheme: dark) {{ :root:not(.theme-light) {{ {dark_vars} }} }}")
    lines.append(f":root.theme-dark {{ {dark_vars} }}")
    return "\n".join(lines) + "\n"


def theme_of(brand: Brand, gallery: Mapping[str, Any] | None) -> str:
    """A gallery's theme: its own choice, else the install's default."""
    chosen = (gallery or {}).get("theme") or ""
    return chosen if chosen in THEMES else brand.theme


def layout_of(brand: Brand, gallery: Mapping[str, Any] | None) -> str:
    chosen = (gallery or {}).get("cover_layout") or ""
    return chosen if chosen in COVER_LAYOUTS else brand.cover_layout


def page_context(brand: Brand) -> dict[str, Any]:
    """What every page's template knows of the brand (installed as a context processor by the app)."""
    return {"brand": brand, "site_name": brand.site_name, "show_our_name": not brand.white_label}


def email_context_of(conn: Connection, settings: Settings) -> dict[str, Any]:
    """:func:`email_context` for the brand in force, with the server's public address: one call for a mailer,
    ``await db.read(brand.email_context_of, settings)``; render the message inside ``i18n.use_locale``."""
    return email_context(load(conn, settings), settings.public_url or "")


def email_context(brand: Brand, base_url: str) -> dict[str, Any]:
    """What an email needs to look like the studio's: its name for the sender and greeting, the logo as an
    absolute URL (or None), the accent with a readable text colour for a button, the footer line. With white
    label the footer does not mention us. Emails have no stylesheet: they take these as inline values."""
    accent = brand.accent_of("light")
    version = brand.logo_version
    return {
        "studio_name": brand.studio_name,
        "site_name": brand.site_name,
        # An email needs an absolute address: without public_url there is none to give.
        "logo_url": f"{base_url.rstrip('/')}/brand/logo.png?v={version}" if version and base_url else None,
        "accent": accent,
        "accent_fg": text_on(accent),
        "font_family": FONTS[brand.font_body].family,
        "footer": (brand.studio_name if brand.white_label
                   else _("Sent by %(studio)s with PicPeak") % {"studio": brand.studio_name} if brand.studio_name
                   else _("Sent with PicPeak")),
        "white_label": brand.white_label,
    }
