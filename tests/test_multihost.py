"""Multi-host suite (issue 31): three hosts, each ``picpeak-lite serve`` in its own network namespace with its own
data directory, sharing only a PostgreSQL database and an S3 bucket (``tests/multihost.py``).

* Spread: an admin client uploads with multipart requests round-robin over the three hosts; a guest who entered
  the gallery's password on one host watches the live feed on every host. Every acknowledged photo is complete
  exactly once, its original in the bucket is the bytes that were sent, and every host's feed shows every photo,
  whichever host received it and whichever host's worker made it.
* Kill: one host is killed (SIGKILL) while it holds claims; once their lease runs out the other hosts take them
  over. No acknowledged photo is lost, none is completed twice, and no webhook event is delivered under two ids.
* tus: one resumable upload's PATCHes go to each host in turn (its pieces in the bucket); the photo is made.
* Wake: with every worker idle, a request to one host is claimed in part by the other hosts' workers at once
  (NOTIFY), not at their safety poll.
* Faults, each while photos are uploaded and processed, each leaving the service whole for the next test:
  PostgreSQL stopped and started again (every host told 503 + Retry-After meanwhile and going on by itself, the
  same processes); the bucket (s3rver) stopped for 20 s (uploads told 503 and sent again, workers hand photos
  back without spending attempts); one host's network cut for 30 s (more than two leases; its claims taken over,
  its late writes fenced by the claim token, the same process working again after); a rolling restart of the
  three hosts (SIGTERM, wait, start) during a 200-photo upload (refused requests sent to the next host).

Each prints its figures line (never a time asserted). Needs root (namespaces); skipped with the reason otherwise.
"""

from __future__ import annotations

import collections
import dataclasses
import hashlib
import itertools
import json
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import trio
from trio_websocket import open_websocket_url

from . import imagefactory, multihost
from .harness import ADMIN_PASSWORD, WebhookReceiver, figures, guest_client, multipart, percentile, unique_jpeg

pytestmark = [pytest.mark.system, pytest.mark.postgresql]

HOSTS = 3
LEASE_SECONDS = 5  # the least config.py allows: a dead host's claims come back within seconds
PASSWORD = "open sesame 31"
PER_REQUEST = 3
HANG_GUARD = 300  # a hung-test stop only: on a loaded 2-core box the suite is slow, not wrong


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[multihost.Cluster]:
    reason = multihost.refused()
    if reason:
        pytest.skip(reason)
    root = tmp_path_factory.mktemp("multihost")
    with multihost.Cluster(root, hosts=HOSTS, receiver=WebhookReceiver(),
                           settings={"workers": 1, "lease_seconds": LEASE_SECONDS}) as made:
        yield made


def camera_photos(count: int, tag: str) -> list[tuple[str, bytes]]:
    """Camera-like JPEGs of about 1.5 MP (three scenes, each file distinct by a comment segment)."""
    bases = [imagefactory.save(imagefactory.photo(1500, 1000, seed=seed), "jpeg", quality=88) for seed in range(3)]
    return [(f"{tag}-{i:03d}.jpg", unique_jpeg(bases[i % 3], f"{tag}-{i}")) for i in range(count)]


async def new_gallery(cluster: multihost.Cluster, name: str) -> dict[str, Any]:
    async with httpx.AsyncClient(base_url=cluster.urls[0], timeout=120,
                                 headers={"Authorization": f"Bearer {cluster.token}"}) as api:
        created = await api.post("/api/admin/galleries", json={"name": name, "password": PASSWORD})
        assert created.status_code == 201, created.text
        gallery: dict[str, Any] = created.json()
    async with httpx.AsyncClient(base_url=cluster.urls[1], timeout=120,
                                 headers={"Authorization": f"Bearer {cluster.token}"}) as api:
        published = await api.post(f"/api/admin/galleries/{gallery['id']}/publish")  # another host: one service
        assert published.status_code == 200, published.text
    return gallery


async def upload_round_robin(cluster: multihost.Cluster, gallery_id: int, photos: list[tuple[str, bytes]],
                             urls: list[str] | None = None) -> dict[int, tuple[int, str]]:
    """Multipart requests of ``PER_REQUEST`` photos, request i to host i mod N (or to ``urls`` in turn), three at a
    time. Returns each acknowledged photo's id -> (the index of the URL that took it, the sha256 of what was
    sent)."""
    acked: dict[int, tuple[int, str]] = {}
    urls = urls or cluster.urls
    limiter = trio.CapacityLimiter(HOSTS)
    clients = [httpx.AsyncClient(base_url=url, timeout=120, headers={"Authorization": f"Bearer {cluster.token}"})
               for url in urls]

    async def send(index: int, files: list[tuple[str, bytes]]) -> None:
        host = index % len(urls)
        sent = {name: hashlib.sha256(data).hexdigest() for name, data in files}
        body, headers = multipart(files)
        async with limiter:
            response = await clients[host].post(f"/api/admin/galleries/{gallery_id}/upload", content=body,
                                                headers=headers)
        assert response.status_code == 202, response.text
        for photo in response.json()["photos"]:
            acked[photo["id"]] = (host, sent[photo["filename"]])

    try:
        async with trio.open_nursery() as nursery:
            for index, start in enumerate(range(0, len(photos), PER_REQUEST)):
                nursery.start_soon(send, index, photos[start:start + PER_REQUEST])
    finally:
        for client in clients:
            await client.aclose()
    return acked


def completions(cluster: multihost.Cluster, ids: list[int]) -> collections.Counter[int]:
    """How many times each photo became ``complete``, from the change log (one row per change of state)."""
    rows = cluster.query("SELECT photo_id FROM photo_changes WHERE status = 'complete' AND photo_id = ANY(?)", ids)
    return collections.Counter(row["photo_id"] for row in rows)


def claims_per_host(cluster: multihost.Cluster, ids: list[int]) -> list[int]:
    rows = cluster.query("SELECT claimed_by, count(*) AS n FROM photos WHERE id = ANY(?) GROUP BY claimed_by", ids)
    counts = {row["claimed_by"]: row["n"] for row in rows}
    return [counts.get(name, 0) for name in cluster.claimants]


async def test_uploads_on_every_host_complete_once_and_every_hosts_feed_sees_them(
        cluster: multihost.Cluster, capsys: pytest.CaptureFixture[str]) -> None:
    gallery = await new_gallery(cluster, "Spread")
    slug = gallery["slug"]
    # The guest enters the password on host 1; the session is the service's (a row in the database), so the
    # feeds on every host accept its cookie.
    guest, _csrf = await guest_client(cluster.urls[1], slug, PASSWORD)
    cookie = guest.cookies.get("pp_guest")
    await guest.aclose()
    assert cookie
    photos = camera_photos(36, "spread")
    seen: list[dict[int, float]] = [{} for _ in range(HOSTS)]  # per feed: photo id -> when its complete arrived
    ready = [trio.Event() for _ in range(HOSTS)]
    acked: dict[int, tuple[int, str]] = {}
    all_acked = trio.Event()

    async def follow(index: int) -> None:
        url = cluster.urls[index].replace("http://", "ws://") + f"/ws/g/{slug}"
        async with open_websocket_url(url, extra_headers=[("Cookie", f"pp_guest={cookie}")]) as feed:
            assert json.loads(await feed.get_message())["type"] == "snapshot"
            ready[index].set()
            while not (all_acked.is_set() and set(acked) <= set(seen[index])):
                with trio.move_on_after(1):
                    frame = json.loads(await feed.get_message())
                    if frame["type"] == "photo" and frame["status"] == "complete":
                        assert frame["id"] not in seen[index], f"photo {frame['id']} arrived twice on host {index}"
                        seen[index][frame["id"]] = time.time()

    with trio.fail_after(HANG_GUARD):
        async with trio.open_nursery() as nursery:
            for index in range(HOSTS):
                nursery.start_soon(follow, index)
            for event in ready:
                await event.wait()
            acked.update(await upload_round_robin(cluster, gallery["id"], photos))
            all_acked.set()

    ids = sorted(acked)
    rows = {row["id"]: row for row in cluster.query(
        "SELECT id, status, claimed_by, storage_key FROM photos WHERE id = ANY(?)", ids)}
    lost = [i for i in ids if i not in rows or rows[i]["status"] != "complete"]
    counted = completions(cluster, ids)
    duplicates = [i for i in ids if counted[i] > 1]
    claims = claims_per_host(cluster, ids)
    made_at = {row["photo_id"]: row["created_at"] for row in cluster.query(
        "SELECT photo_id, max(created_at) AS created_at FROM photo_changes WHERE status = 'complete' "
        "AND photo_id = ANY(?) GROUP BY photo_id", ids)}
    by = {i: cluster.claimants.index(rows[i]["claimed_by"]) for i in ids if rows[i]["claimed_by"] in cluster.claimants}
    # Cross-host pushes: a feed's frame for a photo another host's worker made (it came through PostgreSQL).
    push_ms = [(seen[feed][i] - made_at[i]) * 1000 for feed in range(HOSTS) for i in ids if by.get(i) != feed]
    triples = sum(1 for feed in range(HOSTS) for i in ids if len({feed, acked[i][0], by.get(i)}) == 3)
    # From a photo's row (on the host that took it) to its claim by another host's worker: NOTIFY's wake-up plus
    # the wait for a free worker there.
    changes = cluster.query("SELECT photo_id, status, min(created_at) AS at FROM photo_changes "
                            "WHERE photo_id = ANY(?) AND status IN ('pending', 'processing') GROUP BY 1, 2", ids)
    first = {(row["photo_id"], row["status"]): row["at"] for row in changes}
    claim_ms = [(first[i, "processing"] - first[i, "pending"]) * 1000 for i in ids
                if by.get(i) != acked[i][0] and (i, "pending") in first and (i, "processing") in first]
    figures(capsys, f"multihost: hosts={HOSTS} acked={len(ids)} lost={len(lost)} duplicates={len(duplicates)} "
                    f"push_p50={percentile(push_ms, 0.5):.0f}ms push_p95={percentile(push_ms, 0.95):.0f}ms "
                    f"cross_host_pushes={len(push_ms)} three_host_paths={triples} "
                    f"cross_host_claim_wait_p50={percentile(claim_ms, 0.5):.0f}ms "
                    f"cross_host_claim_wait_p95={percentile(claim_ms, 0.95):.0f}ms claims_per_host={claims}")
    assert len(ids) == len(photos)
    assert lost == [] and duplicates == []
    assert sum(claims) == len(ids), "every photo was claimed by one of the three hosts"
    for feed in range(HOSTS):
        assert set(seen[feed]) == set(ids), f"host {feed}'s feed missed photos made on other hosts"
    objects = cluster.s3.client()
    for i in ids:
        body = objects.get_object(Bucket=cluster.bucket, Key=f"originals/{rows[i]['storage_key'][:2]}/"
                                  f"{rows[i]['storage_key']}")["Body"].read()
        assert hashlib.sha256(body).hexdigest() == acked[i][1]
    for host in cluster.hosts:
        assert host.tracebacks() == [], host.log_tail()


BALANCERS = {"nginx": (multihost.nginx_binary, multihost.nginx_balancer),
             "caddy": (multihost.caddy_binary, multihost.caddy_balancer)}


@pytest.mark.parametrize("proxy", sorted(BALANCERS))
async def test_through_the_balancer_recipe_any_host_answers_any_request(
        cluster: multihost.Cluster, proxy: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """deploy/nginx-several-hosts.conf or deploy/Caddyfile.several-hosts in front of the three hosts (pointed at
    them, plain HTTP): without stickiness an admin's session, a guest's password form and CSRF token, uploads and
    the live feed's WebSocket work whichever host each request reaches."""
    binary, balancer = BALANCERS[proxy]
    if binary() is None:
        pytest.skip(f"no {proxy} binary (CI installs Debian's: .ci/apt-packages)")
    gallery = await new_gallery(cluster, f"Balanced by {proxy}")
    slug = gallery["slug"]
    before = ["".join(host.output) for host in cluster.hosts]
    with balancer(cluster, tmp_path) as url:
        async with httpx.AsyncClient(base_url=url, timeout=120) as browser:
            login = await browser.post("/admin/login", data={"username": "admin", "password": ADMIN_PASSWORD})
            assert login.status_code == 302, login.text
            for _ in range(3 * HOSTS):
                page = await browser.get("/admin/")
                assert page.status_code == 200, page.headers.get("location")  # not sent back to the login
        guest, _csrf = await guest_client(url, slug, PASSWORD)  # the form's page and its POST: any hosts
        cookie = guest.cookies.get("pp_guest")
        await guest.aclose()
        seen: set[int] = set()
        acked: dict[int, tuple[int, str]] = {}
        with trio.fail_after(HANG_GUARD):
            async with open_websocket_url(url.replace("http://", "ws://") + f"/ws/g/{slug}",
                                          extra_headers=[("Cookie", f"pp_guest={cookie}")]) as feed:
                assert json.loads(await feed.get_message())["type"] == "snapshot"
                acked = await upload_round_robin(cluster, gallery["id"], camera_photos(18, "balanced"), [url])
                while not set(acked) <= seen:
                    frame = json.loads(await feed.get_message())
                    if frame["type"] == "photo" and frame["status"] == "complete":
                        seen.add(frame["id"])
    ids = sorted(acked)
    counted = completions(cluster, ids)
    lost = [i for i in ids if counted[i] == 0]
    duplicates = [i for i in ids if counted[i] > 1]
    logs = ["".join(host.output) for host in cluster.hosts]
    pages = [log.count('"GET /admin/ HTTP/1.1" 200') - old.count('"GET /admin/ HTTP/1.1" 200')
             for log, old in zip(logs, before, strict=True)]
    uploads = [log.count(f'"POST /api/admin/galleries/{gallery["id"]}/upload HTTP/1.1" 202') for log in logs]
    figures(capsys, f"multihost-balancer: hosts={HOSTS} proxy={proxy} acked={len(ids)} lost={len(lost)} "
                    f"duplicates={len(duplicates)} admin_pages_per_host={pages} uploads_per_host={uploads} "
                    f"feed_saw={len(seen & set(ids))}")
    assert lost == [] and duplicates == []
    assert sum(pages) == 3 * HOSTS and sum(1 for n in pages if n) >= 2, pages  # one session, several hosts
    assert sum(uploads) == 18 // PER_REQUEST


async def test_a_tus_upload_takes_each_patch_on_another_host(
        cluster: multihost.Cluster, capsys: pytest.CaptureFixture[str]) -> None:
    """Resumable uploads without sticky sessions (``tus_bytes`` auto: its pieces in the bucket): the upload is
    created on one host, its PATCHes go to each host in turn, HEAD on any host tells the same offset, and the last
    PATCH's host makes the photo from the pieces the others stored; none is left in the bucket."""
    gallery = await new_gallery(cluster, "Resumable on every host")
    [(_name, data)] = camera_photos(1, "tus")
    data += bytes(2_500_000)  # still a JPEG: about 3 MB in six PATCHes
    auth = {"Authorization": f"Bearer {cluster.token}", "Tus-Resumable": "1.0.0"}
    step = len(data) // 6 + 1
    patch_hosts: list[int] = []
    async with httpx.AsyncClient(timeout=120, headers=auth) as http:
        created = await http.post(cluster.urls[0] + f"/api/admin/galleries/{gallery['id']}/tus",
                                  headers={"Upload-Length": str(len(data))})
        assert created.status_code == 201, created.text
        path = created.headers["location"]
        path = path[path.index("/api/"):]
        answer = None
        for number, offset in enumerate(range(0, len(data), step)):
            host = (number + 1) % HOSTS  # not the host that created it first
            answer = await http.patch(cluster.urls[host] + path, content=data[offset:offset + step], headers={
                "Content-Type": "application/offset+octet-stream", "Upload-Offset": str(offset)})
            assert answer.status_code == 204, answer.text
            patch_hosts.append(host)
            if offset + step < len(data):
                for url in cluster.urls:  # every host tells the offset the row holds
                    head = await http.head(url + path)
                    assert head.headers["upload-offset"] == str(offset + step), (url, head.status_code)
        assert answer is not None
        photo_id = int(answer.headers["picpeak-photo-id"])
    [row] = cluster.query("SELECT sha256 FROM photos WHERE id = ?", photo_id)
    left = cluster.s3.keys(cluster.bucket, "tus/")
    figures(capsys, f"multihost-tus: hosts={HOSTS} patches={len(patch_hosts)} patch_hosts={len(set(patch_hosts))} "
                    f"photos=1 sha256_matches={int(row['sha256'] == hashlib.sha256(data).hexdigest())} "
                    f"pieces_left={len(left)}")
    assert row["sha256"] == hashlib.sha256(data).hexdigest()
    assert set(patch_hosts) == set(range(HOSTS)) and left == []


async def test_a_killed_hosts_claims_are_taken_over_once(
        cluster: multihost.Cluster, capsys: pytest.CaptureFixture[str]) -> None:
    receiver = cluster.receiver
    assert receiver is not None
    victim = HOSTS - 1
    gallery = await new_gallery(cluster, "Kill")
    acked: dict[int, tuple[int, str]] = {}
    held: list[int] = []
    killed_at = 0.0
    with trio.fail_after(HANG_GUARD):
        for round_ in range(5):  # until the victim is killed holding a claim (on a fast box it may finish first)
            acked.update(await upload_round_robin(cluster, gallery["id"], camera_photos(30, f"kill{round_}")))
            while True:
                holding = cluster.query("SELECT id FROM photos WHERE status = 'processing' AND claimed_by = ?",
                                        cluster.claimants[victim])
                left = cluster.query("SELECT count(*) AS n FROM photos WHERE status IN ('pending', 'processing') "
                                     "AND id = ANY(?)", sorted(acked))[0]["n"]
                if holding or not left:
                    break
                await trio.sleep(0.01)
            if not holding:
                continue
            await trio.to_thread.run_sync(cluster.hosts[victim].kill)
            killed_at = time.monotonic()
            # What it held when it died (its last claim may have ended between the look and the kill).
            held = [row["id"] for row in cluster.query(
                "SELECT id FROM photos WHERE status = 'processing' AND claimed_by = ?", cluster.claimants[victim])]
            if held:
                break
            await trio.to_thread.run_sync(cluster.restart, victim)
        assert held, "the host to be killed never held a claim when it was killed"
        ids = sorted(acked)
        while cluster.query("SELECT count(*) AS n FROM photos WHERE status IN ('pending', 'processing') "
                            "AND id = ANY(?)", ids)[0]["n"]:
            await trio.sleep(0.1)
        settled_s = time.monotonic() - killed_at
        while cluster.query("SELECT count(*) AS n FROM webhook_deliveries WHERE status = 'pending'")[0]["n"]:
            await trio.sleep(0.1)

    rows = {row["id"]: row for row in cluster.query(
        "SELECT id, status, claimed_by, interruptions FROM photos WHERE id = ANY(?)", ids)}
    lost = [i for i in ids if i not in rows or rows[i]["status"] != "complete"]
    counted = completions(cluster, ids)
    duplicates = [i for i in ids if counted[i] > 1]
    claims = claims_per_host(cluster, ids)
    taken_over = sum(1 for i in held if rows[i]["claimed_by"] in cluster.claimants[:victim])
    figures(capsys, f"multihost-kill: hosts={HOSTS} acked={len(ids)} lost={len(lost)} duplicates={len(duplicates)} "
                    f"held_by_killed={len(held)} taken_over={taken_over} "
                    f"settled_after_kill={settled_s:.1f}s lease={LEASE_SECONDS}s "
                    f"webhook_events={receiver.events()} duplicate_webhook_ids={receiver.duplicate_ids()} "
                    f"claims_per_host={claims}")
    assert lost == [] and duplicates == []
    assert held, "the killed host held claims when it died"
    for i in held:  # made by a host still alive, after its interrupted claim came back
        assert rows[i]["claimed_by"] in cluster.claimants[:victim], rows[i]
        assert rows[i]["interruptions"] >= 1, rows[i]
    assert receiver.duplicate_ids() == 0
    assert receiver.bad_signatures == 0
    for host in cluster.hosts[:victim]:
        assert host.tracebacks() == [], host.log_tail()
    await trio.to_thread.run_sync(cluster.restart, victim)  # the service whole again, for any test after this


# --- faults: the database, the bucket and the network go away; hosts are restarted one at a time --------------


@dataclasses.dataclass
class Retries:
    """What an uploader that does not give up met on its way: connections refused (a host stopped) or not made
    (a host cut off), each sent on to the next host; 503 answers, sent again after their Retry-After (to the next
    host, as a balancer would); requests cut off before an answer (their outcome unknown: sent again, and never
    counted as acknowledged until a 202 says so)."""

    refused: int = 0
    unavailable: int = 0
    retry_after: set[str] = dataclasses.field(default_factory=set)
    cut_off: int = 0

    def line(self) -> str:
        return (f"refused_and_resent={self.refused} told_503={self.unavailable} "
                f"retry_after={','.join(sorted(self.retry_after)) or '-'} cut_off_and_resent={self.cut_off}")


async def upload_retrying(cluster: multihost.Cluster, gallery_id: int, photos: list[tuple[str, bytes]],
                          retries: Retries, *, hosts: list[int] | None = None, concurrency: int = HOSTS,
                          sent: Callable[[], None] | None = None) -> dict[int, tuple[int, str]]:
    """As :func:`upload_round_robin` (request i to host i mod N of ``hosts``), with a real uploader's ways: a
    refused connection is sent to the next host, a 503 again after its Retry-After, and every connection is new
    (no keep-alive: a balancer of the recipe keeps none to its hosts either). ``sent`` is called after each
    request's answer."""
    acked: dict[int, tuple[int, str]] = {}
    usable = hosts or list(range(cluster.count))
    limiter = trio.CapacityLimiter(concurrency)
    clients = {i: httpx.AsyncClient(base_url=cluster.urls[i], timeout=httpx.Timeout(120, connect=10),
                                    limits=httpx.Limits(max_keepalive_connections=0),
                                    headers={"Authorization": f"Bearer {cluster.token}"}) for i in usable}

    async def send(index: int, files: list[tuple[str, bytes]]) -> None:
        digests = {name: hashlib.sha256(data).hexdigest() for name, data in files}
        body, headers = multipart(files)
        async with limiter:
            for attempt in itertools.count():
                host = usable[(index + attempt) % len(usable)]
                try:
                    response = await clients[host].post(f"/api/admin/galleries/{gallery_id}/upload", content=body,
                                                        headers=headers)
                except (httpx.ConnectError, httpx.ConnectTimeout):
                    retries.refused += 1
                    continue
                except (httpx.ReadError, httpx.WriteError, httpx.RemoteProtocolError, httpx.ReadTimeout):
                    retries.cut_off += 1
                    continue
                if response.status_code == 503:
                    retries.unavailable += 1
                    retries.retry_after.add(response.headers.get("Retry-After", "none"))
                    await trio.sleep(int(response.headers["Retry-After"]))
                    continue
                assert response.status_code == 202, response.text
                for photo in response.json()["photos"]:
                    acked[photo["id"]] = (host, digests[photo["filename"]])
                break
        if sent is not None:
            sent()

    try:
        async with trio.open_nursery() as nursery:
            for index, start in enumerate(range(0, len(photos), PER_REQUEST)):
                nursery.start_soon(send, index, photos[start:start + PER_REQUEST])
    finally:
        for client in clients.values():
            await client.aclose()
    return acked


def unfinished(cluster: multihost.Cluster, ids: list[int]) -> int:
    return int(cluster.query("SELECT count(*) AS n FROM photos WHERE status IN ('pending', 'processing') "
                             "AND id = ANY(?)", ids)[0]["n"])


async def settled(cluster: multihost.Cluster, ids: list[int]) -> None:
    """Until none of ``ids`` is pending or processing."""
    while unfinished(cluster, ids):
        await trio.sleep(0.1)


def outcome(cluster: multihost.Cluster, ids: list[int]) -> tuple[dict[int, dict[str, Any]], list[int], list[int]]:
    """Each photo's row, the photos not complete (lost), and those completed more than once."""
    rows = {row["id"]: row for row in cluster.query(
        "SELECT id, status, claimed_by, attempts, interruptions FROM photos WHERE id = ANY(?)", ids)}
    counted = completions(cluster, ids)
    return (rows, [i for i in ids if i not in rows or rows[i]["status"] != "complete"],
            [i for i in ids if counted[i] > 1])


def log_count(cluster: multihost.Cluster, text: str) -> int:
    return sum("".join(host.output).count(text) for host in cluster.hosts)


async def test_an_upload_on_one_host_wakes_an_idle_worker_on_another(
        cluster: multihost.Cluster, capsys: pytest.CaptureFixture[str]) -> None:
    """With every host's workers idle, a request of six photos to one host: its own worker tasks (two: one
    worker and the one that has its next photo read) take two, the others are claimed by other hosts' workers,
    woken through PostgreSQL's NOTIFY, not by their safety poll (5 s). Printed: the wait from the photo's row and
    from the 202 to that claim (negative when the claim came before the answer)."""
    gallery = await new_gallery(cluster, "Wake")
    from_row: list[float] = []
    from_answer: list[float] = []
    ids: list[int] = []
    with trio.fail_after(HANG_GUARD):
        for round_ in range(6):  # each host in turn takes the request; more rounds only if no claim crossed
            if round_ >= HOSTS and from_row:
                break
            while cluster.query("SELECT count(*) AS n FROM photos WHERE status IN ('pending', 'processing')"
                                )[0]["n"]:
                await trio.sleep(0.1)
            await trio.sleep(1)  # every worker task back on its bell
            taker = round_ % HOSTS
            acked = await upload_round_robin(cluster, gallery["id"], camera_photos(6, f"wake{round_}"),
                                             [cluster.urls[taker]])
            answered = time.time()
            batch = sorted(acked)
            ids += batch
            await settled(cluster, batch)
            changes = cluster.query("SELECT photo_id, status, min(created_at) AS at FROM photo_changes "
                                    "WHERE photo_id = ANY(?) AND status IN ('pending', 'processing') GROUP BY 1, 2",
                                    batch)
            first = {(row["photo_id"], row["status"]): row["at"] for row in changes}
            for row in cluster.query("SELECT id, claimed_by FROM photos WHERE id = ANY(?)", batch):
                if row["claimed_by"] != cluster.claimants[taker] and (row["id"], "processing") in first:
                    from_row.append((first[row["id"], "processing"] - first[row["id"], "pending"]) * 1000)
                    from_answer.append((first[row["id"], "processing"] - answered) * 1000)
    _rows, lost, duplicates = outcome(cluster, ids)
    figures(capsys, f"multihost-wake: hosts={HOSTS} photos={len(ids)} claimed_by_another_host={len(from_row)} "
                    f"row_to_other_host_claim_p50={percentile(from_row, 0.5):.0f}ms "
                    f"p95={percentile(from_row, 0.95):.0f}ms "
                    f"answer_to_other_host_claim_p50={percentile(from_answer, 0.5):.0f}ms "
                    f"p95={percentile(from_answer, 0.95):.0f}ms safety_poll=5s lost={len(lost)} "
                    f"duplicates={len(duplicates)}")
    assert lost == [] and duplicates == []
    assert from_row, "no photo of a request to one host was claimed by another host's worker"


async def healthz_until_refused(cluster: multihost.Cluster) -> collections.Counter[str]:
    """Ask every host's /healthz until each has answered 503 with Retry-After once (its database is gone);
    returns the answers counted by status."""
    answers: collections.Counter[str] = collections.Counter()
    refused = [False] * cluster.count
    async with httpx.AsyncClient(timeout=60, limits=httpx.Limits(max_keepalive_connections=0)) as http:
        while not all(refused):
            for i, url in enumerate(cluster.urls):
                response = await http.get(f"{url}/healthz")
                answers[str(response.status_code)] += 1
                if response.status_code == 503 and response.headers.get("Retry-After"):
                    refused[i] = True
            await trio.sleep(0.2)
    return answers


async def until_every_host_claims(cluster: multihost.Cluster, gallery_id: int, tag: str, retries: Retries,
                                  acked: dict[int, tuple[int, str]], since: list[int]) -> list[int]:
    """More requests over every host (at most five rounds) until each host's worker has claimed one of the
    photos acknowledged since the fault (``since``, extended here); returns the claims per host."""
    claims = [0] * cluster.count
    for round_ in range(5):
        batch = await upload_retrying(cluster, gallery_id, camera_photos(3 * cluster.count, f"{tag}{round_}"),
                                      retries)
        acked.update(batch)
        since += sorted(batch)
        await settled(cluster, since)
        claims = claims_per_host(cluster, since)
        if all(claims):
            break
    return claims


async def test_postgresql_restarted_under_load_every_host_goes_on_by_itself(
        cluster: multihost.Cluster, capsys: pytest.CaptureFixture[str]) -> None:
    """PostgreSQL stopped (``pg_ctl stop -m fast``: every connection of every host ended) while photos are
    uploaded over the three hosts and processed, and started again on the same data and port once every host's
    /healthz and an upload were answered 503 with Retry-After. The uploader waits its Retry-After and sends again;
    no host is restarted (the same processes), each answers uploads and claims photos afterwards, and every photo
    answered 202 is complete exactly once."""
    gallery = await new_gallery(cluster, "Restart PostgreSQL")
    pids = [host.pid for host in cluster.hosts]
    retries = Retries()
    acked: dict[int, tuple[int, str]] = {}
    since: list[int] = []
    health: collections.Counter[str] = collections.Counter()
    down_s = 0.0
    with trio.fail_after(HANG_GUARD):
        acked.update(await upload_retrying(cluster, gallery["id"], camera_photos(12, "pg-before"), retries))
        while not cluster.query("SELECT count(*) AS n FROM photos WHERE status = 'processing'")[0]["n"] \
                and unfinished(cluster, sorted(acked)):
            await trio.sleep(0.01)
        processing = cluster.query("SELECT count(*) AS n FROM photos WHERE status = 'processing'")[0]["n"]
        await trio.to_thread.run_sync(cluster.postgres.stop_server)
        stopped_at = time.monotonic()

        async def upload_meanwhile() -> None:
            batch = await upload_retrying(cluster, gallery["id"], camera_photos(12, "pg-during"), retries)
            acked.update(batch)
            since.extend(sorted(batch))

        async with trio.open_nursery() as nursery:
            nursery.start_soon(upload_meanwhile)
            health.update(await healthz_until_refused(cluster))
            while not retries.unavailable:
                await trio.sleep(0.1)
            await trio.to_thread.run_sync(cluster.postgres.start_again)
            down_s = time.monotonic() - stopped_at
        ids = sorted(acked)
        await settled(cluster, ids)
        settled_s = time.monotonic() - stopped_at
        claims = await until_every_host_claims(cluster, gallery["id"], "pg-after", retries, acked, since)
    ids = sorted(acked)
    _rows, lost, duplicates = outcome(cluster, ids)
    alive = [host.proc is not None and host.proc.poll() is None and host.pid == pid
             for host, pid in zip(cluster.hosts, pids, strict=True)]
    figures(capsys, f"multihost-postgresql-restart: hosts={HOSTS} acked={len(ids)} lost={len(lost)} "
                    f"duplicates={len(duplicates)} processing_at_stop={processing} down={down_s:.1f}s "
                    f"settled_after_stop={settled_s:.1f}s {retries.line()} "
                    f"healthz={dict(sorted(health.items()))} "
                    f"reconnects={log_count(cluster, 'a dropped connection was opened again')} "
                    f"hosts_restarted={alive.count(False)} claims_per_host_after={claims}")
    assert lost == [] and duplicates == []
    assert retries.unavailable >= 1 and retries.retry_after == {"5"}
    assert all(alive), "a host's process ended or was replaced"
    assert all(claims), f"a host's workers claimed nothing after the restart: {claims}"


BUCKET_DOWN_SECONDS = 20


async def test_the_bucket_down_for_a_while_loses_nothing_and_spends_no_attempt(
        cluster: multihost.Cluster, capsys: pytest.CaptureFixture[str]) -> None:
    """s3rver stopped for ``BUCKET_DOWN_SECONDS`` while photos are processed and more are uploaded, then started
    again on the same port and directory. Uploads meanwhile are answered 503 (StorageUnavailable) with
    Retry-After and sent again after it; workers hand their photos back without counting an attempt; once the
    bucket is back everything completes, each photo after exactly one counted attempt."""
    gallery = await new_gallery(cluster, "Bucket down")
    retries = Retries()
    acked: dict[int, tuple[int, str]] = {}
    handed_back_before = log_count(cluster, "the photo storage did not answer")
    with trio.fail_after(HANG_GUARD):
        acked.update(await upload_retrying(cluster, gallery["id"], camera_photos(12, "bucket-before"), retries))
        await trio.to_thread.run_sync(cluster.s3.stop)
        stopped_at = time.monotonic()

        async def upload_meanwhile() -> None:
            acked.update(await upload_retrying(cluster, gallery["id"], camera_photos(9, "bucket-during"), retries))

        async with trio.open_nursery() as nursery:
            nursery.start_soon(upload_meanwhile)
            while not retries.unavailable:
                await trio.sleep(0.1)
            await trio.sleep(max(0.0, BUCKET_DOWN_SECONDS - (time.monotonic() - stopped_at)))
            await trio.to_thread.run_sync(cluster.s3.start)
            back_at = time.monotonic()
        ids = sorted(acked)
        await settled(cluster, ids)
        settled_s = time.monotonic() - back_at
    rows, lost, duplicates = outcome(cluster, ids)
    spent = sorted(i for i in ids if rows[i]["attempts"] != 1)
    handed_back = log_count(cluster, "the photo storage did not answer") - handed_back_before
    figures(capsys, f"multihost-bucket-down: hosts={HOSTS} acked={len(ids)} lost={len(lost)} "
                    f"duplicates={len(duplicates)} down={back_at - stopped_at:.1f}s "
                    f"settled_after_back={settled_s:.1f}s {retries.line()} worker_hand_backs={handed_back} "
                    f"attempts_spent_by_the_outage={len(spent)}")
    assert lost == [] and duplicates == []
    assert retries.unavailable >= 1 and all(after.isdigit() and int(after) > 0 for after in retries.retry_after)
    assert spent == [], "a photo's attempt was counted for the bucket's absence"
    objects = cluster.s3.client()
    for i in ids:  # every acknowledged original is in the bucket, as sent
        key = cluster.query("SELECT storage_key FROM photos WHERE id = ?", i)[0]["storage_key"]
        body = objects.get_object(Bucket=cluster.bucket, Key=f"originals/{key[:2]}/{key}")["Body"].read()
        assert hashlib.sha256(body).hexdigest() == acked[i][1]


# What a worker logs when a write for its claim found the claim taken over (its token no longer holds it).
FENCED = ("result discarded", "before the result was saved", "the hand-back changed nothing")
CUT_SECONDS = 30  # the cut: longer than two leases (LEASE_SECONDS), so its claims are taken over


async def test_a_host_cut_off_is_taken_over_and_its_late_writes_are_fenced(
        cluster: multihost.Cluster, capsys: pytest.CaptureFixture[str]) -> None:
    """One host's link goes down inside its namespace while it holds claims (nothing reaches it, nothing leaves
    it, no connection is closed) for ``CUT_SECONDS``, then comes up again. The others take its claims over once
    their lease ran out and go on taking uploads; when it is back, whatever it still sends for those claims
    (a renewal, a result) names a token that no longer holds them and changes nothing. Then it goes on working,
    the same process: it takes uploads and claims photos again."""
    receiver = cluster.receiver
    assert receiver is not None
    victim = HOSTS - 1
    others = [i for i in range(HOSTS) if i != victim]
    pid = cluster.hosts[victim].pid
    gallery = await new_gallery(cluster, "Cut")
    retries = Retries()
    acked: dict[int, tuple[int, str]] = {}
    held: list[int] = []
    before = set(cluster.hosts[victim].output)
    with trio.fail_after(HANG_GUARD):
        for round_ in range(5):  # until it is cut off holding a claim (on a fast box it may finish first)
            acked.update(await upload_retrying(cluster, gallery["id"], camera_photos(18, f"cut{round_}"), retries))
            while not cluster.query("SELECT id FROM photos WHERE status = 'processing' AND claimed_by = ?",
                                    cluster.claimants[victim]) and unfinished(cluster, sorted(acked)):
                await trio.sleep(0.01)
            cluster.net.cut(victim)
            cut_at = time.monotonic()
            held = [row["id"] for row in cluster.query(
                "SELECT id FROM photos WHERE status = 'processing' AND claimed_by = ?", cluster.claimants[victim])]
            if held:
                break
            cluster.net.restore(victim)
        assert held, "the host to be cut off never held a claim when it was cut off"
        # The service goes on without it: uploads to the others, and its claims taken over.
        acked.update(await upload_retrying(cluster, gallery["id"], camera_photos(6, "cut-during"), retries,
                                           hosts=others))
        await settled(cluster, sorted(acked))
        taken_over_s = time.monotonic() - cut_at
        await trio.sleep(max(0.0, CUT_SECONDS - (time.monotonic() - cut_at)))
        cluster.net.restore(victim)
        restored_at = time.monotonic()
        # Back: the same process takes uploads and claims photos again (until it does: how long it took is a
        # figure; the hang guard is the only bound).
        after: list[int] = []
        claims_after = 0
        for round_ in itertools.count():
            batch = await upload_retrying(cluster, gallery["id"], camera_photos(6, f"cut-after{round_}"), retries,
                                          hosts=[victim])
            acked.update(batch)
            after += sorted(batch)
            await settled(cluster, after)
            claims_after = cluster.query("SELECT count(*) AS n FROM photos WHERE id = ANY(?) AND claimed_by = ?",
                                         after, cluster.claimants[victim])[0]["n"]
            if claims_after:
                break
        back_s = time.monotonic() - restored_at
        while cluster.query("SELECT count(*) AS n FROM webhook_deliveries WHERE status = 'pending'")[0]["n"]:
            await trio.sleep(0.1)
    ids = sorted(acked)
    rows, lost, duplicates = outcome(cluster, ids)
    taken_over = sum(1 for i in held if rows[i]["claimed_by"] != cluster.claimants[victim])
    said = "".join(line for line in cluster.hosts[victim].output if line not in before)  # this test's
    unanswered = said.count("the bucket did not answer") + said.count("the database did not answer")
    fenced = sum(said.count(text) for text in FENCED)
    figures(capsys, f"multihost-cut: hosts={HOSTS} cut={CUT_SECONDS}s "
                    f"lease={LEASE_SECONDS}s acked={len(ids)} lost={len(lost)} duplicates={len(duplicates)} "
                    f"held_when_cut={len(held)} taken_over={taken_over} settled_after_cut={taken_over_s:.1f}s "
                    f"late_writes_fenced={fenced} cut_host_unreachable_calls={unanswered} "
                    f"back_claimed_after_restore={claims_after} "
                    f"back_working_after={back_s:.1f}s duplicate_webhook_ids={receiver.duplicate_ids()} "
                    f"{retries.line()}")
    assert lost == [] and duplicates == []
    assert taken_over == len(held), "a claim of the cut-off host was not taken over"
    assert receiver.duplicate_ids() == 0 and receiver.bad_signatures == 0
    assert cluster.hosts[victim].pid == pid and cluster.hosts[victim].proc is not None
    assert cluster.hosts[victim].proc.poll() is None, cluster.hosts[victim].log_tail()


ROLLING_PHOTOS = 200


def small_photos(count: int, tag: str) -> list[tuple[str, bytes]]:
    """JPEGs of about 0.5 MP (three scenes, each file distinct), for the rolling restart's many photos."""
    bases = [imagefactory.save(imagefactory.photo(900, 600, seed=seed), "jpeg", quality=85) for seed in range(3)]
    return [(f"{tag}-{i:03d}.jpg", unique_jpeg(bases[i % 3], f"{tag}-{i}")) for i in range(count)]


async def test_a_rolling_restart_during_an_upload_loses_nothing(
        cluster: multihost.Cluster, capsys: pytest.CaptureFixture[str]) -> None:
    """A 200-photo upload spread over the hosts in four parts; during part i (i < 3) host i is stopped (SIGTERM,
    with that part's requests in flight, and waited for: it finishes what it took and hands its claims back), and
    started again once the part is sent. Requests to it meanwhile are refused and sent to the next host, as the
    recipe's uploader (or balancer) does. Every photo is acknowledged and complete exactly once."""
    gallery = await new_gallery(cluster, "Rolling restart")
    photos = small_photos(ROLLING_PHOTOS, "roll")
    parts = [photos[i * len(photos) // (HOSTS + 1):(i + 1) * len(photos) // (HOSTS + 1)] for i in range(HOSTS + 1)]
    retries = Retries()
    acked: dict[int, tuple[int, str]] = {}
    exits: list[int] = []
    answered = 0

    def one_more() -> None:
        nonlocal answered
        answered += 1

    started_at = time.monotonic()
    with trio.fail_after(HANG_GUARD):
        for part, batch in enumerate(parts):
            answered = 0

            async def send(batch: list[tuple[str, bytes]] = batch) -> None:
                acked.update(await upload_retrying(cluster, gallery["id"], batch, retries, sent=one_more))

            async with trio.open_nursery() as nursery:
                nursery.start_soon(send)
                if part < HOSTS:
                    while answered < 2:  # the part under way, its next requests in flight
                        await trio.sleep(0.01)
                    exits.append(await trio.to_thread.run_sync(cluster.hosts[part].stop, 120))
            if part < HOSTS:
                await trio.to_thread.run_sync(cluster.restart, part)
        uploaded_s = time.monotonic() - started_at
        ids = sorted(acked)
        await settled(cluster, ids)
        settled_s = time.monotonic() - started_at
    rows, lost, duplicates = outcome(cluster, ids)
    processes = collections.Counter(row["claimed_by"] for row in rows.values())
    figures(capsys, f"multihost-rolling-restart: hosts={HOSTS} photos={len(photos)} acked={len(ids)} "
                    f"lost={len(lost)} duplicates={len(duplicates)} restarts={len(exits)} exit_codes={exits} "
                    f"{retries.line()} uploaded_in={uploaded_s:.1f}s settled_in={settled_s:.1f}s "
                    f"claiming_processes={len(processes)} "
                    f"interrupted={sum(1 for row in rows.values() if row['interruptions'])}")
    assert len(ids) == len(photos)
    assert lost == [] and duplicates == []
    assert exits == [0] * HOSTS
