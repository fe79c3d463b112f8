"""``GET /healthz``: 200 when the database answers and every page template loads; 503 with a sentence if not.

A database that does not answer (PostgreSQL down or restarting, its network cut) is 503 with ``Retry-After``, not
a 500: a load balancer takes the host out of its rotation and asks again, and with several hosts it sends the
requests to one that can answer.

A process that answers but cannot render its pages (templates missing from an install, a template that does not
compile) is not healthy: a load balancer or ``systemctl`` watchdog must see that, not a 200 next to 500s.
"""

from __future__ import annotations

import logging
from typing import Any

from jinja2 import TemplateError
from quart import Blueprint, current_app

from picpeak_lite.errors import DatabaseError
from picpeak_lite.store import db
from picpeak_lite.web.auth import services

log = logging.getLogger(__name__)
blueprint = Blueprint("health", __name__)

# Every page extends base.html and every error page is error.html: without these two nothing renders.
REQUIRED_TEMPLATES = ("base.html", "error.html")
RETRY_SECONDS = 5


@blueprint.get("/healthz")
async def healthz() -> Any:
    try:
        await services().db.read(db.check)
    except DatabaseError as error:
        # The details (an address, the server's words) go to the log, not to whoever asks: /healthz is public.
        log.warning("/healthz: the database does not answer: %s", error)
        return ({"status": "error", "error": "The database does not answer."}, 503,
                {"Retry-After": str(RETRY_SECONDS)})
    problem = template_problem()
    if problem is not None:
        return {"status": "error", "error": problem}, 503
    return {"status": "ok"}


def template_problem() -> str | None:
    """A sentence naming the first template that cannot be loaded, or None. Loaded templates are cached by
    Jinja (auto-reload is off), so after the first call this costs a directory listing."""
    env = current_app.jinja_env
    folder = current_app.template_folder
    try:
        names = env.list_templates()
    except OSError as error:
        return f"The page templates cannot be read from {folder}: {error.strerror or error}."
    for name in (*REQUIRED_TEMPLATES, *names):
        try:
            env.get_template(name)
        except TemplateError as error:
            if name in REQUIRED_TEMPLATES and name not in names:
                return f"The page templates are missing: {name} is not in {folder}."
            return f"The page template {name} cannot be loaded: {error.message or type(error).__name__}."
    return None
