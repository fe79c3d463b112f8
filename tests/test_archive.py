"""Archive and restore (pipeline/archive.py, store/packing.py) on local storage, through the real app, the real
worker pool and the archiver's own passes: every original's sha256 equal before and after, the derivatives gone
and made again, the guest page saying so with the photographer's contact, the freed bytes on the gallery page,
auto-archiving on expiry on trio's autojump_clock, and resuming after a stop between two real steps."""

from __future__ import annotations

import tarfile
import time
from pathlib import Path
from typing import Any

import pytest
import trio

from picpeak_lite.ops.check import check_data_dir
from picpeak_lite.pipeline import archive
from picpeak_lite.pipeline.archive import Archiver
from picpeak_lite.pipeline.janitor import Janitor
from picpeak_lite.services import Services
from picpeak_lite.store import packing
from picpeak_lite.store.db import Database
from picpeak_lite.store.queries import archive as archive_q
from picpeak_lite.store.storage import Storage, original_name

from . import pgserver
from .conftest import AuthActions, make_settings, sql
from .factories import photo_jpeg, published, run_pool_until_idle, stage_photo
from .harness import figures
from .test_upload import admin_upload


async def gallery_with_photos(admin: AuthActions, services: Services, count: int = 3,
                              **fields: Any) -> tuple[dict[str, Any], dict[int, str]]:
    """A published gallery with ``count`` processed photos; returns it and each photo's original sha256 as read
    from the storage (and checked against its row)."""
    gallery = await published(admin, name="Wedding", **fields)
    sent = [(f"p{i}.jpg", photo_jpeg(seed=40 + i)) for i in range(count)]
    response = await admin_upload(admin, gallery["id"], sent)
    assert response.status_code == 202, await response.get_data(as_text=True)
    await run_pool_until_idle(services)
    return gallery, await original_shas(services, gallery["id"])


async def original_shas(services: Services, gallery_id: int) -> dict[int, str]:
    rows = await services.db.read(archive_q.photos_of, gallery_id)
    storage = services.storage
    shas = {r["id"]: await trio.to_thread.run_sync(storage.sha256_of, original_name(r["storage_key"]))
            for r in rows}
    assert shas == {r["id"]: r["sha256"] for r in rows}
    return shas


async def gallery(services: Services, gallery_id: int) -> dict[str, Any]:
    [row] = sql(services, "SELECT * FROM galleries WHERE id = ?", gallery_id)
    return row


def stored_names(storage: Storage, keys: list[str]) -> list[str]:
    return sorted(name for key in keys for prefix in (original_name(key), f"derived/{key[:2]}/{key}.")
                  for name, _ in storage.list_objects(prefix))


async def keys_of(services: Services, gallery_id: int) -> list[str]:
    return [r["storage_key"] for r in await services.db.read(archive_q.photos_of, gallery_id)]


async def set_contact(services: Services) -> None:
    sql(services, "INSERT INTO app_settings (key, value) VALUES ('contact_name', '\"Ana Studio\"'), "
                  "('contact_email', '\"ana@example.com\"'), ('contact_phone', '\"+49 30 1234\"')")


async def test_round_trip_keeps_every_original_and_remakes_the_images(admin: AuthActions, guest: Any,
                                                                     services: Services, capsys: Any) -> None:
    g, before = await gallery_with_photos(admin, services, watermark=True)
    storage = services.storage
    keys = await keys_of(services, g["id"])
    # A cached watermarked download is a derivative too.
    first = min(before)
    download = await guest.get(f"/g/{g['slug']}/photos/{first}/download")
    assert download.status_code == 200
    names = stored_names(storage, keys)
    assert len(names) == 3 * 3 + 1 and sum(".wm-" in n for n in names) == 1
    bytes_on_disk = sum(storage.stat(n).size for n in names)
    await set_contact(services)

    asked = await admin.client.post(f"/api/admin/galleries/{g['id']}/archive", headers=admin.headers())
    assert asked.status_code == 202
    assert (await asked.get_json())["archive"]["state"] == "archiving"
    [done] = await Archiver(services).pass_once()
    assert done.state == "archived" and done.error is None
    row = await gallery(services, g["id"])
    assert stored_names(storage, keys) == [], "every loose original and every derivative is gone"
    archive_file = services.settings.data_path / row["archive_object"]
    assert row["archive_bytes_before"] == bytes_on_disk
    assert row["archive_bytes_after"] == archive_file.stat().st_size
    assert done.freed == bytes_on_disk - archive_file.stat().st_size > 0
    with tarfile.open(archive_file) as tar:
        assert sorted(tar.getnames()) == sorted(["manifest.json", *(original_name(k) for k in keys)])
    figures(capsys, f"archive local: {len(keys)} photos, {bytes_on_disk} bytes before, {row['archive_bytes_after']} "
            f"after, {done.freed} freed")

    # Guests: the gallery page says it is archived, with the contact; photos and zips are gone too.
    page = await guest.get(f"/g/{g['slug']}")
    html = await page.get_data(as_text=True)
    assert page.status_code == 410
    assert "This gallery has been archived" in html and 'href="mailto:ana@example.com"' in html
    assert "Ana Studio" in html and 'href="tel:+49301234"' in html
    assert (await guest.get(f"/g/{g['slug']}/photos/{first}/grid")).status_code == 410
    assert (await guest.get(f"/g/{g['slug']}/download")).status_code == 410
    # The photographer's page shows the space freed, and the restore button.
    admin_page = await (await admin.client.get(f"/admin/galleries/{g['id']}")).get_data(as_text=True)
    assert f'data-bytes-freed="{done.freed}"' in admin_page and "Restore" in admin_page
    assert "3 photos are archived" in admin_page and 'id="upload"' not in admin_page  # no broken thumbnails
    dashboard = await (await admin.client.get("/admin/")).get_data(as_text=True)
    assert '<span class="badge">Archived</span>' in dashboard and "cover-thumb placeholder" in dashboard
    # Nothing else mistakes the packed originals for lost ones: neither the reconciler nor check.
    counts = await Janitor(services).reconcile()
    assert counts["missing_failed"] == 0 and counts["orphans_removed"] == 0
    report = await trio.to_thread.run_sync(lambda: check_data_dir(services.settings))
    assert report.problems == 0 and report.archived == len(keys)
    # A watermark change while archived makes no images of originals that are packed away.
    off = await admin.client.patch(f"/api/admin/galleries/{g['id']}", json={"watermark": False},
                                   headers=admin.headers())
    assert off.status_code == 200
    assert {r["views_stale"] for r in rows_now(services, g["id"])} == {0}
    # No upload lands in an archived gallery.
    refused = await admin_upload(admin, g["id"], [("late.jpg", photo_jpeg(seed=99))])
    assert refused.status_code == 409
    assert sql(services, "SELECT count(*) AS n FROM photos WHERE gallery_id = ?", g["id"])[0]["n"] == len(keys)

    restore = await admin.client.post(f"/admin/galleries/{g['id']}/restore",
                                      form={"csrf_token": admin.csrf})
    assert restore.status_code == 302
    [done] = await Archiver(services).pass_once()
    assert done.state == "active"
    assert sorted(r["status"] for r in sql(services, "SELECT status FROM photos WHERE gallery_id = ?", g["id"])) \
        == ["pending"] * len(keys), "the photos go back through the normal pipeline"
    assert await original_shas(services, g["id"]) == before, "every original is back, byte for byte"
    assert not archive_file.exists()
    await run_pool_until_idle(services)
    assert {r["status"] for r in sql(services, "SELECT status FROM photos WHERE gallery_id = ?", g["id"])} \
        == {"complete"}
    assert len(stored_names(storage, keys)) == 3 * 3
    assert (await guest.get(f"/g/{g['slug']}")).status_code == 200
    assert (await guest.get(f"/g/{g['slug']}/photos/{first}/grid")).status_code == 200
    admin_page = await (await admin.client.get(f"/admin/galleries/{g['id']}")).get_data(as_text=True)
    assert "data-bytes-freed" not in admin_page and "Archive now" in admin_page


async def test_archive_is_refused_while_photos_wait_and_restore_only_when_archived(
        admin: AuthActions, services: Services) -> None:
    g = await published(admin, name="Busy")
    assert (await admin_upload(admin, g["id"], [("a.jpg", photo_jpeg(seed=1))])).status_code == 202
    busy = await admin.client.post(f"/api/admin/galleries/{g['id']}/archive", headers=admin.headers())
    assert busy.status_code == 409 and "still being processed" in (await busy.get_json())["error"]
    early = await admin.client.post(f"/api/admin/galleries/{g['id']}/restore", headers=admin.headers())
    assert early.status_code == 409 and "Only an archived gallery" in (await early.get_json())["error"]
    page = await admin.client.post(f"/admin/galleries/{g['id']}/archive", form={"csrf_token": admin.csrf})
    assert page.status_code == 409 and "still being processed" in await page.get_data(as_text=True)
    assert (await gallery(services, g["id"]))["archive_state"] == "active"
    missing = await admin.client.post("/api/admin/galleries/999999/archive", headers=admin.headers())
    assert missing.status_code == 404


async def test_a_changed_original_stops_archiving_and_nothing_is_removed(admin: AuthActions,
                                                                         services: Services) -> None:
    g, _ = await gallery_with_photos(admin, services, count=2)
    keys = await keys_of(services, g["id"])
    path = services.settings.data_path / original_name(keys[1])
    path.write_bytes(path.read_bytes()[:-10] + b"0123456789")  # bit rot
    names = stored_names(services.storage, keys)
    await services.db.write(archive.request_archive, g["id"])
    [done] = await Archiver(services).pass_once()
    assert done.state == "active" and "no longer matches its sha256" in (done.error or "")
    assert stored_names(services.storage, keys) == names
    assert not (services.settings.data_path / "archives").exists() or not any(
        (services.settings.data_path / "archives").iterdir())


async def test_stops_between_steps_resume_to_the_same_end(admin: AuthActions, services: Services) -> None:
    """A crash is a stop between two real steps: the state is what the database says, and the archiver's next pass
    (as at start-up) finishes the job. Each stop below is made with the public step functions themselves."""
    g, before = await gallery_with_photos(admin, services, count=3)
    storage = services.storage
    rows = await services.db.read(archive_q.photos_of, g["id"])
    keys = [r["storage_key"] for r in rows]
    name = packing.archive_name(g["id"])
    packed = [packing.Packed(r["id"], r["storage_key"], r["sha256"], storage.stat(original_name(r["storage_key"])).size)
              for r in rows]

    # 1. Stopped after the archive object was written, before it was recorded: packed again, then finished.
    await services.db.write(archive.request_archive, g["id"])
    await trio.to_thread.run_sync(packing.pack, storage, packed[:1], name)  # a half-made earlier try
    [done] = await Archiver(services).pass_once()
    assert done.state == "archived" and stored_names(storage, keys) == []
    await services.db.write(archive.request_restore, g["id"])
    await Archiver(services).pass_once()
    assert await original_shas(services, g["id"]) == before
    await run_pool_until_idle(services)

    # 2. Stopped after recording, with part of the loose files removed: the rest is checked and removed.
    await services.db.write(archive.request_archive, g["id"])
    await trio.to_thread.run_sync(packing.pack, storage, packed, name)
    await trio.to_thread.run_sync(packing.read_back, storage, name, {p.key: p.sha256 for p in packed})
    assert await services.db.write(archive_q.record_packed, g["id"], name, 12345)
    await trio.to_thread.run_sync(storage.remove_files_of, keys[:1])
    assert (await gallery(services, g["id"]))["archive_state"] == "archiving"
    [done] = await Archiver(services).pass_once()
    assert done.state == "archived" and done.bytes_before == 12345 and stored_names(storage, keys) == []

    # 3. Restoring stopped after one original was unpacked: the others are unpacked, each checked.
    await services.db.write(archive.request_restore, g["id"])
    one = {keys[0]: rows[0]["sha256"]}
    assert await trio.to_thread.run_sync(packing.unpack, storage, name, one) == 1
    [done] = await Archiver(services).pass_once()
    assert done.state == "active" and await original_shas(services, g["id"]) == before
    await run_pool_until_idle(services)

    # 4. Restoring stopped after every original was back and the archive removed, before the last commit.
    await services.db.write(archive.request_archive, g["id"])
    await Archiver(services).pass_once()
    await services.db.write(archive.request_restore, g["id"])
    wanted = {r["storage_key"]: r["sha256"] for r in rows}
    assert await trio.to_thread.run_sync(packing.unpack, storage, name, wanted) == len(rows)
    await trio.to_thread.run_sync(storage.remove, name)
    [done] = await Archiver(services).pass_once()
    assert done.state == "active" and await original_shas(services, g["id"]) == before
    assert {r["status"] for r in rows_now(services, g["id"])} == {"pending"}


def rows_now(services: Services, gallery_id: int) -> list[dict[str, Any]]:
    return sql(services, "SELECT * FROM photos WHERE gallery_id = ?", gallery_id)


async def test_a_corrupt_archive_is_not_restored_and_nothing_is_lost(admin: AuthActions,
                                                                      services: Services) -> None:
    g, before = await gallery_with_photos(admin, services, count=2)
    await services.db.write(archive.request_archive, g["id"])
    await Archiver(services).pass_once()
    row = await gallery(services, g["id"])
    path = services.settings.data_path / row["archive_object"]
    data = bytearray(path.read_bytes())
    data[2048] ^= 0xFF  # inside the first original's bytes (the manifest's header and body come first)
    path.write_bytes(bytes(data))
    await services.db.write(archive.request_restore, g["id"])
    [done] = await Archiver(services).pass_once()
    assert done.state == "restoring" and "does not match its sha256" in (done.error or "")
    assert path.exists(), "the archive is kept"
    data[2048] ^= 0xFF
    path.write_bytes(bytes(data))  # the photographer puts back a good copy: the next pass finishes
    [done] = await Archiver(services).pass_once()
    assert done.state == "active" and await original_shas(services, g["id"]) == before


async def test_expired_galleries_are_archived_only_when_they_say_so(admin: AuthActions, services: Services,
                                                                    autojump_clock: trio.abc.Clock) -> None:
    """The archiver's own loop on virtual time: a gallery set to archive is archived once it has expired, never
    before; one set to keep stays as it is."""
    archiving = await published(admin, name="Archive me", on_expiry="archive")
    keeping = await published(admin, name="Keep me")
    assert archiving["on_expiry"] == "archive" and keeping["on_expiry"] == "keep"
    for g in (archiving, keeping):  # complete photos without the worker pool (whose deadlines this clock skips)
        photo_id, _ = stage_photo(services, g["id"], photo_jpeg(seed=g["id"]))
        sql(services, "UPDATE photos SET status = 'complete', completed_at = 1 WHERE id = ?", photo_id)
        [row] = sql(services, "SELECT storage_key FROM photos WHERE id = ?", photo_id)
        services.storage.write_derivative(row["storage_key"], "grid", b"grid")
    now = trio.current_time()
    start = time.time() - now
    services.clock = lambda: start + trio.current_time()  # wall-clock rows on the virtual clock
    expires = start + now + 1000
    sql(services, "UPDATE galleries SET expires_at = ?", expires)
    async with trio.open_nursery() as nursery:
        await nursery.start(Archiver(services).run)
        # Virtual time runs on while the archiver's threads work, so no bound on it is asserted: what shows that
        # nothing happened before the expiry is the time the archive was finished, which the rows' clock records.
        for _ in range(100_000):  # a hung-test stop only
            if (await gallery(services, archiving["id"]))["archive_state"] == "archived":
                break
            await trio.sleep(5)
        nursery.cancel_scope.cancel()
    row = await gallery(services, archiving["id"])
    assert row["archived_at"] >= expires
    assert stored_names(services.storage, await keys_of(services, archiving["id"])) == []
    assert len(stored_names(services.storage, await keys_of(services, keeping["id"]))) == 2
    assert (await gallery(services, keeping["id"]))["archive_state"] == "active"


async def test_the_install_default_and_the_form_choice(admin: AuthActions, services: Services,
                                                       tmp_path: Path) -> None:
    made = await admin.create_gallery(name="Default")
    assert made["on_expiry"] == "keep"
    bad = await admin.client.post("/api/admin/galleries", json={"name": "Bad", "on_expiry": "burn"},
                                  headers=admin.headers())
    assert bad.status_code == 400 and (await bad.get_json())["fields"]["on_expiry"] == "Choose keep or archive."
    form = await (await admin.client.get(f"/admin/galleries/{made['id']}/edit")).get_data(as_text=True)
    assert 'name="on_expiry"' in form and '<option value="keep" selected>' in form
    changed = await admin.client.patch(f"/api/admin/galleries/{made['id']}", json={"on_expiry": "archive"},
                                       headers=admin.headers())
    assert (await changed.get_json())["on_expiry"] == "archive"
    services.settings = services.settings.__class__(**{**services.settings.__dict__,
                                                       "archive_on_expiry": "archive"})
    assert (await admin.create_gallery(name="Archived by default"))["on_expiry"] == "archive"


@pytest.mark.system
async def test_the_command_line_archives_and_restores(admin: AuthActions, services: Services,
                                                      capsys: Any) -> None:
    from .test_cli import run_cli

    g, before = await gallery_with_photos(admin, services, count=2)
    data_dir = str(services.settings.data_path)
    archived = await trio.to_thread.run_sync(lambda: run_cli("gallery", "archive", g["slug"], "--data-dir",
                                                             data_dir))
    assert archived.returncode == 0, archived.stderr
    row = await gallery(services, g["id"])
    freed = row["archive_bytes_before"] - row["archive_bytes_after"]
    assert row["archive_state"] == "archived" and freed > 0
    assert f"{freed} freed" in archived.stdout
    figures(capsys, f"archive cli: {archived.stdout.strip()}")
    again = await trio.to_thread.run_sync(lambda: run_cli("gallery", "archive", g["slug"], "--data-dir", data_dir))
    assert again.returncode == 1 and "not active" in again.stderr
    restored = await trio.to_thread.run_sync(lambda: run_cli("gallery", "restore", g["slug"], "--data-dir",
                                                             data_dir))
    assert restored.returncode == 0, restored.stderr
    assert "Restored" in restored.stdout
    assert await original_shas(services, g["id"]) == before


async def test_a_backup_carries_the_archive_and_restores_from_it(admin: AuthActions, services: Services,
                                                                 tmp_path: Path) -> None:
    """backup copies an archived gallery's archive object in place of its loose originals; the backup, restored
    into a new data directory, passes check and restores every original."""
    from picpeak_lite.ops.backup import backup
    from picpeak_lite.ops.restore import restore

    g, before = await gallery_with_photos(admin, services, count=2)
    await services.db.write(archive.request_archive, g["id"])
    await Archiver(services).pass_once()
    name = (await gallery(services, g["id"]))["archive_object"]
    target = tmp_path / "backup"
    summary = await trio.to_thread.run_sync(backup, services.settings, target)
    assert summary.problems == 0 and summary.missing_originals == []
    assert (target / name).read_bytes() == (services.settings.data_path / name).read_bytes()
    pgserver.empty_database_for(tmp_path / "restored")
    restored = make_settings(tmp_path, data_dir=str(tmp_path / "restored"))
    await trio.to_thread.run_sync(restore, restored, target)
    report = await trio.to_thread.run_sync(lambda: check_data_dir(restored))
    assert report.problems == 0 and report.archived == 2
    elsewhere = Services(settings=restored, db=Database(restored.database))
    try:
        await elsewhere.db.write(archive.request_restore, g["id"])
        [done] = await Archiver(elsewhere).pass_once()
        assert done.state == "active"
        assert await original_shas(elsewhere, g["id"]) == before
    finally:
        elsewhere.db.close()


async def test_an_original_lost_before_archiving_is_failed_on_restore_and_the_others_come_back(
        admin: AuthActions, services: Services) -> None:
    g, before = await gallery_with_photos(admin, services, count=2)
    rows = await services.db.read(archive_q.photos_of, g["id"])
    (services.settings.data_path / original_name(rows[0]["storage_key"])).unlink()  # lost before the reconciler ran
    await services.db.write(archive.request_archive, g["id"])
    [done] = await Archiver(services).pass_once()
    assert done.state == "archived"
    name = (await gallery(services, g["id"]))["archive_object"]
    assert set(packing.read_manifest(services.storage, name)) == {rows[1]["storage_key"]}
    await services.db.write(archive.request_restore, g["id"])
    [done] = await Archiver(services).pass_once()
    assert done.state == "active"
    statuses = {r["id"]: (r["status"], r["error"]) for r in rows_now(services, g["id"])}
    assert statuses[rows[1]["id"]] == ("pending", None)
    assert statuses[rows[0]["id"]][0] == "failed" and statuses[rows[0]["id"]][1]
    assert services.storage.sha256_of(original_name(rows[1]["storage_key"])) == before[rows[1]["id"]]
