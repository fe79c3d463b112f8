"""Issue 34 in a real browser: a gallery's hot folder feeding an open live wall. A real `picpeak-lite serve`
watches the folder (set on the gallery through the API, inside `hot_folder_root`); camera files written into a
card-like subfolder appear on the wall one after the other. Screenshots: wall-hotfolder-0 (empty) to -3."""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from .. import imagefactory
from .conftest import LiveServer, Page, start_server, stop_server
from .test_event_browser import wait_shown, wall_link
from .test_guest_browser import make_gallery


@pytest.fixture
def server(tmp_path: Path) -> Iterator[LiveServer]:
    (tmp_path / "hot").mkdir()
    live = start_server(tmp_path / "data", env={"PICPEAK_HOT_FOLDER_ROOT": str(tmp_path / "hot"),
                                                "PICPEAK_HOT_FOLDER_SETTLE_SECONDS": "0.5"})
    yield live
    stop_server(live)


def test_photos_written_into_the_hot_folder_appear_on_the_wall(server: LiveServer, api: httpx.Client,
                                                               page: Page, tmp_path: Path) -> None:
    card = tmp_path / "hot" / "party" / "DCIM" / "100CANON"
    card.mkdir(parents=True)
    gallery = make_gallery(api, [], hot_folder="party")
    page.goto(wall_link(api, gallery))
    page.wait_for_selector("#wall-empty:not([hidden])")
    page.screenshot("wall-hotfolder-0")
    lags = []
    for n in range(1, 4):
        data = imagefactory.save(imagefactory.photo(3000, 2000, seed=40 + n), "jpeg", quality=90)
        part = card / f"IMG_{n:04d}.JPG.part"  # the way an FTP server writes, then renames when done
        part.write_bytes(data)
        os.rename(part, card / f"IMG_{n:04d}.JPG")
        closed = time.monotonic()
        wait_shown(page, n)
        lags.append((time.monotonic() - closed) * 1000)
        page.wait_for_timeout(1500)  # the cross-fade ends before the picture is taken
        page.screenshot(f"wall-hotfolder-{n}")
    print(f"\nhotfolder_wall: files=3 shown=3 closed_to_shown_ms={' '.join(f'{v:.0f}' for v in lags)} "
          "(6 MP, browser wall, includes the wall's own scheduling)")
    listed = api.get(f"/api/admin/galleries/{gallery['id']}/photos").json()["photos"]
    assert sorted(p["filename"] for p in listed) == ["IMG_0001.JPG", "IMG_0002.JPG", "IMG_0003.JPG"]
