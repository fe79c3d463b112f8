"""Limits that hold for the whole service (issue 31; web/throttle.py, web/ratelimit.py, store/queries/limits.py).

Two apps, each with its own ``Services`` and ``Database`` on one database, stand for two server processes behind
one proxy: a limit of N guesses is N across both (each kept its own count before), guesses sent to both at once
cannot pass the limit, a reservation left by a process that stopped answering mid-check expires, and a token
bucket's burst is one burst for both (also when one host's clock is behind). Then the tables stay bounded (the
janitor's prune), and the cost of one check is printed: ``limits: check_ms_p50= ...``.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import AsyncIterator
from typing import Any

import pytest
import trio

from picpeak_lite.config import Settings
from picpeak_lite.errors import TooManyRequests
from picpeak_lite.pipeline.janitor import Janitor
from picpeak_lite.services import Services
from picpeak_lite.store.db import Database
from picpeak_lite.store.queries import limits as limits_q
from picpeak_lite.web.app import create_app
from picpeak_lite.web.limits import wall_clock
from picpeak_lite.web.ratelimit import RateLimit
from picpeak_lite.web.throttle import MAX_WAIT_SECONDS, RESERVATION_SECONDS

from .conftest import ADMIN_PASSWORD, make_settings
from .harness import figures

LIMIT = 3
VENUE = {"client": ("203.0.113.9", 4000)}


@pytest.fixture
def settings(tmp_path: Any) -> Settings:
    return make_settings(tmp_path, login_attempts=LIMIT)


@pytest.fixture
async def second(services: Services) -> AsyncIterator[Services]:
    """A second process's core on the same database: its own connections, its own app state."""
    db = Database(services.settings.database)
    svc = Services(settings=services.settings, db=db, monotonic=trio.current_time)
    yield svc
    db.close()


class Hashes:
    """Counts the real password-hash checks of both apps (wrapping each services object's ``verify_password``),
    and can hold them: ``hold`` makes every check wait until ``release`` (a process stuck mid-check)."""

    def __init__(self, *services: Services) -> None:
        self.calls = 0
        self.arrived = trio.Event()  # set at the first check
        self.held = trio.Event()
        self.held.set()
        for svc in services:
            original = svc.verify_password

            async def counting(password_hash: str | None, password: str, original: Any = original) -> bool:
                self.calls += 1
                self.arrived.set()
                await self.held.wait()
                return bool(await original(password_hash, password))

            svc.verify_password = counting  # type: ignore[method-assign]

    def hold(self) -> None:
        self.held = trio.Event()


def agree(*apps: Any) -> None:
    """Start the apps' limit clocks together: epoch seconds advanced by the (jumping) trio clock from their first
    reading, which must be one moment for all, as two hosts' synchronised clocks are."""
    for app in apps:
        app.extensions["picpeak_limits"].password_throttle.attempts.clock()


async def login(app: Any, password: str) -> int:
    response = await app.test_client().post("/admin/login", form={"username": "admin", "password": password},
                                            scope_base=VENUE)
    return int(response.status_code)


async def test_a_limit_of_n_guesses_is_n_across_two_processes(services: Services, second: Services) -> None:
    one, two = create_app(services), create_app(second)
    hashes = Hashes(services, second)
    statuses = [await login((one, two)[i % 2], f"guess {i}") for i in range(4 * LIMIT)]
    # Each process kept its own count before: 2 x LIMIT wrong guesses got their hash check.
    assert statuses == [401] * LIMIT + [429] * (3 * LIMIT)
    assert hashes.calls == LIMIT


async def test_guesses_sent_to_both_at_once_cannot_pass_the_limit(services: Services, second: Services) -> None:
    """Twenty wrong guesses at once, ten to each process: at most LIMIT reach a hash check (an attempt is reserved
    before its hash, and counts as a failure while in flight). Real time: the guesses wait for each other."""
    one, two = create_app(services), create_app(second)
    hashes = Hashes(services, second)
    statuses: list[int] = []

    async def guess(i: int) -> None:
        statuses.append(await login((one, two)[i % 2], f"guess {i}"))

    async with trio.open_nursery() as nursery:
        for i in range(20):
            nursery.start_soon(guess, i)
    assert hashes.calls == LIMIT
    assert sorted(statuses) == [401] * LIMIT + [429] * (20 - LIMIT)


async def test_right_passwords_sent_at_once_all_get_in(services: Services, second: Services) -> None:
    """A family on one Wi-Fi entering together: more browsers than the limit, right password, at once, half on
    each process; an attempt held back by others in flight waits for them instead of being refused."""
    one, two = create_app(services), create_app(second)
    statuses: list[int] = []

    async def enter(i: int) -> None:
        statuses.append(await login((one, two)[i % 2], ADMIN_PASSWORD))

    async with trio.open_nursery() as nursery:
        for i in range(2 * LIMIT):
            nursery.start_soon(enter, i)
    assert statuses == [302] * (2 * LIMIT)


async def test_a_stuck_processs_reservation_expires(services: Services, second: Services,
                                                    autojump_clock: Any) -> None:
    """Process one starts a check and never answers (a crash, as far as the database can tell): its reservation
    counts as a failure, so process two's next attempt (the key one failure short of the limit) waits, is answered
    429 with the reservation's remaining time, and gets in once that has passed."""
    one, two = create_app(services), create_app(second)
    agree(one, two)
    for i in range(LIMIT - 1):
        assert await login((one, two)[i % 2], f"guess {i}") == 401
    stuck = Hashes(services)
    stuck.hold()
    async with trio.open_nursery() as nursery:
        nursery.start_soon(login, one, "a guess that never ends")
        await stuck.arrived.wait()
        started = trio.current_time()
        refused = await two.test_client().post("/admin/login", form={"username": "admin",
                                                                     "password": ADMIN_PASSWORD}, scope_base=VENUE)
        assert refused.status_code == 429
        assert trio.current_time() - started >= MAX_WAIT_SECONDS  # it waited for the stuck one first
        wait = int(refused.headers["Retry-After"])
        assert 0 < wait <= RESERVATION_SECONDS - MAX_WAIT_SECONDS
        await trio.sleep(wait)
        assert await login(two, ADMIN_PASSWORD) == 302
        assert stuck.calls == 1  # still stuck
        nursery.cancel_scope.cancel()


async def test_a_bucket_is_one_bucket_for_two_processes(services: Services, second: Services) -> None:
    """Three tokens, refilled once in a thousand seconds: three takes in all, whichever process and however
    many at once (on PostgreSQL the two databases' connections write side by side)."""
    clock = wall_clock(services.clock, services.monotonic)
    buckets = [RateLimit("test", 3, 0.001, db=svc.db, clock=clock) for svc in (services, second)]
    granted: list[int] = []
    refused: list[int] = []

    async def tap(i: int) -> None:
        try:
            await buckets[i % 2].take("guest-1")
        except TooManyRequests as error:
            refused.append(error.retry_after)
        else:
            granted.append(i)

    async with trio.open_nursery() as nursery:
        for i in range(20):
            nursery.start_soon(tap, i)
    assert len(granted) == 3 and len(refused) == 17
    assert all(0 < wait <= 1000 for wait in refused)
    # Debt charged on one process is waited out on the other.
    await buckets[0].charge("guest-2", 5)
    with pytest.raises(TooManyRequests) as debt:
        await buckets[1].take("guest-2")
    assert 2000 < debt.value.retry_after <= 3000


async def test_the_tables_stay_bounded(services: Services) -> None:
    """Full buckets, forgotten failures and expired reservations go; past ``max_keys`` the stalest go; the
    janitor's reconcile round runs the prune."""
    now = [1000.0]
    bucket = RateLimit("test", 2, 0.001, db=services.db, clock=lambda: now[0])
    for key in range(5):
        await bucket.take(key)
    throttle = create_app(services).extensions["picpeak_limits"].password_throttle
    throttle.attempts.clock = lambda: now[0]
    for client in ("a", "b", "c"):
        async with throttle.guard("gallery:1", client, None) as attempt:
            attempt.failed()
        now[0] += 1
    rows = await services.db.read(limits_q.count_rows)
    assert rows == {"rate_buckets": 5, "password_attempts": 6}  # per IP, and the target's total of each
    removed = await services.db.write(limits_q.prune, now[0], 2)
    assert removed == {"buckets": 3, "attempts": 2}  # over the cap: the keys beyond two
    assert await services.db.read(limits_q.count_rows) == {"rate_buckets": 2, "password_attempts": 4}
    # The janitor's round, on the services' own (real) clock: long past all of it.
    await Janitor(services).reconcile()
    assert await services.db.read(limits_q.count_rows) == {"rate_buckets": 0, "password_attempts": 0}


async def test_the_cost_of_a_check(services: Services, capsys: pytest.CaptureFixture[str]) -> None:
    """What a guest's heart tap pays for its rate limit (one write transaction, one upsert), and what a password
    attempt pays for its reservation and its outcome; printed, never asserted."""
    limit = RateLimit("guest", 60, 2, db=services.db, clock=wall_clock(services.clock, services.monotonic))
    taps = []
    for i in range(300):
        started = time.perf_counter()
        await limit.take(i % 50)
        taps.append(time.perf_counter() - started)
    throttle = create_app(services).extensions["picpeak_limits"].password_throttle
    attempts = []
    for i in range(100):
        started = time.perf_counter()
        async with throttle.guard(f"gallery:{i}", "10.0.0.1", None) as attempt:
            attempt.failed()
        attempts.append(time.perf_counter() - started)

    def ms(values: list[float], q: int) -> str:
        return f"{statistics.quantiles(values, n=100)[q - 1] * 1000:.2f}"

    figures(capsys, f"limits: check_ms_p50={ms(taps, 50)} p95={ms(taps, 95)} "
                    f"password_attempt_ms_p50={ms(attempts, 50)} p95={ms(attempts, 95)}")
    assert len(taps) == 300 and len(attempts) == 100


async def test_a_clock_behind_another_processs_refills_nothing_and_takes_nothing_back(services: Services,
                                                                                    second: Services) -> None:
    """Hosts' clocks differ a little: a bucket last written by a process ten seconds ahead is neither refilled
    nor drained by one behind it (negative elapsed time counts as none)."""
    ahead, behind = [1010.0], [1000.0]
    fast = RateLimit("test", 3, 1.0, db=services.db, clock=lambda: ahead[0])
    slow = RateLimit("test", 3, 1.0, db=second.db, clock=lambda: behind[0])
    await fast.take("k")
    await slow.take("k")
    await slow.take("k")
    with pytest.raises(TooManyRequests) as refused:
        await slow.take("k")
    assert refused.value.retry_after == 1  # one second after the later clock's last take, not eleven
    ahead[0] += 1
    await fast.take("k")
