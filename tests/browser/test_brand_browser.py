"""A studio's brand in a real browser (issue 33): the photographer sets a brand on the settings page (name, logo,
accent colours, fonts, cover layout, white label, custom CSS), and a gallery in that brand is looked at in two
themes (light, dark) at desktop (1440 x 900) and phone (390 x 844) size: the brand's colours and fonts are in
force, no "PicPeak" is readable, nothing overflows, axe-core finds no WCAG A/AA violation (contrast included)
with the custom colours. Screenshots in test-artifacts/."""

from __future__ import annotations

import io
from collections.abc import Iterator
from typing import Any

import pytest
from PIL import Image, ImageDraw

from .. import imagefactory
from .conftest import LiveServer, admin_login, api_client, page_at, start_server, stop_server, wait_processed
from .test_a11y_browser import AXE_OPTIONS

SIZES = {"desktop": (1440, 900), "phone": (390, 844)}
# Two studios: one on a light theme with a split cover, one on a dark theme with the full-bleed cover.
BRANDS = {
    "light": {"studio_name": "Lumen Studio", "accent": "#9a3d18", "accent_dark": "#f0a77f", "font_body": "inter",
              "font_heading": "garamond", "theme": "light", "cover_layout": "split",
              "custom_css": ".hero h1 { letter-spacing: .06em; }", "logo": (154, 61, 24)},
    "dark": {"studio_name": "Nordlicht Fotografie", "accent": "#1f5f73", "accent_dark": "#7fd3c8",
             "font_body": "garamond", "font_heading": "inter", "theme": "dark", "cover_layout": "full",
             "custom_css": ".studio-bar { letter-spacing: .12em; }", "logo": (127, 211, 200)},
}


@pytest.fixture(scope="module")
def server(tmp_path_factory: Any) -> Iterator[LiveServer]:
    live = start_server(tmp_path_factory.mktemp("brand") / "data")
    yield live
    stop_server(live)


@pytest.fixture(scope="module")
def gallery(server: LiveServer) -> dict[str, Any]:
    for api in api_client(server):
        made = api.post("/api/admin/galleries", json={"name": "Anna & Ben", "event_date": "2026-06-20",
                                                      "welcome_message": "Thank you for celebrating with us!"}).json()
        made = {**made, **api.post(f"/api/admin/galleries/{made['id']}/publish").json()}
        files = [("photos", (f"p{i}.jpg", imagefactory.save(imagefactory.photo(900, 600 + 150 * (i % 3), seed=i),
                                                             "jpeg"))) for i in range(6)]
        wait_processed(api, api.post(f"/api/admin/galleries/{made['id']}/upload", files=files).json()["upload_id"])
        return made
    raise AssertionError("no API client")


def logo_png(name: str, colour: tuple[int, int, int]) -> bytes:
    """A studio's wordmark: its initial in a ring and a bar, on transparency."""
    image = Image.new("RGBA", (480, 160), (0, 0, 0, 0))
    draw = ImageDraw.Draw(image)
    draw.ellipse((8, 8, 152, 152), outline=(*colour, 255), width=10)
    draw.text((52, 30), name[0], fill=(*colour, 255), font_size=96)
    draw.rounded_rectangle((180, 62, 470, 98), radius=18, fill=(*colour, 255))
    out = io.BytesIO()
    image.save(out, "PNG")
    return out.getvalue()


def set_brand(page: Any, server: LiveServer, theme: str, tmp_path: Any) -> None:
    """Through the settings page, as the photographer does it."""
    brand = BRANDS[theme]
    admin_login(page, server)
    page.goto(server.url + "/admin/settings/#brand")
    form = page.locator("#brand-form")
    for name in ("studio_name", "accent", "accent_dark"):
        form.locator(f"input[name={name}]").fill(str(brand[name]))
    for name in ("font_body", "font_heading", "theme", "cover_layout"):
        form.locator(f"select[name={name}]").select_option(str(brand[name]))
    form.locator("textarea[name=custom_css]").fill(str(brand["custom_css"]))
    form.locator("input[name=white_label]").check()
    logo = tmp_path / f"{theme}-logo.png"
    logo.write_bytes(logo_png(str(brand["studio_name"]), brand["logo"]))  # type: ignore[arg-type]
    form.locator("input[name=brand_logo]").set_input_files(str(logo))
    form.locator("button[type=submit]").click()
    page.wait_for_url("**saved=brand**")
    assert page.locator(".contrast-warning").count() == 0, page.locator(".contrast-warning").all_inner_texts()
    page.screenshot(f"{theme}-settings")


VISIBLE = """() => document.title + ' ' + document.body.innerText"""
LOOK = """() => {
  const root = getComputedStyle(document.documentElement);
  const h1 = document.querySelector('.hero h1');
  return {accent: root.getPropertyValue('--accent').trim(), bg: root.getPropertyValue('--bg').trim(),
          heading: getComputedStyle(h1).fontFamily, spacing: getComputedStyle(h1).letterSpacing,
          body: getComputedStyle(document.body).fontFamily,
          logo: document.querySelector('.studio-logo') ? document.querySelector('.studio-logo').naturalWidth : 0,
          overflow: document.documentElement.scrollWidth - document.documentElement.clientWidth,
          fonts: [...document.fonts].filter(f => f.status === 'loaded').map(f => f.family)};
}"""


@pytest.mark.parametrize("theme", list(BRANDS))
def test_branded_gallery_in_two_themes(server: LiveServer, gallery: dict[str, Any], browser: Any, request: Any,
                                       theme: str, tmp_path: Any) -> None:
    from axe_playwright_python.sync_playwright import Axe

    brand = BRANDS[theme]
    with page_at(browser, request, SIZES["desktop"]) as admin:
        set_brand(admin, server, theme, tmp_path)
    problems: list[str] = []
    for size, viewport in SIZES.items():
        with page_at(browser, request, viewport) as page:
            page.goto(server.url + f"/g/{gallery['slug']}")
            page.wait_for_function("document.fonts.status === 'loaded'")
            look = page.evaluate(LOOK)
            expected_bg = {"light": "#fafaf8", "dark": "#121214"}[theme]
            expected_accent = brand["accent"] if theme == "light" else brand["accent_dark"]
            if look["accent"] != expected_accent or look["bg"] != expected_bg:
                problems.append(f"{size}: colours {look['accent']} on {look['bg']}")
            heading_family = "EB Garamond" if brand["font_heading"] == "garamond" else "Inter"
            if heading_family not in look["heading"] or heading_family not in look["fonts"]:
                problems.append(f"{size}: heading font {look['heading']}, loaded {look['fonts']}")
            if theme == "light" and look["spacing"] in ("normal", "0px"):
                problems.append(f"{size}: the custom CSS is not in force (letter-spacing {look['spacing']})")
            if not look["logo"] or look["overflow"] > 0:
                problems.append(f"{size}: logo {look['logo']} px, overflow {look['overflow']} px")
            if "picpeak" in page.evaluate(VISIBLE).lower():
                problems.append(f"{size}: 'PicPeak' is visible under white label")
            for violation in Axe().run(page.page, options=AXE_OPTIONS).response["violations"]:
                targets = [node["target"] for node in violation["nodes"]][:3]
                problems.append(f"{size}: {violation['id']} at {targets}: {violation['help']}")
            page.screenshot(f"{size}")
            if size == "desktop":
                page.goto(server.url + "/admin/login")
                page.screenshot("login")
                logo_fits = page.evaluate("""() => document.querySelector('.studio-logo').getBoundingClientRect().right
                                            <= document.querySelector('.card').getBoundingClientRect().right""")
                if not logo_fits:
                    problems.append("login: the logo runs out of its card")
                if "picpeak" in page.evaluate(VISIBLE).lower():
                    problems.append("login: 'PicPeak' is visible under white label")
    print(f"figures: brand={theme} sizes={len(SIZES)} problems={len(problems)}")
    assert problems == [], "\n".join(problems)
