"""The small stored files kept in memory for sending (``web/files.py`` ``SmallFiles``): never a stale version,
and never more than their budget."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from picpeak_lite.services import Services
from picpeak_lite.store.storage import derived_name
from picpeak_lite.web import files
from picpeak_lite.web.files import SmallFile, SmallFiles

from .conftest import AuthActions, sql
from .factories import photo_jpeg, run_pool_until_idle, stage_photo


def version(path: Path, data: bytes) -> tuple[SmallFile, os.stat_result]:
    path.write_bytes(data)
    info = os.stat(path)
    return SmallFile(data, info.st_ino, info.st_mtime_ns, info.st_mtime), info


def test_the_budget_is_kept_and_the_least_recently_sent_goes_first(tmp_path: Path) -> None:
    cache = SmallFiles(limit=250)
    kept = {}
    for name in "abc":
        kept[name] = version(tmp_path / name, name.encode() * 100)
    for name in "ab":
        cache.put(tmp_path / name, kept[name][0])
    assert cache.get(tmp_path / "a", kept["a"][1]) is not None  # "a" is now the more recent
    cache.put(tmp_path / "c", kept["c"][0])  # 300 bytes: "b", the least recently sent, goes
    assert cache.size == 200
    assert cache.get(tmp_path / "b", kept["b"][1]) is None
    assert cache.get(tmp_path / "a", kept["a"][1]) is not None
    cache.put(tmp_path / "big", SmallFile(b"x" * 251, 1, 1, 1.0))  # larger than the whole budget: not kept
    assert cache.size == 200


def test_a_changed_file_is_never_answered_from_memory(tmp_path: Path) -> None:
    cache = SmallFiles(limit=10_000)
    path = tmp_path / "grid.jpg"
    first, info = version(path, b"A" * 1000)
    cache.put(path, first)
    assert cache.get(path, info) == first
    # Written again in place, same length: its mtime differs.
    os.utime(path, ns=(info.st_atime_ns, info.st_mtime_ns + 1))
    path.write_bytes(b"B" * 1000)
    os.utime(path, ns=(info.st_atime_ns, info.st_mtime_ns + 1))
    assert cache.get(path, os.stat(path)) is None and cache.size == 0
    # Made again and renamed into place (a new inode), even with the same length and mtime.
    cache.put(path, first)
    replacement = tmp_path / "new.jpg"
    replacement.write_bytes(b"C" * 1000)
    os.utime(replacement, ns=(info.st_atime_ns, info.st_mtime_ns))
    os.replace(replacement, path)
    assert cache.get(path, os.stat(path)) is None


async def test_guests_get_each_version_of_an_image_and_none_after_it_is_gone(
        services: Services, client: Any, guest: Any, admin: AuthActions) -> None:
    gallery = await admin.create_gallery(name="Party")
    await client.post(f"/api/admin/galleries/{gallery['id']}/publish", headers=admin.headers())
    photo_id, _ = stage_photo(services, gallery["id"], photo_jpeg(7))
    await run_pool_until_idle(services)
    url = f"/g/{gallery['slug']}/photos/{photo_id}/grid"
    first = await guest.get(url)
    assert first.status_code == 200
    [row] = sql(services, "SELECT storage_key FROM photos WHERE id = ?", photo_id)
    path = services.storage.local_path(derived_name(row["storage_key"], "grid"))
    assert path is not None
    assert (await (await guest.get(url)).get_data()) == await first.get_data()
    assert files.SMALL_FILES.get().get(path, os.stat(path)) is not None  # the second answer came from memory
    # The grid image is made again (as after a watermark change: a new file renamed into place).
    remade = path.with_name("remade.jpg")
    remade.write_bytes(photo_jpeg(8))
    os.replace(remade, path)
    second = await guest.get(url)
    assert second.status_code == 200 and await second.get_data() == path.read_bytes() != await first.get_data()
    assert second.headers["ETag"] != first.headers["ETag"]
    path.unlink()
    assert (await guest.get(url)).status_code == 404

