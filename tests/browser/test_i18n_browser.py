"""The guest walk in German and Russian on a phone (390 x 844): the gallery, the lightbox and the upload page in
the visitor's language, nothing clipped, and axe-core clean (issue 32). German comes from the gallery's own
language, Russian from the language picker on the page. Screenshots: ``test-artifacts/test_guest_walk_in_*``."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from .. import imagefactory
from .conftest import LiveServer, api_client, page_at, start_server, stop_server, wait_processed
from .test_a11y_browser import AXE_OPTIONS

PHONE = (390, 844)
# Elements whose text would be cut off by their box (the lightbox's symbols and the visually hidden labels aside).
CLIPPED = """() => [...document.querySelectorAll('button, a.button, a.chip, label, summary, h1, p, span, dt, dd')]
  .filter((e) => e.offsetParent !== null && !e.closest('.visually-hidden') && !e.classList.contains('visually-hidden')
                 && e.textContent.trim().length > 1
                 && (e.scrollWidth > e.clientWidth + 1 || e.getBoundingClientRect().right > window.innerWidth + 1))
  .map((e) => e.tagName + '.' + e.className + ': ' + e.textContent.trim().slice(0, 40))"""
# Characters drawn as the missing-glyph box are not visible to the DOM, so the check is that the page's own text
# uses the script it should (Cyrillic for Russian) and that the page's fonts can draw it (document.fonts.check).
CAN_DRAW = "(text) => document.fonts.check('16px system-ui', text)"


@pytest.fixture(scope="module")
def server(tmp_path_factory: Any) -> Iterator[LiveServer]:
    live = start_server(tmp_path_factory.mktemp("i18n") / "data")
    yield live
    stop_server(live)


@pytest.fixture(scope="module")
def galleries(server: LiveServer) -> dict[str, str]:
    for api in api_client(server):
        slugs = {}
        for key, language in (("de", "de"), ("ru", None)):
            made = api.post("/api/admin/galleries", json={
                "name": "Anna & Ben", "allow_guest_uploads": True, "favourite_limit": 5,
                **({"language": language} if language else {})}).json()
            api.post(f"/api/admin/galleries/{made['id']}/publish")
            files = [("photos", (f"p{i}.jpg", imagefactory.save(imagefactory.photo(600, 400 + 100 * i, seed=i),
                                                                "jpeg"))) for i in range(3)]
            upload = api.post(f"/api/admin/galleries/{made['id']}/upload", files=files).json()
            wait_processed(api, upload["upload_id"])
            slugs[key] = made["slug"]
        return slugs
    raise AssertionError("no API client")


def axe(page: Any, name: str) -> list[str]:
    from axe_playwright_python.sync_playwright import Axe

    results = Axe().run(page.page, options=AXE_OPTIONS)
    return [f"{name}: {v['id']} ({v['impact']}) at {[n['target'] for n in v['nodes']][:3]}: {v['help']}"
            for v in results.response["violations"]]


WORDS = {
    "de": {"download": "Alle herunterladen", "next": "Nächstes Foto", "drop": "Legen Sie Ihre Fotos hier ab",
           "choose": "Fotos auswählen"},
    "ru": {"download": "Скачать все", "next": "Следующее фото", "drop": "Перетащите сюда свои фотографии",
           "choose": "Выбрать фотографии"},
}


@pytest.mark.parametrize("language", ["de", "ru"])
def test_guest_walk_in_german_and_russian_on_a_phone(server: LiveServer, galleries: dict[str, str], browser: Any,
                                                     request: Any, language: str) -> None:
    words = WORDS[language]
    problems: list[str] = []
    with page_at(browser, request, PHONE) as page:
        page.goto(f"{server.url}/g/{galleries[language]}")
        if language == "ru":
            # The picker: open it, choose Russian; the choice is remembered for the next pages.
            page.click("details.lang-picker summary")
            page.click("details.lang-picker a[lang=ru]")
            page.wait_for_function("() => document.documentElement.lang === 'ru'")
        assert page.evaluate("() => document.documentElement.lang") == language
        assert page.locator("#download-all").inner_text() == words["download"]
        problems += [f"gallery: clipped {c}" for c in page.evaluate(CLIPPED)]
        problems += axe(page, "gallery")
        assert page.evaluate(CAN_DRAW, page.locator("body").inner_text())
        page.screenshot(f"{language}-gallery")

        page.click("#grid .tile-link >> nth=0")
        box = page.locator("#lightbox")
        box.wait_for(state="visible")
        assert page.locator("#lightbox .lb-next").get_attribute("aria-label") == words["next"]
        page.wait_for_function("() => document.getElementById('lb-img').complete")
        page.screenshot(f"{language}-lightbox")
        page.keyboard.press("Escape")

        page.goto(f"{server.url}/g/{galleries[language]}/upload")
        assert page.evaluate("() => document.documentElement.lang") == language
        assert page.locator(".drop-title").inner_text() == words["drop"]
        assert words["choose"] in page.locator("#drop label.button").inner_text()
        # A file chosen: the script's own strings (upload-queue.js, guest-upload.js) are in the language too.
        page.set_input_files("#file-input", files=[{
            "name": "mine.jpg", "mimeType": "image/jpeg",
            "buffer": imagefactory.save(imagefactory.photo(500, 400, seed=9), "jpeg")}])
        page.wait_for_function("() => document.querySelector('#files .file.is-done') !== null", timeout=120_000)
        summary = page.locator("#summary").inner_text()
        assert ("1 von 1 fertig" if language == "de" else "Готово 1 из 1") in summary, summary
        problems += [f"upload: clipped {c}" for c in page.evaluate(CLIPPED)]
        problems += axe(page, "upload")
        page.screenshot(f"{language}-upload")
    assert problems == [], "\n".join(problems)
