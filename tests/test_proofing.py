"""Proofing (issue 16): the guests' favourites exported for the editing software (file names, filter strings,
CSV; per guest name or everyone's), and the gallery's limit of favourites per guest."""

from __future__ import annotations

import csv
import io
from typing import Any

from picpeak_lite.domain import proofing
from picpeak_lite.services import Services

from .conftest import AuthActions
from .factories import add_photo, published
from .test_upload import start_guest_session


async def heart(client: Any, csrf: str, slug: str, photo_id: int, *, on: bool = True) -> Any:
    return await client.open(f"/api/g/{slug}/favourites/{photo_id}", method="PUT" if on else "DELETE",
                             headers={"X-CSRF-Token": csrf})


async def named_guest(app: Any, services: Services, slug: str, name: str | None) -> tuple[Any, str]:
    client = app.test_client()
    csrf = await start_guest_session(services, client)
    if name is not None:
        answer = await client.post(f"/api/g/{slug}/guest", json={"name": name}, headers={"X-CSRF-Token": csrf})
        assert answer.status_code == 200
    return client, csrf


async def test_exports_by_guest_and_everyone(admin: AuthActions, services: Services, app: Any) -> None:
    gallery = await published(admin, name="Wedding")
    slug, gid = gallery["slug"], gallery["id"]
    ids = [add_photo(services, gid, name=name) for name in ("DSC_0001.jpg", "DSC_0002.JPG", "=cmd.jpg", "IMG 7.png")]
    anna, anna_csrf = await named_guest(app, services, slug, "Anna")
    ben, ben_csrf = await named_guest(app, services, slug, "Ben")
    nameless, nameless_csrf = await named_guest(app, services, slug, None)
    for client, csrf, chosen in ((anna, anna_csrf, ids[:2]), (ben, ben_csrf, ids[1:3]),
                                 (nameless, nameless_csrf, ids[3:])):
        for photo_id in chosen:
            assert (await heart(client, csrf, slug, photo_id)).status_code == 200

    async def get(fmt: str, **query: str) -> tuple[int, str, Any]:
        answer = await admin.client.get(f"/admin/galleries/{gid}/favourites.{fmt}", query_string=query)
        return answer.status_code, await answer.get_data(as_text=True), answer.headers

    status, text, headers = await get("txt")
    assert status == 200 and text == "=cmd.jpg\nDSC_0001.jpg\nDSC_0002.JPG\nIMG 7.png\n"
    assert headers["Content-Disposition"] == f'attachment; filename="{slug}-favourites-everyone.txt"'
    assert (await get("txt", guest="Anna"))[1] == "DSC_0001.jpg\nDSC_0002.JPG\n"
    assert (await get("lightroom", guest="Ben"))[1] == "=cmd, DSC_0002\n"
    assert (await get("captureone"))[1] == "=cmd DSC_0001 DSC_0002 IMG 7\n"
    assert (await get("txt", guest=""))[1] == "IMG 7.png\n"  # the guests who gave no name
    status, text, headers = await get("csv")
    assert headers["Content-Type"].startswith("text/csv")
    table = list(csv.reader(io.StringIO(text)))
    assert table[0] == ["file name", "who", "when"]
    assert [row[:2] for row in table[1:]] == [["'=cmd.jpg", "Ben"], ["DSC_0001.jpg", "Anna"],
                                              ["DSC_0002.JPG", "Anna"], ["DSC_0002.JPG", "Ben"], ["IMG 7.png", ""]]
    assert all(row[2].endswith("Z") and "T" in row[2] for row in table[1:])
    status, text, _ = await get("txt", guest="Nobody")
    assert status == 404 and "chosen no favourites" in text
    page = await (await admin.client.get(f"/admin/galleries/{gid}")).get_data(as_text=True)
    assert "Guests without a name" in page and f"/admin/galleries/{gid}/favourites.csv?guest=Anna" in page


async def test_the_limit_is_enforced_with_a_sentence_and_shown(admin: AuthActions, services: Services,
                                                               app: Any) -> None:
    gallery = await published(admin, name="Limited", favourite_limit=2)
    assert gallery["favourite_limit"] == 2
    slug = gallery["slug"]
    ids = [add_photo(services, gallery["id"], name=f"p{i}.jpg") for i in range(3)]
    client, csrf = await named_guest(app, services, slug, "Carla")
    assert (await heart(client, csrf, slug, ids[0])).status_code == 200
    assert (await heart(client, csrf, slug, ids[1])).status_code == 200
    refused = await heart(client, csrf, slug, ids[2])
    assert refused.status_code == 409
    assert (await refused.get_json())["error"] == proofing.limit_sentence(2)
    assert "up to 2 favourites" in proofing.limit_sentence(2)
    # A heart already given is no new one; taking one back makes room.
    assert (await heart(client, csrf, slug, ids[1])).status_code == 200
    assert (await heart(client, csrf, slug, ids[0], on=False)).status_code == 200
    assert (await heart(client, csrf, slug, ids[2])).status_code == 200
    page = await (await client.get(f"/g/{slug}")).get_data(as_text=True)
    assert "Choose up to 2 favourites" in page and 'id="favourite-error"' in page
    # Another guest has a limit of its own.
    other, other_csrf = await named_guest(app, services, slug, "Dan")
    assert (await heart(other, other_csrf, slug, ids[0])).status_code == 200


async def test_the_limit_field_refuses_nonsense(admin: AuthActions) -> None:
    answer = await admin.client.post("/api/admin/galleries", json={"name": "X", "favourite_limit": 0},
                                     headers=admin.headers())
    assert answer.status_code == 400
    assert "at least 1" in (await answer.get_data(as_text=True))
    form = await admin.client.get("/admin/galleries/new")
    assert 'name="favourite_limit"' in await form.get_data(as_text=True)
