"""One exception hierarchy for everything a client can be told.

Each error carries its HTTP status and a message meant for people. ``web/errors.py`` has the one handler that
renders them as an HTML page (``page``, with ``page_context()``) or JSON (``to_json()``), whichever the client
asked for. Anything that is not an :class:`AppError` is a bug:
it is logged with its traceback and answered 500 without internals.
"""

from __future__ import annotations

from typing import Any

from picpeak_lite.i18n import N_, _, ngettext


class AppError(Exception):
    status = 500
    title = N_("Something went wrong")
    #: The template of this error's HTML page. A page whose form posts needs the guest session that holds its
    #: CSRF token, so the handler makes one first when ``needs_guest_session`` is set.
    page = "error.html"
    needs_guest_session = False

    def __init__(self, message: str | None = None, **extra: Any) -> None:
        # The title is translated here, when the error is raised for one reader, not where it is defined.
        super().__init__(message or _(self.title))
        self.message = message or _(self.title)
        self.extra = extra

    def headers(self) -> dict[str, str]:
        return {}

    def to_json(self) -> dict[str, Any]:
        return {"error": self.message, **self.extra}

    def page_context(self) -> dict[str, Any]:
        """What ``page`` is rendered with."""
        return {"error": self}


class BadRequest(AppError):
    status = 400
    title = N_("Bad request")


class ValidationError(BadRequest):
    """Per-field messages: ``{"name": "Please give the gallery a name."}``."""

    title = N_("Please correct the highlighted fields.")

    def __init__(self, fields: dict[str, str], message: str | None = None) -> None:
        super().__init__(message, fields=fields)
        self.fields = fields


class Unauthorized(AppError):
    status = 401
    title = N_("Please log in")


class Forbidden(AppError):
    status = 403
    title = N_("Forbidden")


class NotFound(AppError):
    status = 404
    title = N_("Not found")


class RequestTimeout(AppError):
    """A request body that arrived slower than ``min_body_rate_kb``: the connection is closed after the answer."""

    status = 408
    title = N_("The upload was too slow")


class Conflict(AppError):
    status = 409
    title = N_("Conflict")


class Gone(AppError):
    status = 410
    title = N_("This gallery has expired")


class TooLarge(AppError):
    status = 413
    title = N_("Too large")


class UnsupportedMedia(AppError):
    status = 415
    title = N_("Unsupported file type")


class Unprocessable(AppError):
    status = 422
    title = N_("Could not process")


class TooManyRequests(AppError):
    status = 429
    title = N_("Too many attempts")

    def __init__(self, retry_after: int, message: str | None = None) -> None:
        minutes = max(1, retry_after // 60)
        super().__init__(message or ngettext("Too many attempts. Try again in %(num)d minute.",
                                             "Too many attempts. Try again in %(num)d minutes.", minutes)
                         % {"num": minutes})
        self.retry_after = max(1, int(retry_after))

    def headers(self) -> dict[str, str]:
        return {"Retry-After": str(self.retry_after)}


class NotReady(AppError):
    """A photo that is still waiting or processing."""

    status = 503
    title = N_("Not ready yet")

    def __init__(self, message: str | None = None, retry_after: int = 5) -> None:
        super().__init__(message)
        self.retry_after = retry_after

    def headers(self) -> dict[str, str]:
        return {"Retry-After": str(self.retry_after)}


class InsufficientStorage(AppError):
    status = 507
    title = N_("The server's disk is full")


class StorageUnavailable(AppError):
    """The photo store (an S3-compatible bucket) did not answer, or answered with a server error. Nothing was
    recorded; the client is told to try again shortly, and workers hand their photo back without it counting
    as an attempt."""

    status = 503
    title = N_("The photo storage is not reachable")

    def __init__(self, message: str | None = None, retry_after: int = 30) -> None:
        super().__init__(message or _("The photo storage is not reachable just now; nothing was saved. "
                                      "Please try again in a minute."))
        self.retry_after = retry_after

    def headers(self) -> dict[str, str]:
        return {"Retry-After": str(self.retry_after)}


class DatabaseError(AppError):
    status = 500
    title = N_("Database error")


class DatabaseUnavailable(DatabaseError):
    """The database server did not answer (PostgreSQL restarting, the network to it cut). Nothing was recorded
    by this request; the client is told to try again shortly, and the connection is opened again by the next
    one (``store/db.py`` ``Database``). ``detail`` is the driver's own reason, for logs and the command line."""

    status = 503
    title = N_("The database is not reachable")

    def __init__(self, detail: str, retry_after: int = 5) -> None:
        super().__init__(_("The database is not answering just now; nothing was saved. "
                           "Please try again in a few seconds."))
        self.detail = detail
        self.retry_after = retry_after

    def __str__(self) -> str:
        return self.detail

    def headers(self) -> dict[str, str]:
        return {"Retry-After": str(self.retry_after)}


class CommandFailed(Exception):
    """An operator command that could not finish (a file that could not be read or stored). The CLI prints it as
    one line and exits 1; the command says in it whether running it again goes on from there."""


class ConfigError(Exception):
    """A bad config file, environment variable or flag. The CLI prints it as one line and exits 2."""
