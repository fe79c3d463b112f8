"""The built wheel, installed in a fresh venv, started from an empty temp directory: every page, every template
and every static file.

This is what a user gets from ``pip install .`` (not the editable install the rest of the suite uses, which
reads the checkout). It runs when ``TEST_WHEEL_VENV`` names that venv (and ``TEST_WHEEL_DIST`` the folder with
the wheel and sdist): ``.ci/run`` builds both, installs the wheel and sets the two; in a plain ``pytest`` run the
module is skipped, because there is no installed wheel to test. (Not ``PICPEAK_*`` names: those are settings,
and an unknown one stops the server.)
"""

from __future__ import annotations

import contextlib
import html
import io
import os
import re
import shutil
import signal
import subprocess
import tarfile
import threading
import time
import zipfile
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from PIL import Image

from picpeak_lite.store import db

ROOT = Path(__file__).resolve().parent.parent
VENV = os.environ.get("TEST_WHEEL_VENV", "")
DIST = os.environ.get("TEST_WHEEL_DIST", "")
PASSWORD = "wheel test password"

pytestmark = pytest.mark.skipif(not VENV, reason="TEST_WHEEL_VENV is not set (.ci/run sets it)")


def repo_files(folder: str) -> list[str]:
    base = ROOT / folder
    return sorted(str(p.relative_to(base)) for p in base.rglob("*") if p.is_file())


def installed_package_dir() -> Path:
    out = subprocess.run([f"{VENV}/bin/python", "-c", "import picpeak_lite; print(picpeak_lite.__file__)"],
                         capture_output=True, text=True, check=True, cwd="/").stdout
    return Path(out.strip()).parent


def test_the_venv_runs_the_installed_package_not_the_checkout() -> None:
    package = installed_package_dir()
    assert Path(VENV).resolve() in package.resolve().parents, package
    assert ROOT not in package.resolve().parents
    for folder in ("templates", "static"):
        shipped = sorted(str(p.relative_to(package / folder)) for p in (package / folder).rglob("*") if p.is_file())
        assert shipped == repo_files(folder)


@pytest.mark.skipif(not DIST, reason="TEST_WHEEL_DIST is not set")
def test_wheel_and_sdist_carry_templates_and_static() -> None:
    wheels = list(Path(DIST).glob("picpeak_lite-*.whl"))
    sdists = list(Path(DIST).glob("picpeak_lite-*.tar.gz"))
    assert len(wheels) == 1 and len(sdists) == 1, list(Path(DIST).iterdir())
    with zipfile.ZipFile(wheels[0]) as wheel:
        names = set(wheel.namelist())
    with tarfile.open(sdists[0]) as sdist:
        in_sdist = {name.split("/", 1)[1] for name in sdist.getnames() if "/" in name}
    for folder in ("templates", "static"):
        for name in repo_files(folder):
            assert f"picpeak_lite/{folder}/{name}" in names
            assert f"{folder}/{name}" in in_sdist  # at the top, as in the repository


@pytest.mark.skipif(not DIST, reason="TEST_WHEEL_DIST is not set")
def test_the_dockerfile_copies_everything_the_wheel_is_built_from(tmp_path: Path) -> None:
    """Build a wheel from only what the Dockerfile COPYs (as its ``pip install .`` does) and compare it with the
    wheel CI built from the whole checkout: the same files."""
    from .test_deploy import dockerfile_copies

    src = tmp_path / "src"
    src.mkdir()
    for source, dest in dockerfile_copies():
        if (ROOT / source).is_dir():
            shutil.copytree(ROOT / source, src / dest, ignore=shutil.ignore_patterns("__pycache__"))
        else:
            shutil.copy(ROOT / source, src / dest)
    out = tmp_path / "out"
    build = subprocess.run([f"{VENV}/bin/pip", "wheel", "--no-deps", "-q", "-w", str(out), str(src)],
                           capture_output=True, text=True, timeout=600)
    assert build.returncode == 0, build.stdout + build.stderr

    def files(wheel: Path) -> set[str]:
        with zipfile.ZipFile(wheel) as archive:
            return {name for name in archive.namelist() if ".dist-info/" not in name}

    (from_docker,) = out.glob("picpeak_lite-*.whl")
    (from_ci,) = Path(DIST).glob("picpeak_lite-*.whl")
    assert files(from_docker) == files(from_ci)


@pytest.fixture
def served(tmp_path: Path) -> Iterator[str]:
    """``picpeak-lite serve --port 0`` from the venv, in an empty directory (no templates/ next to it)."""
    work = tmp_path / "work"
    work.mkdir()
    proc = subprocess.Popen(
        [f"{VENV}/bin/picpeak-lite", "serve", "--port", "0"], cwd=work, stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT, text=True, env={**os.environ, "PICPEAK_ADMIN_PASSWORD": PASSWORD},
    )
    assert proc.stdout is not None
    lines = []
    url = None
    for line in proc.stdout:
        lines.append(line)
        match = re.search(r"running at (http://127\.0\.0\.1:\d+)/admin", line)
        if match:
            url = match.group(1)
            break
    if url is None:
        proc.kill()
        raise AssertionError("the installed server did not start:\n" + "".join(lines))

    def drain() -> None:  # the request log: a full pipe would stop the server
        with contextlib.suppress(ValueError, OSError):
            lines.extend(proc.stdout or ())

    threading.Thread(target=drain, daemon=True).start()
    try:
        yield url
    finally:
        proc.send_signal(signal.SIGTERM)
        out, _ = proc.communicate(timeout=60)
        assert proc.returncode == 0, "".join(lines) + out
        assert "Traceback" not in "".join(lines) + out, "".join(lines) + out
    assert (work / "picpeak-data" / "picpeak.sqlite3").exists()


def jpeg(width: int, height: int) -> bytes:
    buffer = io.BytesIO()
    Image.new("RGB", (width, height), (200, 120, 40)).save(buffer, "JPEG", quality=90)
    return buffer.getvalue()


def html_page(http: httpx.Client, path: str, status: int = 200, **kwargs: object) -> str:
    response = http.get(path, headers={"Accept": "text/html"}, **kwargs)  # type: ignore[arg-type]
    assert response.status_code == status, (path, response.status_code, response.text[:500])
    assert response.headers["content-type"].startswith("text/html"), path
    assert response.text.lstrip().lower().startswith("<!doctype html>"), path
    return response.text


def test_every_page_template_and_static_file_from_the_installed_wheel(served: str, tmp_path: Path) -> None:
    rendered: set[str] = set()
    with httpx.Client(base_url=served, timeout=30) as http:
        assert http.get("/healthz").json() == {"status": "ok"}
        html_page(http, "/admin/login")
        rendered |= {"base.html", "admin/login.html"}
        assert http.post("/admin/login", data={"username": "admin", "password": PASSWORD}).status_code == 302
        form = html_page(http, "/admin/galleries/new")
        csrf = re.search(r'name="csrf_token" value="([^"]+)"', form).group(1)  # type: ignore[union-attr]
        rendered |= {"admin/layout.html", "admin/gallery_form.html"}
        headers = {"X-CSRF-Token": csrf}

        def create(**fields: object) -> dict[str, object]:
            response = http.post("/api/admin/galleries", json=fields, headers=headers)
            assert response.status_code == 201, response.text
            gallery = response.json()
            assert http.post(f"/api/admin/galleries/{gallery['id']}/publish", headers=headers).status_code == 200
            return gallery

        open_gallery = create(name="Open", allow_guest_uploads=True)
        locked = create(name="Locked", password="a gallery password")
        expired = create(name="Expired")
        gid, slug = open_gallery["id"], open_gallery["slug"]
        upload = http.post(f"/api/admin/galleries/{gid}/upload", headers=headers,
                           files=[("photos", ("a.jpg", jpeg(640, 480), "image/jpeg"))])
        assert upload.status_code == 202, upload.text
        photo_id = upload.json()["photo_ids"][0]
        deadline_polls = 0
        while http.get(f"/api/admin/uploads/{upload.json()['upload_id']}").json()["photos"][0]["status"] != "complete":
            deadline_polls += 1
            assert deadline_polls < 3000, "the photo was never processed"
            time.sleep(0.1)

        html_page(http, "/admin/")
        html_page(http, f"/admin/galleries/{gid}")
        html_page(http, f"/admin/galleries/{gid}/edit")
        html_page(http, f"/admin/galleries/{gid}/qr")
        for target, kind in (("gallery", "png"), ("upload", "svg")):
            assert http.get(f"/admin/galleries/{gid}/qr/{target}.{kind}").status_code == 200
        html_page(http, "/admin/password")
        html_page(http, f"/g/{slug}/wall")  # the live wall, opened with the admin's session
        settings_page = html_page(http, "/admin/settings/")
        # The preview the page shows, drawn on static/watermark-sample.jpg (found through the installed package).
        src = re.search(r'id="watermark-preview"[^>]*?src="([^"]+)"', settings_page, re.DOTALL)
        assert src, settings_page
        preview = http.get(html.unescape(src.group(1)))
        assert preview.status_code == 200 and preview.content.startswith(b"\xff\xd8"), preview.text[:300]
        confirm = http.post(f"/admin/galleries/{gid}/photos",
                            data={"csrf_token": csrf, "action": "delete", "ids": str(photo_id)})
        assert confirm.status_code == 200 and "<!doctype html>" in confirm.text.lower(), confirm.text[:300]
        for kind in ("grid", "view", "original"):
            assert http.get(f"/api/admin/photos/{photo_id}/{kind}").status_code == 200
        rendered |= {"admin/dashboard.html", "admin/gallery.html", "admin/qr.html", "admin/password.html",
                     "admin/settings.html", "admin/confirm_delete.html", "wall.html",
                     # included by the dashboard (_activity) and the gallery page (the rest), unconditionally
                     "admin/_activity.html", "admin/_review.html", "admin/_wall.html", "admin/_proofing.html",
                     "admin/_feedback.html", "admin/_findme.html", "admin/_email.html", "admin/_archive.html",
                     "_language.html"}
        # The studio's pages (issue 33) and the email templates' editor, whose preview renders each message's
        # subject, text and HTML parts (issue 32).
        for path in ("/admin/accounts", "/admin/audit", "/admin/security"):
            html_page(http, path)
        rendered |= {"admin/accounts.html", "admin/audit.html", "admin/security.html"}
        for kind in ("gallery_shared", "expiry_reminder", "gallery_expired", "favourites_selection", "guest_digest",
                     "test"):
            html_page(http, f"/admin/settings/email/templates/{kind}")
            rendered |= {f"email/{kind}.html", f"email/{kind}.txt", f"email/{kind}.subject.txt"}
        rendered.add("admin/email_template.html")
        # Pages that need a state this walk does not make (a second factor's code step, an archived gallery, a
        # gallery with "Find me" and its extra installed) are rendered by their own tests (test_accounts,
        # test_archive, test_findme); that they ship byte for byte is checked above.
        rendered |= {"admin/login_code.html", "guest/archived.html", "guest/findme.html"}

    conn = db.connect(tmp_path / "work" / "picpeak-data" / "picpeak.sqlite3")
    try:
        with db.transaction(conn):
            conn.execute("UPDATE galleries SET expires_at = 1 WHERE id = ?", (expired["id"],))
    finally:
        conn.close()

    with httpx.Client(base_url=served, timeout=30) as guest:
        html_page(guest, f"/g/{slug}")
        html_page(guest, f"/g/{slug}/upload")
        for kind in ("grid", "view"):
            assert guest.get(f"/g/{slug}/photos/{photo_id}/{kind}").status_code == 200
        html_page(guest, f"/g/{locked['slug']}", status=401)
        html_page(guest, f"/g/{expired['slug']}", status=410)
        assert "Not found" in html_page(guest, "/no/such/page", status=404)
        rendered |= {"guest/layout.html", "guest/gallery.html", "guest/upload.html", "guest/password.html",
                     "guest/expired.html", "error.html",
                     "guest/_favourite_limit.html", "guest/_own_waiting.html",  # included by the gallery page
                     "guest/_brand.html", "guest/_feedback.html"}

        for name in repo_files("static"):
            response = guest.get(f"/static/{name}")
            assert response.status_code == 200, name
            assert response.content == (ROOT / "static" / name).read_bytes(), name
        favicon = guest.get("/favicon.ico")
        assert favicon.status_code == 200 and favicon.content == (ROOT / "static" / "favicon.ico").read_bytes()

    # Every template of the repository was rendered above: a new one must get its page here.
    assert rendered == set(repo_files("templates")), set(repo_files("templates")) ^ rendered
