"""Where the templates and static files are, resolved once at import.

They live at the top of the repository (``templates/``, ``static/``: the layout the README promises), and the
wheel and sdist carry them inside the package (``picpeak_lite/templates``, ``picpeak_lite/static``: pyproject.toml
maps the two folders there at build time). So an installed package finds them next to its modules, and a source
checkout or an editable install (where the package is the checkout's ``picpeak_lite/``) finds them one level up.
Nothing else is searched: a folder called ``templates`` in the working directory or in site-packages is never
picked up by accident.
"""

from __future__ import annotations

import importlib.resources
from pathlib import Path

PACKAGE_DIR = Path(str(importlib.resources.files("picpeak_lite")))


def _resolve(name: str) -> Path:
    installed = PACKAGE_DIR / name
    if installed.is_dir():
        return installed
    checkout = PACKAGE_DIR.parent / name
    if checkout.is_dir() and (PACKAGE_DIR.parent / "pyproject.toml").is_file():
        return checkout
    # Neither: a broken install. Name the place a wheel would have it; /healthz reports the missing templates.
    return installed


TEMPLATES_DIR = _resolve("templates")
STATIC_DIR = _resolve("static")
