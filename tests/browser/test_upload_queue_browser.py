"""The resumable uploader (static/upload-queue.js) on the guest page in Chromium, against a real server, where
the server's answers are not the happy path's:

* an upload the server no longer has (404 after a tus DELETE, as after ``tus_idle_minutes`` while a phone
  slept): the page creates a new upload and sends the file again from byte 0, and the file ends done with its
  photo, once, byte-exact; whether the server's 404 comes to the PATCH itself or to the HEAD the page asks
  after a PATCH that failed on the way;
* a complete upload whose photo is not made yet (the bucket down at the last step: moto's process stopped):
  the last PATCH answers 503 and HEAD 423 with Retry-After; the row says what the server says (not "connection
  lost", not refused) and shows done once the bucket is back and the photo exists;
* a file refused at the last step whose answer was lost on the way: the HEAD asked afterwards answers the
  refusal with its sentence in ``Picpeak-Error``, and the row shows that sentence.

The browser's own requests are held or cut at the network level (Playwright's ``page.route``); the server is
never mocked. Waits are hang guards (PATIENCE_MS), never speed bounds.
"""

from __future__ import annotations

import contextlib
import hashlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from .. import imagefactory
from ..s3server import MotoServer
from .conftest import PATIENCE_MS, LiveServer, Page, api_client, start_server, stop_server

MB = 1024 * 1024
SIZE = 3 * MB  # three 1 MB pieces (upload_chunk_mb = 1)

# Every status text a row has shown, recorded on each DOM change, so no test depends on catching a moment.
RECORDER = """() => {
  window.__seen = [];
  new MutationObserver(() => {
    for (const row of document.querySelectorAll('#files .file')) {
      const seen = row.dataset.state + ' | ' + row.querySelector('.file-status').textContent;
      if (window.__seen[window.__seen.length - 1] !== seen) window.__seen.push(seen);
    }
  }).observe(document.getElementById('files'), {subtree: true, childList: true, characterData: true,
                                                attributes: true});
}"""


def serve(tmp_path: Path, **settings: Any) -> LiveServer:
    env = {"PICPEAK_UPLOAD_CHUNK_MB": "1"}
    env.update({f"PICPEAK_{key.upper()}": str(value) for key, value in settings.items()})
    return start_server(tmp_path / "data", env=env)


@pytest.fixture
def server(tmp_path: Path) -> Iterator[LiveServer]:
    live = serve(tmp_path)
    yield live
    stop_server(live)


@pytest.fixture
def api(server: LiveServer) -> Iterator[httpx.Client]:
    yield from api_client(server)


def guest_gallery(api: httpx.Client, name: str) -> dict[str, Any]:
    created = api.post("/api/admin/galleries", json={"name": name, "allow_guest_uploads": True})
    assert created.status_code == 201, created.text
    published = api.post(f"/api/admin/galleries/{created.json()['id']}/publish")
    assert published.status_code == 200, published.text
    return published.json()


def photo_file(tmp_path: Path, name: str, seed: int) -> tuple[Path, bytes]:
    """A real JPEG padded after its end to SIZE bytes: three pieces."""
    photo = imagefactory.save(imagefactory.photo(1200, 900, seed=seed), "jpeg")
    data = photo + bytes(SIZE - len(photo))
    path = tmp_path / name
    path.write_bytes(data)
    return path, data


def the_one_photo(api: httpx.Client, gallery: dict[str, Any], data: bytes) -> None:
    """The gallery holds exactly one photo, and its original is the file's bytes."""
    items = api.get(f"/api/admin/galleries/{gallery['id']}/photos").json()["photos"]
    assert len(items) == 1, items
    original = api.get(f"/api/admin/photos/{items[0]['id']}/original")
    assert original.status_code == 200
    assert hashlib.sha256(original.content).hexdigest() == hashlib.sha256(data).hexdigest()


def row_state(page: Page) -> str:
    return str(page.locator("#files .file").get_attribute("data-state"))


def wait_done(page: Page) -> None:
    page.wait_for_selector("#files .file.is-done .file-thumb img", timeout=PATIENCE_MS)
    assert row_state(page) == "complete"
    assert page.locator("#files .file .file-status").inner_text() == "Done"


class Requests:
    """The tus requests the page sent (method, Upload-Offset) and the answers it got (method, status)."""

    def __init__(self, page: Page) -> None:
        self.sent: list[tuple[str, str | None]] = []
        self.answers: list[tuple[str, int]] = []
        page.on("request", lambda r: "/tus" in r.url and self.sent.append((r.method, r.headers.get("upload-offset"))))
        page.on("response", lambda r: "/tus" in r.url and self.answers.append((r.request.method, r.status)))

    def patches(self) -> list[int]:
        return [int(offset or 0) for method, offset in self.sent if method == "PATCH"]

    def posts(self) -> int:
        return sum(1 for method, _ in self.sent if method == "POST")


def hold_patch(page: Page, at_offset: int, times: int = 1) -> list[Any]:
    """Holds the first ``times`` PATCHes the page sends at ``at_offset`` (the others pass): each held route is
    appended to the list returned, for the test to release (continue) or cut (abort)."""
    held: list[Any] = []

    def handle(route: Any) -> None:
        request = route.request
        if len(held) < times and request.method == "PATCH" and request.headers.get("upload-offset") == str(at_offset):
            held.append(route)
            return
        route.continue_()

    page.route("**/tus/*", handle)
    return held


def wait_held(page: Page, held: list[Any], count: int = 1) -> None:
    for _ in range(PATIENCE_MS // 100):
        if len(held) >= count:
            return
        page.wait_for_timeout(100)
    raise AssertionError("the page never sent the PATCH to hold")


def delete_upload(page: Page, url: str) -> int:
    """The tus DELETE of the upload, sent from the page (its guest session and CSRF token): the server forgets
    it, as it does an upload that expired."""
    return int(page.evaluate(
        """async (url) => (await fetch(url, {method: 'DELETE', headers: {
             'Tus-Resumable': '1.0.0', 'X-CSRF-Token': window.PicpeakHttp.csrfToken()}})).status""", url))


@pytest.mark.parametrize("gone_to", ["patch", "head"])
def test_an_upload_the_server_no_longer_has_is_sent_again_from_byte_0(
        server: LiveServer, api: httpx.Client, phone: Page, tmp_path: Path, gone_to: str) -> None:
    gallery = guest_gallery(api, "Slept phone")
    path, data = photo_file(tmp_path, "IMG_4040.jpg", seed=40)
    requests = Requests(phone)
    phone.goto(gallery["share_url"] + "/upload")
    phone.evaluate(RECORDER)
    held = hold_patch(phone, MB)  # the second piece: the first has arrived
    phone.set_input_files("#file-input", [str(path)])
    wait_held(phone, held)
    route = held[0]
    assert requests.patches() == [0, MB] and requests.posts() == 1

    # The server forgets the upload while the piece is on its way.
    assert delete_upload(phone, route.request.url) == 204
    if gone_to == "patch":
        route.continue_()  # the PATCH itself is answered 404
    else:
        route.abort("connectionreset")  # the PATCH fails on the way; the HEAD asked afterwards is answered 404

    wait_done(phone)
    patches = requests.patches()
    assert requests.posts() == 2, requests.sent  # a new upload, made once
    assert patches[patches.index(MB) + 1:] == [0, MB, 2 * MB], patches  # sent again whole, from byte 0
    assert ("HEAD", 404) in requests.answers if gone_to == "head" else ("PATCH", 404) in requests.answers
    seen = phone.evaluate("() => window.__seen")
    assert not any(s.startswith(("refused", "unsent", "failed")) for s in seen), seen
    the_one_photo(api, gallery, data)
    phone.screenshot(f"upload-queue-restarted-{gone_to}")
    phone.console_errors[:] = [e for e in phone.console_errors if "net::ERR_" not in e]


def test_an_upload_lost_again_and_again_is_restarted_three_times_then_left_to_retry(
        server: LiveServer, api: httpx.Client, phone: Page, tmp_path: Path) -> None:
    gallery = guest_gallery(api, "Slept phone, four times")
    path, data = photo_file(tmp_path, "IMG_4343.jpg", seed=43)
    requests = Requests(phone)
    phone.goto(gallery["share_url"] + "/upload")
    phone.evaluate(RECORDER)
    held = hold_patch(phone, MB, times=4)
    phone.set_input_files("#file-input", [str(path)])
    for lost in range(1, 5):  # the first upload and its three fresh starts are each lost mid-file
        wait_held(phone, held, lost)
        assert delete_upload(phone, held[-1].request.url) == 204
        held[-1].continue_()
    row = phone.locator('#files .file[data-state="unsent"]')
    row.wait_for(timeout=PATIENCE_MS)
    assert requests.posts() == 4, requests.sent
    assert row.locator(".file-status").inner_text() == (
        "The server lost this upload again after 3 fresh starts. Retry to send it again.")
    seen = phone.evaluate("() => window.__seen")
    assert not any(s.startswith(("refused", "failed")) for s in seen), seen

    row.locator(".retry").click()  # the person's Retry: a fifth upload, which nothing disturbs
    wait_done(phone)
    assert requests.posts() == 5, requests.sent
    the_one_photo(api, gallery, data)


def test_a_refusal_told_only_by_head_is_shown_with_its_sentence(server: LiveServer, api: httpx.Client,
                                                                phone: Page, tmp_path: Path) -> None:
    """The last piece arrives and the server refuses the file (its bytes are no photo), but the answer is lost
    on the way: the page asks HEAD where the upload is, and HEAD (no body) says the refusal in Picpeak-Error."""
    gallery = guest_gallery(api, "Not a photo")
    path = tmp_path / "IMG_4141.jpg"
    path.write_bytes(bytes(range(256)) * (SIZE // 256))
    requests = Requests(phone)
    lost: list[dict[str, Any]] = []

    def answer_lost(route: Any) -> None:
        request = route.request
        if request.method == "PATCH" and request.headers.get("upload-offset") == str(2 * MB) and not lost:
            answer = route.fetch()  # the server gets the piece and answers; the page never hears it
            lost.append({"status": answer.status, "body": answer.json()})
            route.abort("connectionreset")
            return
        route.continue_()

    phone.route("**/tus/*", answer_lost)
    phone.goto(gallery["share_url"] + "/upload")
    phone.set_input_files("#file-input", [str(path)])
    phone.wait_for_selector('#files .file[data-state="refused"]', timeout=PATIENCE_MS)
    assert lost and lost[0]["status"] == 415, lost
    sentence = lost[0]["body"]["error"]
    assert ("HEAD", 415) in requests.answers, requests.answers
    assert phone.locator("#files .file .file-status").inner_text() == f"Refused: {sentence}"
    assert phone.locator("#files .file .retry").is_hidden()
    phone.screenshot("upload-queue-refused-by-head")
    assert api.get(f"/api/admin/galleries/{gallery['id']}/photos").json()["photos"] == []
    phone.console_errors[:] = [e for e in phone.console_errors if "net::ERR_" not in e]


@pytest.fixture
def moto() -> Iterator[MotoServer]:
    with MotoServer() as s3:
        yield s3


def test_a_photo_not_made_yet_is_waited_for_then_done(moto: MotoServer, phone: Page, tmp_path: Path) -> None:
    """The bucket is down when the last piece arrives: the PATCH answers 503, HEAD 423 with Retry-After. The
    page keeps the file as sending and says what the server says; once the bucket is back the photo is made
    (by the server's finisher, or on the page's next HEAD) and the row shows done."""
    settings = moto.settings_for(moto.new_bucket())
    live = serve(tmp_path, **settings)
    try:
        with contextlib.contextmanager(api_client)(live) as api:
            gallery = guest_gallery(api, "Bucket outage")
            path, data = photo_file(tmp_path, "IMG_4242.jpg", seed=42)
            requests = Requests(phone)
            phone.goto(gallery["share_url"] + "/upload")
            phone.evaluate(RECORDER)
            held = hold_patch(phone, 2 * MB)  # the last piece
            phone.set_input_files("#file-input", [str(path)])
            wait_held(phone, held)

            moto.stop()  # the bucket is down when every byte has arrived
            held[0].continue_()
            for _ in range(PATIENCE_MS // 100):
                if ("HEAD", 423) in requests.answers:
                    break
                phone.wait_for_timeout(100)
            assert ("PATCH", 503) in requests.answers and ("HEAD", 423) in requests.answers, requests.answers
            # The row says what the server says: every byte arrived, the photo is being stored.
            phone.wait_for_function(
                "() => /arrived/.test(document.querySelector('#files .file .file-status').textContent)",
                timeout=PATIENCE_MS)
            assert row_state(phone) == "sending"
            phone.screenshot("upload-queue-not-made-yet")

            moto.start()  # the bucket is back (empty, as after any moto restart: the photo is stored now)
            wait_done(phone)
            seen = phone.evaluate("() => window.__seen")
            print("rows seen:", *seen, "answers:", requests.answers, sep="\n  ")
            assert not any(s.startswith(("refused", "unsent", "failed")) for s in seen), seen
            assert not any("Connection lost" in s for s in seen), seen  # nothing was wrong with the connection
            assert requests.posts() == 1 and 0 not in requests.patches()[1:], requests.sent  # never sent again
            the_one_photo(api, gallery, data)
    finally:
        stop_server(live)
    # The 503s of the outage are the server's real answers, which Chromium logs as failed resources.
    phone.console_errors[:] = [e for e in phone.console_errors if "status of 503" not in e]
