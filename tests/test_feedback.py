"""Guests' feedback (issue 34): likes, star ratings and comments, moderation of comments, the live push to the
photographer, the proofing export and XMP sidecars read back by exiftool (Debian's libimage-exiftool-perl)."""

from __future__ import annotations

import csv
import io
import json
import shutil
import subprocess
import zipfile
from pathlib import Path
from typing import Any

import trio

from picpeak_lite.services import Services
from picpeak_lite.store.queries import changes as change_q
from picpeak_lite.store.queries import guests as guest_q
from picpeak_lite.web.ratelimit import RateLimit

from .conftest import AuthActions
from .factories import add_photo, published
from .test_guest_pages import enter_password, guest_csrf
from .test_upload import rows


def photo_url(slug: str, photo_id: int, what: str) -> str:
    return f"/api/g/{slug}/photos/{photo_id}/{what}"


async def send(client: Any, method: str, url: str, csrf: str, body: Any = None) -> tuple[int, Any]:
    response = await client.open(url, method=method, json=body, headers={"X-CSRF-Token": csrf})
    return response.status_code, await response.get_json()


async def test_one_like_and_one_rating_per_guest_both_changeable(guest: Any, app: Any, admin: AuthActions,
                                                                  services: Services) -> None:
    client = app.test_client()  # a second guest's browser
    gallery = await published(admin, name="G")
    slug, photo = gallery["slug"], add_photo(services, gallery["id"])
    csrf, other_csrf = await guest_csrf(guest, slug), await guest_csrf(client, slug)

    for _ in range(2):  # a second like is the same like
        status, body = await send(guest, "PUT", photo_url(slug, photo, "like"), csrf)
        assert status == 200 and (body["likes"], body["liked"]) == (1, True)
    status, body = await send(guest, "PUT", photo_url(slug, photo, "rating"), csrf, {"stars": 2})
    assert status == 200 and (body["ratings"], body["my_rating"], body["rating"]) == (1, 2, 2)
    status, body = await send(guest, "PUT", photo_url(slug, photo, "rating"), csrf, {"stars": 5})  # changed
    assert (body["ratings"], body["my_rating"], body["rating"]) == (1, 5, 5)
    status, body = await send(client, "PUT", photo_url(slug, photo, "rating"), other_csrf, {"stars": 4})
    assert (body["ratings"], body["my_rating"], body["rating"], body["likes"], body["liked"]) == (2, 4, 4.5, 1, False)

    for bad in (0, 6, "5", True, None, 4.5):
        status, body = await send(guest, "PUT", photo_url(slug, photo, "rating"), csrf, {"stars": bad})
        assert status == 400 and body["error"] == "A rating is 1 to 5 stars.", bad

    status, body = await send(guest, "DELETE", photo_url(slug, photo, "like"), csrf)
    assert (body["likes"], body["liked"]) == (0, False)
    status, body = await send(guest, "DELETE", photo_url(slug, photo, "rating"), csrf)
    assert (body["ratings"], body["rating"], body["my_rating"]) == (1, 4, None)
    assert await rows(services, "SELECT stars FROM photo_ratings") == [{"stars": 4}]

    # Only photos the guest may see, of this gallery; no CSRF token, no change.
    hidden = add_photo(services, gallery["id"], hidden=1)
    elsewhere = add_photo(services, (await published(admin, name="Other"))["id"])
    for photo_id in (hidden, elsewhere, 999_999):
        assert (await send(guest, "PUT", photo_url(slug, photo_id, "like"), csrf))[0] == 404
    assert (await guest.put(photo_url(slug, photo, "like"))).status_code == 403


async def test_a_comment_is_named_plain_text_of_limited_length(guest: Any, admin: AuthActions,
                                                               services: Services) -> None:
    gallery = await published(admin, name="G")
    slug, photo = gallery["slug"], add_photo(services, gallery["id"])
    csrf = await guest_csrf(guest, slug)
    url = photo_url(slug, photo, "comments")

    status, body = await send(guest, "POST", url, csrf, {"text": "Lovely!"})
    assert status == 400 and body["error"] == "Tell us your name first: it is shown with your comment."
    status, body = await send(guest, "POST", url, csrf, {"text": "   \n  "})
    assert status == 400 and body["error"] == "Write a comment first."
    status, body = await send(guest, "POST", url, csrf, {"text": "x" * 1001, "name": "Mary"})
    assert status == 400 and body["error"] == "A comment may be at most 1000 characters long."

    markup = '<img src=x onerror="alert(1)"> <b>so\u202egood</b>\x07\n\n\n\nyes'
    status, body = await send(guest, "POST", url, csrf, {"text": markup, "name": "  Aunt\tMary "})
    assert status == 201, body
    # Kept as text (escaped wherever it is shown), without control or bidi characters, blank lines collapsed.
    assert body["comment"]["text"] == '<img src=x onerror="alert(1)"> <b>sogood</b>\n\nyes'
    assert (body["comment"]["name"], body["comment"]["status"], body["message"]) == ("Aunt Mary", "approved", None)
    # The name is the session's now, as for uploads: the next comment needs none.
    status, body = await send(guest, "POST", url, csrf, {"text": "Second"})
    assert status == 201 and body["comment"]["name"] == "Aunt Mary" and body["comments"] == 2
    page = await (await admin.client.get(f"/admin/galleries/{gallery['id']}")).get_data(as_text=True)
    assert "&lt;img src=x onerror=" in page and '<img src=x onerror' not in page


async def test_comments_are_rate_limited_per_session(guest: Any, admin: AuthActions, app: Any,
                                                     services: Services) -> None:
    client = app.test_client()  # a second guest's browser
    now = [0.0]
    app.extensions["picpeak_limits"].comment_rate_limit = RateLimit("comment", 10, 0.1, db=services.db,
                                                                    clock=lambda: now[0])
    gallery = await published(admin, name="G")
    slug, photo = gallery["slug"], add_photo(services, gallery["id"])
    csrf, other_csrf = await guest_csrf(guest, slug), await guest_csrf(client, slug)
    url = photo_url(slug, photo, "comments")
    for n in range(10):
        assert (await send(guest, "POST", url, csrf, {"text": f"c{n}", "name": "M"}))[0] == 201
    response = await guest.post(url, json={"text": "one more"}, headers={"X-CSRF-Token": csrf})
    assert response.status_code == 429 and response.headers["Retry-After"] == "10"
    assert (await send(client, "POST", url, other_csrf, {"text": "mine", "name": "N"}))[0] == 201  # per session
    now[0] = 10.0
    assert (await send(guest, "POST", url, csrf, {"text": "later"}))[0] == 201
    assert len(await rows(services, "SELECT id FROM photo_comments")) == 12


async def test_held_comments_are_their_authors_and_the_photographers_until_approved(
        guest: Any, app: Any, admin: AuthActions, services: Services) -> None:
    client = app.test_client()  # a second guest's browser
    gallery = await published(admin, name="G", password="pw-held", hold_comments=True)
    slug, photo = gallery["slug"], add_photo(services, gallery["id"])
    await enter_password(guest, slug, "pw-held")
    await enter_password(client, slug, "pw-held")
    csrf, other_csrf = await guest_csrf(guest, slug), await guest_csrf(client, slug)
    url = photo_url(slug, photo, "comments")

    status, body = await send(guest, "POST", url, csrf, {"text": "Held one", "name": "Ann"})
    assert status == 201 and body["comment"]["status"] == "held" and body["comments"] == 0
    assert body["message"] == "Thank you! Your comment is shown to others once the photographer has approved it."
    held_id = body["comment"]["id"]
    _, body = await send(guest, "POST", url, csrf, {"text": "To be rejected"})
    rejected_id = body["comment"]["id"]

    async def seen_by(viewer: Any) -> list[tuple[str, str | None]]:
        answer = await (await viewer.get(photo_url(slug, photo, "feedback"))).get_json()
        return [(c["text"], c["status"]) for c in answer["comment_list"]]

    assert await seen_by(guest) == [("Held one", "held"), ("To be rejected", "held")]
    assert await seen_by(client) == []  # another guest of the gallery
    stranger = app.test_client()
    assert (await stranger.get(photo_url(slug, photo, "feedback"))).status_code == 401
    listed = await (await admin.client.get(f"/api/admin/galleries/{gallery['id']}/comments")).get_json()
    assert [(c["text"], c["status"], c["name"]) for c in listed["comments"]] == [
        ("To be rejected", "held", "Ann"), ("Held one", "held", "Ann")]

    # Only the admin reviews: a guest's call (with its own CSRF token) is refused before anything happens.
    for who, token in ((guest, csrf), (client, other_csrf), (stranger, "")):
        refused = await who.post(f"/api/admin/galleries/{gallery['id']}/comments",
                                 json={"action": "approve", "ids": [held_id]}, headers={"X-CSRF-Token": token})
        assert refused.status_code == 401
    assert await seen_by(client) == []

    approve = await admin.client.post(f"/api/admin/galleries/{gallery['id']}/comments",
                                      json={"action": "approve", "ids": [held_id, 999_999]}, headers=admin.headers())
    assert await approve.get_json() == {"action": "approve", "changed": [held_id], "ids": [held_id]}
    again = await admin.client.post(f"/api/admin/galleries/{gallery['id']}/comments",
                                    json={"action": "reject", "ids": [held_id]}, headers=admin.headers())
    assert (await again.get_json())["ids"] == []  # reviewed once
    form = await admin.client.post(f"/admin/galleries/{gallery['id']}/comments?only={rejected_id}",
                                   form={"action": "reject", "csrf_token": admin.csrf})
    assert form.status_code == 302 and form.headers["Location"].endswith("#feedback")
    assert await seen_by(client) == [("Held one", "approved")]
    assert await seen_by(guest) == [("Held one", "approved")]  # a rejected comment is no longer shown to its author
    bad = await admin.client.post(f"/api/admin/galleries/{gallery['id']}/comments",
                                  json={"action": "publish", "ids": [held_id]}, headers=admin.headers())
    assert bad.status_code == 400 and (await bad.get_json())["error"] == "Choose one of: approve, reject, delete."
    deleted = await admin.client.post(f"/api/admin/galleries/{gallery['id']}/comments",
                                      json={"action": "delete", "ids": [rejected_id]}, headers=admin.headers())
    assert (await deleted.get_json())["ids"] == [rejected_id]
    assert [r["status"] for r in await rows(services, "SELECT status FROM photo_comments")] == ["approved"]


async def receive_json(ws: Any) -> dict[str, Any]:
    with trio.fail_after(60):
        return json.loads(await ws.receive())


async def test_a_new_comment_is_pushed_to_the_photographer_and_approved_ones_to_guests(
        live: Services, admin: AuthActions, guest: Any, app: Any) -> None:
    gallery = await published(admin, name="G", hold_comments=True)
    slug, photo = gallery["slug"], add_photo(live, gallery["id"])
    csrf = await guest_csrf(guest, slug)
    watcher = app.test_client()
    await guest_csrf(watcher, slug)
    async with watcher.websocket(f"/ws/g/{slug}") as guest_ws, \
            admin.client.websocket(f"/ws/admin/galleries/{gallery['id']}") as admin_ws:
        assert (await receive_json(guest_ws))["type"] == "snapshot"
        assert (await receive_json(admin_ws))["type"] == "snapshot"
        status, body = await send(guest, "POST", photo_url(slug, photo, "comments"), csrf,
                                  {"text": "Print this one", "name": "Ann"})
        assert status == 201
        pushed = await receive_json(admin_ws)
        assert (pushed["type"], pushed["id"], pushed["held"], pushed["comments"]) == ("feedback", photo, 1, 0)
        assert pushed["comment"] == {**pushed["comment"], "name": "Ann", "text": "Print this one", "status": "held"}
        # The other guest is told counts only: no word of the held comment's text or author.
        told = await receive_json(guest_ws)
        assert (told["type"], told["comments"]) == ("feedback", 0) and "comment" not in told
        assert "Print this one" not in json.dumps(told) and "Ann" not in json.dumps(told)

        await admin.client.post(f"/api/admin/galleries/{gallery['id']}/comments",
                                json={"action": "approve", "ids": [body["comment"]["id"]]}, headers=admin.headers())
        assert (await receive_json(admin_ws))["comments"] == 1
        assert (await receive_json(guest_ws))["comments"] == 1
        await send(guest, "PUT", photo_url(slug, photo, "like"), csrf)
        liked = await receive_json(guest_ws)
        assert (liked["type"], liked["likes"]) == ("feedback", 1)
        assert (await receive_json(admin_ws))["likes"] == 1


def exiftool(*args: str) -> list[dict[str, Any]]:
    tool = shutil.which("exiftool")
    assert tool, "exiftool is needed (Debian's libimage-exiftool-perl, listed in .ci/apt-packages)"
    done = subprocess.run([tool, "-j", "-struct", *args], capture_output=True, check=True, timeout=120)
    return json.loads(done.stdout)


async def feedback_world(admin: AuthActions, guest: Any, app: Any, services: Services) -> dict[str, Any]:
    """Two guests' feedback on four photos, one comment held: what the exports are checked against."""
    client = app.test_client()
    gallery = await published(admin, name="G", hold_comments=True)
    slug = gallery["slug"]
    ids = {name: add_photo(services, gallery["id"], name=name)
           for name in ("DSC_0001.NEF.jpg", "DSC_0002.jpg", "DSC_0003.jpg", "DSC_0004.jpg")}
    a, b = await guest_csrf(guest, slug), await guest_csrf(client, slug)
    await guest.post(f"/api/g/{slug}/guest", json={"name": "Ann"}, headers={"X-CSRF-Token": a})
    await client.post(f"/api/g/{slug}/guest", json={"name": "Ben"}, headers={"X-CSRF-Token": b})
    one, two, three = ids["DSC_0001.NEF.jpg"], ids["DSC_0002.jpg"], ids["DSC_0003.jpg"]
    await send(guest, "PUT", f"/api/g/{slug}/favourites/{one}", a)
    await send(guest, "PUT", photo_url(slug, one, "rating"), a, {"stars": 4})
    await send(client, "PUT", photo_url(slug, one, "rating"), b, {"stars": 5})  # mean 4.5 -> 5
    await send(client, "PUT", photo_url(slug, two, "like"), b)
    await send(guest, "PUT", photo_url(slug, two, "rating"), a, {"stars": 2})
    texts = ['Crop the <left> side & "brighten"', "Schön! 😍", "Not yet approved"]
    comment_ids = []
    for text, (who, csrf), photo in zip(texts, ((guest, a), (client, b), (guest, a)), (one, one, three),
                                        strict=True):
        comment_ids.append((await send(who, "POST", photo_url(slug, photo, "comments"), csrf, {"text": text}))[1]
                           ["comment"]["id"])
    await admin.client.post(f"/api/admin/galleries/{gallery['id']}/comments",
                            json={"action": "approve", "ids": comment_ids[:2]}, headers=admin.headers())
    return {"gallery": gallery, "ids": ids, "texts": texts}


async def test_xmp_sidecars_are_read_back_by_exiftool(guest: Any, app: Any, admin: AuthActions,
                                                      services: Services, tmp_path: Path) -> None:
    world = await feedback_world(admin, guest, app, services)
    response = await admin.client.get(f"/admin/galleries/{world['gallery']['id']}/sidecars.zip")
    assert response.status_code == 200 and response.mimetype == "application/zip"
    with zipfile.ZipFile(io.BytesIO(await response.get_data())) as archive:
        assert sorted(archive.namelist()) == ["DSC_0001.NEF.xmp", "DSC_0002.xmp"]  # DSC_0003's only comment waits
        archive.extractall(tmp_path)
    read = {Path(r["SourceFile"]).name: r for r in exiftool("-XMP:Rating", "-XMP:Label", "-XMP:Description",
                                                            str(tmp_path / "DSC_0001.NEF.xmp"),
                                                            str(tmp_path / "DSC_0002.xmp"))}
    first, second = read["DSC_0001.NEF.xmp"], read["DSC_0002.xmp"]
    assert (first["Rating"], first["Label"]) == (5, "Green")  # rated 4 and 5; a favourite
    assert first["Description"] == f"Ann: {world['texts'][0]}\nBen: {world['texts'][1]}"
    assert (second["Rating"], second["Label"]) == (2, "Yellow")  # liked, no favourite
    assert "Description" not in second
    # Anything exiftool warns about (malformed XML, unknown structure) would show here.
    assert all("Warning" not in r and "Error" not in r for r in exiftool(str(tmp_path / "DSC_0001.NEF.xmp")))


async def test_the_proofing_export_has_ratings_likes_and_comments(guest: Any, app: Any, admin: AuthActions,
                                                                   services: Services) -> None:
    world = await feedback_world(admin, guest, app, services)
    gid = world["gallery"]["id"]
    response = await admin.client.get(f"/admin/galleries/{gid}/feedback.csv")
    assert response.status_code == 200 and response.headers["Content-Disposition"].endswith('-feedback.csv"')
    table = list(csv.DictReader(io.StringIO(await response.get_data(as_text=True))))
    by_name = {r["file name"]: r for r in table}
    assert list(by_name) == ["DSC_0001.NEF.jpg", "DSC_0002.jpg"]
    first, second = by_name["DSC_0001.NEF.jpg"], by_name["DSC_0002.jpg"]
    assert (first["favourites"], first["likes"], first["rating"], first["ratings"], first["label"]) == (
        "1", "0", "4.50", "2", "Green")
    assert first["ratings by guest"] == "Ann: 4; Ben: 5"
    assert first["comments"] == f"Ann: {world['texts'][0]}\nBen: {world['texts'][1]}"
    assert (second["likes"], second["rating"], second["label"], second["comments"]) == ("1", "2.00", "Yellow", "")
    text = await (await admin.client.get(f"/admin/galleries/{gid}/feedback.txt")).get_data(as_text=True)
    assert "DSC_0001.NEF.jpg: 0 likes, 1 favourites, 4.5 stars from 2\n" in text
    assert "Ann (" in text and world["texts"][0] in text and "Not yet approved" not in text
    empty = await published(admin, name="Empty")
    missing = await admin.client.get(f"/admin/galleries/{empty['id']}/feedback.csv")
    assert missing.status_code == 404
    page = await (await admin.client.get(f"/admin/galleries/{gid}")).get_data(as_text=True)
    assert f"/admin/galleries/{gid}/sidecars.zip" in page and f"/admin/galleries/{gid}/feedback.csv" in page


async def test_a_session_that_gave_feedback_is_kept(guest: Any, admin: AuthActions, services: Services) -> None:
    gallery = await published(admin, name="G")
    slug, photo = gallery["slug"], add_photo(services, gallery["id"])
    csrf = await guest_csrf(guest, slug)
    await send(guest, "PUT", photo_url(slug, photo, "rating"), csrf, {"stars": 3})
    await services.db.write(guest_q.prune_idle_sessions, services.clock() + 10)
    assert await rows(services, "SELECT stars FROM photo_ratings") == [{"stars": 3}]


async def test_feedback_is_in_the_gallery_change_log_and_not_in_the_uploads(guest: Any, admin: AuthActions,
                                                                            services: Services) -> None:
    """An upload's feed (and its ``?since=`` replay) tells of photos only; a gallery's also of feedback."""
    gallery = await published(admin, name="G")
    slug, photo = gallery["slug"], add_photo(services, gallery["id"])
    csrf = await guest_csrf(guest, slug)
    [row] = await rows(services, "SELECT upload_id FROM photos WHERE id = ?", photo)
    await send(guest, "PUT", photo_url(slug, photo, "like"), csrf)
    await send(guest, "PUT", photo_url(slug, photo, "rating"), csrf, {"stars": 3})
    by_gallery = await services.db.read(change_q.for_gallery_after, gallery["id"], 0)
    by_upload = await services.db.read(change_q.for_upload_after, row["upload_id"], 0)
    assert [r["feedback"] for r in by_gallery] == [0, 1, 1]
    assert [r["feedback"] for r in by_upload] == [0]
