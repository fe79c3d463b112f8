"""Test data, made the way the product makes it: one home for the galleries, photos and images the suites need.

Three levels, so that each test sets up no more than it is about:

* images: :func:`jpeg`, :func:`photo_jpeg`, :func:`png`, :func:`webp`, :func:`tiny_png` (real files encoded
  by Pillow through :mod:`tests.imagefactory`, which stays the place where pixels, EXIF blocks and hostile
  headers are synthesised; this module only picks the sizes the suites use);
* galleries through the admin API, as an admin creates them (:func:`draft`, :func:`published`,
  :func:`with_password`, :func:`expired`), for tests of the web layer;
* rows through ``store/queries`` (:func:`gallery_row`, :func:`stage_photo`, :func:`add_photo`), for tests below
  the web layer or ones that need a state no request can make directly (a photo mid-processing, an expired
  gallery); and :func:`run_pool_until_idle`, the real worker pool run until nothing is waiting.
"""

from __future__ import annotations

import hashlib
import io
import secrets
import time
from typing import TYPE_CHECKING, Any

import trio
from PIL import Image

from picpeak_lite import security
from picpeak_lite.pipeline.worker import WorkerPool
from picpeak_lite.services import Services
from picpeak_lite.store import db
from picpeak_lite.store.queries import galleries as gallery_q
from picpeak_lite.store.queries import photos as photo_q
from picpeak_lite.store.storage import new_key

from . import imagefactory

if TYPE_CHECKING:
    from .conftest import AuthActions

# Small enough to cost microseconds; no derivative of it is a downscale.
SMALL_SIZE = (64, 48)
# Big enough that the thumb and the preview are real downscales (the pipeline suites need that).
PHOTO_SIZE = (640, 480)
# A past expiry (epoch seconds): the gallery expired in 1970.
EXPIRED_AT = 1000.0


# --- images ------------------------------------------------------------------------------------------------

def jpeg(seed: int = 0, size: tuple[int, int] = SMALL_SIZE, **save_kwargs: Any) -> bytes:
    """A photo-like JPEG (noise and gradients, so each seed is a distinct file)."""
    return imagefactory.save(imagefactory.photo(*size, seed=seed), "jpeg", **save_kwargs)


def photo_jpeg(seed: int = 0, size: tuple[int, int] = PHOTO_SIZE, **save_kwargs: Any) -> bytes:
    """:func:`jpeg` at a camera-like size (640x480 unless told)."""
    return jpeg(seed, size, **save_kwargs)


def png(size: tuple[int, int] = (40, 30), seed: int = 1) -> bytes:
    return imagefactory.save(imagefactory.photo(*size, seed=seed), "png")


def webp() -> bytes:
    return imagefactory.save(imagefactory.photo(50, 50, seed=2), "webp")


def tiny_png() -> bytes:
    """8x8: below the 10x10 minimum, so refused with a sentence."""
    out = io.BytesIO()
    Image.new("RGB", (8, 8), "red").save(out, "PNG")
    return out.getvalue()


# --- galleries through the admin API -------------------------------------------------------------------------

async def draft(admin: AuthActions, **fields: Any) -> dict[str, Any]:
    """A new gallery as the admin creates it (a draft: guests get 404)."""
    return await admin.create_gallery(**fields)


async def published(admin: AuthActions, **fields: Any) -> dict[str, Any]:
    """A gallery created and published through the admin API; returns the publish answer's JSON."""
    gallery = await admin.create_gallery(**fields)
    response = await admin.client.post(f"/api/admin/galleries/{gallery['id']}/publish", headers=admin.headers())
    assert response.status_code == 200, await response.get_data(as_text=True)
    return await response.get_json()


async def with_password(admin: AuthActions, password: str = "letmein", **fields: Any) -> dict[str, Any]:
    """A published gallery behind a password."""
    return await published(admin, password=password, **fields)


async def expired(admin: AuthActions, services: Services, **fields: Any) -> dict[str, Any]:
    """A published gallery whose expiry date has passed (set in the database: the API refuses a past date)."""
    gallery = await published(admin, **fields)
    await services.db.write(gallery_q.update, gallery["id"], {"expires_at": EXPIRED_AT}, time.time())
    return gallery


# --- rows through store/queries --------------------------------------------------------------------------------

def gallery_row(conn: db.Connection, name: str = "G", *, draft: bool = False, watermark: bool | int = False,
                slug: str | None = None, share_token: str | None = None, password: str | None = None,
                photo_cap: int | None = None, expires_at: float | None = None, now: float = 0.0) -> int:
    """A gallery row, for tests without the web layer; published unless ``draft``. Returns its id."""
    values: dict[str, Any] = {"name": name, "watermark": int(watermark), "photo_cap": photo_cap,
                              "expires_at": expires_at}
    gallery_id = gallery_q.create(
        conn, values, slug=slug or f"g-{secrets.token_hex(4)}", share_token=share_token or secrets.token_hex(16),
        password_hash=security.hash_password(password) if password is not None else None, now=now)
    if not draft:
        gallery_q.set_draft(conn, gallery_id, False, now)
    return gallery_id


def create_gallery(conn: db.Connection, name: str = "G", watermark: int = 0) -> int:
    """A published gallery row (the shape ``svc.db.write(create_gallery)`` wants)."""
    return gallery_row(conn, name, watermark=watermark)


def stage_photo(svc: Services, gallery_id: int, data: bytes, *, name: str = "p.jpg", upload_id: str | None = None,
                fmt: str = "jpeg") -> tuple[int, str]:
    """Store bytes and insert a pending row with the same primitives the upload path uses. Returns the photo's
    id and its upload's id (pass that back in to add photos to the same upload)."""
    storage = svc.storage
    storage.create_dirs()
    temp = storage.new_temp_path()
    temp.write_bytes(data)
    key = new_key()
    storage.commit_original(temp, key)
    upload_id = upload_id or secrets.token_hex(16)
    conn = db.connect(svc.settings.database)
    try:
        with db.transaction(conn):
            if photo_q.get_upload(conn, upload_id) is None:
                photo_q.create_upload(conn, upload_id, gallery_id, "admin", None, None, time.time())
            photo_id = photo_q.insert_photo(
                conn, gallery_id=gallery_id, upload_id=upload_id, storage_key=key,
                sha256=hashlib.sha256(data).hexdigest(), display_name=name, size=len(data), format=fmt,
                uploaded_by="admin", guest_name=None, width=1, height=1, now=time.time(),
            )
    finally:
        conn.close()
    return photo_id, upload_id


def add_photo(svc: Services, gallery_id: int, *, name: str = "p.jpg", status: str = "complete", hidden: int = 0,
              taken_at: str | None = None, data: bytes | None = None, fmt: str = "jpeg",
              created_at: float | None = None) -> int:
    """A photo row in any state, with its original and (tiny) derivative files: no pipeline needed.

    Raw SQL on purpose: no query of ours writes a row in an arbitrary state with camera fields at once (the
    pipeline gets there in steps), and a test of what guests see needs exactly that."""
    data = data if data is not None else jpeg(secrets.randbelow(10**9))
    storage = svc.storage
    storage.create_dirs()
    key = new_key()
    temp = storage.new_temp_path()
    temp.write_bytes(data)
    storage.commit_original(temp, key)
    if status == "complete":
        for kind in ("grid", "view"):
            storage.write_derivative(key, kind, data)
    conn = db.connect(svc.settings.database)
    try:
        with db.transaction(conn):
            upload_id = secrets.token_hex(16)
            now = created_at if created_at is not None else time.time()
            conn.execute("INSERT INTO uploads (id, gallery_id, uploaded_by, created_at) VALUES (?, ?, 'admin', ?)",
                         (upload_id, gallery_id, now))
            return int(conn.execute(
                "INSERT INTO photos (gallery_id, upload_id, storage_key, sha256, display_name, size, format, "
                "uploaded_by, status, claim_token, lease_until, hidden, width, height, taken_at, camera_make, "
                "camera_model, created_at) VALUES (?, ?, ?, ?, ?, ?, ?, 'admin', ?, ?, ?, ?, 64, 48, ?, 'Canon', "
                "'Canon EOS R5', ?) RETURNING id",
                (gallery_id, upload_id, key, hashlib.sha256(data + secrets.token_bytes(8)).hexdigest(), name,
                 len(data), fmt, status, "t" if status == "processing" else None,
                 now + 60 if status == "processing" else None, hidden, taken_at, now),
            ).fetchall()[0]["id"])
    finally:
        conn.close()


async def run_pool_until_idle(svc: Services, count: int = 2) -> None:
    """The real worker pool, until no photo is pending or processing."""
    pool = WorkerPool(svc, count=count, poll_seconds=0.05)
    async with trio.open_nursery() as nursery:
        await nursery.start(pool.run)
        while True:
            counts = await svc.db.read(photo_q.queue_counts)
            if counts["pending"] == 0 and counts["processing"] == 0:
                break
            await trio.sleep(0.05)
        nursery.cancel_scope.cancel()
