"""``GET /healthz``: 200 when the database answers and every page template loads; 503 with a sentence if not.

A process that answers but cannot render its pages (templates missing from an install, a template that does not
compile) is not healthy: a load balancer or ``systemctl`` watchdog must see that, not a 200 next to 500s.
"""

from __future__ import annotations

from typing import Any

from jinja2 import TemplateError
from quart import Blueprint, current_app

from picpeak_lite.store import db
from picpeak_lite.web.auth import services

blueprint = Blueprint("health", __name__)

# Every page extends base.html and every error page is error.html: without these two nothing renders.
REQUIRED_TEMPLATES = ("base.html", "error.html")


@blueprint.get("/healthz")
async def healthz() -> Any:
    await services().db.read(db.check)
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
