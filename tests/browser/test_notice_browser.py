"""The live "N new photos" notice on the guest gallery: its Show button must be readable (issue 12, point 16:
it was white on white), in the light and the dark colour scheme. Screenshots go to test-artifacts/."""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from .. import imagefactory
from .conftest import LiveServer, api_client, new_page, start_server, stop_server


@pytest.fixture(scope="module")
def server(tmp_path_factory: Any) -> Iterator[LiveServer]:
    live = start_server(tmp_path_factory.mktemp("notice") / "data")
    yield live
    stop_server(live)


@pytest.fixture(scope="module")
def api(server: LiveServer) -> Iterator[httpx.Client]:
    yield from api_client(server)


def upload(api: httpx.Client, gallery_id: int, seed: int) -> None:
    data = imagefactory.save(imagefactory.photo(900, 600, seed=seed), "jpeg")
    response = api.post(f"/api/admin/galleries/{gallery_id}/upload", files=[("photos", ("p.jpg", data, "image/jpeg"))])
    assert response.status_code == 202, response.text
    while not api.get(f"/api/admin/uploads/{response.json()['upload_id']}").json()["done"]:
        time.sleep(0.1)


# WCAG relative luminance and contrast ratio of two computed "rgb(r, g, b)" colours.
CONTRAST_JS = """(el) => {
  const rgb = (s) => s.match(/[\\d.]+/g).slice(0, 3).map(Number);
  const lum = ([r, g, b]) => {
    const f = (c) => { c /= 255; return c <= 0.03928 ? c / 12.92 : ((c + 0.055) / 1.055) ** 2.4; };
    return 0.2126 * f(r) + 0.7152 * f(g) + 0.0722 * f(b);
  };
  const ratio = (a, b) => {
    const [x, y] = [lum(rgb(a)), lum(rgb(b))].sort((p, q) => q - p);
    return (x + 0.05) / (y + 0.05);
  };
  const button = getComputedStyle(el);
  const pill = getComputedStyle(el.parentElement);
  return {text: ratio(button.color, button.backgroundColor), edge: ratio(button.backgroundColor, pill.backgroundColor)};
}"""


@pytest.mark.parametrize("scheme", ["light", "dark"])
def test_new_photos_notice_show_button_is_readable(server: LiveServer, api: httpx.Client, browser: Any,
                                                   request: Any, scheme: str) -> None:
    created = api.post("/api/admin/galleries", json={"name": f"Notice {scheme}"})
    assert created.status_code == 201, created.text
    gallery = created.json()
    upload(api, gallery["id"], seed=1)
    assert api.post(f"/api/admin/galleries/{gallery['id']}/publish").status_code == 200
    for page in new_page(browser, request, viewport={"width": 1280, "height": 900}, color_scheme=scheme):
        page.goto(f"{server.url}/g/{gallery['slug']}")
        page.wait_for_selector("#grid")
        upload(api, gallery["id"], seed=2)
        button = page.wait_for_selector("#new-photos:not([hidden]) .button")
        page.screenshot(f"notice-{scheme}")
        contrast = button.evaluate(CONTRAST_JS)
        assert contrast["text"] >= 4.5, contrast  # WCAG AA for normal text
        assert contrast["edge"] >= 1.5, contrast  # the button stands out from the pill around it
        button.click()
        page.wait_for_selector("#new-photos[hidden]", state="attached")
