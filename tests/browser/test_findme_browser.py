""""Find me" on a phone (issue 36): the photographer switches it on, the lane indexes the photos already there,
and a guest at phone size agrees to the notice, opens the front camera (Chromium's fake video device, fed a
public-domain portrait from tests/faces as a Y4M file), takes the selfie and sees the photos they are in; "Not
me" takes one away. Screenshots: test-artifacts/<test>-{admin,consent,camera,results,not-me}.png; axe-clean."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest
from PIL import Image

from picpeak_lite.media import faces

from .conftest import (
    ACTION_TIMEOUT_MS,
    ARTIFACTS,
    CHROMIUM,
    CHROMIUM_ARGS,
    PATIENCE_S,
    LiveServer,
    Page,
    admin_login,
    wait_processed,
)
from .test_a11y_browser import AXE_OPTIONS

FACES = Path(__file__).resolve().parents[1] / "faces"
pytestmark = pytest.mark.skipif(not faces.available(), reason="the faces extra is not installed")


def y4m(picture: Path, out: Path, size: tuple[int, int] = (640, 480)) -> Path:
    """One 4:2:0 frame of ``picture`` (fitted into ``size``) as a YUV4MPEG2 file, which Chromium's fake camera
    plays in a loop."""
    frame = Image.new("RGB", size, (90, 90, 90))
    face = Image.open(picture).convert("RGB")
    face.thumbnail(size)
    frame.paste(face, ((size[0] - face.width) // 2, (size[1] - face.height) // 2))
    y, cb, cr = frame.convert("YCbCr").split()
    half = (size[0] // 2, size[1] // 2)
    planes = y.tobytes() + cb.resize(half).tobytes() + cr.resize(half).tobytes()
    out.write_bytes(f"YUV4MPEG2 W{size[0]} H{size[1]} F30:1 Ip A1:1 C420jpeg\n".encode() + b"FRAME\n" + planes)
    return out


def indexed(server: LiveServer) -> int:
    from picpeak_lite.store import db

    conn = db.connect(server.data_dir / "picpeak.sqlite3")
    try:
        return conn.execute("SELECT count(*) AS n FROM face_scans").fetchall()[0]["n"]
    finally:
        conn.close()


def test_a_guest_finds_their_photos_with_the_phone_camera(server: LiveServer, api: Any, request: Any,
                                                          tmp_path: Path, browser: Any) -> None:
    from axe_playwright_python.sync_playwright import Axe

    gallery = api.post("/api/admin/galleries", json={"name": "State dinner"}).json()
    api.post(f"/api/admin/galleries/{gallery['id']}/publish")
    names = ("obama", "obama1", "obama3", "biden", "biden2", "two_people")
    files = [("photos", (f"{name}.jpg", (FACES / f"{name}.jpg").read_bytes())) for name in names]
    upload = api.post(f"/api/admin/galleries/{gallery['id']}/upload", files=files).json()
    wait_processed(api, upload["upload_id"])
    camera = y4m(FACES / "obama2.jpg", tmp_path / "selfie.y4m")

    # A browser of its own, for the fake camera's flags, from the session's Playwright (a second sync Playwright
    # cannot start inside the first).
    camera_browser = browser.browser_type.launch(executable_path=CHROMIUM, headless=True, args=[
        *CHROMIUM_ARGS, "--use-fake-ui-for-media-stream", "--use-fake-device-for-media-stream",
        f"--use-file-for-fake-video-capture={camera}"])
    try:
        admin_context = camera_browser.new_context(viewport={"width": 1280, "height": 900})
        admin_context.set_default_timeout(ACTION_TIMEOUT_MS)
        admin = Page(admin_context.new_page(), request.node.name)
        admin_login(admin, server)
        admin.goto(f"{server.url}/admin/galleries/{gallery['id']}")
        admin.check("#findme input[name=find_me]")
        admin.click("#findme button[type=submit]")
        deadline = time.monotonic() + PATIENCE_S  # a hung-test stop, not a speed bound
        while indexed(server) < len(names):
            assert time.monotonic() < deadline, "the photos were not indexed in time"
            time.sleep(0.2)
        admin.reload()
        assert "6 of 6 photos looked at" in " ".join(admin.inner_text("#findme-progress").split())
        ARTIFACTS.mkdir(exist_ok=True)
        admin.locator("#findme").screenshot(path=str(ARTIFACTS / f"{request.node.name}-admin.png"))
        admin_context.close()

        context = camera_browser.new_context(viewport={"width": 390, "height": 844}, device_scale_factor=3,
                                      is_mobile=True, has_touch=True, permissions=["camera"])
        context.set_default_timeout(ACTION_TIMEOUT_MS)
        phone = Page(context.new_page(), request.node.name)
        phone.goto(f"{server.url}/g/{gallery['slug']}")
        phone.click("#findme-link")
        phone.locator("#consent").wait_for()
        assert phone.locator("#camera").is_hidden()  # nothing opens before the guest agrees
        phone.screenshot("consent")
        violations = Axe().run(phone.page, options=AXE_OPTIONS).response["violations"]
        assert violations == [], [(v["id"], [n["target"] for n in v["nodes"]][:3]) for v in violations]

        phone.click("#consent-camera")
        phone.locator("#camera").wait_for(state="visible")
        phone.wait_for_function("() => document.getElementById('camera-video').videoWidth > 0")
        phone.screenshot("camera")
        phone.click("#take-selfie")
        phone.locator("#findme-status").filter(has_text="photos found").wait_for()
        results = phone.locator(".findme-result")
        assert results.count() == 4  # obama, obama1, obama3 and the pair; not Biden's portraits
        assert phone.evaluate("() => document.querySelector('#findme').scrollWidth <= window.innerWidth")
        # Every result's image arrives (they load after the results are shown: waited for, not checked at once).
        phone.wait_for_function("() => [...document.querySelectorAll('.findme-result img')]"
                                ".every(img => img.complete && img.naturalWidth > 0)")
        assert phone.locator("#camera").is_hidden()  # the camera is closed after the picture
        phone.screenshot("results")
        violations = Axe().run(phone.page, options=AXE_OPTIONS).response["violations"]
        assert violations == [], [(v["id"], [n["target"] for n in v["nodes"]][:3]) for v in violations]

        before = results.count()
        phone.locator(".findme-not-me").last.click()
        phone.wait_for_function(f"() => document.querySelectorAll('.findme-result').length < {before}")
        phone.screenshot("not-me")
        unexpected = [e for e in phone.console_errors if "status of 4" not in e]
        assert not unexpected, unexpected
        context.close()
    finally:
        camera_browser.close()
