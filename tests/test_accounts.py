"""Accounts with roles, the TOTP second factor, recovery codes, the login throttle against the owner, disabling,
and the audit trail (issue 33). The access matrix (test_access_matrix) covers every route x every role."""

from __future__ import annotations

import base64
import re
import time
from pathlib import Path
from typing import Any

import pytest

from picpeak_lite import totp
from picpeak_lite.domain import accounts
from picpeak_lite.ops import bootstrap
from picpeak_lite.pipeline.janitor import Janitor
from picpeak_lite.store.queries import admin as admin_q
from picpeak_lite.store.queries import audit as audit_q

from .conftest import ADMIN_PASSWORD, AuthActions, add_account
from .test_cli import run_cli
from .test_upload import multipart, published

CSRF = re.compile(r'name="csrf_token" value="([^"]+)"')
SECRET_ON_PAGE = re.compile(r"<code>([A-Z2-7]{32})</code>")

# RFC 6238 Appendix B: the seeds (ASCII) and the 8-digit codes at each time, for SHA-1, SHA-256 and SHA-512.
RFC_SEEDS = {"sha1": b"12345678901234567890", "sha256": b"12345678901234567890123456789012",
             "sha512": b"1234567890123456789012345678901234567890123456789012345678901234"}
RFC_VECTORS = [
    (59, "94287082", "46119246", "90693936"),
    (1111111109, "07081804", "68084774", "25091201"),
    (1111111111, "14050471", "67062674", "99943326"),
    (1234567890, "89005924", "91819424", "93441116"),
    (2000000000, "69279037", "90698825", "38618901"),
    (20000000000, "65353130", "77737706", "47863826"),
]


@pytest.mark.parametrize("at, sha1, sha256, sha512", RFC_VECTORS)
def test_rfc_6238_appendix_b(at: int, sha1: str, sha256: str, sha512: str) -> None:
    for digest, want in (("sha1", sha1), ("sha256", sha256), ("sha512", sha512)):
        assert totp.totp(RFC_SEEDS[digest], at, digits=8, digest=digest) == want, (digest, at)


def test_verify_takes_a_step_either_side_and_no_further() -> None:
    secret = base64.b32encode(RFC_SEEDS["sha1"]).decode()
    key = RFC_SEEDS["sha1"]
    at = 1111111111.0
    step = int(at // 30)
    for offset in (-1, 0, 1):
        assert totp.verify(secret, totp.hotp(key, step + offset), at) == step + offset
    for offset in (-2, 2):
        assert totp.verify(secret, totp.hotp(key, step + offset), at) is None
    assert totp.verify(secret, "12345", at) is None and totp.verify(secret, "abcdef", at) is None
    uri = totp.provisioning_uri(secret, "anna", "PicPeak")
    assert uri.startswith("otpauth://totp/PicPeak%3Aanna?") and f"secret={secret}" in uri


def code_for(secret: str, at: float, ahead: int = 0) -> str:
    return totp.hotp(base64.b32decode(secret + "=" * (-len(secret) % 8)), int(at // 30) + ahead)


async def enrol(client: Any, csrf: str, services: Any) -> tuple[str, list[str]]:
    """Turn the second factor on through the pages; returns the secret and the recovery codes shown."""
    started = await client.post("/admin/security/totp", form={"csrf_token": csrf})
    assert started.status_code == 200
    secret = SECRET_ON_PAGE.search(await started.get_data(as_text=True)).group(1)
    qr = await client.get("/admin/security/totp.svg")
    assert qr.status_code == 200 and qr.mimetype == "image/svg+xml"
    wrong = await client.post("/admin/security/totp/confirm", form={"csrf_token": csrf, "code": "000000"})
    assert wrong.status_code == 400
    confirmed = await client.post("/admin/security/totp/confirm",
                                  form={"csrf_token": csrf, "code": code_for(secret, services.clock())})
    page = await confirmed.get_data(as_text=True)
    assert confirmed.status_code == 200, page
    codes = re.findall(r"<code>([a-z2-9]{4}-[a-z2-9]{4}-[a-z2-9]{4})</code>", page)
    assert len(codes) == 10 and len(set(codes)) == 10
    return secret, codes


async def test_totp_login_codes_work_once_and_recovery_codes_once(app: Any, services: Any,
                                                                   admin: AuthActions) -> None:
    assert admin.csrf is not None
    secret, codes = await enrol(admin.client, admin.csrf, services)
    stored = await services.db.read(admin_q.get_user_by_name, "admin")
    assert stored["totp_enabled_at"] is not None
    stored_codes = await services.db.read(lambda c: c.execute("SELECT code_hash FROM recovery_codes").fetchall())
    assert sorted(r["code_hash"] for r in stored_codes) == sorted(totp.recovery_hash(code) for code in codes)

    async def password_step(client: Any) -> Any:
        answer = await client.post("/admin/login", form={"username": "admin", "password": ADMIN_PASSWORD})
        assert answer.status_code == 200 and 'name="code"' in await answer.get_data(as_text=True)
        assert (await client.get("/admin/")).status_code == 302  # the pending login opens nothing
        return answer

    browser = app.test_client()
    await password_step(browser)
    code = code_for(secret, services.clock(), ahead=1)  # the enrolment used the current step
    assert (await browser.post("/admin/login/code", form={"code": "123456"})).status_code == 401
    done = await browser.post("/admin/login/code", form={"code": code})
    assert done.status_code == 302 and (await browser.get("/admin/")).status_code == 200
    # The same code again, in another browser that has the password: refused (a code works once).
    again = app.test_client()
    await password_step(again)
    assert (await again.post("/admin/login/code", form={"code": code})).status_code == 401
    # A recovery code works once, with or without its dashes, in any case.
    recovery = codes[3]
    assert (await again.post("/admin/login/code", form={"code": recovery.upper()})).status_code == 302
    third = app.test_client()
    await password_step(third)
    assert (await third.post("/admin/login/code", form={"code": recovery})).status_code == 401
    assert await services.db.read(admin_q.unused_recovery_codes, stored["id"]) == 9
    actions = [row["action"] for row in await services.db.read(lambda c: audit_q.search(c, account="admin"))]
    assert {"account.totp_enabled", "account.recovery_code_used", "login.second_factor_failed",
            "login"} <= set(actions)


async def test_a_stranger_cannot_lock_the_owner_out(app: Any, services: Any, admin: AuthActions) -> None:
    """A stranger guessing the owner's password from one address is slowed (429) there; the owner logs in from
    their own address, and from the stranger's address too with the browser that logged in before."""
    stranger = app.test_client()
    statuses = []
    for _ in range(services.settings.login_attempts * 4):
        answer = await stranger.post("/admin/login", form={"username": "admin", "password": "guess"},
                                     scope_base={"client": ("203.0.113.9", 1)})
        statuses.append(answer.status_code)
    assert statuses[:services.settings.login_attempts] == [401] * services.settings.login_attempts
    assert 429 in statuses
    owner_elsewhere = app.test_client()
    answer = await owner_elsewhere.post("/admin/login", form={"username": "admin", "password": ADMIN_PASSWORD},
                                        scope_base={"client": ("198.51.100.7", 1)})
    assert answer.status_code == 302
    # The fixture's browser logged in before: it holds a device cookie and is not slowed on the stranger's IP.
    same_ip = await admin.client.post("/admin/login", form={"username": "admin", "password": ADMIN_PASSWORD},
                                      scope_base={"client": ("203.0.113.9", 1)})
    assert same_ip.status_code == 302
    # Guessing at the owner slows no other account's login from that address.
    await add_account(services, "assistant", "editor")
    other = await stranger.post("/admin/login", form={"username": "assistant", "password": ADMIN_PASSWORD},
                                scope_base={"client": ("203.0.113.9", 1)})
    assert other.status_code == 302
    failed = await services.db.read(lambda c: audit_q.search(c, action="login.failed"))
    assert len(failed) == statuses.count(401) and failed[0]["ip"] == "203.0.113.9"


async def test_a_disabled_account_is_refused_at_its_next_request(app: Any, services: Any, admin: AuthActions) -> None:
    gallery = await admin.create_gallery(name="Given")
    await add_account(services, "assistant", "editor", grants=(gallery["id"],))
    editor = AuthActions(app.test_client())
    assert (await editor.login(username="assistant")).status_code == 302
    token = await services.db.write(bootstrap.create_api_token, "assistant-script", time.time(), "assistant")
    bearer = {"Authorization": f"Bearer {token}"}
    assert (await editor.client.get(f"/admin/galleries/{gallery['id']}")).status_code == 200
    assert (await app.test_client().get(f"/api/admin/galleries/{gallery['id']}", headers=bearer)).status_code == 200
    page = await admin.client.get("/admin/accounts")
    account_id = (await services.db.read(admin_q.get_user_by_name, "assistant"))["id"]
    assert "assistant" in await page.get_data(as_text=True)
    disabled = await admin.client.post(f"/admin/accounts/{account_id}/disable", form={"csrf_token": admin.csrf})
    assert disabled.status_code == 302
    assert (await editor.client.get(f"/admin/galleries/{gallery['id']}")).status_code == 302  # to the login
    assert (await editor.client.get(f"/api/admin/galleries/{gallery['id']}")).status_code == 401
    refused = await app.test_client().get(f"/api/admin/galleries/{gallery['id']}", headers=bearer)
    assert refused.status_code == 401 and "disabled" in (await refused.get_json())["error"]
    again = await editor.client.post("/admin/login", form={"username": "assistant", "password": ADMIN_PASSWORD})
    assert again.status_code == 401
    # Enabled again: the token works again; the old session stays ended.
    await admin.client.post(f"/admin/accounts/{account_id}/enable", form={"csrf_token": admin.csrf})
    assert (await app.test_client().get(f"/api/admin/galleries/{gallery['id']}", headers=bearer)).status_code == 200
    assert (await editor.client.get(f"/admin/galleries/{gallery['id']}")).status_code == 302
    # The last enabled owner cannot be disabled or demoted.
    owner_id = (await services.db.read(admin_q.get_user_by_name, "admin"))["id"]
    last = await admin.client.post(f"/admin/accounts/{owner_id}/disable", form={"csrf_token": admin.csrf})
    assert last.status_code == 409 and "last enabled owner" in await last.get_data(as_text=True)
    demote = await admin.client.post(f"/admin/accounts/{owner_id}/role", form={"csrf_token": admin.csrf,
                                                                              "role": "editor"})
    assert demote.status_code == 409


async def test_an_editor_works_on_their_galleries_and_deletes_nothing(app: Any, services: Any,
                                                                      admin: AuthActions) -> None:
    mine = await published(admin, name="Mine", allow_guest_uploads=True)
    theirs = await published(admin, name="Theirs")
    await add_account(services, "assistant", "editor", grants=(mine["id"],))
    editor = AuthActions(app.test_client())
    assert (await editor.login(username="assistant")).status_code == 302
    dashboard = await (await editor.client.get("/admin/")).get_data(as_text=True)
    assert "Mine" in dashboard and "Theirs" not in dashboard and "New gallery" not in dashboard
    listed = await (await editor.client.get("/api/admin/galleries")).get_json()
    assert [g["name"] for g in listed["galleries"]] == ["Mine"]
    assert (await editor.client.get("/admin/settings/")).status_code == 403
    assert (await editor.client.get("/admin/accounts")).status_code == 403
    from . import imagefactory

    body, headers = multipart([("a.jpg", imagefactory.save(imagefactory.photo(64, 48, seed=3), "jpeg"))])
    sent = await editor.client.post(f"/api/admin/galleries/{mine['id']}/upload", data=body,
                                    headers={**headers, **editor.headers()})
    assert sent.status_code == 202
    photo_id = (await sent.get_json())["photo_ids"][0]
    blocked = await editor.client.post(f"/api/admin/galleries/{theirs['id']}/upload", data=body,
                                       headers={**headers, **editor.headers()})
    assert blocked.status_code == 403
    hide = await editor.client.post(f"/api/admin/galleries/{mine['id']}/photos/bulk",
                                    json={"action": "hide", "ids": [photo_id]}, headers=editor.headers())
    assert hide.status_code == 200 and (await hide.get_json())["changed"] == 1
    for attempt in (
        editor.client.post(f"/api/admin/galleries/{mine['id']}/photos/bulk",
                           json={"action": "delete", "ids": [photo_id]}, headers=editor.headers()),
        editor.client.delete(f"/api/admin/photos/{photo_id}", headers=editor.headers()),
        editor.client.post(f"/api/admin/galleries/{mine['id']}/review",
                           json={"action": "delete", "ids": [photo_id]}, headers=editor.headers()),
        editor.client.delete(f"/api/admin/galleries/{mine['id']}", headers=editor.headers()),
    ):
        assert (await attempt).status_code == 403
    assert await services.db.read(admin_q.gallery_of_photo, photo_id) == mine["id"]  # still there


async def test_the_audit_trail_records_changes_with_them_and_filters(app: Any, services: Any,
                                                                     admin: AuthActions) -> None:
    gallery = await admin.create_gallery(name="Audited")
    await admin.client.post(f"/api/admin/galleries/{gallery['id']}/publish", headers=admin.headers())
    # A change that finds nothing records nothing: the row is written in the change's transaction.
    assert (await admin.client.delete("/api/admin/galleries/999999", headers=admin.headers())).status_code == 404
    await admin.client.post("/admin/settings/contact", form={"csrf_token": admin.csrf, "contact_name": "Studio"})
    await admin.client.delete(f"/api/admin/galleries/{gallery['id']}", headers=admin.headers())
    rows = await services.db.read(lambda c: audit_q.search(c, account="admin"))
    actions = [row["action"] for row in rows]
    for action in ("login", "gallery.created", "gallery.published", "gallery.deleted", "settings.changed"):
        assert action in actions, actions
    assert actions.count("gallery.deleted") == 1
    deleted = next(row for row in rows if row["action"] == "gallery.deleted")
    assert deleted["gallery_name"] == "Audited" and deleted["gallery_id"] == gallery["id"]
    page = await admin.client.get(f"/admin/audit?action=gallery.published&gallery={gallery['id']}")
    html = await page.get_data(as_text=True)
    body = html.split("<tbody>")[1]
    assert page.status_code == 200 and ">gallery.published</td>" in body and ">gallery.created</td>" not in body
    none = await admin.client.get("/admin/audit?from=2000-01-01&to=2000-01-02")
    assert "Nothing matches" in await none.get_data(as_text=True)
    assert (await admin.client.get("/admin/audit?from=yesterday")).status_code == 400
    # Kept audit_retention_days: the janitor's round removes what is older.
    old = services.clock() - (services.settings.audit_retention_days + 1) * 86400
    await services.db.write(accounts.CLI.record, old, "login")
    await Janitor(services).reconcile()
    assert await services.db.read(lambda c: audit_q.search(c, until=old + 1)) == []
    assert await services.db.read(lambda c: audit_q.search(c, action="gallery.created")) != []


def test_account_commands(tmp_path: Path) -> None:
    data = str(tmp_path / "d")
    first = run_cli("admin", "set-password", "--password-stdin", "--data-dir", data, stdin="owner password\n")
    assert first.returncode == 0, first.stderr
    added = run_cli("admin", "account", "add", "anna", "--role", "editor", "--password-stdin", "--data-dir", data,
                    stdin="anna's password\n")
    assert added.returncode == 0, added.stderr
    twice = run_cli("admin", "account", "add", "anna", "--role", "admin", "--password-stdin", "--data-dir", data,
                    stdin="anna's password\n")
    assert twice.returncode == 2 and "exists already" in twice.stderr
    bad_role = run_cli("admin", "account", "add", "ben", "--role", "boss", "--password-stdin", "--data-dir", data,
                       stdin="ben's password\n")
    assert bad_role.returncode != 0
    spaced = run_cli("admin", "account", "add", "ben smith", "--role", "admin", "--password-stdin", "--data-dir",
                     data, stdin="ben's password\n")
    assert spaced.returncode == 2 and "no spaces" in spaced.stderr
    token = run_cli("admin", "token", "create", "--name", "anna-lr", "--account", "anna", "--data-dir", data)
    assert token.returncode == 0, token.stderr
    changed = run_cli("admin", "set-password", "--account", "anna", "--password-stdin", "--data-dir", data,
                      stdin="a new password\n")
    assert changed.returncode == 0 and "'anna'" in changed.stdout
    assert run_cli("admin", "account", "disable", "anna", "--data-dir", data).returncode == 0
    assert run_cli("admin", "account", "disable", "admin", "--data-dir", data).returncode == 2  # the last owner
    listed = run_cli("admin", "account", "list", "--data-dir", data).stdout.splitlines()
    assert "admin\towner\tactive\t-\tall" in listed and "anna\teditor\tdisabled\t-\t-" in listed
    tokens = run_cli("admin", "token", "list", "--data-dir", data).stdout
    assert "anna-lr\tactive\tanna" in tokens
    assert run_cli("admin", "account", "disable", "nobody", "--data-dir", data).returncode == 2


async def test_the_audit_trail_has_every_admin_change_of_the_merged_features(tmp_path: Path) -> None:
    """Brand, email templates and the test message, archive and restore, comment review, photo replacement and
    "Find me": each change is in the trail with who did it and on which gallery, written with the change."""
    from picpeak_lite.pipeline.archive import Archiver
    from picpeak_lite.web.app import create_app

    from .conftest import own_services
    from .factories import add_photo, published, run_pool_until_idle
    from .test_feedback import photo_url, send
    from .test_guest_pages import guest_csrf
    from .test_replace import replace, shot, step
    from .test_upload import admin_upload

    with own_services(tmp_path, smtp_host="127.0.0.1", smtp_port=9, email_from="photos@studio.test") as svc:
        bootstrap.ensure_admin(svc.settings, {"PICPEAK_ADMIN_PASSWORD": ADMIN_PASSWORD})
        app = create_app(svc)
        admin = AuthActions(app.test_client())
        await admin.login()
        form = {"csrf_token": admin.csrf}

        async def post(url: str, **fields: Any) -> None:
            answer = await admin.client.post(url, form={**form, **fields})
            assert answer.status_code == 302, (url, await answer.get_data(as_text=True))

        await post("/admin/settings/brand", studio_name="Lumen", accent="#8a3b12", accent_dark="#f0b48c",
                   font_body="system", font_heading="system", theme="auto", cover_layout="full", custom_css="")
        await post("/admin/settings/email/templates/test", subject="Hi {{ brand.site_name }}", text="t",
                   html="<p>h</p>", language="en")
        await post("/admin/settings/email/templates/test/reset")
        await post("/admin/settings/email/test", address="me@studio.test")

        empty = await published(admin, name="Quiet")
        archived = await admin.client.post(f"/api/admin/galleries/{empty['id']}/archive", headers=admin.headers())
        assert archived.status_code == 202, await archived.get_data(as_text=True)
        [done] = await Archiver(svc).pass_once()
        assert done.state == "archived"
        await post(f"/admin/galleries/{empty['id']}/restore")

        gallery = await published(admin, name="Party", hold_comments=True)
        gid, slug = gallery["id"], gallery["slug"]
        photo = add_photo(svc, gid)
        guest = app.test_client()
        csrf = await guest_csrf(guest, slug)
        ids = [(await send(guest, "POST", photo_url(slug, photo, "comments"), csrf, {"text": t, "name": "Ann"}))[1]
               ["comment"]["id"] for t in ("Keep", "Drop")]
        for action, comment in (("approve", ids[0]), ("reject", ids[1])):
            answer = await admin.client.post(f"/api/admin/galleries/{gid}/comments", headers=admin.headers(),
                                             json={"action": action, "ids": [comment]})
            assert (await answer.get_json())["ids"] == [comment]

        [uploaded] = (await (await admin_upload(admin, gid, [("IMG_1.jpg", shot(1))])).get_json())["photo_ids"]
        await run_pool_until_idle(svc)
        for n, last in ((2, "confirm"), (3, "revert")):
            assert (await replace(admin, gid, uploaded, shot(n))).status_code == 202
            await run_pool_until_idle(svc)
            assert (await step(admin, gid, uploaded, last)).status_code == 200

        await post(f"/admin/galleries/{gid}/findme")  # switched off
        await post(f"/admin/galleries/{gid}/findme/delete")

        rows = await svc.db.read(lambda c: audit_q.search(c, account="admin"))
    found = {(row["action"], row["gallery_id"], row["detail"]) for row in rows}
    expected = [
        ("settings.changed", None, "brand"), ("settings.changed", None, "email template test saved"),
        ("settings.changed", None, "email template test reset"), ("email.test_sent", None, "me@studio.test"),
        ("gallery.archive_requested", empty["id"], ""), ("gallery.restore_requested", empty["id"], ""),
        ("comments.approved", gid, f"comments {ids[0]}"), ("comments.rejected", gid, f"comments {ids[1]}"),
        ("photo.replaced", gid, f"photo {uploaded}: IMG_1.jpg"),
        ("photo.replacement_confirmed", gid, f"photo {uploaded}"),
        ("photo.replacement_reverted", gid, f"photo {uploaded}"),
    ]
    for item in expected:
        assert item in found, (item, sorted(found, key=str))
    assert [row["action"] for row in rows].count("photo.replaced") == 2
    findme = [row["detail"] for row in rows if row["gallery_id"] == gid and row["action"] == "gallery.updated"]
    assert any(d.startswith("find me off") for d in findme) and any("face index deleted" in d for d in findme)
    assert {action for action, _, _ in expected} <= set(accounts.ACTIONS)  # the audit page's filter offers them
