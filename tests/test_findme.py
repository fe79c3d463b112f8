""""Find me" (issue 36): accuracy on real portraits (tests/faces, public domain; see tests/faces/SOURCE.md), the
background index (switching on, guests' photos, cascades, deleting the index), the guests' search (one face,
only what they may see, only their gallery, "not me", rate limit), and that a selfie leaves nothing behind.

These need the ``faces`` extra (it is in ``.[test]``, so CI runs them); without it they are skipped, and the
last test checks what the pages say then (the extra hidden from this process: ``sys.modules`` entries of None,
which ``importlib.util.find_spec`` reads as "not installed")."""

from __future__ import annotations

import fnmatch
import io
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import pytest

from picpeak_lite.media import faces
from picpeak_lite.pipeline import faces as faces_lane
from picpeak_lite.pipeline.faces import FaceIndexer
from picpeak_lite.services import Services

from .conftest import AuthActions
from .factories import add_photo, jpeg, published
from .test_guest_pages import guest_csrf
from .test_upload import rows

FACES = Path(__file__).parent / "faces"
needs_faces = pytest.mark.skipif(not faces.available(), reason="the faces extra is not installed")
# Who each face is, left to right in the picture (tests/faces/SOURCE.md).
WHO = {
    "obama": ["obama"], "obama1": ["obama"], "obama2": ["obama"], "obama3": ["obama"],
    "obama_partial_face": ["obama"], "obama_partial_face2": ["obama"], "biden": ["biden"], "biden2": ["biden"],
    "obama_and_biden": ["biden", "obama", "other"], "two_people": ["obama", "biden"],
}
GROUPS = ("obama_and_biden", "two_people")
PROFILES = ("obama_partial_face", "obama_partial_face2")


def picture(name: str) -> bytes:
    return (FACES / f"{name}.jpg").read_bytes()


def figures(queries: list[str], index: dict[str, list[tuple[str, bytes]]], only: tuple[str, ...] | None = None
            ) -> tuple[int, int, float, float]:
    """(faces, queries, recall, precision): each query picture's one face searched among the other pictures'
    faces (``only``: among those pictures alone); a picture is found when one of its faces is within the
    threshold, and right when that face is the query's person."""
    found_right = found_wrong = missed = 0
    pool = [(name, who, embedding) for name, found in index.items() if only is None or name in only
            for who, embedding in found]
    for query in queries:
        person, embedding = index[query][0]
        candidates = [(name, who, e) for name, who, e in pool if name != query]
        near = faces.nearest(embedding, [e for _, _, e in candidates])
        hits = {candidates[i][0]: candidates[i][1] for i, _ in reversed(near)}  # the nearest face per picture
        for who in hits.values():
            if who == person:
                found_right += 1
            else:
                found_wrong += 1
        missed += len({name for name, who, _ in candidates if who == person} - set(hits))
    recall = found_right / max(1, found_right + missed)
    precision = found_right / max(1, found_right + found_wrong)
    return len(pool), len(queries), recall, precision


@needs_faces
def test_accuracy_on_public_domain_portraits() -> None:
    index: dict[str, list[tuple[str, bytes]]] = {}
    cpu: list[float] = []
    for name, people in WHO.items():
        start = time.process_time()
        found = sorted(faces.find(FACES / f"{name}.jpg"), key=lambda face: face.box[0])
        cpu.append(time.process_time() - start)
        assert len(found) == len(people), name
        index[name] = list(zip(people, (face.embedding for face in found), strict=True))
    singles = [name for name, people in WHO.items() if len(people) == 1]

    count, queries, recall, precision = figures(singles, index)
    print(f"\nfindme: faces={count} queries={queries} recall={recall:.2f} precision={precision:.2f} "
          f"threshold={faces.MATCH_DISTANCE}")
    group = figures([n for n in singles if n not in PROFILES], index, only=GROUPS)
    print(f"findme_groups: faces={group[0]} queries={group[1]} recall={group[2]:.2f} precision={group[3]:.2f}")
    side = figures(list(PROFILES), index)
    print(f"findme_profiles: faces={side[0]} queries={side[1]} recall={side[2]:.2f} precision={side[3]:.2f}")
    print(f"findme_index: cpu_ms_per_picture_p50={statistics.median(cpu[1:]) * 1000:.0f} "
          f"max={max(cpu[1:]) * 1000:.0f} (pictures of at most 900 px; the first, with the models' load: "
          f"{cpu[0] * 1000:.0f})")
    assert precision == 1.0 and group[3] == 1.0 and side[3] == 1.0  # nobody is shown someone else
    assert recall >= 0.95 and group[2] == 1.0 and side[2] >= 0.9


@needs_faces
def test_descriptors_are_dlibs_own(tmp_path: Path) -> None:
    """media/faces.py runs dlib's face network in numpy (dlib-bin's own is 7 times slower): every face of the
    portraits gets the numbers dlib's network gives it, found as dlib alone finds and aligns it."""
    import dlib
    import numpy as np
    from PIL import Image

    detector = dlib.get_frontal_face_detector()
    landmarks = dlib.shape_predictor(str(faces.models_dir() / "shape_predictor_5_face_landmarks.dat"))
    network = dlib.face_recognition_model_v1(str(faces.models_dir() / "dlib_face_recognition_resnet_model_v1.dat"))
    compared, worst = 0, 0.0
    for name in WHO:
        pixels = np.asarray(Image.open(FACES / f"{name}.jpg").convert("RGB"))
        ours = {face.box: faces.unpack(face.embedding) for face in faces.find(FACES / f"{name}.jpg")}
        for rect in detector(pixels, 0):
            box = (rect.left(), rect.top(), rect.right(), rect.bottom())
            if box not in ours:  # cut at the picture's edge: find() keeps the box inside it
                continue
            theirs = np.asarray(network.compute_face_descriptor(pixels, landmarks(pixels, rect)))
            worst = max(worst, float(np.abs(ours[box] - theirs).max()))
            compared += 1
    assert compared >= 11 and worst < 1e-4, (compared, worst)


@needs_faces
def test_a_model_file_of_another_shape_is_refused(tmp_path: Path) -> None:
    """The network is read from face_recognition_models' file with its shape checked: a file that stops early
    (or holds another network) fails loudly at load instead of describing faces wrongly."""
    data = (faces.models_dir() / "dlib_face_recognition_resnet_model_v1.dat").read_bytes()
    cut = tmp_path / "cut.dat"
    cut.write_bytes(data[:data.index(b"\x0aavg_pool_2", len(data) // 2)])
    with pytest.raises(RuntimeError, match="not the network this code knows"):
        faces._Network(cut)


def _in_a_view(name: str, face_px: int) -> bytes:
    """A 1600x1067 view image (PNG) with the portrait ``name`` scaled so that its face is ``face_px`` wide."""
    from PIL import Image

    portrait = Image.open(FACES / f"{name}.jpg").convert("RGB")
    left, _, right, _ = faces.find(FACES / f"{name}.jpg")[0].box
    scale = face_px / (right - left)
    view = Image.new("RGB", (1600, 1067), (128, 128, 128))
    view.paste(portrait.resize((round(portrait.width * scale), round(portrait.height * scale))), (700, 400))
    out = io.BytesIO()
    view.save(out, "PNG")
    return out.getvalue()


@needs_faces
def test_smallest_face_found_in_a_view_image() -> None:
    """The detector scans a 1200-px copy of a 1600-px view (faces.DETECT_SIDE): faces of 100 px are found; the
    smallest found is printed (it was 50-62 px when the whole view was scanned)."""
    smallest = {}
    for name in ("obama1", "biden"):
        assert len(faces.find(_in_a_view(name, 100))) == 1, name
        size = 100
        while size > 40 and faces.find(_in_a_view(name, size - 4)):
            size -= 4
        smallest[name] = size
    print(f"\nfindme_min_face: smallest_found_px_in_1600px_view={smallest} detect_side={faces.DETECT_SIDE} "
          f"(faces of 100 px are always found)")


@needs_faces
def test_view_sized_photo_index_speed(tmp_path: Path) -> None:
    """The figures of the issue: CPU per photo from a 1600-px view image, and the models' memory. Measured in a
    fresh process, as an image child runs the job: one BLAS thread (media/faces.py sets it before numpy loads;
    in this test process numpy is loaded already) and the models loaded on the first face job."""
    from PIL import Image

    big = Image.open(FACES / "obama_and_biden.jpg").resize((1600, 1142))
    path = tmp_path / "view.jpg"
    big.save(path, quality=85)
    script = "\n".join((
        "import statistics, time",
        "from picpeak_lite.media import faces",
        f"faces.find({str(FACES / 'obama.jpg')!r})",
        # VmHWM: this process's own peak (ru_maxrss would count the test process it was forked from).
        "rss = next(int(line.split()[1]) for line in open('/proc/self/status') if line.startswith('VmHWM')) // 1024",
        "cpu = []",
        "for _ in range(5):",
        "    start = time.process_time()",
        f"    count = len(faces.find({str(path)!r}))",
        "    cpu.append(time.process_time() - start)",
        "print(count, round(min(cpu) * 1000), round(statistics.median(cpu) * 1000), rss)",
    ))
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=True)
    count, best, median, rss = done.stdout.split()
    assert count == "3"
    print(f"\nfindme_speed: index_cpu_ms_per_view_1600px={best} median={median} faces=3 "
          f"peak_rss_mb_models_loaded={rss} (in a fresh process with one BLAS thread, as an image child; the models "
          f"load there on its first face job)")


@needs_faces
async def test_search_over_5000_faces(admin: AuthActions, services: Services) -> None:
    """The search's server time (the gallery's faces read from the database and compared) over 5,000 faces in
    500 photos: synthetic vectors, as the search is arithmetic over the stored numbers."""
    import numpy as np
    import trio

    gallery = await published(admin, name="Big")
    photos = [add_photo(services, gallery["id"]) for _ in range(500)]
    vectors = np.random.default_rng(7).normal(size=(5000, faces.DIMENSIONS)).astype("<f4")
    vectors /= np.linalg.norm(vectors, axis=1, keepdims=True) * 2

    def store(conn: Any) -> None:
        for photo in photos:
            conn.execute("INSERT INTO face_scans (photo_id, gallery_id, faces, scanned_at) VALUES (?, ?, 10, 0)",
                         (photo, gallery["id"]))
        for i in range(5000):
            conn.execute("INSERT INTO faces (photo_id, gallery_id, box_left, box_top, box_right, box_bottom, "
                         "embedding) VALUES (?, ?, 0, 0, 60, 60, ?)",
                         (photos[i // 10], gallery["id"], vectors[i].tobytes()))

    await services.db.write(store)
    limiter, times = trio.CapacityLimiter(1), []
    for i in range(40):
        start = time.perf_counter()
        matches = await faces_lane.search(services, gallery["id"], vectors[i * 100].tobytes(), set(),
                                          limiter=limiter)
        times.append(time.perf_counter() - start)
        assert matches[0].photo_id == photos[i * 10] and matches[0].distance == 0
    print(f"\nfindme_search: faces=5000 photos=500 server_ms_p50={statistics.median(times) * 1000:.1f} "
          f"p95={sorted(times)[37] * 1000:.1f} (database read and comparison)")


def _selfie_headers(csrf: str) -> dict[str, str]:
    return {"X-CSRF-Token": csrf, "Content-Type": "image/jpeg", "Accept": "application/json"}


async def _index_all(services: Services) -> int:
    indexer, done = FaceIndexer(services), 0
    while await indexer.index_one():
        done += 1
    return done


async def _switch(admin: AuthActions, gallery_id: int, **form: str) -> None:
    response = await admin.client.post(f"/admin/galleries/{gallery_id}/findme",
                                       form={"csrf_token": admin.csrf, **form})
    assert response.status_code == 302, await response.get_data(as_text=True)


@needs_faces
async def test_search_finds_only_what_this_guest_may_see_and_not_me_refines(
        guest: Any, app: Any, admin: AuthActions, services: Services) -> None:
    a = await published(admin, name="A")
    b = await published(admin, name="B")
    ids = {name: add_photo(services, a["id"], data=picture(name), name=f"{name}.jpg")
           for name in ("obama", "obama1", "obama3", "biden", "biden2", "two_people", "obama_and_biden")}
    hidden = add_photo(services, a["id"], data=picture("obama_partial_face"), hidden=1)
    elsewhere = add_photo(services, b["id"], data=picture("obama_partial_face2"))
    assert await _index_all(services) == 0  # "Find me" is off everywhere: nothing is looked at
    slug = a["slug"]
    assert (await guest.get(f"/g/{slug}/findme")).status_code == 404

    await _switch(admin, a["id"], find_me="on")
    await _switch(admin, b["id"], find_me="on")
    assert await _index_all(services) == 9  # the photos already there, both galleries
    page = await admin.client.get(f"/admin/galleries/{a['id']}")
    assert "8 of 8 photos looked at, 11 faces indexed." in " ".join((await page.get_data(as_text=True)).split())

    html = await (await guest.get(f"/g/{slug}")).get_data(as_text=True)
    assert f'href="/g/{slug}/findme"' in html
    html = await (await guest.get(f"/g/{slug}/findme")).get_data(as_text=True)
    assert "never stored and never leaves this server" in html and 'id="consent-camera"' in html
    csrf = await guest_csrf(guest, slug)

    response = await guest.post(f"/api/g/{slug}/findme", data=picture("obama2"), headers=_selfie_headers(csrf))
    assert response.status_code == 200, await response.get_data(as_text=True)
    body = await response.get_json()
    found = [m["photo_id"] for m in body["matches"]]
    assert set(found) == {ids["obama"], ids["obama1"], ids["obama3"], ids["two_people"], ids["obama_and_biden"]}
    assert hidden not in found and elsewhere not in found  # hidden from guests; gallery B's
    distances = [m["distance"] for m in body["matches"]]
    assert distances == sorted(distances) and body["message"] == "5 photos found."
    assert set(body["matches"][0]) == {"photo_id", "face_id", "distance", "grid_url", "view_url"}

    # "Not me" on one result: it goes, with the shown faces more like it than like the selfie and as near to it as
    # one person's two photos; the guest's own photos stay. The look-alike is played by Biden's faces, shown
    # (as the client says) at 0.5 from the selfie: refusing one portrait hides his others, never Obama's.
    stored = await rows(services, "SELECT id, photo_id FROM faces WHERE gallery_id = ?", a["id"])
    biden_faces = {r["photo_id"]: r["id"] for r in stored if r["photo_id"] in (ids["biden"], ids["biden2"])}
    shown = [{"face": m["face_id"], "distance": m["distance"]} for m in body["matches"]]
    shown += [{"face": face, "distance": 0.5} for face in biden_faces.values()]
    response = await guest.post(f"/api/g/{slug}/findme/not-me", headers={"X-CSRF-Token": csrf},
                                json={"face": biden_faces[ids["biden"]], "shown": shown})
    answer = await response.get_json()
    assert response.status_code == 200 and sorted(answer["hide"]) == sorted(biden_faces.values())
    assert answer["message"] == "5 photos found."
    # Refusing one of their own: that one goes for this guest (with those more like it than like the selfie:
    # here nothing tells the two apart), and what went stays gone in their next search.
    refused = next(m for m in body["matches"] if m["photo_id"] == ids["obama3"])
    response = await guest.post(f"/api/g/{slug}/findme/not-me", headers={"X-CSRF-Token": csrf},
                                json={"face": refused["face_id"], "shown": shown[:5]})
    hidden = set((await response.get_json())["hide"])
    assert refused["face_id"] in hidden
    response = await guest.post(f"/api/g/{slug}/findme", data=picture("obama2"), headers=_selfie_headers(csrf))
    again = {m["face_id"] for m in (await response.get_json())["matches"]}
    assert again == {m["face_id"] for m in body["matches"]} - hidden
    # Kept in the database, not one process's memory: a search answered by another process or host knows it.
    remembered = await rows(services, "SELECT face_id FROM findme_not_me WHERE gallery_id = ?", a["id"])
    assert {r["face_id"] for r in remembered} == hidden | set(biden_faces.values())
    for bad in ({"face": refused["face_id"], "shown": [1, 2]}, {"face": "1", "shown": []},
                {"face": refused["face_id"], "shown": [{"face": 1, "distance": "near"}]}):
        response = await guest.post(f"/api/g/{slug}/findme/not-me", headers={"X-CSRF-Token": csrf}, json=bad)
        assert response.status_code == 400
    # Another guest's "not me" is theirs: a second browser still finds the photo.
    other = app.test_client()
    other_csrf = await guest_csrf(other, slug)
    response = await other.post(f"/api/g/{slug}/findme", data=picture("obama2"), headers=_selfie_headers(other_csrf))
    assert ids["obama3"] in [m["photo_id"] for m in (await response.get_json())["matches"]]
    # A face of gallery B is not this gallery's to refuse.
    b_face = (await rows(services, "SELECT id FROM faces WHERE gallery_id = ?", b["id"]))[0]["id"]
    response = await guest.post(f"/api/g/{slug}/findme/not-me", json={"face": b_face, "shown": []},
                                headers={"X-CSRF-Token": csrf})
    assert response.status_code == 404

    # No face, several faces, not a picture: a sentence each. The fifth search of the burst is still served,
    # the sixth is told to wait.
    response = await guest.post(f"/api/g/{slug}/findme", data=jpeg(3), headers=_selfie_headers(csrf))
    assert response.status_code == 422
    assert (await response.get_json())["error"].startswith("No face was found in this picture.")
    response = await guest.post(f"/api/g/{slug}/findme", data=picture("two_people"), headers=_selfie_headers(csrf))
    assert response.status_code == 422
    assert (await response.get_json())["error"].startswith("This picture shows more than one face.")
    response = await guest.post(f"/api/g/{slug}/findme", data=b"not a picture at all",
                                headers=_selfie_headers(csrf))
    assert response.status_code == 422
    assert (await response.get_json())["error"].startswith("This picture could not be read.")
    response = await guest.post(f"/api/g/{slug}/findme", data=picture("obama2"), headers=_selfie_headers(csrf))
    assert response.status_code == 429
    # Without the CSRF token: refused before anything is read.
    response = await other.post(f"/api/g/{slug}/findme", data=picture("obama2"),
                                headers={"Content-Type": "image/jpeg"})
    assert response.status_code == 403


def _scan(roots: list[tuple[Any, float]], needles: list[bytes], leave_out: str = "") -> tuple[int, list[str]]:
    """(files read, those holding a needle) under each root, of the files modified since its time, outside the
    folders whose names match the pattern ``leave_out``."""
    scanned, holding = 0, []
    for root, since in roots:
        for folder, folders, names in os.walk(root):
            folders[:] = [name for name in folders if not (leave_out and fnmatch.fnmatch(name, leave_out))]
            for name in names:
                path = os.path.join(folder, name)
                try:
                    info = os.stat(path)
                    if info.st_mtime < since or info.st_size > 200_000_000:
                        continue
                    content = Path(path).read_bytes()
                except OSError:
                    continue
                scanned += 1
                if any(needle in content for needle in needles):
                    holding.append(path)
    return scanned, holding


@needs_faces
async def test_a_selfie_leaves_no_bytes_on_disk_or_in_the_database(guest: Any, admin: AuthActions,
                                                                    services: Services) -> None:
    gallery = await published(admin, name="A")
    add_photo(services, gallery["id"], data=picture("obama"))
    await _switch(admin, gallery["id"], find_me="on")
    await _index_all(services)
    slug = gallery["slug"]
    csrf = await guest_csrf(guest, slug)
    selfie = picture("obama1")
    began = time.time() - 1
    response = await guest.post(f"/api/g/{slug}/findme", data=selfie, headers=_selfie_headers(csrf))
    assert response.status_code == 200 and len((await response.get_json())["matches"]) == 1
    # Three slices of the selfie's entropy-coded data, searched in every file under the data directory (the
    # database, its WAL, temp folders, storage) and every file of the system's temp folder written since the
    # test began (it is shared with other programs). Left out there: the test runs' own folders (pytest's
    # pytest-of-<user>), where the other engine's pass, running beside this one, may be storing the same
    # picture as a photo at this moment; this test's data directory is among them and is searched whole.
    needles = [selfie[i:i + 48] for i in (len(selfie) // 4, len(selfie) // 2, 3 * len(selfie) // 4)]
    scanned, holding = _scan([(services.settings.data_dir, 0.0), (tempfile.gettempdir(), began)], needles,
                             leave_out="pytest-of-*")
    assert holding == []
    assert scanned > 3
    print(f"\nfindme_privacy: files_scanned={scanned} selfie_bytes_found=0")


@needs_faces
async def test_index_follows_the_gallery_guest_photos_deletions(guest: Any, admin: AuthActions,
                                                                services: Services) -> None:
    gallery = await published(admin, name="A")
    gid = gallery["id"]
    mine = add_photo(services, gid, data=picture("obama"))
    theirs = add_photo(services, gid, data=picture("biden"))
    await services.db.write(lambda conn: conn.execute("UPDATE photos SET uploaded_by = 'guest' WHERE id = ?",
                                                      (theirs,)))
    await _switch(admin, gid, find_me="on")
    assert await _index_all(services) == 1  # the guest's photo is not indexed...
    await _switch(admin, gid, find_me="on", find_me_guest_uploads="on")
    assert await _index_all(services) == 1  # ...until the gallery says so
    assert len(await rows(services, "SELECT id FROM faces WHERE gallery_id = ?", gid)) == 2
    await _switch(admin, gid, find_me="on")  # and off again: its faces go at once
    assert [r["photo_id"] for r in await rows(services, "SELECT photo_id FROM faces")] == [mine]

    # Deleting the photo deletes its faces.
    second = add_photo(services, gid, data=picture("obama2"))
    assert await _index_all(services) == 1
    response = await admin.client.delete(f"/api/admin/photos/{second}", headers=admin.headers())
    assert response.status_code == 204
    assert await rows(services, "SELECT id FROM faces WHERE photo_id = ?", second) == []

    # Deleting the index: at once, and "Find me" is off (nothing is indexed again).
    response = await admin.client.post(f"/admin/galleries/{gid}/findme/delete", form={"csrf_token": admin.csrf})
    assert response.status_code == 302
    assert await rows(services, "SELECT id FROM faces") == [] and await _index_all(services) == 0
    assert (await rows(services, "SELECT find_me FROM galleries WHERE id = ?", gid))[0]["find_me"] == 0
    trail = await rows(services, "SELECT detail FROM audit_log WHERE gallery_id = ? ORDER BY id DESC LIMIT 1", gid)
    assert trail == [{"detail": "find me off, face index deleted (1 faces)"}]

    # Deleting the gallery deletes its faces.
    await _switch(admin, gid, find_me="on")
    assert await _index_all(services) == 1
    response = await admin.client.delete(f"/api/admin/galleries/{gid}", headers=admin.headers())
    assert response.status_code in (200, 204)
    assert await rows(services, "SELECT id FROM faces") == []
    assert await rows(services, "SELECT photo_id FROM face_scans") == []


@needs_faces
async def test_a_photo_whose_faces_cannot_be_read_is_counted_not_retried(admin: AuthActions,
                                                                         services: Services) -> None:
    gallery = await published(admin, name="A")
    broken = add_photo(services, gallery["id"], data=picture("obama"))
    key = (await rows(services, "SELECT storage_key FROM photos WHERE id = ?", broken))[0]["storage_key"]
    services.storage.write_derivative(key, "view", b"\xff\xd8 not really a jpeg")
    await _switch(admin, gallery["id"], find_me="on")
    assert await _index_all(services) == 1 and await _index_all(services) == 0
    scan = (await rows(services, "SELECT faces, error FROM face_scans WHERE photo_id = ?", broken))[0]
    assert scan["faces"] == 0 and scan["error"]
    page = await (await admin.client.get(f"/admin/galleries/{gallery['id']}")).get_data(as_text=True)
    assert "1 photo could not be read" in page



@needs_faces
async def test_the_lane_wakes_when_switched_on_and_resumes_where_it_stopped(admin: AuthActions,
                                                                           services: Services) -> None:
    import trio

    gallery = await published(admin, name="A")
    for name in ("obama", "obama1", "biden"):
        add_photo(services, gallery["id"], data=picture(name))
    await _switch(admin, gallery["id"], find_me="on")
    assert await FaceIndexer(services).index_one()  # one photo, then the process "dies"
    progress = await faces_lane.progress(services, gallery["id"])
    assert (progress["photos"], progress["scanned"]) == (3, 1)

    async with trio.open_nursery() as nursery:  # a new process's lane, with a poll far beyond the test
        await nursery.start(FaceIndexer(services, poll_seconds=3600).run)
        while (await faces_lane.progress(services, gallery["id"]))["scanned"] < 3:
            await trio.sleep(0.05)
        # Switched on for another gallery with photos: the bell wakes the idle lane at once.
        other = await published(admin, name="B")
        add_photo(services, other["id"], data=picture("obama2"))
        await _switch(admin, other["id"], find_me="on")
        while (await faces_lane.progress(services, other["id"]))["scanned"] < 1:
            await trio.sleep(0.05)
        nursery.cancel_scope.cancel()
    assert (await faces_lane.progress(services, gallery["id"]))["faces"] == 3


async def test_without_the_extra_the_pages_say_how_to_turn_it_on(guest: Any, admin: AuthActions, services: Services,
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("dlib", "numpy", "face_recognition_models"):
        monkeypatch.setitem(sys.modules, name, None)
    assert not faces.available()
    gallery = await published(admin, name="A")
    add_photo(services, gallery["id"])
    page = await (await admin.client.get(f"/admin/galleries/{gallery['id']}")).get_data(as_text=True)
    assert "pip install &#39;picpeak-lite[faces]&#39;, then restart." in page
    assert 'name="find_me"' not in page  # no switch to flip
    response = await admin.client.post(f"/admin/galleries/{gallery['id']}/findme",
                                       form={"csrf_token": admin.csrf, "find_me": "on"})
    assert response.status_code == 422
    assert "pip install &#39;picpeak-lite[faces]&#39;" in await response.get_data(as_text=True)
    # A gallery switched on before the extra went: guests are told, and nothing else of the gallery changes.
    await services.db.write(lambda conn: conn.execute("UPDATE galleries SET find_me = 1 WHERE id = ?",
                                                      (gallery["id"],)))
    html = await (await guest.get(f"/g/{gallery['slug']}/findme")).get_data(as_text=True)
    assert "Find me is not available on this server yet." in html and 'id="consent-camera"' not in html
    csrf = await guest_csrf(guest, gallery["slug"])
    response = await guest.post(f"/api/g/{gallery['slug']}/findme", data=b"x", headers=_selfie_headers(csrf))
    assert response.status_code == 422 and "picpeak-lite[faces]" in (await response.get_json())["error"]
    assert (await guest.get(f"/api/g/{gallery['slug']}/photos")).status_code == 200
