"""Serving (issue 7, suite 7): what every accepted upload is served as.

Originals and derivatives carry a content type from the detected format, never from the client's name or
part header (a PNG named .jpg sent as image/gif is served as image/png); every answer has ``nosniff``;
originals are attachments; derivative bytes hold no EXIF, XMP, JPEG comment or GPS, whatever the upload had.
"""

from __future__ import annotations

import re
from typing import Any

import pytest

from . import imagefactory
from .conftest import AuthActions
from .factories import published, run_pool_until_idle
from .harness import figures
from .test_upload import start_guest_session

BOUNDARY = "----picpeak-serving-3b1d"
GPS = (52.520008, 13.404954)
COMMENT = b"secret comment <script>alert(1)</script>"
EXIF = imagefactory.make_exif(make="Canon", model="EOS R5", date_original="2024:06:20 14:03:00", gps=GPS,
                              orientation=6)
DETECTED = {"jpeg": "image/jpeg", "png": "image/png", "webp": "image/webp", "heif": ("image/heif", "image/heic")}


def uploads() -> list[tuple[str, str, str, bytes]]:
    """(file name, client content type, detected format, bytes): names and types that lie, metadata everywhere."""
    picture = imagefactory.photo(120, 80, seed=7)
    return [
        ("holiday.jpg", "image/gif", "png", imagefactory.save(picture, "png", exif=EXIF)),
        ("really-a-webp.png", "text/html", "webp", imagefactory.save(picture, "webp", exif=EXIF,
                                                                     xmp=imagefactory.XMP)),
        ("camera.gif", "application/octet-stream", "jpeg",
         imagefactory.save(imagefactory.photo(120, 80, seed=8), "jpeg", exif=EXIF, comment=COMMENT,
                           xmp=imagefactory.XMP, icc=imagefactory.srgb_icc())),
        ("phone.html", "text/html", "heif", imagefactory.save(imagefactory.photo(120, 80, seed=9), "heif",
                                                               exif=EXIF)),
        ("no-extension", "image/svg+xml", "jpeg",
         imagefactory.save(imagefactory.photo(120, 80, seed=10), "jpeg", exif=EXIF)),
    ]


def multipart(files: list[tuple[str, str, str, bytes]], fields: dict[str, str] | None = None
              ) -> tuple[bytes, dict[str, str]]:
    body = b""
    for name, value in (fields or {}).items():
        body += f'--{BOUNDARY}\r\nContent-Disposition: form-data; name="{name}"\r\n\r\n{value}\r\n'.encode()
    for filename, content_type, _, data in files:
        body += (f'--{BOUNDARY}\r\nContent-Disposition: form-data; name="photos"; filename="{filename}"\r\n'
                 f"Content-Type: {content_type}\r\n\r\n").encode() + data + b"\r\n"
    return body + f"--{BOUNDARY}--\r\n".encode(), {"Content-Type": f"multipart/form-data; boundary={BOUNDARY}"}


def metadata_in_jpeg(data: bytes) -> list[str]:
    """What a derivative carries that it must not: EXIF/XMP (APP1), comments (COM), and GPS anywhere."""
    found = []
    for marker, payload in imagefactory.jpeg_segments(data):
        if marker == 0xE1:
            found.append("XMP" if payload.startswith(imagefactory.XMP_NS) else "EXIF")
        elif marker == 0xFE:
            found.append("comment")
        elif 0xE2 < marker <= 0xEF:
            found.append(f"APP{marker - 0xE0}")
    if b"Exif\x00\x00" in data or b"adobe:ns:meta" in data or COMMENT in data or b"Canon" in data:
        found.append("metadata bytes")
    return found


def check_headers(response: Any, expected_type: str | tuple[str, ...], *, attachment: bool) -> list[str]:
    problems = []
    content_type = response.headers.get("Content-Type", "").split(";")[0]
    if content_type not in (expected_type if isinstance(expected_type, tuple) else (expected_type,)):
        problems.append(f"content type {content_type!r}, expected {expected_type!r}")
    if response.headers.get("X-Content-Type-Options") != "nosniff":
        problems.append("no nosniff")
    disposition = response.headers.get("Content-Disposition", "")
    if attachment and not disposition.startswith("attachment"):
        problems.append(f"not an attachment: {disposition!r}")
    if not attachment and disposition.startswith("attachment"):
        problems.append("a derivative served as an attachment")
    return problems


async def test_every_accepted_upload_is_served_by_its_detected_type_without_metadata(
        services: Any, client: Any, guest: Any, admin: AuthActions, capsys: pytest.CaptureFixture[str]) -> None:
    gallery = await published(admin, name="Served", allow_guest_uploads=True, allow_downloads=True)
    sent = uploads()
    body, headers = multipart(sent)
    answer = await client.post(f"/api/admin/galleries/{gallery['id']}/upload", data=body,
                               headers={**headers, **admin.headers()})
    assert answer.status_code == 202, await answer.get_data(as_text=True)
    admin_ids = [p["id"] for p in (await answer.get_json())["photos"]]
    # The same files from a guest, re-encoded at another quality so that they are not duplicates.
    guest_files = [(n, t, f, imagefactory.save(imagefactory.photo(100, 70, seed=20 + i), f, exif=EXIF,
                                                 **({"comment": COMMENT} if f == "jpeg" else {})))
                   for i, (n, t, f, _) in enumerate(sent)]
    csrf = await start_guest_session(services, guest)
    body, headers = multipart(guest_files, {"csrf_token": csrf})
    answer = await guest.post(f"/api/g/{gallery['slug']}/upload", data=body, headers=headers)
    assert answer.status_code == 202, await answer.get_data(as_text=True)
    guest_ids = [p["id"] for p in (await answer.get_json())["photos"]]
    await run_pool_until_idle(services)

    problems: list[str] = []
    served = derivatives = originals = 0
    for ids in (admin_ids, guest_ids):
        for photo_id, (name, _, fmt, _) in zip(ids, sent, strict=True):
            where = f"{name} (photo {photo_id})"
            original = await client.get(f"/api/admin/photos/{photo_id}/original")
            problems += [f"{where} admin original: {p}" for p in check_headers(original, DETECTED[fmt],
                                                                               attachment=True)]
            download = await guest.get(f"/g/{gallery['slug']}/photos/{photo_id}/download")
            problems += [f"{where} guest download: {p}" for p in check_headers(download, DETECTED[fmt],
                                                                               attachment=True)]
            originals += 2
            for kind in ("grid", "view"):
                for who, response in (
                        ("admin", await client.get(f"/api/admin/photos/{photo_id}/{kind}")),
                        ("guest", await guest.get(f"/g/{gallery['slug']}/photos/{photo_id}/{kind}"))):
                    problems += [f"{where} {who} {kind}: {p}" for p in check_headers(response, "image/jpeg",
                                                                                      attachment=False)]
                    leaked = metadata_in_jpeg(await response.get_data())
                    problems += [f"{where} {who} {kind}: carries {m}" for m in leaked]
                    derivatives += 1
            served += 1
    # The client's name is kept for display, but the download's name gets the detected type's extension.
    holiday = await client.get(f"/api/admin/photos/{admin_ids[0]}/original")
    assert re.search(r'filename="holiday\.jpg\.png"', holiday.headers["Content-Disposition"])
    def tally(word: str) -> int:
        return sum(1 for p in problems if word in p)

    figures(capsys, f"serving: photos={served} originals_checked={originals} derivatives_checked={derivatives} "
                    f"wrong_type={tally('content type')} missing_nosniff={tally('nosniff')} "
                    f"not_attachment={tally('attachment')} metadata_leaks={tally('carries')}")
    assert problems == []
