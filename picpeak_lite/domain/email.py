"""Email: which messages are sent, to whom, when, in which language; every trigger lives here.

* the gallery shared with the client: the "email to client" button on the gallery page (``queue_share``);
* expiry reminders (``email_reminder_days`` before) and "expired", to the client and the photographer, and the
  digest of new guest uploads and photos waiting for approval (at most one per gallery per
  ``email_digest_minutes``): ``queue_due``, called by the scheduler task (``events/email.py``);
* a guest's favourites to the photographer: the "send my selection" action (``queue_favourites``);
* a test message: the settings page's button (``queue_test``); the CLI's ``email test`` sends one directly.

No spam vector: a message goes only to an address the photographer entered, the gallery's ``customer_email`` or
the photographer's ``contact_email`` setting, and never to one taken from a request; nothing a guest types
reaches a header (names go into bodies, escaped in HTML); every header value is checked for line breaks; the
sender sends at most ``email_per_minute``. The password of a gallery is never in a message.

Each message is rendered once, when it is queued, inside ``i18n.use_locale`` of its recipient (the client: the
gallery's ``language`` when it has one, else the install's default; the photographer: the install's default),
then stored whole with its Message-ID (``make_message``), so every retry sends the same bytes. The templates are
``templates/email/<kind>.subject.txt``, ``.txt`` and ``.html``; the photographer may replace each on the
settings page (stored in ``app_settings`` as ``email_template.<kind>.<part>``) and they are rendered in Jinja's
sandbox, so an edited template cannot reach into Python.

Every message wears the studio's brand (issue 33, ``domain/brand.py`` ``email_context``): its name is the From
display name, the HTML part's header (or its logo, when ``public_url`` makes the logo reachable) and the text
part's signature line; links take the accent colour and the templates' button its readable text colour. The
templates see it as ``brand``. With white label on, no message says our name anywhere (subject, sender, body,
footer, the inline image's Content-ID), because the client is the studio's, not ours.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import json
import logging
import re
import secrets
from collections.abc import Mapping
from dataclasses import dataclass
from email.headerregistry import Address
from email.message import EmailMessage
from email.policy import SMTP
from email.utils import format_datetime, make_msgid
from typing import Any
from urllib.parse import quote

import jinja2
from jinja2.sandbox import SandboxedEnvironment
from markupsafe import escape

from picpeak_lite import i18n
from picpeak_lite.config import Settings
from picpeak_lite.domain import admin_settings
from picpeak_lite.domain import brand as brand_mod
from picpeak_lite.errors import AppError, BadRequest, Conflict

# The default templates ship with the pages (the catalogs extract their strings like any template's). The
# resources module is the one place that knows where the templates folder is.
from picpeak_lite.resources import TEMPLATES_DIR
from picpeak_lite.store.db import Connection
from picpeak_lite.store.queries import email as email_q
from picpeak_lite.store.queries import settings as settings_q

logger = logging.getLogger(__name__)

# The messages, in the settings page's order.
KINDS = ("gallery_shared", "expiry_reminder", "gallery_expired", "favourites_selection", "guest_digest", "test")


def kind_title(kind: str) -> str:
    """What a message is, for the settings page (translated when called)."""
    titles = {
        "gallery_shared": i18n._("The gallery shared with the client"),
        "expiry_reminder": i18n._("Expiry reminder (to the client and to you)"),
        "gallery_expired": i18n._("Gallery expired (to the client and to you)"),
        "favourites_selection": i18n._("A guest's favourites (to you)"),
        "guest_digest": i18n._("New guest uploads and photos awaiting approval (to you)"),
        "test": i18n._("Test message"),
    }
    return titles[kind]


def page_data(conn: Connection, settings: Settings) -> dict[str, Any]:
    """The settings page's email section: whether email is set up, the outbox's counts and newest messages (their
    failures with the server's reason), and which templates the photographer replaced."""
    stored = stored_templates(conn)
    return {
        "enabled": enabled(settings), "host": settings.smtp_host, "security": settings.smtp_security,
        "sender": settings.email_from, "counts": email_q.counts(conn), "messages": email_q.list_messages(conn),
        "kinds": [{"kind": k, "title": kind_title(k), "customised": any((k, p) in stored for p in PARTS)}
                  for k in KINDS],
        "photographer": admin_settings.contact(conn).get("email", ""),
    }
PARTS = ("subject", "text", "html")
_FILES = {"subject": "{kind}.subject.txt", "text": "{kind}.txt", "html": "{kind}.html"}
TEMPLATE_KEY = "email_template.{kind}.{part}"
MAX_TEMPLATE_CHARS = 20_000
MAX_SUBJECT_CHARS = 200
# An old gallery that expired long before email was set up is not announced.
EXPIRED_LOOKBACK = 2 * 86400.0
# A second click on "email to client" within this window is the same message.
SHARE_WINDOW = 60.0
# The digest looks for guest uploads this far back (the cut per gallery is its last digest).
DIGEST_LOOKBACK = 7 * 86400.0
FAVOURITES_LISTED = 50
_ADDRESS = re.compile(r"[^@\s<>,;\"]+@[^@\s<>,;\"]+\.[^@\s<>,;\"]+")


class NotConfigured(Conflict):
    pass


class HeaderRefused(BadRequest):
    """A header value with a line break (or an address that is not one): never put on a message."""


def enabled(settings: Settings) -> bool:
    return bool(settings.smtp_host and settings.email_from)


def require_enabled(settings: Settings) -> None:
    if not enabled(settings):
        raise NotConfigured(i18n._("Email is not set up: set smtp_host and email_from in picpeak.toml."))


def check_header(value: str) -> str:
    """``value`` as it may go into a header: a line break (CR, LF, or any other control character) is refused,
    never stripped, so that nothing can smuggle in a header of its own."""
    if any(ord(c) < 32 or ord(c) == 127 for c in value):
        raise HeaderRefused(i18n._("An email's name, subject or address may not contain line breaks."))
    return value


def check_address(value: str) -> str:
    check_header(value)
    if not _ADDRESS.fullmatch(value) or len(value) > 254:
        raise HeaderRefused(i18n._("%(address)s is not an email address.") % {"address": value})
    return value


# --- templates ------------------------------------------------------------------------------------------------

def _environment(autoescape: bool) -> SandboxedEnvironment:
    env = SandboxedEnvironment(
        autoescape=autoescape, extensions=["jinja2.ext.i18n"], undefined=jinja2.ChainableUndefined,
        keep_trailing_newline=True,
    )
    env.install_gettext_callables(i18n.gettext, i18n.ngettext, newstyle=True)  # type: ignore[attr-defined]
    return env


_TEXT_ENV = _environment(False)
_HTML_ENV = _environment(True)


def default_template(kind: str, part: str) -> str:
    return (TEMPLATES_DIR / "email" / _FILES[part].format(kind=kind)).read_text(encoding="utf-8")


def stored_templates(conn: Connection) -> dict[tuple[str, str], str]:
    """The photographer's replacements, by (kind, part)."""
    out: dict[tuple[str, str], str] = {}
    for key, raw in settings_q.get_all(conn).items():
        if key.startswith("email_template."):
            _, kind, part = [*key.split("."), "", ""][:3]
            if kind in KINDS and part in PARTS:
                try:
                    value = json.loads(raw)
                except ValueError:
                    continue
                if isinstance(value, str):
                    out[(kind, part)] = value
    return out


def templates_for(conn: Connection, kind: str) -> dict[str, str]:
    stored = stored_templates(conn)
    return {part: stored.get((kind, part), default_template(kind, part)) for part in PARTS}


def check_template(part: str, source: str) -> str | None:
    """A sentence when the template cannot be used (too long, not valid Jinja), else None."""
    if len(source) > MAX_TEMPLATE_CHARS:
        return i18n._("A template may be at most %(num)d characters.") % {"num": MAX_TEMPLATE_CHARS}
    try:
        (_HTML_ENV if part == "html" else _TEXT_ENV).from_string(source)
    except jinja2.TemplateSyntaxError as error:
        return i18n._("Line %(line)d: %(error)s") % {"line": error.lineno, "error": error.message or ""}
    return None


def save_templates(conn: Connection, kind: str, sources: Mapping[str, str]) -> None:
    """Store the replacements; a part equal to the default is stored as no replacement."""
    for part in PARTS:
        key = TEMPLATE_KEY.format(kind=kind, part=part)
        source = sources.get(part, "").replace("\r\n", "\n")
        if not source.strip() or source == default_template(kind, part):
            settings_q.delete_keys(conn, [key])
        else:
            settings_q.set_many(conn, {key: json.dumps(source)})


def reset_templates(conn: Connection, kind: str) -> None:
    settings_q.delete_keys(conn, [TEMPLATE_KEY.format(kind=kind, part=part) for part in PARTS])


@dataclass(frozen=True)
class Rendered:
    subject: str
    text: str
    html: str

    @property
    def body(self) -> str:
        """The HTML part without its document wrapper, for the settings page's preview."""
        return self.html.partition(_CONTENT_START)[2].rpartition(_CONTENT_END)[0] or self.html


_CONTENT_START = "<!--content-->\n"
_CONTENT_END = "\n<!--/content-->"


def render(templates: Mapping[str, str], context: Mapping[str, Any], language: str,
           look: brand_mod.Brand | None = None, public_url: str = "") -> Rendered:
    """The three parts in ``language``, in the studio's ``look`` (the built-in one when None). A template that
    fails while rendering (a sandbox refusal, a bad filter) is a BadRequest with its reason: the settings page
    shows it, a queued message is not made."""
    try:
        with i18n.use_locale(language):
            branded = brand_mod.email_context(look or brand_mod.Brand(), public_url)
            context = {**context, "brand": branded}
            subject = _TEXT_ENV.from_string(templates["subject"]).render(context)
            text = _TEXT_ENV.from_string(templates["text"]).render(context)
            html = _HTML_ENV.from_string(templates["html"]).render(context)
    except jinja2.TemplateError as error:
        reason = i18n._("The email template cannot be rendered: %(error)s") % {"error": str(error)}
        raise BadRequest(reason) from None
    subject = " ".join(subject.split())[:MAX_SUBJECT_CHARS]
    text = _tidy(text)
    if branded["footer"]:
        text += f"\n-- \n{branded['footer']}\n"
    return Rendered(subject, text, _html_document(html, language, branded))


def _html_document(body: str, language: str, branded: Mapping[str, Any]) -> str:
    """The HTML part around a template's output: the studio's name or logo on top, its footer below, its font
    and accent. Inline styles (and one small ``<style>`` for links), since mail clients load no stylesheet; every
    value is escaped (a studio name is the photographer's text)."""
    accent, font, name = escape(branded["accent"]), escape(branded["font_family"]), escape(branded["site_name"])
    if branded["logo_url"]:
        top = (f'<img src="{escape(branded["logo_url"])}" alt="{name}" '
               'style="max-height:64px;max-width:240px;border:0">')
    else:
        top = f'<span style="font-size:20px;font-weight:600;color:#1c1c1e">{name}</span>' if name else ""
    header = (f'<div style="padding:0 0 12px;margin:0 0 20px;border-bottom:3px solid {accent}">{top}</div>\n'
              if top else "")
    footer = (f'\n<p style="margin:28px 0 0;padding-top:12px;border-top:1px solid #ddd;color:#666;font-size:12px">'
              f'{escape(branded["footer"])}</p>' if branded["footer"] else "")
    return (f'<!doctype html>\n<html lang="{language}"><head><meta charset="utf-8">'
            f'<style>a{{color:{accent}}}</style></head>'
            f'<body style="margin:0;padding:24px;font-family:{font};color:#1c1c1e">\n'
            f'<div style="max-width:600px;margin:0 auto">\n{header}{_CONTENT_START}{body}{_CONTENT_END}{footer}\n'
            f'</div>\n</body></html>\n')


def _tidy(text: str) -> str:
    """Template whitespace aside: at most one blank line in a row, no blank lines at either end."""
    return re.sub(r"\n{3,}", "\n\n", "\n".join(line.rstrip() for line in text.splitlines())).strip() + "\n"


# --- the message ------------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Recipient:
    address: str
    name: str
    language: str
    role: str  # 'client' or 'photographer'


def make_message(settings: Settings, recipient: Recipient, rendered: Rendered, *, now: float,
                 inline_png: bytes | None = None, inline_cid: str | None = None,
                 sender_name: str = "") -> tuple[str, bytes]:
    """The whole message (multipart/alternative: text, then HTML with the QR code as a related inline image) and
    its Message-ID, made here once: every retry sends these bytes. ``sender_name``: the From display name (the
    studio's; none under white label without a studio name)."""
    sender = check_address(settings.email_from)
    sender_name = check_header(sender_name)
    address = check_address(recipient.address)
    name = check_header(recipient.name)
    subject = check_header(rendered.subject)
    domain = sender.rpartition("@")[2]
    message_id = make_msgid(idstring=secrets.token_hex(4), domain=domain)
    message = EmailMessage(policy=SMTP)
    message["From"] = Address(display_name=sender_name, addr_spec=sender) if sender_name else sender
    message["To"] = Address(display_name=name, addr_spec=address) if name else address
    message["Subject"] = subject
    message["Date"] = format_datetime(dt.datetime.fromtimestamp(now, dt.UTC))
    message["Message-ID"] = message_id
    message["Auto-Submitted"] = "auto-generated"
    message["Content-Language"] = recipient.language
    message.set_content(rendered.text)
    message.add_alternative(rendered.html, subtype="html")
    if inline_png is not None and inline_cid is not None:
        for part in message.iter_parts():
            if part.get_content_type() == "text/html":
                part.add_related(inline_png, "image", "png", cid=inline_cid, filename="upload-qr.png")
    return message_id, message.as_bytes()


def _queue(conn: Connection, settings: Settings, kind: str, recipient: Recipient, context: Mapping[str, Any], *,
           dedup_key: str, gallery_id: int | None, now: float, inline_png: bytes | None = None,
           inline_cid: str | None = None) -> int | None:
    if email_q.is_queued(conn, dedup_key):
        return None
    look = brand_mod.load(conn, settings)
    rendered = render(templates_for(conn, kind), context, recipient.language, look, settings.public_url or "")
    message_id, data = make_message(settings, recipient, rendered, now=now, inline_png=inline_png,
                                    inline_cid=inline_cid, sender_name=look.site_name)
    return email_q.enqueue(conn, message_id=message_id, dedup_key=dedup_key, kind=kind, gallery_id=gallery_id,
                           recipient=recipient.address, subject=rendered.subject, message=data, now=now)


def client_of(gallery: Mapping[str, Any], default_language: str) -> Recipient | None:
    """The gallery's client, as the photographer entered them; None without an address. Their language is the
    gallery's, else the install's ``default_language``."""
    address = (gallery.get("customer_email") or "").strip()
    if not address:
        return None
    language = gallery.get("language") or default_language
    return Recipient(address, (gallery.get("customer_name") or "").strip(), language, "client")


def photographer(conn: Connection, default_language: str) -> Recipient | None:
    """The photographer: the contact email of the settings page; None when it is not set."""
    contact = admin_settings.contact(conn)
    address = contact.get("email")
    if not address:
        return None
    return Recipient(address, contact.get("name", ""), default_language, "photographer")


def _signature(conn: Connection) -> str:
    return admin_settings.contact(conn).get("name", "")


def _date(timestamp: float | None) -> str:
    if timestamp is None:
        return ""
    return dt.datetime.fromtimestamp(timestamp, dt.UTC).date().isoformat()


def _gallery_context(conn: Connection, gallery: Mapping[str, Any], base_url: str, now: float) -> dict[str, Any]:
    base = base_url.rstrip("/")
    expires_at = gallery.get("expires_at")
    days_left = max(1, int(-(-(expires_at - now) // 86400))) if expires_at and expires_at > now else 0
    return {
        "gallery_name": gallery["name"], "customer_name": gallery.get("customer_name") or "",
        "customer_email": gallery.get("customer_email") or "", "gallery_url": f"{base}/g/{gallery['slug']}",
        "admin_url": f"{base}/admin/galleries/{gallery['id']}", "expires_on": _date(expires_at),
        "days_left": days_left, "signature": _signature(conn), "to_photographer": False,
    }


def sample_context(kind: str, settings: Settings, base_url: str) -> dict[str, Any]:
    """What a preview on the settings page renders with."""
    base = base_url.rstrip("/")
    return {
        "gallery_name": "Anna & Ben", "customer_name": "Anna Example", "customer_email": "anna@example.com",
        "gallery_url": f"{base}/g/anna-ben", "admin_url": f"{base}/admin/galleries/1", "expires_on": "2030-06-30",
        "days_left": 3, "signature": "Studio Example", "to_photographer": False, "upload_url":
        f"{base}/g/anna-ben/upload", "qr_src": "", "password_protected": True, "guest_name": "Aunt Mary",
        "count": 3, "file_names": ["DSC_0001.jpg", "DSC_0002.jpg", "DSC_0003.jpg"], "more": 0,
        "export_url": f"{base}/admin/galleries/1/favourites.csv", "new_guest_photos": 12, "awaiting_approval": 4,
        "smtp_host": settings.smtp_host or "smtp.example.com",
    }


def preview(templates: Mapping[str, str], kind: str, settings: Settings, base_url: str, language: str,
            look: brand_mod.Brand | None = None) -> Rendered:
    return render(templates, sample_context(kind, settings, base_url), language, look, settings.public_url or "")


# --- the triggers -----------------------------------------------------------------------------------------------

def queue_share(conn: Connection, settings: Settings, gallery: Mapping[str, Any], *, base_url: str, now: float,
                upload_qr_png: bytes | None) -> int:
    """The gallery shared with its client: the link, the expiry, and (when guests may upload) the upload link with
    its QR code inline. Never the password: only that there is one. Returns the row id (a second click within
    ``SHARE_WINDOW`` is the same message)."""
    require_enabled(settings)
    recipient = client_of(gallery, settings.default_language)
    if recipient is None:
        raise BadRequest(i18n._("Enter the client's email address on the gallery first."))
    if gallery.get("is_draft"):
        raise Conflict(i18n._("Publish the gallery before you send it to the client."))
    context = _gallery_context(conn, gallery, base_url, now)
    cid = None
    if gallery.get("allow_guest_uploads"):
        context["upload_url"] = context["gallery_url"] + "/upload"
        if upload_qr_png is not None:
            # The sender's domain, not ours: under white label nothing in the message may name us.
            cid = make_msgid(idstring="qr", domain=settings.email_from.rpartition("@")[2] or "localhost")
            context["qr_src"] = "cid:" + cid[1:-1]
    context["password_protected"] = bool(gallery.get("password_hash"))
    dedup = f"share:{gallery['id']}:{recipient.address}:{int(now // SHARE_WINDOW)}"
    row = _queue(conn, settings, "gallery_shared", recipient, context, dedup_key=dedup, gallery_id=gallery["id"],
                 now=now, inline_png=upload_qr_png if cid else None, inline_cid=cid)
    return row if row is not None else 0


def queue_favourites(conn: Connection, settings: Settings, gallery: Mapping[str, Any], guest_session_id: int, *,
                     base_url: str, now: float) -> bool:
    """A guest's favourites to the photographer (only ever the photographer's own address). The same selection
    sent again is the same message. Returns whether a new message was queued."""
    require_enabled(settings)
    recipient = photographer(conn, settings.default_language)
    if recipient is None:
        raise NotConfigured(i18n._("The photographer has not set up an email address."))
    names, guest_name = email_q.session_favourites(conn, guest_session_id, gallery["id"])
    if not names:
        raise BadRequest(i18n._("Choose some favourites first."))
    context = _gallery_context(conn, gallery, base_url, now)
    # The proofing export (domain/proofing.py) of this guest's name: the photographer's own, behind the login.
    export = f"{context['admin_url']}/favourites.csv" + (f"?guest={quote(guest_name)}" if guest_name else "")
    context.update(guest_name=guest_name, count=len(names), file_names=names[:FAVOURITES_LISTED],
                   more=max(0, len(names) - FAVOURITES_LISTED), export_url=export)
    digest = hashlib.sha256("\n".join(names).encode()).hexdigest()[:16]
    dedup = f"favourites:{gallery['id']}:{guest_session_id}:{digest}"
    return _queue(conn, settings, "favourites_selection", recipient, context, dedup_key=dedup,
                  gallery_id=gallery["id"], now=now) is not None


def queue_test(conn: Connection, settings: Settings, address: str, *, now: float) -> int:
    """The settings page's test message, to the address the photographer typed there."""
    require_enabled(settings)
    recipient = Recipient(check_address(address.strip()), "", settings.default_language, "photographer")
    row = _queue(conn, settings, "test", recipient, {"smtp_host": settings.smtp_host},
                 dedup_key=f"test:{secrets.token_hex(8)}", gallery_id=None, now=now)
    assert row is not None
    return row


def test_message(settings: Settings, address: str, *, now: float) -> tuple[str, bytes]:
    """The CLI's test message (not queued): its Message-ID and bytes."""
    require_enabled(settings)
    recipient = Recipient(check_address(address.strip()), "", settings.default_language, "photographer")
    templates = {part: default_template("test", part) for part in PARTS}
    rendered = render(templates, {"smtp_host": settings.smtp_host}, recipient.language)
    return make_message(settings, recipient, rendered, now=now)


def queue_due(conn: Connection, settings: Settings, *, base_url: str, now: float) -> int:
    """The scheduler's pass: expiry reminders, "expired" notes and guest-upload digests that are due and not
    queued yet (each one's dedup key makes a second pass a no-op). Returns how many messages were queued."""
    if not enabled(settings):
        return 0
    queued = 0
    owner = photographer(conn, settings.default_language)
    reminder_until = now + settings.email_reminder_days * 86400.0
    for kind, rows in (("expiry_reminder", email_q.galleries_expiring(conn, now, reminder_until)),
                       ("gallery_expired", email_q.galleries_expired(conn, now - EXPIRED_LOOKBACK, now))):
        for gallery in rows:
            context = _gallery_context(conn, gallery, base_url, now)
            for recipient in (client_of(gallery, settings.default_language), owner):
                if recipient is None:
                    continue
                dedup = f"{kind}:{gallery['id']}:{gallery['expires_at']!r}:{recipient.role}"
                queued += _queue_timed(conn, settings, kind, recipient, {**context, "to_photographer":
                                       recipient.role == "photographer"}, dedup_key=dedup,
                                       gallery_id=gallery["id"], now=now)
    if owner is not None:
        interval = settings.email_digest_minutes * 60.0
        for gallery in email_q.guest_activity(conn, now - DIGEST_LOOKBACK):
            last = email_q.last_digest_at(conn, gallery["id"])
            if last is not None and now - last < interval:
                continue  # at most one digest per gallery per interval
            since = last if last is not None else now - DIGEST_LOOKBACK
            new, waiting = email_q.new_guest_photos(conn, gallery["id"], since)
            if not new:
                continue
            context = {**_gallery_context(conn, gallery, base_url, now), "new_guest_photos": new,
                       "awaiting_approval": waiting, "to_photographer": True}
            dedup = f"guest_digest:{gallery['id']}:{now!r}"
            queued += _queue_timed(conn, settings, "guest_digest", owner, context, dedup_key=dedup,
                                   gallery_id=gallery["id"], now=now)
    return queued


def _queue_timed(conn: Connection, settings: Settings, kind: str, recipient: Recipient, context: Mapping[str, Any],
                 *, dedup_key: str, gallery_id: int, now: float) -> int:
    """One timed message; one that cannot be made (an address with a line break, a template that no longer
    renders) is logged and skipped, so it never holds up the others. Returns 1 when a message was queued."""
    try:
        return int(_queue(conn, settings, kind, recipient, context, dedup_key=dedup_key, gallery_id=gallery_id,
                          now=now) is not None)
    except AppError as error:
        logger.warning("email: %s for gallery %d to %s not queued: %s", kind, gallery_id, recipient.address,
                       error.message)
        return 0
