"""Resumable uploads in Chromium (issue 14): the guest page at phone size sends a 30 MB photo as a tus upload in
1 MB pieces (the server's upload_chunk_mb = 1, and an upload throughput the test throttles so that there is time
to act mid-file). The network is cut (Playwright's offline mode): the row says it is paused, and when the
network is back the file goes on from where it was. Then the page is reloaded mid-file and the same file chosen
again: the first piece sent after the reload starts at the offset the server kept, not at 0, and the photo
arrives byte-exact, once.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from .. import imagefactory
from .conftest import PATIENCE_MS, LiveServer, Page, api_client, start_server, stop_server

SIZE = 30 * 1024 * 1024
THROTTLE = {"offline": False, "latency": 0, "downloadThroughput": -1, "uploadThroughput": 3 * 1024 * 1024}


@pytest.fixture
def server(tmp_path: Path) -> Iterator[LiveServer]:
    live = start_server(tmp_path / "data", env={"PICPEAK_UPLOAD_CHUNK_MB": "1"})
    yield live
    stop_server(live)


@pytest.fixture
def api(server: LiveServer) -> Iterator[httpx.Client]:
    yield from api_client(server)


def progress(page: Page) -> int:
    return int(page.eval_on_selector("#files .file progress", "p => p.value"))


def test_phone_upload_survives_offline_and_a_reload(server: LiveServer, api: httpx.Client, phone: Page,
                                                     tmp_path: Path) -> None:
    created = api.post("/api/admin/galleries", json={"name": "Venue Wi-Fi", "allow_guest_uploads": True})
    assert created.status_code == 201, created.text
    gallery = api.post(f"/api/admin/galleries/{created.json()['id']}/publish").json()
    photo = imagefactory.save(imagefactory.photo(1600, 1200, seed=14), "jpeg")
    data = photo + bytes(SIZE - len(photo))  # a real JPEG, padded after its end to 30 MB
    path = tmp_path / "IMG_3000.jpg"
    path.write_bytes(data)

    offsets: list[int] = []  # the Upload-Offset of every PATCH the page sends
    phone.on("request", lambda r: r.method == "PATCH" and offsets.append(int(r.headers["upload-offset"])))
    phone.on("dialog", lambda dialog: dialog.accept())  # the page asks before leaving while it is sending
    cdp = phone.context.new_cdp_session(phone.page)
    cdp.send("Network.enable")
    cdp.send("Network.emulateNetworkConditions", THROTTLE)

    phone.goto(gallery["share_url"] + "/upload")
    phone.set_input_files("#file-input", [str(path)])
    phone.wait_for_function("() => document.querySelector('#files .file progress').value >= 15",
                            timeout=PATIENCE_MS)

    # The network goes away mid-file: the row says it waits, and nothing is lost.
    phone.context.set_offline(True)
    phone.wait_for_function("() => /offline/i.test(document.querySelector('#files .file-status').textContent)",
                            timeout=PATIENCE_MS)
    assert phone.locator("#files .file").get_attribute("data-state") == "sending"
    before = progress(phone)
    phone.wait_for_timeout(1500)
    assert phone.locator("#files .file").get_attribute("data-state") == "sending"
    phone.screenshot("resumable-offline")
    phone.context.set_offline(False)
    cdp.send("Network.emulateNetworkConditions", THROTTLE)
    phone.wait_for_function(f"() => document.querySelector('#files .file progress').value >= {max(before, 45)}",
                            timeout=PATIENCE_MS)
    assert not re.search("offline", phone.locator("#files .file-status").inner_text(), re.I)

    # A reload mid-file, and the same file chosen again: it goes on from the server's offset.
    sent_before_reload = len(offsets)
    phone.reload()
    cdp = phone.context.new_cdp_session(phone.page)
    cdp.send("Network.enable")
    cdp.send("Network.emulateNetworkConditions", THROTTLE)
    phone.set_input_files("#file-input", [str(path)])
    phone.wait_for_selector("#files .file.is-done .file-thumb img", timeout=PATIENCE_MS)
    resumed_at = offsets[sent_before_reload]
    assert resumed_at >= SIZE * 0.4, f"after the reload the first piece started at {resumed_at}"
    phone.screenshot("resumable-done")

    items = api.get(f"/api/admin/galleries/{gallery['id']}/photos").json()["photos"]
    assert len(items) == 1
    original = api.get(f"/api/admin/photos/{items[0]['id']}/original")
    assert original.status_code == 200 and hashlib.sha256(original.content).digest() == hashlib.sha256(data).digest()
    # The failed requests while offline are the test's doing, not the page's.
    phone.console_errors[:] = [e for e in phone.console_errors if "net::ERR_" not in e]
