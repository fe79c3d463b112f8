"""The folder importer: through the same intake as uploads, against the data directory, without a server."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from picpeak_lite.errors import ConfigError
from picpeak_lite.media import images
from picpeak_lite.ops import bootstrap, importer
from picpeak_lite.store import db
from picpeak_lite.store.storage import LocalStorage

from . import imagefactory
from .conftest import make_settings
from .factories import gallery_row, tiny_png


@pytest.fixture
def settings(tmp_path: Path) -> Any:
    settings = make_settings(tmp_path)
    bootstrap.prepare(settings)
    conn = db.connect(settings.database)
    with db.transaction(conn):
        gallery_row(conn, "Wedding", slug="wedding", share_token="share1", draft=True)
        gallery_row(conn, "Small", slug="small", share_token="share2", photo_cap=2, draft=True)
    conn.close()
    return settings


def query(settings: Any, sql: str) -> list[dict[str, Any]]:
    conn = db.connect(settings.database)
    try:
        return conn.execute(sql).fetchall()
    finally:
        conn.close()


def write_photos(folder: Path, count: int) -> dict[str, bytes]:
    folder.mkdir(exist_ok=True)
    files = {}
    for i in range(count):
        fmt = ("jpeg", "png", "webp")[i % 3]
        name = f"IMG_{i:04d}.{'jpg' if fmt == 'jpeg' else fmt}"
        files[name] = imagefactory.save(imagefactory.photo(40 + i, 30, seed=i), fmt, folder / name)
    return files


def test_import_adds_every_photo_then_skips_them(settings: Any, tmp_path: Path, monkeypatch: Any) -> None:
    monkeypatch.setattr(importer, "BATCH_FILES", 2)  # several batches, one upload group
    folder = tmp_path / "card"
    sent = write_photos(folder, 5)
    events: list[importer.ImportProgress] = []
    summary = importer.run_import(settings, folder, "wedding", events.append)
    assert (summary.added, summary.duplicates, summary.errors) == (5, 0, [])
    assert [(e.done, e.total, e.path.name, e.status) for e in events] == [
        (i + 1, 5, name, "added") for i, name in enumerate(sorted(sent))]
    rows = query(settings, "SELECT * FROM photos ORDER BY id")
    assert {(r["status"], r["uploaded_by"], r["upload_id"]) for r in rows} == {
        ("pending", "admin", summary.upload_id)}
    storage = LocalStorage(settings.data_path)
    assert {r["display_name"]: storage.original_path(r["storage_key"]).read_bytes() for r in rows} == sent
    assert [u["id"] for u in query(settings, "SELECT id FROM uploads")] == [summary.upload_id]

    again = importer.run_import(settings, folder, "wedding")
    assert (again.added, again.duplicates, again.errors, again.upload_id) == (0, 5, [], None)
    assert len(query(settings, "SELECT id FROM photos")) == 5
    assert len(query(settings, "SELECT id FROM uploads")) == 1
    assert sum(1 for p in (settings.data_path / "originals").rglob("*") if p.is_file()) == 5
    assert list((settings.data_path / "tmp").iterdir()) == []


def test_import_reports_bad_files_and_ignores_others(settings: Any, tmp_path: Path) -> None:
    folder = tmp_path / "mixed"
    write_photos(folder, 1)
    (folder / "empty.jpg").write_bytes(b"")
    (folder / "page.jpg").write_bytes(b"<!doctype html><p>not a photo</p>")
    (folder / "tiny.png").write_bytes(tiny_png())
    (folder / "notes.txt").write_text("shot list")
    (folder / ".hidden.jpg").write_bytes(b"x")
    (folder / "sub").mkdir()
    summary = importer.run_import(settings, folder, "wedding")
    assert summary.added == 1 and summary.ignored == 2
    errors = {p.name: reason for p, reason in summary.errors}
    assert sorted(errors) == ["empty.jpg", "page.jpg", "tiny.png"]
    assert "empty" in errors["empty.jpg"] and "too small" in errors["tiny.png"]
    assert errors["page.jpg"] == images.UNSUPPORTED
    assert list((settings.data_path / "tmp").iterdir()) == []


def test_import_respects_the_photo_cap(settings: Any, tmp_path: Path) -> None:
    folder = tmp_path / "many"
    write_photos(folder, 3)
    summary = importer.run_import(settings, folder, "small")
    assert summary.added == 2
    assert [reason for _, reason in summary.errors] == ["The gallery is full: it holds at most 2 photos."]


def test_import_refuses_unknown_gallery_and_folder(settings: Any, tmp_path: Path) -> None:
    write_photos(tmp_path / "card", 1)
    with pytest.raises(ConfigError, match="no gallery with the slug 'nope'"):
        importer.run_import(settings, tmp_path / "card", "nope")
    with pytest.raises(ConfigError, match="is not a folder"):
        importer.run_import(settings, tmp_path / "missing", "wedding")
    assert query(settings, "SELECT id FROM photos") == []


def test_import_walks_a_camera_cards_folders_in_order_and_names_what_it_skipped(settings: Any,
                                                                                  tmp_path: Path) -> None:
    """A card as the camera wrote it: DCIM/100CANON, DCIM/101CANON, the card's MISC (print orders) and a
    Mac's .Trashes and .Spotlight-V100. It used to add nothing ("Added 0 ... 0 other files ignored")."""
    card = tmp_path / "card"
    first = write_photos(_mkdir(card / "DCIM" / "100CANON"), 2)
    second = write_photos(_mkdir(card / "DCIM" / "101CANON"), 1)
    for system in ("MISC", ".Trashes", ".Spotlight-V100"):
        write_photos(_mkdir(card / system), 1)
    (card / "DCIM" / "100CANON" / "IMG_0000.CR3").write_bytes(b"raw")
    summary = importer.run_import(settings, card, "wedding")
    assert (summary.added, summary.errors, summary.ignored) == (3, [], 1)
    assert [str(p) for p in summary.skipped_folders] == [".Spotlight-V100", ".Trashes", "MISC"]
    rows = query(settings, "SELECT display_name, size FROM photos ORDER BY id")
    assert [(r["display_name"], r["size"]) for r in rows] == [
        *((name, len(data)) for name, data in sorted(first.items())),
        *((name, len(data)) for name, data in second.items())]


def _mkdir(path: Path) -> Path:
    path.mkdir(parents=True)
    return path
