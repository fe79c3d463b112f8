"""Webhook outbox and delivery, against a real SQLite file and a real HTTP receiver on 127.0.0.1.

No test sends traffic anywhere else: refused URLs are refused before any connection, public names are only
ever answered by a fake resolver, and the one public literal is resolved (numerically) but never connected to.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import hmac
import json
import re
from collections.abc import AsyncIterator, Iterator
from typing import Any

import h11
import pytest
import trio

from picpeak_lite.config import WEBHOOK_EVENTS, Settings, WebhookEndpoint
from picpeak_lite.events.webhooks import ATTEMPT_TIMEOUT, WebhookSender, resolve_target, sign
from picpeak_lite.store import db, schema
from picpeak_lite.store.queries import webhooks as queries
from picpeak_lite.targets import TargetRefused, is_public_address

SECRET = "s3cret-s3cret-s3cret"
SUBJECT = "photo:1:0f3c"


class Receiver:
    """A tiny webhook receiver: records every request, checks its signature, answers from a plan.

    Each entry of ``plan`` answers one request: a status code, ``(status, headers)``, or ``"hang"`` (never
    answer). Once the plan is used up it answers 200.
    """

    def __init__(self, secret: str = SECRET) -> None:
        self.secret = secret
        self.plan: list[Any] = []
        self.requests: list[dict[str, Any]] = []
        self.connections = 0
        self.port = 0
        self._changed = trio.Event()

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        async with trio.open_nursery() as nursery:
            serve = functools.partial(trio.serve_tcp, host="127.0.0.1")
            listeners = await nursery.start(serve, self._handle, 0)
            self.port = listeners[0].socket.getsockname()[1]
            task_status.started()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/hook"

    async def wait_for_requests(self, n: int) -> None:
        while len(self.requests) < n:
            await self._changed.wait()

    async def _handle(self, stream: trio.SocketStream) -> None:
        self.connections += 1
        conn = h11.Connection(h11.SERVER)
        request: h11.Request | None = None
        body = b""
        try:
            while True:
                event = conn.next_event()
                if event is h11.NEED_DATA:
                    conn.receive_data(await stream.receive_some(65536))
                elif isinstance(event, h11.Request):
                    request = event
                elif isinstance(event, h11.Data):
                    body += event.data
                elif isinstance(event, h11.EndOfMessage):
                    break
                else:
                    return
        except (trio.BrokenResourceError, h11.RemoteProtocolError):
            return
        assert request is not None
        headers = {k.decode().lower(): v.decode() for k, v in request.headers}
        expected = hmac.new(
            self.secret.encode(),
            f"{headers['x-picpeak-id']}.{headers['x-picpeak-timestamp']}.{body.decode()}".encode(),
            hashlib.sha256,
        ).hexdigest()
        self.requests.append(
            {
                "method": request.method.decode(),
                "target": request.target.decode(),
                "headers": headers,
                "body": body.decode(),
                "time": trio.current_time(),
                "signature_ok": hmac.compare_digest(headers["x-picpeak-signature"], f"sha256={expected}"),
            }
        )
        self._changed.set()
        self._changed = trio.Event()
        answer = self.plan.pop(0) if self.plan else 200
        if answer == "hang":
            await trio.sleep_forever()
        status, extra = answer if isinstance(answer, tuple) else (answer, [])
        data = conn.send(h11.Response(status_code=status, headers=[("Content-Length", "2"), *extra]))
        data += conn.send(h11.Data(data=b"ok")) + conn.send(h11.EndOfMessage())
        with contextlib.suppress(trio.BrokenResourceError):
            await stream.send_all(data)
        await stream.aclose()


@pytest.fixture
def database(tmp_path: Any) -> Iterator[db.Database]:
    path = tmp_path / "picpeak.sqlite3"
    conn = db.connect(path)
    schema.migrate(conn)
    conn.close()
    database = db.Database(path, readers=2)
    yield database
    database.close()


@pytest.fixture
async def receiver(nursery: trio.Nursery) -> AsyncIterator[Receiver]:
    receiver = Receiver()
    await nursery.start(receiver.run)
    yield receiver


def settings_for(*urls: str, allow_private: bool = True, events: tuple[str, ...] | None = None) -> Settings:
    endpoints = tuple(WebhookEndpoint(url, SECRET, events or WEBHOOK_EVENTS) for url in urls)
    return Settings(webhooks=endpoints, webhook_allow_private=allow_private)


async def enqueue(database: db.Database, settings: Settings, now: float, subject: str = SUBJECT) -> None:
    data = {"photo_id": 1, "gallery": "g"}
    await database.write(queries.enqueue_event, settings.webhooks, "photo.uploaded", subject, data, now)


async def wait_for_status(database: db.Database, status: str) -> None:
    """The sender records outcomes in the database and signals nothing else, so the test looks."""
    while (await only_row(database))["status"] != status:
        await trio.sleep(0.01)


async def only_row(database: db.Database) -> dict[str, Any]:
    rows = await database.read(queries.list_deliveries)
    assert len(rows) == 1, rows
    return rows[0]


def test_sign_is_hmac_sha256_over_id_timestamp_body() -> None:
    expected = hmac.new(b"k" * 16, b"evt_1.1700000000.{}", hashlib.sha256).hexdigest()
    assert sign("k" * 16, "evt_1", 1700000000, "{}") == expected
    assert sign("k" * 16, "evt_1", "1700000000", "{}") == expected


async def test_delivered_at_once_on_wake_with_valid_signature_and_headers(
    database: db.Database, receiver: Receiver, nursery: trio.Nursery
) -> None:
    settings = settings_for(receiver.url)
    # A long poll: only a ring can explain a delivery within the deadline below.
    sender = WebhookSender(database, settings, poll_seconds=3600)
    await nursery.start(sender.run)
    await enqueue(database, settings, now=1_700_000_000.0)
    sender.bell.ring()
    sender.bell.ring()  # rings that pile up never block
    with trio.fail_after(120):  # far below the 3600 s poll, far above any load's delay
        await receiver.wait_for_requests(1)
        await wait_for_status(database, "delivered")

    [request] = receiver.requests
    row = await only_row(database)
    headers = request["headers"]
    assert request["method"] == "POST" and request["target"] == "/hook"
    assert request["signature_ok"]
    assert headers["x-picpeak-id"] == row["event_id"] == queries.event_id("photo.uploaded", SUBJECT)
    assert re.fullmatch(r"evt_[0-9a-f]{32}", row["event_id"])
    assert headers["x-picpeak-timestamp"].isdigit()
    assert headers["content-type"] == "application/json"
    assert headers["user-agent"].startswith("picpeak-lite")
    assert headers["host"] == f"127.0.0.1:{receiver.port}"
    assert request["body"] == row["body"]
    assert json.loads(request["body"]) == {
        "id": row["event_id"],
        "type": "photo.uploaded",
        "created_at": "2023-11-14T22:13:20Z",
        "data": {"photo_id": 1, "gallery": "g"},
    }
    assert (row["attempts"], row["last_status_code"], row["last_error"]) == (1, 200, None)
    assert row["delivered_at"] is not None


def test_enqueue_twice_gives_one_row_and_one_id(tmp_path: Any) -> None:
    conn = db.connect(tmp_path / "picpeak.sqlite3")
    schema.migrate(conn)
    endpoints = (
        WebhookEndpoint("http://a.invalid/", SECRET, ("photo.uploaded",)),
        WebhookEndpoint("http://b.invalid/", SECRET, ("photo.deleted",)),
    )
    with db.transaction(conn):
        queries.enqueue_event(conn, endpoints, "photo.uploaded", SUBJECT, {"v": 1}, 100.0)
    with db.transaction(conn):  # the photo is reprocessed: same event, new data, later
        queries.enqueue_event(conn, endpoints, "photo.uploaded", SUBJECT, {"v": 2}, 200.0)
    with db.transaction(conn):
        queries.enqueue_event(conn, endpoints, "photo.failed", SUBJECT, {"v": 3}, 300.0)  # nobody listens
    rows = queries.list_deliveries(conn)
    assert len(rows) == 1, rows
    [row] = rows
    assert row["endpoint_url"] == "http://a.invalid/"
    assert row["event_id"] == queries.event_id("photo.uploaded", SUBJECT)
    assert json.loads(row["body"])["data"] == {"v": 1}, "the first body stays"
    assert queries.event_id("photo.uploaded", SUBJECT) != queries.event_id("photo.deleted", SUBJECT)
    with pytest.raises(ValueError, match="unknown webhook event"):
        queries.enqueue_event(conn, endpoints, "photo.exploded", SUBJECT, {}, 0.0)
    conn.close()


async def test_500_then_200_retries_same_id_after_one_minute(
    database: db.Database, receiver: Receiver, nursery: trio.Nursery, autojump_clock: trio.testing.MockClock
) -> None:
    receiver.plan = [500]
    settings = settings_for(receiver.url)
    # A poll interval that does not divide 60: the retry must come from the schedule, not from polling.
    sender = WebhookSender(database, settings, clock=trio.current_time, poll_seconds=7)
    await nursery.start(sender.run)
    await enqueue(database, settings, now=trio.current_time())
    sender.bell.ring()
    await receiver.wait_for_requests(2)
    await wait_for_status(database, "delivered")

    first, second = receiver.requests
    assert 60 <= second["time"] - first["time"] < 61
    assert first["headers"]["x-picpeak-id"] == second["headers"]["x-picpeak-id"]
    assert first["body"] == second["body"]
    assert first["signature_ok"] and second["signature_ok"]
    row = await only_row(database)
    assert (row["attempts"], row["last_status_code"], row["last_error"]) == (2, 200, None)


async def test_five_failed_attempts_follow_the_schedule_then_fail(
    database: db.Database, receiver: Receiver, autojump_clock: trio.testing.MockClock
) -> None:
    assert queries.RETRY_DELAYS == (60, 300, 1800, 7200) and queries.MAX_ATTEMPTS == 5
    receiver.plan = [500] * 10
    settings = settings_for(receiver.url)
    sender = WebhookSender(database, settings, clock=trio.current_time)
    await enqueue(database, settings, now=trio.current_time())
    for attempt, delay in enumerate(queries.RETRY_DELAYS, start=1):
        attempted_at = trio.current_time()
        assert await sender.deliver_due() == 1
        row = await only_row(database)
        assert (row["status"], row["attempts"], row["last_status_code"]) == ("pending", attempt, 500)
        assert row["next_attempt_at"] - attempted_at == pytest.approx(delay, abs=0.01)
        assert "HTTP 500" in row["last_error"]
        await trio.sleep(delay - 1)
        assert await sender.deliver_due() == 0, "nothing is due before the retry time"
        await trio.sleep(1)
    assert await sender.deliver_due() == 1
    row = await only_row(database)
    assert (row["status"], row["attempts"], row["last_status_code"]) == ("failed", 5, 500)
    await trio.sleep(86_400)
    assert await sender.deliver_due() == 0, "a failed delivery is never attempted again"
    assert len(receiver.requests) == 5
    assert len({r["headers"]["x-picpeak-id"] for r in receiver.requests}) == 1


async def test_redirect_is_not_followed(database: db.Database, receiver: Receiver) -> None:
    receiver.plan = [(302, [("Location", f"http://127.0.0.1:{receiver.port}/elsewhere")])]
    settings = settings_for(receiver.url)
    sender = WebhookSender(database, settings)
    await enqueue(database, settings, now=1000.0)
    assert await sender.deliver_due() == 1
    assert [r["target"] for r in receiver.requests] == ["/hook"]
    row = await only_row(database)
    assert (row["status"], row["attempts"], row["last_status_code"]) == ("pending", 1, 302)
    assert "redirect" in row["last_error"] and "/elsewhere" in row["last_error"]


async def test_a_receiver_that_never_answers_times_out_after_10_s(
    database: db.Database, receiver: Receiver, autojump_clock: trio.testing.MockClock
) -> None:
    receiver.plan = ["hang"]
    settings = settings_for(receiver.url)
    sender = WebhookSender(database, settings, clock=trio.current_time)
    await enqueue(database, settings, now=trio.current_time())
    started = trio.current_time()
    assert await sender.deliver_due() == 1
    assert trio.current_time() - started == pytest.approx(ATTEMPT_TIMEOUT, abs=0.01)
    assert len(receiver.requests) == 1
    row = await only_row(database)
    assert (row["status"], row["attempts"], row["last_status_code"]) == ("pending", 1, None)
    assert "timed out after 10 s" in row["last_error"]


REFUSED = [
    "http://127.0.0.1/",
    "http://[::1]/",
    "http://[::ffff:127.0.0.1]/",
    "http://2130706433/",
    "http://127.1/",
    "http://0177.0.0.1/",
    "http://localhost/",
    "http://169.254.169.254/",
    "http://100.64.0.1/",
    "http://10.1.2.3/",
    "http://192.168.1.1/",
    "http://[2002:7f00:1::]/",
    "http://[fe80::1]/",
    "http://224.0.0.1/",
    "http://0.0.0.0/",
    "ftp://x/",
    "http://user:pw@example.com/",
    "http:///nohost",
]


@pytest.mark.parametrize("url", REFUSED)
async def test_resolve_target_refuses_non_public_targets(url: str) -> None:
    with pytest.raises(TargetRefused):
        await resolve_target(url, allow_private=False)


@pytest.mark.parametrize("url", ["ftp://x/", "http://user:pw@example.com/", "http://u@127.0.0.1/"])
async def test_scheme_and_userinfo_are_refused_even_when_private_is_allowed(url: str) -> None:
    with pytest.raises(TargetRefused):
        await resolve_target(url, allow_private=True)


async def test_private_targets_allowed_when_configured() -> None:
    target = await resolve_target("http://127.0.0.1:8081/hook?x=1", allow_private=True)
    assert (target.addresses, target.port, target.path, target.host_header) == (
        ("127.0.0.1",), 8081, "/hook?x=1", "127.0.0.1:8081"
    )


async def test_public_literal_is_accepted_without_connecting() -> None:
    target = await resolve_target("https://93.184.216.34/in", allow_private=False)
    assert (target.scheme, target.addresses, target.port, target.host_header) == (
        "https", ("93.184.216.34",), 443, "93.184.216.34"
    )


def test_is_public_address() -> None:
    for address in ["8.8.8.8", "2606:4700:4700::1111", "64:ff9b::808:808"]:
        assert is_public_address(address), address
    private = ["::ffff:8.8.8.8", "::7f00:1", "64:ff9b::a00:1", "fc00::1", "198.18.0.1", "255.255.255.255"]
    for address in private:
        assert not is_public_address(address), address


class FakeResolver(trio.abc.HostnameResolver):
    """Answers for made-up names so no DNS query leaves the machine; counts lookups."""

    def __init__(self, answers: dict[str, list[str]]) -> None:
        self.answers = answers
        self.lookups: list[str] = []

    async def getaddrinfo(self, host: Any, port: Any, family: int = 0, type: int = 0, proto: int = 0,
                          flags: int = 0) -> Any:
        name = host.decode() if isinstance(host, bytes) else host
        self.lookups.append(name)
        if name not in self.answers:
            raise trio.socket.gaierror(trio.socket.EAI_NONAME, "Name or service not known")
        results = []
        for address in self.answers[name]:
            if ":" in address:
                results.append((trio.socket.AF_INET6, trio.socket.SOCK_STREAM, 6, "", (address, port, 0, 0)))
            else:
                results.append((trio.socket.AF_INET, trio.socket.SOCK_STREAM, 6, "", (address, port)))
        return results

    async def getnameinfo(self, sockaddr: Any, flags: int) -> Any:
        raise NotImplementedError


async def test_every_resolved_address_must_be_public() -> None:
    resolver = FakeResolver({"mixed.test": ["93.184.216.34", "10.0.0.7"], "public.test": ["93.184.216.34"]})
    trio.socket.set_custom_hostname_resolver(resolver)
    with pytest.raises(TargetRefused, match=r"10\.0\.0\.7"):
        await resolve_target("http://mixed.test/", allow_private=False)
    target = await resolve_target("https://public.test/x", allow_private=False)
    assert (target.host, target.addresses) == ("public.test", ("93.184.216.34",))
    assert target.host_header == "public.test"


async def test_connection_goes_to_the_pinned_address_with_one_lookup(
    database: db.Database, receiver: Receiver
) -> None:
    resolver = FakeResolver({"receiver.test": ["127.0.0.1"]})
    trio.socket.set_custom_hostname_resolver(resolver)
    url = f"http://receiver.test:{receiver.port}/hook"
    settings = settings_for(url)
    sender = WebhookSender(database, settings)
    await enqueue(database, settings, now=1000.0)
    assert await sender.deliver_due() == 1
    assert resolver.lookups == ["receiver.test"]
    [request] = receiver.requests
    assert request["headers"]["host"] == f"receiver.test:{receiver.port}"
    assert (await only_row(database))["status"] == "delivered"


async def test_deliveries_to_refused_targets_make_no_connection(
    database: db.Database, receiver: Receiver
) -> None:
    port = receiver.port
    urls = [
        f"http://127.0.0.1:{port}/",
        f"http://[::1]:{port}/",
        f"http://[::ffff:127.0.0.1]:{port}/",
        f"http://2130706433:{port}/",
        f"http://127.1:{port}/",
        f"http://0177.0.0.1:{port}/",
        f"http://localhost:{port}/",
    ]
    settings = settings_for(*urls, allow_private=False)
    sender = WebhookSender(database, settings, concurrency=len(urls))
    await enqueue(database, settings, now=1000.0)
    assert await sender.deliver_due() == len(urls)
    assert receiver.connections == 0
    rows = await database.read(queries.list_deliveries)
    assert sorted(row["endpoint_url"] for row in rows) == sorted(urls)
    for row in rows:
        assert (row["status"], row["attempts"], row["last_status_code"]) == ("pending", 1, None)
        assert row["last_error"].startswith("refused:") and "not a public address" in row["last_error"]


async def test_endpoint_removed_from_config_fails_at_once(database: db.Database) -> None:
    old = settings_for("http://127.0.0.1:9/gone")
    await enqueue(database, old, now=1000.0)
    sender = WebhookSender(database, settings_for())
    assert await sender.deliver_due() == 1
    row = await only_row(database)
    assert (row["status"], row["attempts"]) == ("failed", 1)
    assert "no longer in the configuration" in row["last_error"]


def test_a_claim_lapses_so_a_crashed_attempt_is_retried_with_the_same_id(tmp_path: Any) -> None:
    conn = db.connect(tmp_path / "picpeak.sqlite3")
    schema.migrate(conn)
    with db.transaction(conn):
        endpoints = settings_for("http://a.invalid/").webhooks
        queries.enqueue_event(conn, endpoints, "photo.deleted", SUBJECT, {}, 0.0)
    with db.transaction(conn):
        [claimed] = queries.claim_due(conn, 1.0, 10, 60.0)
    with db.transaction(conn):
        assert queries.claim_due(conn, 30.0, 10, 60.0) == [], "claimed rows are not handed out twice"
    with db.transaction(conn):
        [again] = queries.claim_due(conn, 61.0, 10, 60.0)
    assert (again["id"], again["event_id"], again["attempts"]) == (claimed["id"], claimed["event_id"], 0)
    assert queries.delivery_counts(conn) == {"pending": 1, "delivered": 0, "failed": 0}
    conn.close()


async def test_https_speaks_tls_to_the_pinned_address(database: db.Database, receiver: Receiver) -> None:
    # The receiver speaks plain HTTP, so the handshake fails: proof that https is not sent in the clear.
    settings = settings_for(f"https://127.0.0.1:{receiver.port}/hook")
    sender = WebhookSender(database, settings)
    await enqueue(database, settings, now=1000.0)
    assert await sender.deliver_due() == 1
    assert (receiver.connections, receiver.requests) == (1, [])
    row = await only_row(database)
    assert (row["status"], row["attempts"], row["last_status_code"]) == ("pending", 1, None)
    assert row["last_error"].startswith("BrokenResourceError")


async def test_connection_refused_is_a_readable_failed_attempt(database: db.Database) -> None:
    # Port 1 on 127.0.0.1: nothing listens there, so the kernel refuses at once.
    settings = settings_for("http://127.0.0.1:1/hook")
    sender = WebhookSender(database, settings)
    await enqueue(database, settings, now=1000.0)
    assert await sender.deliver_due() == 1
    row = await only_row(database)
    assert (row["status"], row["attempts"], row["last_status_code"]) == ("pending", 1, None)
    assert "Connection refused" in row["last_error"]
