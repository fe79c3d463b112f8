"""Refresh the translation catalogs from the source: ``.venv/bin/python bench/i18n_catalogs.py``.

Extracts every marked string (babel.cfg: Python, templates, scripts) into
``picpeak_lite/locales/messages.pot``, then brings each language's ``messages.po`` up to date with it (new strings
appear with an empty translation, strings no longer in the source are dropped). Then translate the empty entries
and run ``tests/test_i18n.py``, which fails while any string of any language is untranslated. The catalogs are
shipped as .po files and compiled in memory at start (picpeak_lite/i18n.py), so there is no compile step.
``--check`` only says which strings are missing where, and exits 1 if any are.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

from babel.messages.frontend import CommandLineInterface
from babel.messages.pofile import read_po

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from picpeak_lite.i18n import DEFAULT_LOCALE, LANGUAGES, LOCALES_DIR  # noqa: E402

TEMPLATE = LOCALES_DIR / "messages.pot"
KEYWORDS = ["-k", "N_"]


def pybabel(*args: str) -> None:
    CommandLineInterface().run(["pybabel", "-q", *args])


def extract() -> None:
    """From the repository root, so that each string's location reads ``static/gallery.js:12`` (the server finds
    the scripts' strings by these locations)."""
    os.chdir(ROOT)
    pybabel("extract", "-F", "babel.cfg", *KEYWORDS, "--no-wrap", "--sort-by-file", "--project", "picpeak-lite",
            "--copyright-holder", "picpeak-lite", "-o", str(TEMPLATE.relative_to(ROOT)), ".")


def update() -> None:
    for code in LANGUAGES:
        if code == DEFAULT_LOCALE:
            continue
        po = LOCALES_DIR / code / "LC_MESSAGES" / "messages.po"
        if po.exists():
            pybabel("update", "-i", str(TEMPLATE), "-o", str(po), "-l", code, "--no-wrap", "--no-fuzzy-matching",
                    "--ignore-obsolete")
        else:
            pybabel("init", "-i", str(TEMPLATE), "-o", str(po), "-l", code, "--no-wrap")


def missing() -> dict[str, list[str]]:
    found: dict[str, list[str]] = {}
    for code in LANGUAGES:
        if code == DEFAULT_LOCALE:
            continue
        with (LOCALES_DIR / code / "LC_MESSAGES" / "messages.po").open("rb") as fp:
            catalog = read_po(fp)
        for message in catalog:
            if not message.id:
                continue
            strings = message.string if isinstance(message.string, tuple) else (message.string,)
            if message.fuzzy or not all(strings):
                found.setdefault(code, []).append(message.id if isinstance(message.id, str) else message.id[0])
    return found


def main() -> int:
    if "--check" not in sys.argv:
        extract()
        update()
    gaps = missing()
    for code, ids in gaps.items():
        print(f"{code}: {len(ids)} untranslated")
        for msgid in ids[:20]:
            print(f"  {msgid!r}")
    return 1 if gaps else 0


if __name__ == "__main__":
    sys.exit(main())
