"""Guessing (issue 7, suite 5): 1,000 wrong passwords from one IP at one gallery and at the admin login.

At most ``login_attempts`` (5) real password-hash checks from one IP's unknown browsers before they are slowed
(``login_backoff_seconds``, doubling; tests/test_passwords.py follows it on a jumping clock), the rest 429 with
``Retry-After``; a browser that gave the right password before, on the same IP, and a second IP with the right
password get in at once. Hash checks are counted by wrapping the
services object's own ``verify_password`` (as tests/test_admin_auth.py does), so a check skipped by the
throttle is really skipped, not just answered differently.

"An unknown gallery takes about as long as a known one": the gallery's existence is already told by its status
(404 versus the 401 password page), and a slug carries 40 random bits, so the time of the password check can
add nothing for a *published* gallery. What must not leak is what the status hides:

* a draft gallery (it exists, but is not shown yet) must be indistinguishable from an unknown slug: the same
  status, the same body, no hash check in either, and about the same time;
* at the admin login, an unknown user name must cost the same hash check (and so about the same time) as a
  known name with a wrong password, or the time would tell which user names exist.
"""

from __future__ import annotations

import re
import statistics
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import pytest

from .conftest import ADMIN_PASSWORD, AuthActions
from .factories import published
from .harness import figures

# A system suite (a thousand guesses per target, through the real password hashing):
# left out by -m "not system", run by plain pytest and CI.
pytestmark = pytest.mark.system

CSRF = re.compile(r'name="csrf_token" value="([^"]+)"')
GUESSES = 1000
GALLERY_PASSWORD = "letmein-please"
SECOND_IP = {"client": ("10.0.0.2", 1)}


class HashCounter:
    """Wraps ``Services.verify_password`` on this services object and counts the real hash checks."""

    def __init__(self, services: Any) -> None:
        self.calls = 0
        self._original = services.verify_password
        services.verify_password = self._counting

    async def _counting(self, password_hash: str | None, password: str) -> bool:
        self.calls += 1
        return await self._original(password_hash, password)


async def guest_csrf(client: Any, slug: str, **kw: Any) -> str:
    page = await client.get(f"/g/{slug}", **kw)
    assert page.status_code == 401
    return CSRF.search(await page.get_data(as_text=True)).group(1)


def retry_after_ok(response: Any, window: int) -> bool:
    value = response.headers.get("Retry-After", "")
    return value.isdigit() and 0 < int(value) <= window


@dataclass
class Guesses:
    statuses: list[int]
    bad_retry_after: int  # 429s without a Retry-After within the window
    hash_checks: int
    seconds: float  # on the services' clock, which the throttle reads

    def backoffs_over(self, backoff: int) -> int:
        """How many backoffs (backoff, 2 x backoff, ...) can have ended while the guesses were sent: each lets
        one more guess through; on a quiet machine the thousand guesses take a few seconds, so none."""
        steps = 0
        while backoff * (2 ** (steps + 1) - 1) <= self.seconds:
            steps += 1
        return steps


async def guess(services: Any, attempt: Callable[[int], Awaitable[Any]]) -> Guesses:
    """GUESSES wrong passwords, one after the other (``attempt(i)`` sends the i-th), counting the hash checks."""
    window = services.settings.login_window_seconds
    counter = HashCounter(services)
    statuses: list[int] = []
    bad_retry_after = 0
    began = services.monotonic()
    for i in range(GUESSES):
        response = await attempt(i)
        statuses.append(response.status_code)
        if response.status_code == 429 and not retry_after_ok(response, window):
            bad_retry_after += 1
    return Guesses(statuses, bad_retry_after, counter.calls, services.monotonic() - began)


def report_and_check(capsys: Any, target: str, guesses: Guesses, second_ip_seconds: float, settings: Any) -> None:
    statuses, limit = guesses.statuses, settings.login_attempts
    extra = guesses.backoffs_over(settings.login_backoff_seconds)
    figures(capsys, f"guessing {target}: attempts={GUESSES} hash_checks={guesses.hash_checks} "
                    f"refused_401={statuses.count(401)} throttled_429={statuses.count(429)} "
                    f"bad_retry_after={guesses.bad_retry_after} second_ip_in_ms={second_ip_seconds * 1000:.0f} "
                    f"guessing_s={guesses.seconds:.1f}")
    assert limit <= 10
    assert guesses.hash_checks == statuses.count(401)
    assert statuses[:limit + 1] == [401] * limit + [429]
    assert limit <= statuses.count(401) <= limit + extra
    assert statuses.count(401) + statuses.count(429) == GUESSES
    assert guesses.bad_retry_after == 0


async def test_a_thousand_wrong_gallery_passwords(services: Any, admin: AuthActions, app: Any,
                                                  capsys: pytest.CaptureFixture[str]) -> None:
    gallery = await published(admin, name="Private party", password=GALLERY_PASSWORD)
    url = f"/g/{gallery['slug']}/password"
    # A guest who entered before, on the attacker's IP (the venue's Wi-Fi): its browser is known from then on.
    known = app.test_client()
    known_csrf = await guest_csrf(known, gallery["slug"])
    assert (await known.post(url, form={"password": GALLERY_PASSWORD, "csrf_token": known_csrf})).status_code == 302
    attacker = app.test_client()
    csrf = await guest_csrf(attacker, gallery["slug"])
    guesses = await guess(services, lambda i: attacker.post(url, form={"password": f"guess-{i}", "csrf_token": csrf}))
    # The attacker's guesses did not lock the known browser out.
    assert (await known.post(url, form={"password": GALLERY_PASSWORD, "csrf_token": known_csrf})).status_code == 302
    # A real guest on another IP gets in at once.
    friend = app.test_client()
    friend_csrf = await guest_csrf(friend, gallery["slug"], scope_base=SECOND_IP)
    started = time.perf_counter()
    entered = await friend.post(url, form={"password": GALLERY_PASSWORD, "csrf_token": friend_csrf},
                                scope_base=SECOND_IP)
    friend_seconds = time.perf_counter() - started
    assert entered.status_code == 302
    assert (await friend.get(f"/g/{gallery['slug']}", scope_base=SECOND_IP)).status_code == 200
    report_and_check(capsys, "gallery", guesses, friend_seconds, services.settings)


async def test_a_thousand_wrong_admin_passwords(services: Any, auth: AuthActions, app: Any,
                                                capsys: pytest.CaptureFixture[str]) -> None:
    # The photographer's own browser, on the attacker's network, logged in before.
    photographer = AuthActions(app.test_client())
    assert (await photographer.login()).status_code == 302
    guesses = await guess(services, lambda i: auth.login(password=f"guess-{i}"))
    assert (await photographer.login()).status_code == 302  # not locked out by the attacker's guesses
    other = app.test_client()
    started = time.perf_counter()
    entered = await other.post("/admin/login", form={"username": "admin", "password": ADMIN_PASSWORD},
                               scope_base=SECOND_IP)
    second_seconds = time.perf_counter() - started
    assert entered.status_code == 302
    assert (await other.get("/admin/", scope_base=SECOND_IP)).status_code == 200
    report_and_check(capsys, "admin", guesses, second_seconds, services.settings)


async def timed(call: Any, n: int) -> tuple[float, list[Any]]:
    """Median seconds of ``n`` calls, and their responses."""
    seconds, responses = [], []
    for i in range(n):
        started = time.perf_counter()
        responses.append(await call(i))
        seconds.append(time.perf_counter() - started)
    return statistics.median(seconds), responses


def about_as_long(a: float, b: float) -> bool:
    """Within 2x of each other, or both so quick (under 5 ms apart) that scheduling noise dominates."""
    return abs(a - b) < 0.005 or max(a, b) <= 2 * min(a, b)


async def draft_versus_unknown(services: Any, admin: AuthActions, app: Any, capsys: Any) -> dict[str, Any]:
    """30 wrong passwords at a draft and at an unknown slug: the same answers, no hash check in either. Returns
    ``label -> (median seconds, answers, page status, page body)``; the medians are printed."""
    draft = await admin.create_gallery(name="Not yet", password=GALLERY_PASSWORD)
    unknown_slug = draft["slug"][:-8] + "zzzzzzzz"
    guest = app.test_client()
    csrf = await guest_csrf(guest, (await published(admin, name="Open one", password="x-pass-1"))["slug"])
    counter = HashCounter(services)
    results = {}
    for label, slug in (("draft", draft["slug"]), ("unknown", unknown_slug)):
        async def attempt(i: int, slug: str = slug) -> tuple[int, str]:
            response = await guest.post(f"/g/{slug}/password", form={"password": f"g{i}", "csrf_token": csrf},
                                        scope_base={"client": (f"10.2.0.{i % 200}", 1)})
            return response.status_code, await response.get_data(as_text=True)

        median, responses = await timed(attempt, 30)
        page = await guest.get(f"/g/{slug}", headers={"Accept": "application/json"})
        # The page links the language picker back to the path the visitor asked for: its own slug, which tells
        # nothing. Everything else must be the same, byte for byte.
        answers = {(status, body.replace(slug, "<slug>")) for status, body in responses}
        results[label] = (median, answers, page.status_code, await page.get_json())
    figures(capsys, f"guessing draft-vs-unknown: hash_checks={counter.calls} "
                    f"draft_ms={results['draft'][0] * 1000:.1f} unknown_ms={results['unknown'][0] * 1000:.1f}")
    assert counter.calls == 0
    assert results["draft"][1] == results["unknown"][1] and len(results["draft"][1]) == 1
    assert {status for status, _ in results["draft"][1]} == {404}
    assert results["draft"][2:] == results["unknown"][2:]
    return results


async def test_a_draft_gallery_looks_exactly_like_an_unknown_one(services: Any, admin: AuthActions, app: Any,
                                                                 capsys: pytest.CaptureFixture[str]) -> None:
    """No hash check for either is what makes their times alike; the times are printed, and compared in the
    slow variant (two medians of a few milliseconds are noise on a busy machine)."""
    await draft_versus_unknown(services, admin, app, capsys)


@pytest.mark.slow
async def test_a_draft_gallery_takes_about_as_long_as_an_unknown_one(services: Any, admin: AuthActions, app: Any,
                                                                     capsys: pytest.CaptureFixture[str]) -> None:
    results = await draft_versus_unknown(services, admin, app, capsys)
    assert about_as_long(results["draft"][0], results["unknown"][0])


async def known_versus_unknown_name(services: Any, app: Any, capsys: Any) -> dict[str, float]:
    """8 wrong passwords for a known and for an unknown user name: one hash check each. Returns the medians."""
    client = app.test_client()
    counter = HashCounter(services)
    medians = {}
    for label, username in (("known", "admin"), ("unknown", "root")):
        async def attempt(i: int, username: str = username, label: str = label) -> int:
            response = await client.post("/admin/login", form={"username": username, "password": f"nope {i}"},
                                         scope_base={"client": (f"10.3.{len(label)}.{i}", 1)})
            return response.status_code

        medians[label], statuses = await timed(attempt, 8)
        assert statuses == [401] * 8
    figures(capsys, f"guessing admin-names: hash_checks={counter.calls} known_ms={medians['known'] * 1000:.1f} "
                    f"unknown_ms={medians['unknown'] * 1000:.1f}")
    assert counter.calls == 16
    return medians


async def test_an_unknown_admin_name_costs_the_same_hash_check(services: Any, app: Any,
                                                               capsys: pytest.CaptureFixture[str]) -> None:
    """The same hash check for both is what makes their times alike; the times are printed, and compared in
    the slow variant."""
    await known_versus_unknown_name(services, app, capsys)


@pytest.mark.slow
async def test_an_unknown_admin_name_takes_about_as_long_as_a_known_one(services: Any, app: Any,
                                                                        capsys: pytest.CaptureFixture[str]) -> None:
    medians = await known_versus_unknown_name(services, app, capsys)
    assert about_as_long(medians["known"], medians["unknown"])
