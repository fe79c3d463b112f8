"""Email delivery from the outbox (``picpeak_lite.store.queries.email``): the one home of smtplib.

Messages are queued whole, Message-ID included, by ``domain/email.py``; :class:`EmailSender` sends due rows
and records the outcome, like the webhook sender (``events/outbox.py`` is their shared loop). SMTP cannot
promise exactly once: a connection that drops after the server took the message but before its "250" reached
us looks like a failure, and the retry sends it again. The retry sends the very same bytes under the very same
Message-ID, which receiving servers and mail programs use to drop the duplicate, so the recipient sees one
message.

smtplib blocks, so each SMTP transaction runs in a thread under :data:`smtp_limiter`, with a timeout on every
socket operation (``SEND_TIMEOUT``) and a deadline on the whole attempt (the thread is abandoned past it and its
row tried again later). At most ``email_per_minute`` messages go out in any 60 s, counted from the rows, so a
restart does not reset the count.
"""

from __future__ import annotations

import functools
import logging
import smtplib
import ssl
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import trio

from picpeak_lite.domain import email as email_domain
from picpeak_lite.errors import AppError
from picpeak_lite.events import outbox
from picpeak_lite.perrun import PerRun
from picpeak_lite.runtime.bell import Bell
from picpeak_lite.store.queries import email as queries

if TYPE_CHECKING:
    from picpeak_lite.config import Settings
    from picpeak_lite.store.db import Database

logger = logging.getLogger(__name__)

# Each socket operation of an SMTP exchange (connect, each command's answer).
SEND_TIMEOUT = 30.0
# One whole attempt, from connect to the answer to DATA; past it the thread is left to end by its timeouts.
ATTEMPT_DEADLINE = 120.0
# A claimed row comes back by itself after this long if its attempt never got recorded (a crash).
CLAIM_SECONDS = 300.0
POLL_SECONDS = 30.0
# Rows claimed per pass, sent one after another.
BATCH = 4
RATE_WINDOW = 60.0

# SMTP transactions at once in this process: a handful of messages a minute needs no more.
_LIMITER: PerRun[trio.CapacityLimiter] = PerRun("picpeak_smtp_limiter", lambda: trio.CapacityLimiter(2))


def smtp_limiter() -> trio.CapacityLimiter:
    return _LIMITER.get()


class SendFailed(Exception):
    """One attempt failed: ``reason`` is the sentence for the log and the settings page; ``permanent`` when the
    server refused for good (a 5xx answer to MAIL, RCPT or DATA), so trying again cannot help."""

    def __init__(self, reason: str, *, permanent: bool = False) -> None:
        super().__init__(reason)
        self.reason = reason
        self.permanent = permanent


@dataclass(frozen=True)
class Smtp:
    """Where and how to send: from the settings (``from_settings``)."""

    host: str
    port: int
    security: str  # 'starttls', 'tls' or 'none'
    user: str = ""
    password: str = ""

    @classmethod
    def from_settings(cls, settings: Settings) -> Smtp:
        return cls(settings.smtp_host, settings.smtp_port, settings.smtp_security, settings.smtp_user,
                   settings.smtp_password)


@functools.cache
def default_tls_context() -> ssl.SSLContext:
    """The system's CA bundle, loaded once."""
    return ssl.create_default_context()


def _answer(code: int, text: bytes | str) -> str:
    text = text.decode(errors="replace") if isinstance(text, bytes) else text
    return f"{code} {' '.join(text.split())}".strip()


def send(smtp: Smtp, sender: str, recipient: str, message: bytes, *, tls: ssl.SSLContext | None = None,
         timeout: float = SEND_TIMEOUT) -> str:
    """One SMTP transaction for one message; returns the server's answer to DATA (``250 2.0.0 Ok: queued``).

    Sync and blocking: call it in a thread. Raises :class:`SendFailed` with a readable reason."""
    context = tls or default_tls_context()
    try:
        client: smtplib.SMTP
        if smtp.security == "tls":
            client = smtplib.SMTP_SSL(smtp.host, smtp.port, timeout=timeout, context=context)
        else:
            client = smtplib.SMTP(smtp.host, smtp.port, timeout=timeout)
        with client:
            client.ehlo()
            if smtp.security == "starttls":
                if not client.has_extn("starttls"):
                    raise SendFailed(f"{smtp.host} does not offer STARTTLS (smtp_security = \"starttls\")")
                client.starttls(context=context)
                client.ehlo()
            if smtp.user:
                client.login(smtp.user, smtp.password)
            code, text = client.mail(sender)
            if code != 250:
                raise SendFailed(f"MAIL FROM refused: {_answer(code, text)}", permanent=500 <= code < 600)
            code, text = client.rcpt(recipient)
            if code not in (250, 251):
                raise SendFailed(f"RCPT TO refused: {_answer(code, text)}", permanent=500 <= code < 600)
            code, text = client.data(message)
            if code != 250:
                raise SendFailed(f"DATA refused: {_answer(code, text)}", permanent=500 <= code < 600)
            return _answer(code, text)
    except SendFailed:
        raise
    except smtplib.SMTPAuthenticationError as error:
        raise SendFailed(f"login refused: {_answer(error.smtp_code, error.smtp_error)}") from None
    except smtplib.SMTPResponseException as error:
        raise SendFailed(_answer(error.smtp_code, error.smtp_error)) from None
    except ssl.SSLError as error:
        raise SendFailed(f"TLS failed: {error.reason or error}") from None
    except (OSError, smtplib.SMTPException) as error:
        raise SendFailed(f"{type(error).__name__}: {error}") from None


class EmailSender:
    """Sends due outbox rows and records the outcome; one per server process.

    Start it with ``await nursery.start(sender.run)``; ring ``bell`` after committing a queued message.
    """

    def __init__(
        self,
        db: Database,
        settings: Settings,
        *,
        bell: Bell | None = None,
        clock: Callable[[], float] = time.time,
        tls: ssl.SSLContext | None = None,
        poll_seconds: float = POLL_SECONDS,
        attempt_deadline: float = ATTEMPT_DEADLINE,
    ) -> None:
        self._db = db
        self._smtp = Smtp.from_settings(settings)
        self._sender = settings.email_from
        self._per_minute = settings.email_per_minute
        # Wall-clock seconds as stored in the rows; tests pass trio.current_time with autojump_clock.
        self._clock = clock
        self._tls = tls
        self._poll_seconds = poll_seconds
        self._attempt_deadline = attempt_deadline
        self.bell = bell or Bell()

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Send forever. Rows claimed by a process that died come back when their claim runs out."""
        task_status.started()
        await outbox.serve(self.bell, self.deliver_due, self.next_due_at, self._clock,
                           poll_seconds=self._poll_seconds, batch=BATCH)

    async def _room(self) -> tuple[int, float]:
        """How many messages the rate limit lets out now, and when the next one may go if none may."""
        now = self._clock()
        window = await self._db.read(queries.sent_since, now - RATE_WINDOW)
        room = self._per_minute - len(window)
        if room > 0:
            return room, now
        return 0, window[-self._per_minute] + RATE_WINDOW

    async def next_due_at(self) -> float | None:
        """When the next message may go: its row's due time, or later while the rate limit's window is full (so
        the loop sleeps instead of spinning on a due row it may not send)."""
        due = await self._db.read(queries.next_due_at)
        if due is None:
            return None
        room, free_at = await self._room()
        return due if room else max(due, free_at)

    async def deliver_due(self) -> int:
        """One pass: claim what is due (at most what the rate limit allows, at most ``BATCH``), send the rows one
        after another, record each outcome. Returns how many rows were claimed."""
        room, _ = await self._room()
        if not room:
            return 0
        rows = await self._db.write(queries.claim_due, self._clock(), min(room, BATCH), CLAIM_SECONDS)
        for row in rows:
            await self._send_one(row)
        return len(rows)

    async def _send_one(self, row: dict[str, Any]) -> None:
        reply: str | None = None
        error: SendFailed | None = None
        with trio.move_on_after(self._attempt_deadline):
            try:
                reply = await trio.to_thread.run_sync(
                    functools.partial(send, self._smtp, self._sender, row["recipient"], row["message"],
                                      tls=self._tls),
                    limiter=smtp_limiter(), abandon_on_cancel=True,
                )
            except SendFailed as failed:
                error = failed
            except Exception as bug:  # a bug of ours, not the server's: record it and carry on
                logger.exception("email %s to %s crashed", row["message_id"], row["recipient"])
                error = SendFailed(f"internal error: {type(bug).__name__}: {bug}")
        if reply is None and error is None:
            error = SendFailed(f"timed out after {self._attempt_deadline:g} s")
        now = self._clock()
        if reply is not None:
            await self._db.write(queries.record_sent, row["id"], reply, now)
            logger.info("email %s (%s) to %s sent: %s", row["message_id"], row["kind"], row["recipient"], reply)
            return
        assert error is not None
        updated = await self._db.write(
            functools.partial(queries.record_failure, final=error.permanent), row["id"], error.reason, now
        )
        if updated is not None and updated["status"] == "failed":
            logger.error("email %s (%s) to %s failed after %d attempts, giving up: %s", row["message_id"],
                         row["kind"], row["recipient"], updated["attempts"], error.reason)
        else:
            logger.warning("email %s (%s) to %s failed, will retry: %s", row["message_id"], row["kind"],
                           row["recipient"], error.reason)


# How often the scheduler looks for reminders, "expired" notes and digests that have fallen due.
SCHEDULE_SECONDS = 300.0


class EmailScheduler:
    """Queues the timed messages (``domain.email.queue_due``) every ``SCHEDULE_SECONDS``; one per server process.

    What is due is decided from the rows each time (a reminder's dedup key names the gallery and its expiry), so
    a restart, a second process or a missed pass sends nothing twice and forgets nothing.
    """

    def __init__(self, db: Database, settings: Settings, *, bell: Bell, base_url: Callable[[], str],
                 clock: Callable[[], float] = time.time, every: float = SCHEDULE_SECONDS) -> None:
        self._db = db
        self._settings = settings
        self._bell = bell
        # Links in timed messages: public_url, else the address the server listens on (known once it is bound).
        self._base_url = base_url
        self._clock = clock
        self._every = every

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        task_status.started()
        while True:
            try:
                await self.tick()
            except AppError as error:  # a photographer's template that no longer renders: say so, try later
                logger.error("email: the timed messages could not be queued: %s", error)
            await trio.sleep(self._every)

    async def tick(self) -> int:
        """One pass; returns how many messages it queued (and wakes the sender if any)."""
        queue = functools.partial(email_domain.queue_due, settings=self._settings, base_url=self._base_url(),
                                  now=self._clock())
        queued = await self._db.write(queue)
        if queued:
            self._bell.ring()
        return queued
