"""Admin login, sessions, CSRF and origin checks, API tokens, throttling."""

from __future__ import annotations

import time
from typing import Any

import trio

from picpeak_lite.ops import bootstrap
from picpeak_lite.store import db
from picpeak_lite.store.queries import admin as admin_q

from .conftest import ADMIN_PASSWORD, AuthActions, HashChecks


async def test_pages_need_login(client: Any) -> None:
    response = await client.get("/admin/")
    assert response.status_code == 302
    assert response.headers["Location"].startswith("/admin/login?next=/admin/")
    api = await client.get("/api/admin/galleries")
    assert api.status_code == 401
    assert "error" in await api.get_json()


async def test_login_sets_a_hardened_cookie_and_logout_revokes_it(client: Any, auth: AuthActions) -> None:
    response = await auth.login()
    assert response.status_code == 302
    cookie = response.headers["Set-Cookie"]
    assert "pp_admin=" in cookie and "HttpOnly" in cookie and "SameSite=Lax" in cookie
    assert "Secure" not in cookie  # not configured for HTTPS in tests
    assert (await client.get("/admin/")).status_code == 200
    token = cookie.split("pp_admin=")[1].split(";")[0]

    logout = await client.post("/admin/logout", form={"csrf_token": auth.csrf})
    assert logout.status_code == 302
    # The server-side session is gone: replaying the old cookie does not work.
    client.cookie_jar.clear()
    replay = await client.get("/api/admin/galleries", headers={"Cookie": f"pp_admin={token}"})
    assert replay.status_code == 401


UNSAFE_NEXT = (
    "/admin\r\nX: y", "/admin/\nSet-Cookie: a=b", "/admin/\x00", "/admin/\x7f", "/admin/\t", "/admin/ x",
    "//evil.example", "//evil.example/admin", "/\\evil.example", "/admin\\..\\x", "https://evil.example/admin",
    "javascript:alert(1)", "/adminevil", "evil", "/g/some-gallery", "/admin/#frag", "/admin/ü", " /admin/",
    "/admin/" + "a" * 3000,
)


async def test_an_unsafe_next_falls_back_to_the_dashboard(client: Any, auth: AuthActions) -> None:
    """A crafted login link loses its destination, never the login (CR/LF once made this a 500)."""
    for value in UNSAFE_NEXT:
        page = await client.get("/admin/login", query_string={"next": value})
        assert page.status_code == 200 and 'name="next"' not in await page.get_data(as_text=True), repr(value)
        response = await client.post("/admin/login", form={"username": "admin", "password": ADMIN_PASSWORD,
                                                            "next": value})
        assert response.status_code == 302, repr(value)
        assert response.headers["Location"] == "/admin/", repr(value)
        assert "pp_admin=" in response.headers["Set-Cookie"]
        client.cookie_jar.clear()
    for value in ("/admin/", "/admin", "/admin/galleries/7?status=failed&source=guest", "/admin/settings%2Fx"):
        response = await client.post("/admin/login", form={"username": "admin", "password": ADMIN_PASSWORD,
                                                            "next": value})
        assert response.status_code == 302 and response.headers["Location"] == value, value
        client.cookie_jar.clear()
    # The redirect to the login form keeps a page's own address (with its query) as a safe next.
    found = await client.get("/admin/galleries/7", query_string={"status": "failed"})
    assert found.headers["Location"].startswith("/admin/login?next=")
    login_page = await client.get(found.headers["Location"])
    assert 'name="next" value="/admin/galleries/7?status=failed"' in await login_page.get_data(as_text=True)


async def test_wrong_password_is_refused(client: Any, auth: AuthActions) -> None:
    response = await auth.login(password="wrong password")
    assert response.status_code == 401
    assert "Wrong user name or password" in await response.get_data(as_text=True)
    unknown = await auth.login(username="root")
    assert unknown.status_code == 401


async def test_state_change_without_csrf_token_is_refused(client: Any, admin: AuthActions) -> None:
    no_token = await client.post("/api/admin/galleries", json={"name": "X"})
    assert no_token.status_code == 403
    assert "security token" in (await no_token.get_json())["error"]
    form = await client.post("/admin/galleries/new", form={"name": "X"})
    assert form.status_code == 403
    ok = await client.post("/api/admin/galleries", json={"name": "X"}, headers=admin.headers())
    assert ok.status_code == 201


async def test_foreign_origin_is_refused(client: Any, admin: AuthActions) -> None:
    headers = {**admin.headers(), "Origin": "https://evil.example"}
    response = await client.post("/api/admin/galleries", json={"name": "X"}, headers=headers)
    assert response.status_code == 403
    cross = {**admin.headers(), "Sec-Fetch-Site": "cross-site"}
    assert (await client.post("/api/admin/galleries", json={"name": "X"}, headers=cross)).status_code == 403
    same = {**admin.headers(), "Origin": "http://localhost", "Sec-Fetch-Site": "same-origin"}
    assert (await client.post("/api/admin/galleries", json={"name": "X"}, headers=same)).status_code == 201
    login = await client.post("/admin/login", form={"password": "x"}, headers={"Origin": "https://evil.example"})
    assert login.status_code == 403


async def test_login_throttled_per_ip_then_released(client: Any, auth: AuthActions, autojump_clock: Any) -> None:
    for _ in range(5):
        assert (await auth.login(password="nope nope")).status_code == 401
    blocked = await auth.login()  # even the right password: the IP is out of attempts
    assert blocked.status_code == 429
    assert 0 < int(blocked.headers["Retry-After"]) <= 900
    # Another IP is not affected: no global lockout.
    other = await client.post(
        "/admin/login", form={"username": "admin", "password": ADMIN_PASSWORD},
        scope_base={"client": ("10.9.9.9", 5000)},
    )
    assert other.status_code == 302
    await trio.sleep(901)
    assert (await auth.login()).status_code == 302


async def test_throttle_skips_the_hash_check(hash_checks: HashChecks, client: Any, auth: AuthActions) -> None:
    """Past the limit no password hash is computed: 40 guesses cost 5 hash checks."""
    statuses = [(await auth.login(password=f"guess {i}")).status_code for i in range(40)]
    assert statuses.count(401) == 5 and statuses.count(429) == 35
    assert hash_checks.count == 5


async def test_password_change_revokes_sessions(client: Any, admin: AuthActions) -> None:
    bad = await client.post("/admin/password", form={"csrf_token": admin.csrf, "current": "x", "new": "short",
                                                     "confirm": "short"})
    assert bad.status_code == 400
    text = await bad.get_data(as_text=True)
    assert "not your current password" in text and "At least 8 characters" in text
    ok = await client.post("/admin/password", form={
        "csrf_token": admin.csrf, "current": ADMIN_PASSWORD, "new": "a new long password", "confirm":
        "a new long password"})
    assert ok.status_code == 302
    assert (await client.get("/api/admin/galleries")).status_code == 401
    assert (await admin.login()).status_code == 401
    assert (await admin.login(password="a new long password")).status_code == 302


async def test_api_token_works_without_csrf_and_dies_when_revoked(services: Any, client: Any) -> None:
    conn = db.connect(services.settings.database)
    with db.transaction(conn):
        token = bootstrap.create_api_token(conn, "script", time.time())
    headers = {"Authorization": f"Bearer {token}"}
    response = await client.post("/api/admin/galleries", json={"name": "From a script"}, headers=headers)
    assert response.status_code == 201
    with db.transaction(conn):
        assert admin_q.revoke_token(conn, "script", time.time())
    conn.close()
    revoked = await client.get("/api/admin/galleries", headers=headers)
    assert revoked.status_code == 401
    assert "revoked" in (await revoked.get_json())["error"]
    garbage = await client.get("/api/admin/galleries", headers={"Authorization": "Basic abc"})
    assert garbage.status_code == 401


async def test_security_headers_on_every_response(client: Any) -> None:
    for path in ("/admin/login", "/healthz", "/no/such/page", "/static/app.css"):
        response = await client.get(path)
        assert response.headers["X-Content-Type-Options"] == "nosniff"
        csp = response.headers["Content-Security-Policy"]
        assert "frame-ancestors 'none'" in csp and "script-src 'self'" in csp and "unsafe-inline" not in csp
        assert response.headers["Referrer-Policy"]


async def test_unknown_route_renders_html_or_json(client: Any) -> None:
    page = await client.get("/no/such/page", headers={"Accept": "text/html"})
    assert page.status_code == 404 and "<h1>Not found</h1>" in await page.get_data(as_text=True)
    api = await client.get("/api/admin/nope")
    assert api.status_code == 404 and (await api.get_json())["error"]


async def test_concurrent_guesses_are_counted_before_hashing(hash_checks: HashChecks, client: Any,
                                                             auth: AuthActions) -> None:
    """Forty guesses sent at once take their turns, so only five hashes run."""
    statuses: list[int] = []

    async def guess(i: int) -> None:
        statuses.append((await auth.login(password=f"parallel guess {i}")).status_code)

    async with trio.open_nursery() as nursery:
        for i in range(40):
            nursery.start_soon(guess, i)
    assert sorted(statuses) == [401] * 5 + [429] * 35
    assert hash_checks.count == 5


async def test_forwarded_for_is_believed_only_from_trusted_proxies(tmp_path: Any) -> None:
    from picpeak_lite.web.app import create_app

    from .conftest import own_services

    with own_services(tmp_path, trusted_proxies="127.0.0.1, 10.0.0.1") as svc:
        bootstrap.ensure_admin(svc.settings, {"PICPEAK_ADMIN_PASSWORD": ADMIN_PASSWORD})
        client = create_app(svc).test_client()

        async def login(forwarded: str, peer: str = "127.0.0.1", password: str = "wrong") -> int:
            response = await client.post("/admin/login", form={"username": "admin", "password": password},
                                         headers={"X-Forwarded-For": forwarded}, scope_base={"client": (peer, 1)})
            return response.status_code

        # Behind the proxy, each guest is counted as itself: one guesser does not lock out the others.
        assert [await login("203.0.113.5, 10.0.0.1") for _ in range(6)] == [401] * 5 + [429]
        assert await login("203.0.113.6", password=ADMIN_PASSWORD) == 302
        # A client talking to us directly cannot pick its own address with the header.
        assert [await login(f"198.51.100.{i}", peer="192.0.2.9") for i in range(6)] == [401] * 5 + [429]


def test_ipv6_clients_count_by_their_64() -> None:
    from picpeak_lite.web.views.common import throttle_key

    assert throttle_key("2001:db8:1:2:aaaa::1") == throttle_key("2001:db8:1:2:ffff::9") == "2001:db8:1:2::/64"
    assert throttle_key("2001:db8:1:3::1") != throttle_key("2001:db8:1:2::1")
    assert throttle_key("::ffff:203.0.113.5") == "203.0.113.5"
    assert throttle_key("203.0.113.5") == "203.0.113.5"


async def test_right_passwords_at_the_same_moment_from_one_address_all_get_in(client: Any, app: Any) -> None:
    """A family on one wifi logging in together: right passwords never count against the address."""
    clients = [app.test_client() for _ in range(12)]
    statuses: list[int] = []

    async def login(c: Any) -> None:
        response = await c.post("/admin/login", form={"username": "admin", "password": ADMIN_PASSWORD})
        statuses.append(response.status_code)

    async with trio.open_nursery() as nursery:
        for c in clients:
            nursery.start_soon(login, c)
    assert statuses == [302] * 12
