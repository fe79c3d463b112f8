"""Languages (issue 32): every marked string translated in every catalog, plural forms by CLDR, the order in
which a page's language is chosen, and pages that really are in the chosen language.

The catalog test extracts the strings itself, from the source (babel.cfg: Python, templates, scripts), so a
string marked today and not yet translated fails it; ``bench/i18n_catalogs.py`` refreshes the catalogs.
"""

from __future__ import annotations

import html
import json
import re
from configparser import ConfigParser
from html.parser import HTMLParser
from pathlib import Path
from typing import Any

import pytest
from babel import Locale
from babel.messages.extract import extract_from_dir
from babel.messages.pofile import read_po

from picpeak_lite import i18n
from picpeak_lite.services import Services
from picpeak_lite.web.app import create_app
from picpeak_lite.web.locale import LANG_COOKIE

from .conftest import ADMIN_PASSWORD, AuthActions, own_services
from .factories import add_photo, published

ROOT = Path(__file__).resolve().parent.parent
TRANSLATED = [code for code in i18n.LANGUAGES if code != i18n.DEFAULT_LOCALE]
PLACEHOLDER = re.compile(r"%\((\w+)\)[sdr]")
KEYWORDS = {"_": None, "gettext": None, "ngettext": (1, 2), "N_": None}


def extracted() -> dict[str, tuple[str, ...]]:
    """Every marked string in the source, as ``pybabel extract -F babel.cfg`` finds it: msgid -> its ids."""
    config = ConfigParser()
    config.read(ROOT / "babel.cfg")
    method_map = []
    for section in config.sections():
        method, pattern = (part.strip() for part in section.split(":", 1))
        method_map.append((pattern, method))
    found: dict[str, tuple[str, ...]] = {}
    for _filename, _lineno, message, _comments, _context in extract_from_dir(
            str(ROOT), method_map, keywords=KEYWORDS):
        ids = message if isinstance(message, tuple) else (message,)
        if ids[0]:
            found[ids[0]] = tuple(i for i in ids if i)
    return found


def catalog(code: str) -> Any:
    with i18n.catalog_path(code).open("rb") as fp:
        return read_po(fp, locale=code)


def test_extraction_finds_strings_from_python_templates_and_scripts() -> None:
    found = extracted()
    # One from each kind of source, so that a broken babel.cfg section cannot pass as "nothing to translate".
    assert "Please give the gallery a name." in found  # Python (N_)
    assert "Download all" in found  # templates
    assert "The gallery has changed." in found  # static/gallery.js
    assert found["%(num)d photo"] == ("%(num)d photo", "%(num)d photos")
    print(f"i18n: {len(found)} strings, {len(TRANSLATED)} languages besides English")


def test_the_shipped_template_is_current() -> None:
    """The server finds the scripts' strings through messages.pot: it must list exactly what the source marks."""
    with (i18n.LOCALES_DIR / "messages.pot").open("rb") as fp:
        template = read_po(fp)
    shipped = {m.id if isinstance(m.id, str) else m.id[0] for m in template if m.id}
    assert shipped == set(extracted()), "run bench/i18n_catalogs.py"


@pytest.mark.parametrize("code", TRANSLATED)
def test_every_string_is_translated_with_the_same_placeholders(code: str) -> None:
    messages = catalog(code)
    untranslated, wrong = [], []
    for msgid, ids in extracted().items():
        entry = messages.get(msgid)
        forms = () if entry is None else entry.string if isinstance(entry.string, tuple) else (entry.string,)
        if entry is None or entry.fuzzy or not forms or not all(forms):
            untranslated.append(msgid)
            continue
        wanted = set().union(*(PLACEHOLDER.findall(i) for i in ids))
        for index, form in enumerate(forms):
            have = set(PLACEHOLDER.findall(form))
            # The form for exactly one (or none) may say "the last day" instead of "the last 1 day".
            optional = {"num"} if len(ids) == 2 and index == 0 and _form_is_one(code) else set()
            if not (wanted - optional <= have <= wanted):
                wrong.append((msgid, form))
        if "%%" in msgid and not all("%%" in form for form in forms):
            wrong.append((msgid, "a literal %% is missing"))
    assert untranslated == [], f"{code}: {len(untranslated)} untranslated, e.g. {untranslated[:5]}"
    assert wrong == [], f"{code}: placeholders differ: {wrong[:5]}"


def _form_is_one(code: str) -> bool:
    """Whether a language's first plural form is used only for 0 and 1 (not 21, 31 as in Russian)."""
    return all(i18n._form_index(code, n) != 0 for n in range(2, 1000))


@pytest.mark.parametrize("code", TRANSLATED)
def test_plural_forms_follow_cldr(code: str) -> None:
    """The header's nplurals is what Babel's CLDR data says for the language, and every plural entry has all of
    them; the forms are picked by the catalog's own rule (Russian: 1, 2-4, 5-20, 21...)."""
    messages = catalog(code)
    from babel.messages.plurals import get_plural

    expected = get_plural(code)
    assert messages.num_plurals == expected.num_plurals
    assert messages.plural_expr == expected.plural_expr
    short = [m.id for m in messages if m.id and isinstance(m.id, tuple) and len(m.string) != expected.num_plurals]
    assert short == []
    with i18n.use_locale(code):
        counted = [i18n.ngettext("%(num)d photo", "%(num)d photos", n) % {"num": n} for n in (1, 3, 5, 21, 22, 25)]
    print(f"i18n plural {code}: {' / '.join(counted)}")
    if code == "ru":
        assert counted == ["1 фотография", "3 фотографии", "5 фотографий", "21 фотография", "22 фотографии",
                           "25 фотографий"]
    assert i18n._plural_categories(code)["one"] == 0
    # Every CLDR category the browser may answer for a count (a whole number) has a form.
    rule = Locale.parse(code).plural_form
    categories = {rule(n) for n in (*range(0, 1000), 1_000_000, 3_000_000)}
    assert categories <= set(i18n._plural_categories(code))


def test_choose_order_picker_then_gallery_then_browser_then_default() -> None:
    assert i18n.choose(picked="nl", gallery="de", accepted=["fr"], default="it") == "nl"
    assert i18n.choose(picked=None, gallery="de", accepted=["fr"], default="it") == "de"
    assert i18n.choose(picked=None, gallery=None, accepted=["fr-CA", "en"], default="it") == "fr"
    assert i18n.choose(picked=None, gallery=None, accepted=["ja"], default="it") == "it"
    # What we do not speak falls through: a forged cookie, a region we know the language of, nothing at all.
    assert i18n.choose(picked="xx", gallery=None, accepted=["pt-BR"], default="it") == "pt"
    assert i18n.choose(picked=None, gallery=None, accepted=[], default="xx") == "en"


class Text(HTMLParser):
    """What a person reads or hears on a page: text outside <script>, and the labels of things."""

    def __init__(self) -> None:
        super().__init__()
        self.chunks: list[str] = []
        self.lang: str | None = None
        self._skip = 0

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        found = dict(attrs)
        if tag == "html":
            self.lang = found.get("lang")
        if tag in ("script", "style", "template"):
            self._skip += 1
        for name in ("aria-label", "title", "alt", "placeholder", "data-confirm", "content"):
            if found.get(name) and not (tag == "meta" and found.get("name") in ("viewport", "csrf-token",
                                                                                "color-scheme", "robots")):
                self.chunks.append(found[name] or "")

    def handle_endtag(self, tag: str) -> None:
        if tag in ("script", "style", "template"):
            self._skip -= 1

    def handle_data(self, data: str) -> None:
        if not self._skip and data.strip():
            self.chunks.append(data)


def read(page: str) -> Text:
    parser = Text()
    parser.feed(page)
    return parser


def english_left(page: str, code: str) -> list[str]:
    """The catalog's English sentences still on a page rendered in ``code``: every msgid (without placeholders)
    that the language translates differently, found as a whole text or label."""
    messages = catalog(code)
    english = {m.id for m in messages if isinstance(m.id, str) and m.id and not PLACEHOLDER.search(m.id)
               and m.string and m.string != m.id and len(m.id) > 2}
    texts = {" ".join(html.unescape(chunk).split()) for chunk in read(page).chunks}
    return sorted(english & texts)


async def test_a_gallery_in_german_has_no_english_left(app: Any, admin: AuthActions, services: Services) -> None:
    gallery = await published(admin, name="Anna & Ben", language="de", allow_guest_uploads=True,
                              favourite_limit=3)
    add_photo(services, gallery["id"], taken_at="2024-06-20T14:03:00")
    guest = app.test_client()
    for path in (f"/g/{gallery['slug']}", f"/g/{gallery['slug']}?favourites=1", f"/g/{gallery['slug']}/upload"):
        page = await (await guest.get(path)).get_data(as_text=True)
        assert read(page).lang == "de"
        assert english_left(page, "de") == [], path
    page = await (await guest.get(f"/g/{gallery['slug']}")).get_data(as_text=True)
    assert "Alle herunterladen" in page and "Foto, aufgenommen am 20. Juni 2024, 14:03" in page
    # The scripts' strings come with the page, in German, as data (the policy runs no inline script).
    block = re.search(r'<script type="application/json" id="i18n">(.*?)</script>', page, re.S)
    assert block is not None
    data = json.loads(block.group(1))
    assert data["lang"] == "de" and data["strings"]["The gallery has changed."] == "Die Galerie hat sich geändert."
    assert data["strings"]["%(num)d new photo"] == ["%(num)d neues Foto", "%(num)d neue Fotos"]


async def test_admin_pages_in_russian_have_no_english_left(client: Any, admin: AuthActions) -> None:
    gallery = await published(admin, name="Свадьба", guest_photos_need_approval=True, allow_guest_uploads=True)
    await client.get("/lang/ru?next=/admin/")  # the admin picks Russian on the page
    for path in ("/admin/", f"/admin/galleries/{gallery['id']}", f"/admin/galleries/{gallery['id']}/edit",
                 "/admin/settings/", "/admin/password"):
        response = await client.get(path)
        page = await response.get_data(as_text=True)
        assert response.status_code == 200 and read(page).lang == "ru", path
        assert english_left(page, "ru") == [], path


async def test_language_comes_from_picker_then_gallery_then_browser_then_default(tmp_path: Any) -> None:
    """Through the app: the same gallery page, asked for by four browsers, on an install whose default is
    Italian."""
    with own_services(tmp_path, default_language="it") as svc:
        from picpeak_lite.ops import bootstrap

        bootstrap.ensure_admin(svc.settings, {"PICPEAK_ADMIN_PASSWORD": ADMIN_PASSWORD})
        app = create_app(svc)
        admin = AuthActions(app.test_client())
        assert (await admin.login()).status_code == 302
        german = await published(admin, name="Hochzeit", language="de")
        plain = await published(admin, name="Party")

        async def lang(path: str, cookie: str | None = None, accept: str | None = None) -> str | None:
            browser = app.test_client()
            if cookie:
                browser.set_cookie("localhost", LANG_COOKIE, cookie)
            headers = {"Accept-Language": accept} if accept else {}
            page = await (await browser.get(path, headers=headers)).get_data(as_text=True)
            return read(page).lang

        g, p = f"/g/{german['slug']}", f"/g/{plain['slug']}"
        assert await lang(g, cookie="nl", accept="fr") == "nl"  # the visitor's own choice first
        assert await lang(g, accept="fr") == "de"  # then the photographer's language for the gallery
        assert await lang(p, accept="fr-CH, en;q=0.5") == "fr"  # then the browser's
        assert await lang(p, accept="ja") == "it"  # then the install's default
        assert await lang(p) == "it"
        # The expired and password pages are the gallery's too.
        locked = await published(admin, name="Geheim", language="de", password="geheim123")
        page = await (await app.test_client().get(f"/g/{locked['slug']}")).get_data(as_text=True)
        assert read(page).lang == "de" and "Diese Galerie ist geschützt." in page


async def test_picker_remembers_the_choice_and_goes_back_only_to_this_site(client: Any) -> None:
    response = await client.get("/lang/ru?next=/g/abc?sort=taken")
    assert response.status_code == 302 and response.headers["Location"] == "/g/abc?sort=taken"
    cookie = response.headers["Set-Cookie"]
    assert f"{LANG_COOKIE}=ru" in cookie and "HttpOnly" in cookie and "SameSite=Lax" in cookie
    for bad in ("//evil.example/", "/\\evil.example", "https://evil.example/", ""):
        answer = await client.get("/lang/de", query_string={"next": bad})
        assert answer.headers["Location"] == "/", bad
    assert (await client.get("/lang/xx")).status_code == 404
    page = await (await client.get("/admin/login")).get_data(as_text=True)
    assert read(page).lang == "de" and "Anmelden" in page


async def test_errors_are_said_in_the_visitors_language(client: Any, admin: AuthActions) -> None:
    await client.get("/lang/fr")
    missing = await client.get("/g/nothing-here", headers={"Accept": "application/json"})
    assert missing.status_code == 404
    assert (await missing.get_json())["error"] == "Il n'y a pas de galerie à cette adresse."
    invalid = await client.post("/api/admin/galleries", json={"name": ""}, headers=admin.headers())
    assert (await invalid.get_json())["fields"]["name"] == "Veuillez donner un nom à la galerie."


def test_dates_numbers_and_sizes_follow_the_language() -> None:
    cases = {"en": ("20 June 2026", "12,345", "3.6\xa0MB"), "de": ("20. Juni 2026", "12.345", "3,6\xa0MB"),
             "ru": ("20 июня 2026\u202fг.", "12\xa0345", "3,6\xa0МБ"),
             "fr": ("20 juin 2026", "12\u202f345", "3,6\u202fMo")}
    for code, (day, number, size) in cases.items():
        with i18n.use_locale(code):
            assert (i18n.format_date("2026-06-20"), i18n.format_number(12345),
                    i18n.format_size(3.64e6, base=1000)) == (day, number, size), code


# Text in templates that is not a sentence to translate: block contents that are class names, an example
# address, the name of a WCAG level, product and format names.
NOT_PROSE = {"admin", "guest", 'class="theme- "', "https://example.com/hooks/picpeak", "AA",
             'aria-invalid="true" aria-describedby=" -error"'}
PROPER_NAMES = {"PicPeak", "CSV", "URL", "PNG", "JPEG", "WebP", "HEIC", "MP4", "MOV", "WebM"}
LABELS = re.compile(r'\b(aria-label|title|alt|placeholder|data-confirm|data-msg-[\w-]+)="([^"]*)"')


def unmarked_text(template: str) -> list[str]:
    """Words a person would read that a template writes as they are, outside ``{{ _(...) }}``: text between
    tags and the labels of things. Catches a string added without marking, which the catalog test cannot see."""
    text = re.sub(r"\{#.*?#\}", " ", template, flags=re.S)
    text = re.sub(r"<script\b.*?</script>|<style\b.*?</style>", " ", text, flags=re.S)
    found = [m.group(2) for m in LABELS.finditer(text)
             if re.search(r"[A-Za-z]{3,}", re.sub(r"\{\{.*?\}\}|\{%.*?%\}", " ", m.group(2), flags=re.S))]
    body = re.sub(r"\{\{.*?\}\}|\{%.*?%\}", " ", text, flags=re.S)
    body = re.sub(r"&\w+;|&#\d+;", " ", re.sub(r"<[^>]*>", " ", body, flags=re.S))
    for chunk in re.split(r"\s{2,}|\n", body):
        if [w for w in re.findall(r"[A-Za-z][A-Za-z']+", chunk) if w not in PROPER_NAMES]:
            found.append(chunk.strip())
    return [f for f in found if f not in NOT_PROSE and not f.startswith("{{")]


def test_templates_write_no_unmarked_text() -> None:
    problems = {str(path.relative_to(ROOT)): found for path in sorted((ROOT / "templates").rglob("*.html"))
                if (found := unmarked_text(path.read_text()))}
    assert problems == {}, "mark these with _() (docs/architecture.md, Languages)"
