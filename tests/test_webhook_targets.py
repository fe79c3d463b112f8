"""Webhook targets (issue 7, suite 8): what tests/test_webhooks.py does not already show.

That file checks the URL list against ``resolve_target`` and, for the loopback spellings, that the sender
makes no connection. Here: every spelling of the list *and* names resolving to each private range go through
the sender with 0 connections and one lookup each; and two end-to-end paths (a config webhook fired by the
worker pool when a photo completes, and a webhook added on the settings page and tested with its button)
leave a ``refused`` delivery row and make no connection. The only listener is a receiver on 127.0.0.1, which
stays untouched unless private targets are allowed; made-up names are answered by a fake resolver.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import trio
from markupsafe import escape

from picpeak_lite.config import load_settings
from picpeak_lite.errors import ConfigError
from picpeak_lite.events.webhooks import WebhookSender, attempt_delivery
from picpeak_lite.ops import bootstrap
from picpeak_lite.services import Services
from picpeak_lite.store import db, schema
from picpeak_lite.store.db import Database
from picpeak_lite.store.queries import webhooks as webhook_q
from picpeak_lite.web.app import create_app

from .conftest import ADMIN_PASSWORD, AuthActions, make_settings
from .factories import create_gallery, photo_jpeg, run_pool_until_idle, stage_photo
from .harness import figures
from .test_webhooks import SECRET, FakeResolver, Receiver, enqueue, settings_for

# Names the fake resolver answers with a private address: "names resolving to them".
PRIVATE_NAMES = {
    "loopback.test": ["127.0.0.1"],
    "loopback6.test": ["::1"],
    "metadata.test": ["169.254.169.254"],
    "cgnat.test": ["100.64.0.1"],
    "ten.test": ["10.20.30.40"],
    "home.test": ["192.168.0.10"],
    "mapped.test": ["::ffff:127.0.0.1"],
    "rebind.test": ["93.184.216.34", "127.0.0.1"],  # one public answer does not excuse a private one
}
SPELLINGS = ["127.0.0.1", "[::1]", "[::ffff:127.0.0.1]", "2130706433", "127.1", "0177.0.0.1", "localhost",
             "169.254.169.254", "100.64.0.1", "10.0.0.1", "10.255.1.2", "192.168.1.1", "192.168.200.7"]


@pytest.fixture
async def receiver(nursery: trio.Nursery) -> Receiver:
    receiver = Receiver()
    await nursery.start(receiver.run)
    return receiver


@pytest.fixture
def database(tmp_path: Path) -> Iterator[Database]:
    path = tmp_path / "picpeak.sqlite3"
    conn = db.connect(path)
    schema.migrate(conn)
    conn.close()
    database = Database(path, readers=2)
    yield database
    database.close()


async def test_every_refused_target_makes_no_connection(database: Any, receiver: Receiver,
                                                        capsys: pytest.CaptureFixture[str]) -> None:
    # Numeric spellings never reach a resolver (trio parses them itself); "localhost" gets the system's answer.
    resolver = FakeResolver({**PRIVATE_NAMES, "localhost": ["127.0.0.1", "::1"]})
    trio.socket.set_custom_hostname_resolver(resolver)
    port = receiver.port
    urls = [f"http://{host}:{port}/hook" for host in SPELLINGS] + [f"http://{n}:{port}/hook" for n in PRIVATE_NAMES]
    settings = settings_for(*urls, allow_private=False)
    sender = WebhookSender(database, settings, concurrency=len(urls))
    await enqueue(database, settings, now=1000.0)
    assert await sender.deliver_due() == len(urls)
    rows = await database.read(webhook_q.list_deliveries)
    refused = [r for r in rows if r["last_error"].startswith("refused:")]
    name_lookups = [n for n in resolver.lookups if n in PRIVATE_NAMES]
    figures(capsys, f"webhook_targets: urls={len(urls)} refused={len(refused)} connections={receiver.connections} "
                    f"name_lookups={len(name_lookups)} names={len(PRIVATE_NAMES)}")
    assert receiver.connections == 0
    assert sorted(r["endpoint_url"] for r in refused) == sorted(urls)
    assert all(r["status"] == "pending" and r["attempts"] == 1 for r in rows)
    # Refused for what the address is, not for failing to resolve.
    assert all("not a public address" in r["last_error"] for r in rows), [r["last_error"] for r in rows]
    assert sorted(name_lookups) == sorted(PRIVATE_NAMES), "each name is looked up once, and only once"


async def test_the_same_targets_are_delivered_when_private_targets_are_allowed(database: Any,
                                                                               receiver: Receiver) -> None:
    """The control: the refusals above are the check's doing, not an unreachable receiver."""
    resolver = FakeResolver({"loopback.test": ["127.0.0.1"]})
    trio.socket.set_custom_hostname_resolver(resolver)
    urls = [f"http://{host}:{receiver.port}/hook" for host in ("127.0.0.1", "127.1", "2130706433", "loopback.test")]
    settings = settings_for(*urls, allow_private=True)
    await enqueue(database, settings, now=1000.0)
    assert await WebhookSender(database, settings, concurrency=len(urls)).deliver_due() == len(urls)
    rows = await database.read(webhook_q.list_deliveries)
    assert [r["status"] for r in rows] == ["delivered"] * len(urls)
    assert receiver.connections == len(urls)


async def test_pipeline_webhook_at_a_refused_target_leaves_a_refused_row(tmp_path: Path,
                                                                          receiver: Receiver) -> None:
    """A photo completes, the outbox gets its photo.uploaded event, the sender refuses the loopback target.

    A numeric loopback target is refused when the config is loaded (see below), so this one is a name that
    resolves to 127.0.0.1 by the time of delivery, as a name whose DNS answer changed would."""
    trio.socket.set_custom_hostname_resolver(FakeResolver({"loopback.test": ["127.0.0.1"]}))
    url = f"http://loopback.test:{receiver.port}/hook"
    settings = make_settings(tmp_path, webhooks=[{"url": url, "secret": SECRET}])
    bootstrap.prepare(settings)
    database = Database(settings.database)
    svc = Services(settings=settings, db=database)
    try:
        gallery_id = await database.write(create_gallery)
        photo_id, _ = stage_photo(svc, gallery_id, photo_jpeg(3))
        await run_pool_until_idle(svc)
        sender = WebhookSender(database, settings)
        assert await sender.deliver_due() >= 1
        rows = await database.read(webhook_q.list_deliveries)
    finally:
        database.close()
    uploaded = [r for r in rows if r["event_type"] == "photo.uploaded"]
    assert [json.loads(r["body"])["data"]["photo_id"] for r in uploaded] == [photo_id]
    for row in rows:
        assert row["last_error"].startswith("refused:") and "127.0.0.1" in row["last_error"]
        assert (row["status"], row["attempts"], row["last_status_code"]) == ("pending", 1, None)
    assert receiver.connections == 0


async def test_settings_page_webhook_at_a_refused_target_is_refused_when_tested(
        services: Services, client: Any, admin: AuthActions, receiver: Receiver) -> None:
    """The form refuses the target now (see test_a_refused_target_is_not_saved_from_the_settings_page); one
    saved before, or whose name has since come to resolve privately, is still refused by the sender."""
    url = f"http://127.1:{receiver.port}/hook"
    await services.db.write(lambda conn: conn.execute(
        "INSERT INTO webhook_endpoints (url, secret, events, created_at) VALUES (?, ?, '[\"photo.uploaded\"]', 0)",
        (url, SECRET)))
    endpoint_id = await services.db.read(
        lambda conn: conn.execute("SELECT id FROM webhook_endpoints WHERE url = ?", (url,)).fetchall()[0]["id"])
    tested = await client.post(f"/admin/settings/webhooks/{endpoint_id}/test", form={"csrf_token": admin.csrf})
    assert tested.status_code == 302
    assert await WebhookSender(services.db, services.settings).deliver_due() == 1
    [row] = await services.db.read(webhook_q.list_deliveries)
    assert row["endpoint_url"] == url and row["last_error"].startswith("refused:")
    assert receiver.connections == 0


# --- refused when saved (issue 11) -------------------------------------------------------------------------

async def sender_reason(url: str, allow_private: bool = False) -> str:
    """What the sender records for ``url``, minus its ``refused: `` prefix."""
    result = await attempt_delivery(url, SECRET, "id", "photo.uploaded", "{}", allow_private=allow_private,
                                    timestamp=0)
    assert result.error is not None and result.error.startswith("refused: "), result
    return result.error.removeprefix("refused: ")


async def test_a_refused_target_is_not_saved_from_the_settings_page(services: Services, client: Any,
                                                                    admin: AuthActions, receiver: Receiver,
                                                                    capsys: pytest.CaptureFixture[str]) -> None:
    trio.socket.set_custom_hostname_resolver(FakeResolver({**PRIVATE_NAMES, "public.test": ["93.184.216.34"]}))
    port = receiver.port
    urls = ([f"http://{host}:{port}/hook" for host in SPELLINGS] + [f"http://{n}:{port}/hook" for n in PRIVATE_NAMES]
            + [f"http://unknown.test:{port}/hook", "http://user:pw@public.test/", "ftp://public.test/"])
    for url in urls:
        answer = await client.post("/admin/settings/webhooks", form={"csrf_token": admin.csrf, "url": url,
                                                                      "events": "photo.uploaded"})
        html = await answer.get_data(as_text=True)
        assert answer.status_code == 400, url
        reason = await sender_reason(url)
        # The field error is the sender's sentence (HTML-escaped on the page).
        assert 'id="url-error"' in html and escape(f"Not a usable webhook URL: {reason}.") in html, (url, reason)
    saved = await services.db.read(lambda conn: conn.execute("SELECT count(*) AS n FROM webhook_endpoints")
                                   .fetchall()[0]["n"])
    figures(capsys, f"webhook_targets_saved: refused_forms={len(urls)} saved={saved} "
                    f"connections={receiver.connections}")
    assert saved == 0 and receiver.connections == 0
    ok = await client.post("/admin/settings/webhooks", form={"csrf_token": admin.csrf,
                                                              "url": "https://public.test/hook",
                                                              "events": "photo.uploaded"})
    assert ok.status_code == 201


async def test_webhook_allow_private_lets_the_settings_page_save_them(tmp_path: Path, receiver: Receiver) -> None:
    trio.socket.set_custom_hostname_resolver(FakeResolver({"loopback.test": ["127.0.0.1"],
                                                           "localhost": ["127.0.0.1", "::1"]}))
    settings = make_settings(tmp_path, webhook_allow_private=True)
    bootstrap.prepare(settings)
    bootstrap.ensure_admin(settings, {"PICPEAK_ADMIN_PASSWORD": ADMIN_PASSWORD})
    database = Database(settings.database)
    try:
        admin = AuthActions(create_app(Services(settings=settings, db=database)).test_client())
        assert (await admin.login()).status_code == 302
        for url in (f"http://127.0.0.1:{receiver.port}/hook", f"http://loopback.test:{receiver.port}/hook",
                    f"http://localhost:{receiver.port}/hook"):
            answer = await admin.client.post("/admin/settings/webhooks", form={
                "csrf_token": admin.csrf, "url": url, "events": "photo.uploaded"})
            assert answer.status_code == 201, (url, await answer.get_data(as_text=True))
    finally:
        database.close()


@pytest.mark.parametrize("host", ["127.0.0.1", "[::1]", "[::ffff:127.0.0.1]", "2130706433", "127.1", "0177.0.0.1",
                                  "localhost", "app.localhost", "169.254.169.254", "100.64.0.1", "10.0.0.1",
                                  "192.168.1.1", "[fe80::1]", "0.0.0.0"])
async def test_a_config_webhook_at_a_refused_address_is_refused_at_load(tmp_path: Path, host: str) -> None:
    url = f"http://{host}:9/hook"
    config = tmp_path / "picpeak.toml"
    config.write_text(f'[[webhooks]]\nurl = "{url}"\nsecret = "{SECRET}"\n')
    with pytest.raises(ConfigError) as refused:
        load_settings(config, environ={})
    assert str(refused.value) == f"webhook {url!r} is refused: {await sender_reason(url)}"
    # webhook_allow_private lets it through; a name is left to the sender (DNS is not asked at load).
    assert load_settings(config, environ={"PICPEAK_WEBHOOK_ALLOW_PRIVATE": "true"}).webhooks[0].url == url
    config.write_text(f'[[webhooks]]\nurl = "http://loopback.test:9/hook"\nsecret = "{SECRET}"\n')
    assert load_settings(config, environ={}).webhooks[0].url == "http://loopback.test:9/hook"
