"""A studio's brand (issue 33): the settings' checks (colours, custom CSS, logo re-encoding, SVG refused), the
brand on the guest pages (white label: no "picpeak" a guest can read), the CSP unchanged by custom CSS, the
contrast warning, per-gallery theme and cover layout, and the email context."""

from __future__ import annotations

import html
import io
import json
import re
from typing import Any

import pytest
from PIL import Image, PngImagePlugin
from werkzeug.datastructures import FileStorage, MultiDict

from picpeak_lite.domain import brand as brand_rules
from picpeak_lite.store import db
from picpeak_lite.web.app import content_security_policy

from . import imagefactory
from .conftest import AuthActions
from .factories import published

GOOD = {"studio_name": "Lumen Studio", "accent": "#8A3B12", "accent_dark": "#f0b48c", "font_body": "inter",
        "font_heading": "garamond", "theme": "light", "cover_layout": "split", "custom_css": ""}


def stored(services: Any) -> brand_rules.Brand:
    conn = db.connect(services.settings.database_path)
    try:
        return brand_rules.load(conn, services.settings)
    finally:
        conn.close()


async def save(admin: AuthActions, files: MultiDict[str, Any] | None = None, **fields: Any) -> Any:
    form = {"csrf_token": admin.csrf, **GOOD, **fields}
    form = {k: v for k, v in form.items() if v is not None}
    return await admin.client.post("/admin/settings/brand", form=form, files=files)


def visible_text(page: str) -> str:
    """What a guest can read: the title and the body's text, without tags, scripts, styles or attributes."""
    page = re.sub(r"<(script|style|template)\b.*?</\1>", " ", page, flags=re.S | re.I)
    title = re.search(r"<title>(.*?)</title>", page, re.S)
    body = re.sub(r"<[^>]+>", " ", page.split("<body", 1)[1])
    return html.unescape((title.group(1) if title else "") + " " + body)


@pytest.mark.parametrize("colour", ["#abc", "red", "#12345g", "#1234567", "rgb(1,2,3)", "#12 456"])
def test_colours_must_be_six_hex_digits(colour: str) -> None:
    _brand, errors, typed = brand_rules.parse_form({**GOOD, "accent": colour})
    assert list(errors) == ["accent"] and "#2f6f5e" in errors["accent"]
    assert typed["accent"] == colour  # shown again as typed


def test_a_good_form_is_kept_lower_case() -> None:
    chosen, errors, _typed = brand_rules.parse_form({**GOOD, "white_label": "on"})
    assert errors == {}
    assert chosen.accent == "#8a3b12" and chosen.white_label and chosen.font_heading == "garamond"


@pytest.mark.parametrize(("css", "says"), [
    ("@import url(/static/app.css);", "@import"),
    ("@\\69mport '/x.css';", "@import"),  # an escaped @import is still one
    ("@im/**/port '/x.css';", None),  # a comment splits the keyword: the browser reads no @import (kept)
    ("body { background: url(https://evil.example/x.png) }", "url()"),
    ("body { background: url('//evil.example/x.png') }", "url()"),
    ("body { background: url(data:image/png;base64,AAAA) }", "url()"),
    ("body { background: u\\72l(https://evil.example/x.png) }", "url()"),
    ("body { background: image-set('https://evil.example/x.png' 1x) }", "//"),
    ("p { width: expression(alert(1)) }", "expression()"),
    ("p { width: EXPRESSION /**/ (alert(1)) }", "expression()"),
    ("a { background: url(javascript:alert(1)) }", "javascript:"),
    ("p { behavior: url(/x.htc) }", "behavior"),
    ("p { -moz-binding: url(/x.xml#x) }", "-moz-binding"),
    ("</style><script>alert(1)</script>", "<"),
    ("p { color: red }\x00", "control characters"),
    ("p{}" + " " * brand_rules.CSS_MAX_BYTES, "at most"),
])
def test_custom_css_refusals(css: str, says: str | None) -> None:
    if says is None:
        assert brand_rules.check_css(css) == css
        return
    with pytest.raises(brand_rules.Invalid) as refused:
        brand_rules.check_css(css)
    assert says in str(refused.value)


def test_custom_css_that_only_styles_is_kept() -> None:
    css = ".hero h1 { letter-spacing: .1em; color: var(--accent); background: url(/static/favicon.svg) }"
    assert brand_rules.check_css(css) == css


async def test_settings_save_and_errors(admin: AuthActions, services: Any) -> None:
    bad = await save(admin, accent="#abcd", custom_css="@import url(https://fonts.example/x.css);")
    text = await bad.get_data(as_text=True)
    assert bad.status_code == 400
    assert "@import is not allowed" in text and "#abcd" in text and "@import url(https://fonts.example" in text
    assert stored(services) == brand_rules.Brand()  # nothing saved from a refused form
    ok = await save(admin, custom_css=".hero h1 { letter-spacing: .2em }", white_label="on")
    assert ok.status_code == 302
    now = stored(services)
    assert now.studio_name == "Lumen Studio" and now.white_label and now.cover_layout == "split"
    assert (await admin.client.post("/admin/settings/brand", form=GOOD)).status_code == 403  # no CSRF token


def logo_files(data: bytes, name: str = "logo.png") -> MultiDict[str, Any]:
    return MultiDict({"brand_logo": FileStorage(io.BytesIO(data), filename=name, content_type="image/png")})


async def test_logo_is_re_encoded_and_never_served_as_uploaded(admin: AuthActions, guest: Any,
                                                                services: Any) -> None:
    image = imagefactory.marked(1600, 400).convert("RGBA")
    info = PngImagePlugin.PngInfo()
    info.add_text("Comment", "secret text chunk")
    buffer = io.BytesIO()
    image.save(buffer, "PNG", pnginfo=info)
    uploaded = buffer.getvalue() + b"<script>alert(1)</script>"  # a polyglot's tail after IEND
    assert (await save(admin, files=logo_files(uploaded))).status_code == 302
    served = await admin.client.get(f"/brand/logo.png?v={stored(services).logo_version}")
    data = await served.get_data()
    assert served.status_code == 200 and served.mimetype == "image/png"
    assert data != uploaded and b"secret text chunk" not in data and b"<script" not in data
    with Image.open(io.BytesIO(data)) as logo:
        assert logo.format == "PNG" and logo.mode == "RGBA"
        assert logo.size == (brand_rules.LOGO_MAX_SIDE, brand_rules.LOGO_MAX_SIDE // 4)
        assert not logo.text
    page = await guest.get("/admin/login")
    assert page.status_code == 200 and 'class="studio-logo"' in await page.get_data(as_text=True)
    removed = await save(admin, remove_brand_logo="on")
    assert removed.status_code == 302 and (await admin.client.get("/brand/logo.png")).status_code == 404


@pytest.mark.parametrize("svg", [
    b'<svg xmlns="http://www.w3.org/2000/svg"><script>alert(1)</script></svg>',
    b'<?xml version="1.0"?>\n<svg xmlns="http://www.w3.org/2000/svg" width="10" height="10"/>',
    b'\xef\xbb\xbf  <!-- made by hand --><svg xmlns="http://www.w3.org/2000/svg"/>',
])
async def test_svg_logo_is_refused(admin: AuthActions, services: Any, svg: bytes) -> None:
    answer = await save(admin, files=logo_files(svg, "logo.svg"))
    assert answer.status_code == 400
    assert "SVG logos are not accepted" in await answer.get_data(as_text=True)
    assert not brand_rules.logo_path(services.settings).exists() and stored(services) == brand_rules.Brand()


async def test_not_an_image_is_refused(admin: AuthActions, services: Any) -> None:
    answer = await save(admin, files=logo_files(b"GIF89a not really", "logo.gif"))
    assert answer.status_code == 400 and 'id="brand_logo-error"' in await answer.get_data(as_text=True)
    assert not brand_rules.logo_path(services.settings).exists()


async def test_white_label_gallery_shows_no_picpeak(admin: AuthActions, guest: Any) -> None:
    gallery = await published(admin, name="Anna & Ben")
    slug = gallery["slug"]
    before = await (await guest.get(f"/g/{slug}")).get_data(as_text=True)
    assert "picpeak" in visible_text(before).lower()  # our name in the footer, until white label
    assert (await save(admin, studio_name="", white_label="on")).status_code == 302
    for path in (f"/g/{slug}", "/g/no-such-gallery", "/admin/login"):
        page = await guest.get(path)
        assert page.status_code in (200, 404)
        text = visible_text(await page.get_data(as_text=True))
        assert "picpeak" not in text.lower(), (path, text)
    await save(admin, white_label="on")  # with a studio name: titles and footer name the studio
    page = await (await guest.get("/g/no-such-gallery")).get_data(as_text=True)
    assert "<title>" in page and "Lumen Studio" in page and "picpeak" not in visible_text(page).lower()


async def test_the_wall_wears_the_brand(admin: AuthActions) -> None:
    gallery = await published(admin, name="Anna & Ben")
    assert (await save(admin, white_label="on", custom_css="h1 { color: var(--accent) }")).status_code == 302
    page = await (await admin.client.get(f"/g/{gallery['slug']}/wall")).get_data(as_text=True)
    assert "/brand/brand.css?v=" in page and "/brand/custom.css?v=" in page
    assert 'class="wall-studio wall-studio-right"' in page and "Lumen Studio" in visible_text(page)
    assert "picpeak" not in visible_text(page).lower()
    # A watermark in the top right corner: the studio's mark moves to the left, clear of it.
    marked = await published(admin, name="Marked", watermark=True)
    moved = await admin.client.post("/admin/settings/watermark", form={
        "csrf_token": admin.csrf, "watermark_text": "© Lumen", "watermark_position": "top-right",
        "watermark_opacity": "0.5", "watermark_size": "0.2"})
    assert moved.status_code == 302
    page = await (await admin.client.get(f"/g/{marked['slug']}/wall")).get_data(as_text=True)
    assert 'class="wall-studio wall-studio-left"' in page


async def test_custom_css_is_a_stylesheet_and_the_csp_is_unchanged(admin: AuthActions, services: Any) -> None:
    gallery = await published(admin)
    css = ".hero h1 { letter-spacing: .2em }"
    plain = await admin.client.get(f"/g/{gallery['slug']}")
    assert (await save(admin, custom_css=css)).status_code == 302
    page = await admin.client.get(f"/g/{gallery['slug']}")
    expected = content_security_policy(services.storage.presigned_origin())
    assert page.headers["Content-Security-Policy"] == plain.headers["Content-Security-Policy"] == expected
    text = await page.get_data(as_text=True)
    assert css not in text and "<style" not in text and " style=" not in text
    link = re.search(r'href="(/brand/custom\.css\?v=[0-9a-f]+)"', text)
    assert link, "the custom CSS is linked as a stylesheet"
    served = await admin.client.get(link.group(1))
    assert served.mimetype == "text/css" and await served.get_data(as_text=True) == css
    assert served.headers["X-Content-Type-Options"] == "nosniff"
    brand_css = await (await admin.client.get(re.search(r'href="(/brand/brand\.css[^"]*)"', text).group(1))).get_data(
        as_text=True)
    assert "--accent: #8a3b12; --accent-fg: #ffffff;" in brand_css  # dark accent: light text on buttons
    assert "--accent: #f0b48c; --accent-fg: #000000;" in brand_css  # light accent: dark text on buttons
    assert "/static/fonts/inter-regular.woff2" in brand_css and "/static/fonts/ebgaramond-regular.woff2" in brand_css
    assert "http" not in brand_css  # no font CDN
    assert (await admin.client.get("/static/fonts/inter-regular.woff2")).status_code == 200


async def test_a_stored_css_that_fails_the_check_is_not_served(admin: AuthActions, services: Any) -> None:
    """The check runs again when the stylesheet is served: a row written by anything but the form is not sent."""
    conn = db.connect(services.settings.database_path)
    try:
        with db.transaction(conn):
            brand_rules.save(conn, brand_rules.Brand(custom_css="@import url(https://evil.example/x.css);"))
    finally:
        conn.close()
    served = await admin.client.get("/brand/custom.css")
    assert served.status_code == 200 and await served.get_data(as_text=True) == ""


async def test_a_logo_too_large_is_refused(admin: AuthActions, services: Any) -> None:
    answer = await save(admin, files=logo_files(b"\x89PNG\r\n\x1a\n" + b"\0" * brand_rules.LOGO_MAX_BYTES))
    assert answer.status_code == 400 and "at most 5 MB" in await answer.get_data(as_text=True)
    assert not brand_rules.logo_path(services.settings).exists()


def test_contrast_matches_wcag() -> None:
    assert brand_rules.contrast("#000000", "#ffffff") == pytest.approx(21.0)
    assert brand_rules.contrast("#777777", "#ffffff") == pytest.approx(4.48, abs=0.01)
    assert brand_rules.text_on("#ffeb3b") == "#000000" and brand_rules.text_on("#1a237e") == "#ffffff"
    for colour in ("#777777", "#808080", "#ff0000", "#00ff00", "#0000ff", "#8a3b12"):
        assert brand_rules.contrast(colour, brand_rules.text_on(colour)) >= 4.5


async def test_contrast_warning_on_the_settings_page(admin: AuthActions) -> None:
    assert (await save(admin, accent="#f5d76e")).status_code == 302  # pale yellow on a light background
    page = await (await admin.client.get("/admin/settings/")).get_data(as_text=True)
    warnings = re.findall(r'<p class="warning contrast-warning"[^>]*>(.*?)</p>', page, re.S)
    assert len(warnings) == 1 and "#f5d76e" in warnings[0] and "4.5:1" in warnings[0]
    assert (await save(admin)).status_code == 302
    page = await (await admin.client.get("/admin/settings/")).get_data(as_text=True)
    assert "contrast-warning" not in page and "fails AA" not in page


async def test_gallery_theme_and_layout_over_the_default(admin: AuthActions) -> None:
    await save(admin)  # default: light theme, split cover
    own = await published(admin, theme="dark", cover_layout="minimal")
    default = await published(admin, name="Default look")
    page = await (await admin.client.get(f"/g/{own['slug']}")).get_data(as_text=True)
    assert '<html lang="en" class="theme-dark">' in page and "hero layout-minimal" in page
    page = await (await admin.client.get(f"/g/{default['slug']}")).get_data(as_text=True)
    assert '<html lang="en" class="theme-light">' in page and "hero layout-split" in page
    refused = await admin.client.post("/api/admin/galleries", json={"name": "X", "theme": "neon"},
                                      headers=admin.headers())
    assert refused.status_code == 400 and "theme" in json.dumps(await refused.get_json())


def test_email_context_follows_white_label() -> None:
    plain = brand_rules.email_context(brand_rules.Brand(studio_name="Lumen"), "https://photos.example/")
    assert "PicPeak" in plain["footer"] and plain["logo_url"] is None and plain["accent_fg"] == "#ffffff"
    white = brand_rules.email_context(brand_rules.Brand(studio_name="Lumen", white_label=True, logo_version="ab"),
                                      "https://photos.example/")
    assert "picpeak" not in repr(white).lower()
    assert white["footer"] == "Lumen" and white["logo_url"] == "https://photos.example/brand/logo.png?v=ab"
    assert brand_rules.email_context(brand_rules.Brand(logo_version="ab"), "")["logo_url"] is None


async def test_email_context_of_the_brand_in_force(admin: AuthActions, services: Any) -> None:
    assert (await save(admin, white_label="on")).status_code == 302
    context = await services.db.read(brand_rules.email_context_of, services.settings)
    assert context["studio_name"] == "Lumen Studio" and context["accent"] == "#8a3b12"
    assert context["footer"] == "Lumen Studio" and "EB Garamond" not in context["font_family"]
