"""Email (issue 32): the outbox against a real SMTP server process (aiosmtpd, tests/smtpserver.py) on 127.0.0.1,
with and without STARTTLS; a server that dies mid-message and comes back; the Message-ID that makes a retry no
second message; header injection; no third party reachable from a guest's request; the CLI's test command;
failures on the settings page; backoff and reminders on trio's autojump clock."""

from __future__ import annotations

import email
import email.policy
import itertools
import json
import math
import re
import socket
import ssl
import subprocess
import sys
from collections import defaultdict
from pathlib import Path
from typing import Any

import pytest
import trio

from picpeak_lite import i18n
from picpeak_lite.domain import email as email_domain
from picpeak_lite.events.email import CLAIM_SECONDS, EmailScheduler, EmailSender
from picpeak_lite.ops import bootstrap
from picpeak_lite.services import Services
from picpeak_lite.store.queries import email as email_q
from picpeak_lite.store.queries import galleries as gallery_q
from picpeak_lite.store.queries import outbox
from picpeak_lite.store.queries import settings as settings_q
from picpeak_lite.web.app import create_app

from .conftest import ADMIN_PASSWORD, AuthActions, make_settings, own_services, sql
from .factories import add_photo, gallery_row, published
from .harness import figures
from .smtpserver import SmtpServer, self_signed_certificate
from .test_guest_pages import guest_csrf

ROOT = Path(__file__).resolve().parent.parent
SENDER = "photos@studio.test"
PHOTOGRAPHER = "me@studio.test"
CLIENT = "anna@client.test"


def email_settings(port: int, security: str = "none", **extra: Any) -> dict[str, Any]:
    return {"smtp_host": "127.0.0.1", "smtp_port": port, "smtp_security": security, "email_from": SENDER,
            "email_per_minute": 1000, **extra}


def closed_port() -> int:
    """A port on 127.0.0.1 that nothing listens on (bound by the kernel's choice, then closed)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def set_contact(svc: Services, address: str = PHOTOGRAPHER) -> None:
    """The photographer's contact email, as the settings page stores it."""
    _write_now(svc, lambda conn: settings_q.set_many(conn, {"contact_email": json.dumps(address),
                                                           "contact_name": json.dumps("Studio")}))


def _write_now(svc: Services, fn: Any) -> Any:
    from picpeak_lite.store import db

    conn = db.connect(svc.settings.database)
    try:
        with db.transaction(conn):
            return fn(conn)
    finally:
        conn.close()


def client_gallery(svc: Services, name: str = "Anna & Ben", *, email_address: str = CLIENT, **fields: Any) -> int:
    def make(conn: Any) -> int:
        gallery_id = gallery_row(conn, name, now=1.0, **{k: v for k, v in fields.items() if k in ("expires_at",)})
        extra = {k: v for k, v in fields.items() if k != "expires_at"}
        gallery_q.update(conn, gallery_id, {"customer_email": email_address, "customer_name": "Anna", **extra}, 1.0)
        return gallery_id
    return _write_now(svc, make)


def gallery(svc: Services, gallery_id: int) -> dict[str, Any]:
    return _write_now(svc, lambda conn: gallery_q.get(conn, gallery_id))


def app_for(svc: Services) -> Any:
    """The real app over these services, with the admin account (its password known to AuthActions)."""
    bootstrap.ensure_admin(svc.settings, {"PICPEAK_ADMIN_PASSWORD": ADMIN_PASSWORD})
    return create_app(svc)


def share(svc: Services, gallery_id: int, **kwargs: Any) -> int:
    row = gallery(svc, gallery_id)
    return _write_now(svc, lambda conn: email_domain.queue_share(conn, svc.settings, row, **kwargs))


async def drain(sender: EmailSender) -> None:
    while await sender.deliver_due():
        pass


# --- delivery -----------------------------------------------------------------------------------------------------

async def test_server_dies_mid_message_every_message_arrives_once(tmp_path: Path, capsys: Any) -> None:
    """The server stores message 4 and dies before it answers (the worst moment: it arrived, the sender cannot
    know); messages 5-12 find no server; our own process 'dies' holding two claims. After the restart every
    queued message is in the mailbox exactly once by Message-ID, and no message arrived under a second
    Message-ID (which no receiver could recognise as a duplicate)."""
    server = SmtpServer(tmp_path / "mailbox").start(crash_at=4)
    try:
        with own_services(tmp_path, **email_settings(server.port)) as svc:
            now = [1_000_000.0]
            queued = 12
            for n in range(queued):
                _write_now(svc, lambda conn, n=n: email_domain.queue_test(conn, svc.settings, f"p{n}@client.test",
                                                                          now=now[0]))
            sender = EmailSender(svc.db, svc.settings, clock=lambda: now[0])
            await drain(sender)
            assert server.wait_ended() == 3, "the server died at message 4, as arranged"
            rows = sql(svc, "SELECT status, attempts, last_error FROM email_outbox ORDER BY id")
            assert [r["status"] for r in rows[:3]] == ["sent"] * 3
            assert all(r["status"] == "pending" and r["attempts"] == 1 for r in rows[3:])
            # The server hung up while we waited for its answer to DATA.
            assert any(word in rows[3]["last_error"] for word in ("SMTPServerDisconnected", "ConnectionReset")), rows[3]
            server.start()  # the same port again
            now[0] += 61
            # Our own process takes two due rows and dies before it records anything: their claims run out.
            lost_claims = _write_now(svc, lambda conn: email_q.claim_due(conn, now[0], 2, CLAIM_SECONDS))
            assert len(lost_claims) == 2
            for _ in range(10):
                await drain(EmailSender(svc.db, svc.settings, clock=lambda: now[0]))
                now[0] += 61
            rows = sql(svc, "SELECT message_id, recipient, subject, status, attempts FROM email_outbox")
    finally:
        server.stop()
    journal = server.journal()
    stored = {str(m["Message-ID"]): m for m in server.messages()}
    by_content: dict[tuple[str, ...], set[str]] = defaultdict(set)
    for entry in journal:
        by_content[(*entry["rcpt"],)].add(entry["message_id"])
    dup = sum(len(ids) - 1 for ids in by_content.values())
    lost = sum(1 for r in rows if r["message_id"] not in stored)
    sent = sum(1 for r in rows if r["status"] == "sent")
    retried = sum(r["attempts"] - 1 for r in rows)
    received_again = len(journal) - len({e["message_id"] for e in journal})
    figures(capsys, f"email: queued={queued} sent={sent} retried={retried} dup={dup} lost={lost} "
                    f"(the server received {len(journal)} times, {received_again} a message it had: dropped by "
                    f"Message-ID)")
    assert (sent, dup, lost) == (queued, 0, 0)
    assert len(stored) == queued, "one stored message per Message-ID"
    assert received_again >= 1, "message 4 reached the server twice: the retry came under the same Message-ID"
    assert retried >= queued - 3


async def test_starttls_with_a_certificate_made_here(tmp_path: Path) -> None:
    cert, key = self_signed_certificate(tmp_path)
    trust = ssl.create_default_context(cafile=str(cert))
    with SmtpServer(tmp_path / "mailbox", tls=(cert, key)) as server, \
            own_services(tmp_path, **email_settings(server.port, "starttls")) as svc:
        set_contact(svc)
        gallery_id = client_gallery(svc, allow_guest_uploads=1)
        share(svc, gallery_id, base_url="https://photos.test", now=10.0, upload_qr_png=b"\x89PNG fake")
        await drain(EmailSender(svc.db, svc.settings, clock=lambda: 10.0, tls=trust))
        [row] = sql(svc, "SELECT status, last_reply, last_error FROM email_outbox")
        assert row["status"] == "sent", row
        assert row["last_reply"].startswith("250 ")
        # Without trusting the certificate the same server is refused: the check is real.
        _write_now(svc, lambda conn: email_domain.queue_test(conn, svc.settings, CLIENT, now=10.0))
        await drain(EmailSender(svc.db, svc.settings, clock=lambda: 10.0))
        failed = sql(svc, "SELECT last_error FROM email_outbox WHERE status = 'pending'")
        assert failed and "TLS failed" in failed[0]["last_error"] and "CERTIFICATE" in failed[0]["last_error"]
    [entry] = server.journal()
    assert entry["tls"] is True and entry["rcpt"] == [CLIENT]
    [message] = server.messages()
    assert message.get_content_type() == "multipart/alternative"
    text = message.get_body(("plain",)).get_content()
    html_part = message.get_body(("html",))
    assert "https://photos.test/g/" in text and "/upload" in text
    assert html_part.get_content_type() == "text/html"
    related = [p for p in message.walk() if p.get_content_type() == "image/png"]
    assert len(related) == 1 and related[0]["Content-ID"].strip("<>") in html_part.get_content()


async def test_implicit_tls(tmp_path: Path) -> None:
    cert, key = self_signed_certificate(tmp_path)
    trust = ssl.create_default_context(cafile=str(cert))
    with SmtpServer(tmp_path / "mailbox", tls=(cert, key), implicit_tls=True) as server, \
            own_services(tmp_path, **email_settings(server.port, "tls")) as svc:
        _write_now(svc, lambda conn: email_domain.queue_test(conn, svc.settings, PHOTOGRAPHER, now=10.0))
        await drain(EmailSender(svc.db, svc.settings, clock=lambda: 10.0, tls=trust))
        [row] = sql(svc, "SELECT status, last_error FROM email_outbox")
        assert row["status"] == "sent", row
    assert [e["rcpt"] for e in server.journal()] == [[PHOTOGRAPHER]]


async def test_rate_limit_holds_messages_back_without_counting_attempts(tmp_path: Path) -> None:
    with SmtpServer(tmp_path / "mailbox") as server, \
            own_services(tmp_path, **email_settings(server.port, email_per_minute=2)) as svc:
        now = [5000.0]
        for n in range(5):
            _write_now(svc, lambda conn, n=n: email_domain.queue_test(conn, svc.settings, f"p{n}@client.test",
                                                                      now=now[0]))
        sender = EmailSender(svc.db, svc.settings, clock=lambda: now[0])
        sent_per_minute = []
        for _ in range(3):
            await drain(sender)
            sent_per_minute.append(len(server.journal()))
            due = await sender.next_due_at()
            assert due is None or due > now[0], "the sender sleeps until the window has room"
            now[0] += 61
        rows = sql(svc, "SELECT status, attempts FROM email_outbox")
    assert sent_per_minute == [2, 4, 5]
    assert all(r["status"] == "sent" and r["attempts"] == 1 for r in rows), "waiting is no failed attempt"


async def test_plain_smtp_share_never_carries_the_password(tmp_path: Path) -> None:
    with SmtpServer(tmp_path / "mailbox") as server, own_services(tmp_path, **email_settings(server.port)) as svc:
        gallery_id = client_gallery(svc)
        _write_now(svc, lambda conn: conn.execute("UPDATE galleries SET password_hash = 'x' WHERE id = ?",
                                                  (gallery_id,)))
        share(svc, gallery_id, base_url="http://h.test", now=10.0, upload_qr_png=None)
        await drain(EmailSender(svc.db, svc.settings, clock=lambda: 10.0))
    [message] = server.messages()
    text = message.get_body(("plain",)).get_content()
    assert "password" in text.lower() and "separately" in text  # that there is one, never which
    assert message["Message-ID"] and message["To"].addresses[0].addr_spec == CLIENT


# --- no spam vector ---------------------------------------------------------------------------------------------

async def test_header_injection_is_refused_or_defused(tmp_path: Path) -> None:
    with own_services(tmp_path, **email_settings(25)) as svc:
        # A client address with a line break never becomes a message.
        bad = client_gallery(svc, email_address="anna@client.test\r\nBcc: victim@evil.test")
        with pytest.raises(email_domain.HeaderRefused):
            share(svc, bad, base_url="http://h.test", now=1.0, upload_qr_png=None)
        # A name with a line break is refused; a name that looks like addresses stays one display name.
        recipient = email_domain.Recipient(CLIENT, "Eve\nBcc: victim@evil.test", "en", "client")
        rendered = email_domain.Rendered("Hi", "x\n", "<p>x</p>")
        with pytest.raises(email_domain.HeaderRefused):
            email_domain.make_message(svc.settings, recipient, rendered, now=1.0)
        tricky = email_domain.Recipient(CLIENT, 'Smith, John <victim@evil.test>, "x"', "en", "client")
        _, data = email_domain.make_message(svc.settings, tricky, rendered, now=1.0)
        parsed = email.message_from_bytes(data, policy=email.policy.default)
        assert [a.addr_spec for a in parsed["To"].addresses] == [CLIENT]
        # A gallery name with line breaks (stored by any path) ends up on one Subject line, no header of its own.
        named = client_gallery(svc, name="Party\r\nBcc: victim@evil.test")
        _write_now(svc, lambda conn: conn.execute("UPDATE galleries SET name = ? WHERE id = ?",
                                                  ("Party\r\nBcc: victim@evil.test", named)))
        share(svc, named, base_url="http://h.test", now=1.0, upload_qr_png=None)
        [row] = sql(svc, "SELECT message FROM email_outbox")
        parsed = email.message_from_bytes(row["message"], policy=email.policy.default)
        assert parsed["Bcc"] is None and "victim" not in str(parsed["To"])
        assert "Bcc: victim@evil.test" in parsed["Subject"]  # harmless text inside the one Subject header
        assert b"\r\nBcc:" not in row["message"].split(b"\r\n\r\n", 1)[0]


async def test_a_guest_cannot_make_the_server_mail_anyone_else(tmp_path: Path, guest: Any, admin: AuthActions,
                                                                services: Services) -> None:
    """'Send my selection' goes to the photographer's own address whatever the request says; without that
    address nothing is sent. The guest's name (typed by the guest) is in the body only."""
    g = await published(admin, name="G")
    photo = add_photo(services, g["id"], name="DSC_0001.jpg")
    slug = g["slug"]
    csrf = await guest_csrf(guest, slug)
    await guest.post(f"/api/g/{slug}/guest", json={"name": "victim@evil.test\r\nBcc: victim@evil.test"},
                     headers={"X-CSRF-Token": csrf})
    assert (await guest.put(f"/api/g/{slug}/favourites/{photo}", headers={"X-CSRF-Token": csrf})).status_code == 200
    send = f"/api/g/{slug}/favourites/send"
    body = {"to": "victim@evil.test", "email": "victim@evil.test", "recipient": "victim@evil.test"}
    # Email is not set up in this app: refused with a sentence, nothing queued.
    refused = await guest.post(send, json=body, headers={"X-CSRF-Token": csrf})
    assert refused.status_code == 409 and sql(services, "SELECT * FROM email_outbox") == []
    page = await (await guest.get(f"/g/{slug}?favourites=1")).get_data(as_text=True)
    assert 'id="send-selection"' not in page  # no button where email is not set up
    assert (await guest.post(send, json=body)).status_code == 403  # no CSRF token


async def test_send_selection_reaches_only_the_photographer(tmp_path: Path) -> None:
    with own_services(tmp_path, **email_settings(closed_port())) as svc:
        app = app_for(svc)
        admin = AuthActions(app.test_client())
        await admin.login()
        g = await published(admin, name="G")
        photo = add_photo(svc, g["id"], name="DSC_0001.jpg")
        guest = app.test_client()
        csrf = await guest_csrf(guest, g["slug"])
        await guest.post(f"/api/g/{g['slug']}/guest", json={"name": "Mallory <victim@evil.test>"},
                         headers={"X-CSRF-Token": csrf})
        await guest.put(f"/api/g/{g['slug']}/favourites/{photo}", headers={"X-CSRF-Token": csrf})
        send = f"/api/g/{g['slug']}/favourites/send"
        body = {"to": "victim@evil.test"}
        no_photographer = await guest.post(send, json=body, headers={"X-CSRF-Token": csrf})
        assert no_photographer.status_code == 409
        set_contact(svc)
        page = await (await guest.get(f"/g/{g['slug']}?favourites=1")).get_data(as_text=True)
        assert 'id="send-selection"' in page and "Send my selection to the photographer" in page
        for _ in range(3):  # the same selection sent again is the same message
            assert (await guest.post(send, json=body, headers={"X-CSRF-Token": csrf})).status_code == 200
        rows = sql(svc, "SELECT recipient, kind, message FROM email_outbox")
    assert [(r["recipient"], r["kind"]) for r in rows] == [(PHOTOGRAPHER, "favourites_selection")]
    parsed = email.message_from_bytes(rows[0]["message"], policy=email.policy.default)
    assert [a.addr_spec for a in parsed["To"].addresses] == [PHOTOGRAPHER]
    assert "victim" not in str(parsed["Subject"]) and parsed["Cc"] is None and parsed["Bcc"] is None
    html = parsed.get_body(("html",)).get_content()
    assert "Mallory &lt;victim@evil.test&gt;" in html and "DSC_0001.jpg" in html
    assert "/favourites.csv?guest=Mallory" in parsed.get_body(("plain",)).get_content()


# --- the command and the settings page ------------------------------------------------------------------------------

def test_cli_email_test_prints_the_servers_answer(tmp_path: Path) -> None:
    with SmtpServer(tmp_path / "mailbox") as server:
        config = tmp_path / "picpeak.toml"
        config.write_text(f'data_dir = "{tmp_path / "data"}"\nsmtp_host = "127.0.0.1"\nsmtp_port = {server.port}\n'
                          f'smtp_security = "none"\nemail_from = "{SENDER}"\n')
        done = subprocess.run([sys.executable, "-m", "picpeak_lite", "email", "test", PHOTOGRAPHER, "--config",
                               str(config)], cwd=ROOT, capture_output=True, text=True, env={"PATH": "/usr/bin"},
                              timeout=120)
        assert done.returncode == 0, done.stderr
        assert "The server answered: 250 2.0.0 Ok: queued as" in done.stdout
        [message] = server.messages()
        assert message["To"] == PHOTOGRAPHER and message["Message-ID"] in done.stdout
    down = subprocess.run([sys.executable, "-m", "picpeak_lite", "email", "test", PHOTOGRAPHER, "--config",
                           str(config)], cwd=ROOT, capture_output=True, text=True, env={"PATH": "/usr/bin"},
                          timeout=120)
    assert down.returncode == 1 and "the server did not take the message: ConnectionRefusedError" in down.stderr


async def test_settings_page_shows_failures_and_sends_a_test(tmp_path: Path) -> None:
    with own_services(tmp_path, **email_settings(closed_port())) as svc:
        app = app_for(svc)
        admin = AuthActions(app.test_client())
        await admin.login()
        page = await admin.client.get("/admin/settings/")
        html = await page.get_data(as_text=True)
        assert 'id="email-test"' in html and "No messages yet." in html
        token = admin.csrf
        answer = await admin.client.post("/admin/settings/email/test", form={"address": PHOTOGRAPHER,
                                                                            "csrf_token": token})
        assert answer.status_code == 302
        bad = await admin.client.post("/admin/settings/email/test", form={"address": "x@y.test\nBcc: z@evil.test",
                                                                         "csrf_token": token})
        assert bad.status_code == 400
        await drain(EmailSender(svc.db, svc.settings, clock=svc.clock))
        html = await (await admin.client.get("/admin/settings/")).get_data(as_text=True)
        assert "email-pending" in html and "ConnectionRefusedError" in html and PHOTOGRAPHER in html
        assert "1 waiting, 0 sent, 0 failed." in html


async def test_template_editor_previews_saves_and_refuses_bad_templates(tmp_path: Path) -> None:
    with own_services(tmp_path, **email_settings(closed_port())) as svc:
        app = app_for(svc)
        admin = AuthActions(app.test_client())
        await admin.login()
        url = "/admin/settings/email/templates/gallery_shared"
        page = await (await admin.client.get(url)).get_data(as_text=True)
        assert "Your photos are ready: Anna &amp; Ben" in page  # the preview with sample values
        form = {"csrf_token": admin.csrf, "subject": "Hi {{ customer_name }}!", "text": "See {{ gallery_url }}",
                "html": "<p>{{ gallery_name }}</p>", "preview": "1"}
        shown = await (await admin.client.post(url, form=form)).get_data(as_text=True)
        assert "Hi Anna Example!" in shown
        escape = {**form, "html": "{{ ''.__class__.__mro__[1].__subclasses__() }}"}
        refused = await admin.client.post(url, form=escape)
        assert refused.status_code == 400 and "cannot be rendered" in await refused.get_data(as_text=True)
        broken = await admin.client.post(url, form={**form, "text": "{% if %}"})
        assert broken.status_code == 400
        saved = await admin.client.post(url, form={k: v for k, v in form.items() if k != "preview"})
        assert saved.status_code == 302
        g = client_gallery(svc)
        share(svc, g, base_url="http://h.test", now=1.0, upload_qr_png=None)
        [row] = sql(svc, "SELECT subject FROM email_outbox")
        assert row["subject"] == "Hi Anna!"


# --- timing on the autojump clock -------------------------------------------------------------------------------

async def test_backoff_then_given_up(tmp_path: Path, autojump_clock: Any) -> None:
    """The sender's own schedule on the virtual clock: it sleeps until its next row is due, then tries it. The
    steps are driven one at a time (no timer runs while an SMTP thread does, so the clock cannot jump past a due
    time): every retry comes exactly its delay after the attempt before it, and the fifth failure gives up."""
    with own_services(tmp_path, **email_settings(closed_port())) as svc:
        _write_now(svc, lambda conn: email_domain.queue_test(conn, svc.settings, PHOTOGRAPHER, now=trio.current_time()))
        sender = EmailSender(svc.db, svc.settings, clock=trio.current_time, attempt_deadline=math.inf)
        attempts_at = []
        while (due := await sender.next_due_at()) is not None:
            await trio.sleep_until(due)
            assert await sender.deliver_due() == 1
            attempts_at.append(trio.current_time())
        [row] = sql(svc, "SELECT status, attempts, last_error FROM email_outbox")
    gaps = [later - earlier for earlier, later in itertools.pairwise(attempts_at)]
    print(f"email: retries after {gaps} s (virtual)")
    assert row["status"] == "failed" and row["attempts"] == outbox.MAX_ATTEMPTS
    assert "ConnectionRefusedError" in row["last_error"]
    assert gaps == list(outbox.RETRY_DELAYS)


async def test_reminders_expired_and_digests_on_schedule(tmp_path: Path, autojump_clock: Any) -> None:
    """The scheduler's passes at chosen virtual times (each pass is one write; no timer runs meanwhile): the
    reminder not before N days ahead and then at once, once; one digest per gallery per interval with only the
    new photos; "expired" once the expiry has passed. The task itself passes every 300 s."""
    base = 1_000_000.0

    def clock() -> float:
        return base + trio.current_time()

    with own_services(tmp_path, **email_settings(closed_port(), email_reminder_days=3,
                                                 email_digest_minutes=60)) as svc:
        set_contact(svc)
        start = clock()
        expires = start + 5 * 86400
        g = client_gallery(svc, expires_at=expires)
        scheduler = EmailScheduler(svc.db, svc.settings, bell=svc.email_bell, base_url=lambda: "http://h.test",
                                   clock=clock, every=300)

        def kinds() -> list[tuple[str, str]]:
            rows = sql(svc, "SELECT kind, recipient FROM email_outbox ORDER BY id")
            return [(r["kind"], r["recipient"]) for r in rows]

        def digests() -> list[dict[str, Any]]:
            return sql(svc, "SELECT message, created_at FROM email_outbox WHERE kind = 'guest_digest' ORDER BY id")

        async def pass_at(offset: float) -> int:
            await trio.sleep_until(offset)
            return await scheduler.tick()

        assert await pass_at(2 * 86400 - 1) == 0, "no reminder before N days ahead"
        assert await pass_at(2 * 86400) == 2
        assert sorted(kinds()) == [("expiry_reminder", CLIENT), ("expiry_reminder", PHOTOGRAPHER)]
        assert await pass_at(2 * 86400 + 300) == 0 and await pass_at(3 * 86400) == 0, "one reminder each"
        for n in range(3):
            _guest_photo(svc, g, f"g{n}.jpg", clock())
        assert await pass_at(3 * 86400 + 300) == 1
        assert b"3 new guest photos" in digests()[0]["message"]
        _guest_photo(svc, g, "late.jpg", clock())
        assert await pass_at(3 * 86400 + 300 + 3599) == 0, "at most one digest per gallery per interval"
        assert await pass_at(3 * 86400 + 300 + 3600) == 1
        assert b"1 new guest photo " in digests()[1]["message"]
        assert await pass_at(3 * 86400 + 300 + 7200) == 0, "no new uploads, no digest"
        assert await pass_at(expires - base - 1) == 0
        assert await pass_at(expires - base) == 2
        assert sorted(k for k in kinds() if k[0] == "gallery_expired") == [
            ("gallery_expired", CLIENT), ("gallery_expired", PHOTOGRAPHER)]
        # The task: its first pass at once, then one every 300 s; passes that find nothing new queue nothing.
        async with trio.open_nursery() as nursery:
            await nursery.start(scheduler.run)
            await trio.sleep(3 * 300 + 1)
            nursery.cancel_scope.cancel()
        assert len(kinds()) == 6


def _guest_photo(svc: Services, gallery_id: int, name: str, now: float) -> None:
    photo = add_photo(svc, gallery_id, name=name, created_at=now)
    _write_now(svc, lambda conn: conn.execute("UPDATE photos SET uploaded_by = 'guest' WHERE id = ?", (photo,)))


def test_the_clients_language_is_the_gallerys() -> None:
    """A ``language`` on the gallery (when the gallery has one) is the client's; else the install's default. The
    photographer always gets the install's default."""
    row = {"customer_email": CLIENT, "customer_name": "Anna", "language": "de"}
    assert email_domain.client_of(row, "it") == email_domain.Recipient(CLIENT, "Anna", "de", "client")
    assert email_domain.client_of({**row, "language": None}, "it").language == "it"  # the install's default_language
    assert email_domain.client_of({"customer_email": ""}, "it") is None
    seen: list[str] = []
    templates = {"subject": "{{ lang() }}", "text": "t", "html": "h"}
    rendered = email_domain.render(templates, {"lang": lambda: seen.append(i18n.current_locale()) or "x"}, "de")
    assert seen == ["de"] and rendered.subject == "x" and i18n.current_locale() == "en"


async def test_the_server_sends_what_the_share_button_queues(tmp_path: Path) -> None:
    """server.run starts the sender and the scheduler when email is set up; the gallery page's button queues the
    share message and rings the sender, which delivers it to the real SMTP server."""
    import httpx

    from picpeak_lite import server

    with SmtpServer(tmp_path / "mailbox") as smtp:
        settings = make_settings(tmp_path, **email_settings(smtp.port))
        bootstrap.prepare(settings)
        bootstrap.ensure_admin(settings, {"PICPEAK_ADMIN_PASSWORD": ADMIN_PASSWORD})
        async with trio.open_nursery() as nursery:
            running = await nursery.start(server.run, settings)
            gallery_id = client_gallery(running.services, allow_guest_uploads=1)
            async with httpx.AsyncClient(base_url=running.url, timeout=120) as http:
                await http.post("/admin/login", data={"username": "admin", "password": ADMIN_PASSWORD})
                page = (await http.get(f"/admin/galleries/{gallery_id}")).text
                assert 'id="email-client"' in page
                csrf = re.search(r'name="csrf_token" value="([^"]+)"', page).group(1)
                answer = await http.post(f"/admin/galleries/{gallery_id}/email-client", data={"csrf_token": csrf})
                assert answer.status_code == 302
            with trio.fail_after(60):  # a hang guard, not a speed bound: the bell wakes the sender at once
                while not smtp.messages():
                    await trio.sleep(0.05)
            running.stop()
    [message] = smtp.messages()
    assert [a.addr_spec for a in message["To"].addresses] == [CLIENT]
    assert any(p.get_content_type() == "image/png" for p in message.walk())


async def test_one_bad_address_does_not_hold_up_the_other_reminders(tmp_path: Path) -> None:
    with own_services(tmp_path, **email_settings(closed_port())) as svc:
        client_gallery(svc, "Bad", email_address="x@client.test\nBcc: victim@evil.test", expires_at=2 * 86400)
        client_gallery(svc, "Good", expires_at=2 * 86400)
        queued = _write_now(svc, lambda conn: email_domain.queue_due(conn, svc.settings, base_url="http://h.test",
                                                                     now=86400.0))
        rows = sql(svc, "SELECT kind, recipient FROM email_outbox")
    assert queued == 1 and rows == [{"kind": "expiry_reminder", "recipient": CLIENT}]


# --- the studio's brand (issue 33) ----------------------------------------------------------------------------------

def _queued_messages(svc: Services) -> list[bytes]:
    return [bytes(row["message"]) for row in sql(svc, "SELECT message FROM email_outbox ORDER BY id")]


def _branded_mails(svc: Services, look: Any) -> list[bytes]:
    """The share mail (with its inline upload QR code) and the test mail, under the brand ``look``: raw bytes."""
    from picpeak_lite.domain import brand

    _write_now(svc, lambda conn: brand.save(conn, look))
    gallery_id = client_gallery(svc, allow_guest_uploads=1)
    share(svc, gallery_id, base_url="http://h.test", now=10.0, upload_qr_png=b"\x89PNG fake qr")
    _write_now(svc, lambda conn: email_domain.queue_test(conn, svc.settings, PHOTOGRAPHER, now=11.0))
    return _queued_messages(svc)


def _readable(raw: bytes) -> str:
    """A message as its reader sees it: every header decoded and every text part decoded (so that no
    quoted-printable or base64 can hide a word)."""
    message = email.message_from_bytes(raw, policy=email.policy.default)
    out = [f"{name}: {value}" for part in message.walk() for name, value in part.items()]
    out += [part.get_content() for part in message.walk() if part.get_content_maintype() == "text"]
    return "\n".join(out)


def test_a_branded_share_mail_carries_the_studio_name_and_accent(tmp_path: Path) -> None:
    """The studio's name is the sender's display name, the HTML header and the text's signature line; the
    accent colours the button (with its readable text colour) and the links."""
    from picpeak_lite.domain.brand import Brand

    with own_services(tmp_path, **email_settings(closed_port())) as svc:
        share_raw = _branded_mails(svc, Brand(studio_name="Lumen & Co", accent="#aa3355"))[0]
    message = email.message_from_bytes(share_raw, policy=email.policy.default)
    assert message["From"].addresses[0].display_name == "Lumen & Co"
    assert message["From"].addresses[0].addr_spec == SENDER
    html = message.get_body(("html",)).get_content()
    assert "Lumen &amp; Co" in html  # the header, escaped
    assert "background:#aa3355;color:#ffffff" in html  # the button: accent, white text on it
    assert "a{color:#aa3355}" in html
    text = message.get_body(("plain",)).get_content()
    assert text.rstrip().endswith("Sent by Lumen & Co with PicPeak")


def test_a_white_labelled_mail_never_names_us(tmp_path: Path) -> None:
    """White label: no "picpeak" anywhere in the share and test messages (subject, From, body, footer, the QR
    code's Content-ID), raw or decoded, with a studio name and without one."""
    from picpeak_lite.domain.brand import Brand

    for studio in ("Lumen Studio", ""):
        with own_services(tmp_path / (studio or "none"), **email_settings(closed_port())) as svc:
            mails = _branded_mails(svc, Brand(studio_name=studio, white_label=True))
        assert len(mails) == 2
        for raw in mails:
            assert b"picpeak" not in raw.lower()
            assert "picpeak" not in _readable(raw).lower()
            assert ("Lumen Studio" in _readable(raw)) == bool(studio)
    with own_services(tmp_path / "ours", **email_settings(closed_port())) as svc:
        mails = _branded_mails(svc, Brand())
    assert all("PicPeak" in _readable(raw) for raw in mails)  # without white label, the footer says who sent it
