"""Password throttling that cannot lock out others (issue 27; ``web/passwords.py``).

All on one address, as on a venue's Wi-Fi or the photographer's own network: a stranger's wrong guesses leave
the photographer's known browser and a guest's known browser able to enter at once; other browsers of that
address are slowed (a backoff that doubles), not shut for the window; a known browser's own wrong guesses are
limited for it alone; a forged or outdated device cookie counts for nothing; and guessing from many addresses
is bounded per target. Time runs on trio's ``autojump_clock``; ``login_attempts`` is 2 here, so that the
many-address case costs 40 password hashes rather than 100.
"""

from __future__ import annotations

import re
from typing import Any

import pytest
import trio

from picpeak_lite.config import Settings
from picpeak_lite.web.passwords import DEVICE_COOKIE, UNTRUSTED_FACTOR

from .conftest import ADMIN_PASSWORD, AuthActions, make_settings
from .factories import published

CSRF = re.compile(r'name="csrf_token" value="([^"]+)"')
VENUE = {"client": ("203.0.113.7", 4000)}
PASSWORD = "letmein-please"
LIMIT = 2


@pytest.fixture
def settings(tmp_path: Any) -> Settings:
    return make_settings(tmp_path, login_attempts=LIMIT)


async def admin_login(client: Any, password: str, scope: dict[str, Any] = VENUE) -> Any:
    return await client.post("/admin/login", form={"username": "admin", "password": password}, scope_base=scope)


async def guest(app: Any, slug: str, scope: dict[str, Any] = VENUE) -> tuple[Any, Any]:
    """A new browser at the gallery's password page, and a function that sends a password from it."""
    client = app.test_client()
    page = await client.get(f"/g/{slug}", scope_base=scope)
    assert page.status_code == 401
    csrf = CSRF.search(await page.get_data(as_text=True)).group(1)  # type: ignore[union-attr]

    async def enter(password: str) -> Any:
        return await client.post(f"/g/{slug}/password", form={"password": password, "csrf_token": csrf},
                                 scope_base=scope)

    return client, enter


def device_cookie(client: Any) -> str | None:
    return next((c.value for c in client.cookie_jar if c.name == DEVICE_COOKIE), None)


async def test_a_strangers_guesses_leave_the_photographers_known_browser_in(app: Any, services: Any,
                                                                           autojump_clock: Any) -> None:
    photographer = app.test_client()
    assert (await admin_login(photographer, ADMIN_PASSWORD)).status_code == 302
    assert device_cookie(photographer)
    stranger = app.test_client()
    statuses = [(await admin_login(stranger, f"guess {i}")).status_code for i in range(50)]
    assert statuses == [401] * LIMIT + [429] * (50 - LIMIT)
    # The known browser, on the same address, gets in at once, again and again.
    for _ in range(3):
        assert (await admin_login(photographer, ADMIN_PASSWORD)).status_code == 302
    # A browser the server has not seen before, on that address, is slowed, not shut out for the window.
    newcomer = app.test_client()
    slowed = await admin_login(newcomer, ADMIN_PASSWORD)
    assert slowed.status_code == 429
    wait = int(slowed.headers["Retry-After"])
    assert 0 < wait <= services.settings.login_backoff_seconds
    await trio.sleep(wait)
    assert (await admin_login(newcomer, ADMIN_PASSWORD)).status_code == 302
    assert (await newcomer.get("/admin/", scope_base=VENUE)).status_code == 200


async def test_a_strangers_guesses_leave_a_guests_known_browser_in(app: Any, admin: AuthActions,
                                                                  autojump_clock: Any) -> None:
    gallery = await published(admin, name="Party", password=PASSWORD)
    _, friend_enters = await guest(app, gallery["slug"])
    assert (await friend_enters(PASSWORD)).status_code == 302
    _, stranger_enters = await guest(app, gallery["slug"])
    statuses = [(await stranger_enters(f"guess {i}")).status_code for i in range(50)]
    assert statuses == [401] * LIMIT + [429] * (50 - LIMIT)
    assert (await friend_enters(PASSWORD)).status_code == 302
    # Another guest at the venue waits out the backoff and is in.
    _, newcomer_enters = await guest(app, gallery["slug"])
    slowed = await newcomer_enters(PASSWORD)
    assert slowed.status_code == 429
    await trio.sleep(int(slowed.headers["Retry-After"]))
    assert (await newcomer_enters(PASSWORD)).status_code == 302


async def test_untrusted_guessing_waits_twice_as_long_after_each_failure(app: Any, services: Any,
                                                                         admin: AuthActions,
                                                                         autojump_clock: Any) -> None:
    """Past the limit each wrong guess doubles the wait, up to the window; a stranger guessing as fast as it is
    let through for six hours then gets one guess per window (the old lockout allowed login_attempts per window)."""
    gallery = await published(admin, name="Party", password=PASSWORD)
    _, enters = await guest(app, gallery["slug"])
    settings = services.settings
    backoff, window = settings.login_backoff_seconds, settings.login_window_seconds
    for i in range(settings.login_attempts):
        assert (await enters(f"guess {i}")).status_code == 401
    waits = []
    for i in range(4):
        refused = await enters(f"early {i}")
        assert refused.status_code == 429
        waits.append(int(refused.headers["Retry-After"]))
        await trio.sleep(waits[-1])
        assert (await enters(f"late {i}")).status_code == 401
    assert waits == [backoff, 2 * backoff, 4 * backoff, 8 * backoff]
    # Six hours of guessing at the fastest the server lets through.
    hours = 6 * 3600
    began, guesses, longest = trio.current_time(), 0, 0
    while trio.current_time() - began < hours:
        answer = await enters(f"day {guesses}")
        if answer.status_code == 429:
            wait = int(answer.headers["Retry-After"])
            longest = max(longest, wait)
            await trio.sleep(wait)
        else:
            assert answer.status_code == 401
            guesses += 1
    assert longest <= window
    assert guesses <= 2 + hours // window, guesses


async def test_a_known_browser_guessing_is_limited_for_itself_alone(app: Any, admin: AuthActions,
                                                                    autojump_clock: Any) -> None:
    gallery = await published(admin, name="Party", password=PASSWORD)
    _, known_enters = await guest(app, gallery["slug"])
    assert (await known_enters(PASSWORD)).status_code == 302
    statuses = [(await known_enters(f"guess {i}")).status_code for i in range(20)]
    assert statuses == [401] * LIMIT + [429] * (20 - LIMIT)
    assert (await known_enters(PASSWORD)).status_code == 429  # its own failures: no unlimited guessing
    # Nobody else at the address was touched by them.
    _, other_enters = await guest(app, gallery["slug"])
    assert (await other_enters(PASSWORD)).status_code == 302
    await trio.sleep(901)
    assert (await known_enters(PASSWORD)).status_code == 302


async def test_a_forged_or_outdated_device_cookie_counts_for_nothing(app: Any, admin: AuthActions,
                                                                     autojump_clock: Any) -> None:
    gallery = await published(admin, name="Party", password=PASSWORD)
    known, known_enters = await guest(app, gallery["slug"])
    assert (await known_enters(PASSWORD)).status_code == 302
    cookie = device_cookie(known)
    assert cookie is not None
    _, stranger_enters = await guest(app, gallery["slug"])
    for i in range(LIMIT):
        assert (await stranger_enters(f"guess {i}")).status_code == 401

    async def enter_with(cookie_value: str) -> int:
        client = app.test_client()
        client.set_cookie("localhost", DEVICE_COOKIE, cookie_value)
        page = await client.get(f"/g/{gallery['slug']}", scope_base=VENUE)
        csrf = CSRF.search(await page.get_data(as_text=True)).group(1)  # type: ignore[union-attr]
        answer = await client.post(f"/g/{gallery['slug']}/password",
                                   form={"password": PASSWORD, "csrf_token": csrf}, scope_base=VENUE)
        return int(answer.status_code)

    # The cookie itself, in another browser, is trusted (it is the device's); with another id the proof does
    # not match and the browser is as untrusted as any other: slowed by the stranger's guesses.
    assert await enter_with(cookie) == 302
    _, proof = cookie.split("~", 1)
    assert await enter_with("A" * 22 + "~" + proof) == 429
    assert await enter_with(cookie[:-1] + ("A" if cookie[-1] != "A" else "B")) == 429
    # A new password: the known browser proved the old one only, so it is untrusted (and slowed) too.
    changed = await admin.client.patch(f"/api/admin/galleries/{gallery['id']}",
                                       json={"password": "a-new-password"}, headers=admin.headers())
    assert changed.status_code == 200, await changed.get_data(as_text=True)
    assert (await known_enters("a-new-password")).status_code == 429


async def test_guessing_from_many_addresses_is_bounded_per_target(app: Any, services: Any, admin: AuthActions,
                                                                  autojump_clock: Any) -> None:
    gallery = await published(admin, name="Party", password=PASSWORD)
    limit = services.settings.login_attempts
    total = limit * UNTRUSTED_FACTOR
    failures = 0
    for address in range(UNTRUSTED_FACTOR):
        _, enters = await guest(app, gallery["slug"], {"client": (f"198.51.100.{address}", 1)})
        for i in range(limit):
            assert (await enters(f"guess {address}-{i}")).status_code == 401
            failures += 1
    assert failures == total
    _, fresh_enters = await guest(app, gallery["slug"], {"client": ("192.0.2.200", 1)})
    slowed = await fresh_enters(PASSWORD)
    assert slowed.status_code == 429
    await trio.sleep(int(slowed.headers["Retry-After"]))
    assert (await fresh_enters(PASSWORD)).status_code == 302
