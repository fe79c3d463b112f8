"""Hostile: tus reservations (issue 27). Link holders announce big uploads and send nothing, and stuff
``Upload-Metadata``; the admin and another guest must still upload, never told the disk is full while it is not.

A real server process on a real disk. The attack, from one client address (127.0.0.1) and many free guest
sessions, at this machine's scale: each announced length is ``FILE_SHARE`` of the disk's free space (so that,
as in the issue, some thirty such reservations would make the disk "full" for everyone):

1. 3 sessions x 20 creations with ~46 KB of ``Upload-Metadata`` each (the issue's DB growth);
2. 4 sessions x 26 creations announcing that length, 0 bytes sent;
3. the server restarts (the reservations and their caps are in the database, and so, since the limits are kept
   for the whole service, are the guests' byte budgets: none is forgotten), and 4 fresh sessions x 26 creations
   again, each session halving the length from one creation to the next (to fill whatever room is left to the
   brim).

Then, while the reservations stand, the admin uploads a photo by tus to another gallery, and a guest at another
client address (127.0.0.2, bound as the client's source address) to the attacked gallery: both 201, then
PATCHes, then their photos complete. Asserted: every attack request is refused past the caps with a 4xx and a
sentence (metadata 400; budget or cap 429; the session's own cap 409), the attacker's unfinished announced
bytes stay within ``tus_unfinished_mb_per_client``, the database grows by less than ``DB_GROWTH_MAX_KB``, the
others never see a 507 (nor any 5xx), and the watch's checks (no traceback, /healthz answered, RSS bound).
"""

from __future__ import annotations

import base64
import contextlib
import re
import shutil
from collections import Counter
from collections.abc import AsyncIterator
from pathlib import Path

import httpx
import pytest
import trio

from .harness import ServerProcess, base_jpeg, create_token, query, unique_jpeg, write_config
from .hostile import Watch

pytestmark = pytest.mark.system

TUS = {"Tus-Resumable": "1.0.0"}
OCTETS = {**TUS, "Content-Type": "application/offset+octet-stream"}
CSRF_META = re.compile(r'<meta name="csrf-token" content="([^"]+)"')
MB = 2**20
FILE_SHARE = 1 / 30  # each announced upload: this share of the free disk (30 of them "fill" it)
PER_CLIENT_FILES = 3  # tus_unfinished_mb_per_client, in announced files
DB_GROWTH_MAX_KB = 1024  # the 600 creations grew it by 35 MB; a few hundred refused ones must not
REQUEST_SECONDS = 120.0  # one answer (a hang guard, not a speed bound)
SETTLE_SECONDS = 600.0  # the good photos complete (a hang guard)


def meta(**values: str) -> str:
    return ",".join(f"{k} {base64.b64encode(v.encode()).decode()}" for k, v in values.items())


def db_bytes(data_dir: Path) -> int:
    """The bytes the SQLite database's pages in use hold, as its connections see them (the write-ahead log
    included). Not the files' sizes: the log file's size depends on when the last checkpoint could run, and on a
    loaded machine the log alone once passed the bound. 0 on PostgreSQL (no file here)."""
    if not (data_dir / "picpeak.sqlite3").exists():
        return 0
    [row] = query(data_dir, "SELECT (p.page_count - f.freelist_count) * s.page_size AS n "
                            "FROM pragma_page_count() AS p, pragma_freelist_count() AS f, pragma_page_size() AS s")
    return int(row["n"])


@contextlib.asynccontextmanager
async def guest(url: str, slug: str, address: str = "127.0.0.1") -> AsyncIterator[httpx.AsyncClient]:
    """A fresh guest session (a new browser: sessions cost nothing) whose connections come from ``address``."""
    transport = httpx.AsyncHTTPTransport(local_address=address)
    async with httpx.AsyncClient(base_url=url, timeout=REQUEST_SECONDS, transport=transport) as http:
        page = await http.get(f"/g/{slug}/upload")
        assert page.status_code == 200, page.text[:300]
        found = CSRF_META.search(page.text)
        assert found is not None
        http.headers["X-CSRF-Token"] = found.group(1)
        yield http


class Tally:
    """What the attack's creations got: statuses, and each refusal's sentence by kind."""

    def __init__(self, watch: Watch) -> None:
        self.watch = watch
        self.accepted = 0
        self.refused: Counter[str] = Counter()
        self.no_sentence: list[str] = []

    def record(self, answer: httpx.Response) -> None:
        self.watch.saw(answer.status_code)
        if answer.status_code == 201:
            self.accepted += 1
            return
        error = answer.json().get("error", "") if answer.headers.get("content-type", "").startswith(
            "application/json") else ""
        if not error.endswith(".") or answer.status_code >= 500:
            self.no_sentence.append(f"{answer.status_code} {answer.text[:200]}")
        self.refused[f"{answer.status_code}"] += 1
        if "at most 4 KB" in error:
            self.refused["metadata"] += 1
        elif "from your network" in error:
            self.refused["client_cap"] += 1
        elif "faster than this server accepts" in error:
            self.refused["budget"] += 1


async def create_many(url: str, slug: str, tally: Tally, *, sessions: int, lengths: list[int],
                      metadata: str) -> None:
    """Each of ``sessions`` fresh guest sessions creates one upload of each of ``lengths``, sending nothing."""
    for _ in range(sessions):
        async with guest(url, slug) as http:
            for length in lengths:
                tally.record(await http.post(f"/api/g/{slug}/tus", headers={
                    **TUS, "Upload-Length": str(length), "Upload-Metadata": metadata}))


async def tus_upload(http: httpx.AsyncClient, create_url: str, data: bytes, name: str,
                     seen: list[int]) -> int | None:
    """Create, PATCH in three pieces, and return the photo id the last answer names (None when an answer was
    not the expected one: ``seen`` has every status, asserted after the figures line is printed)."""
    created = await http.post(create_url, headers={**TUS, "Upload-Length": str(len(data)),
                                                   "Upload-Metadata": meta(filename=name)})
    seen.append(created.status_code)
    if created.status_code != 201:
        return None
    location = created.headers["location"]
    piece = len(data) // 3 + 1
    answer = created
    for offset in range(0, len(data), piece):
        answer = await http.patch(location, content=data[offset:offset + piece],
                                  headers={**OCTETS, "Upload-Offset": str(offset)})
        seen.append(answer.status_code)
        if answer.status_code != 204:
            return None
    return int(answer.headers["picpeak-photo-id"])


async def test_tus_reservations_cannot_fill_the_disk_for_others(tmp_path: Path, capsys: pytest.CaptureFixture[str]
                                                               ) -> None:
    data_dir = tmp_path / "data"
    data_dir.mkdir()
    free_mb = shutil.disk_usage(data_dir).free // MB
    file_mb = max(64, int(free_mb * FILE_SHARE))
    config = write_config(tmp_path / "picpeak.toml", guest_max_file_mb=file_mb, workers=1, log_level="warning",
                          tus_unfinished_mb_per_client=PER_CLIENT_FILES * file_mb,
                          tus_unfinished_mb_per_gallery=4 * PER_CLIENT_FILES * file_mb)
    token = create_token(data_dir, config)
    server = ServerProcess(data_dir, config)
    url = await trio.to_thread.run_sync(server.start)
    base = base_jpeg(1200, 900, seed=27)
    try:
        async with httpx.AsyncClient(base_url=url, headers={"Authorization": f"Bearer {token}"},
                                     timeout=REQUEST_SECONDS) as admin:
            attacked = await admin.post("/api/admin/galleries", json={"name": "Party", "allow_guest_uploads": True})
            assert attacked.status_code == 201, attacked.text
            assert (await admin.post(f"/api/admin/galleries/{attacked.json()['id']}/publish")).status_code == 200
            own = await admin.post("/api/admin/galleries", json={"name": "Wedding"})
            assert own.status_code == 201, own.text
        slug, attacked_id, own_id = attacked.json()["slug"], attacked.json()["id"], own.json()["id"]
        db_before = db_bytes(data_dir)
        watch = Watch(server, "tus_reservations")
        tally = Tally(watch)
        stuffed = meta(filename="x.jpg", filetype="image/jpeg", padding="p" * 34_000)  # ~46 KB as sent
        # Before the watch: the first waves and a restart (the watch follows one server process).
        await create_many(url, slug, tally, sessions=3, lengths=[1000] * 20, metadata=stuffed)
        await create_many(url, slug, tally, sessions=4, lengths=[file_mb * MB] * 26, metadata=meta(filename="big.jpg"))
        await trio.to_thread.run_sync(server.stop)
        url = await trio.to_thread.run_sync(server.start)
        others_seen: list[int] = []
        refused_before_restart = tally.refused["budget"] + tally.refused["client_cap"]
        async with watch.during():
            # Halving lengths: what is left of any room is filled to the brim, so that a disk check counting
            # everyone's reservations would refuse even a small photo.
            await create_many(url, slug, tally, sessions=4, lengths=[max(1, (file_mb * MB) >> k) for k in range(26)],
                              metadata=meta(filename="big.jpg"))
            held = query(data_dir, "SELECT count(*) AS n, coalesce(sum(upload_length), 0) AS bytes FROM tus_uploads "
                                   "WHERE state = 'receiving' AND client_ip = '127.0.0.1'")[0]
            # Meanwhile, with those reservations standing: the admin in another gallery, and another guest.
            async with httpx.AsyncClient(base_url=url, headers={"Authorization": f"Bearer {token}"},
                                         timeout=REQUEST_SECONDS) as admin:
                admin_photo = await tus_upload(admin, f"/api/admin/galleries/{own_id}/tus",
                                               unique_jpeg(base, "admin"), "admin.jpg", others_seen)
            async with guest(url, slug, "127.0.0.2") as other:
                guest_photo = await tus_upload(other, f"/api/g/{slug}/tus", unique_jpeg(base, "guest"),
                                               "guest.jpg", others_seen)
            good = [p for p in (admin_photo, guest_photo) if p is not None]
            with trio.fail_after(SETTLE_SECONDS):  # a hang guard only
                while len(query(data_dir, "SELECT id FROM photos WHERE status = 'complete' AND id IN (?, ?)",
                                *[*good, 0, 0][:2])) < len(good):
                    await trio.sleep(0.2)
        for status in others_seen:
            watch.saw(status)
        db_growth_kb = (db_bytes(data_dir) - db_before) / 1024
        tmp_files = len(list((data_dir / "tmp" / "tus").iterdir()))
        photos = query(data_dir, "SELECT id, gallery_id, uploaded_by FROM photos ORDER BY id")
        refusals = " ".join(f"refused_{kind}={n}" for kind, n in sorted(tally.refused.items()))
        watch.line(capsys, lost=0, announced_mb=file_mb, creations_accepted=tally.accepted,
                   creations_refused=sum(n for kind, n in tally.refused.items() if kind.isdigit()), refusals=refusals,
                   held_files=held["n"], held_mb=held["bytes"] // MB, db_growth_kb=f"{db_growth_kb:.0f}",
                   tmp_files=tmp_files, others_507=others_seen.count(507))
        watch.check()
        assert tally.no_sentence == [], tally.no_sentence[:5]
        assert others_seen.count(507) == 0 and all(s in (201, 204) for s in others_seen), others_seen
        assert [(p["id"], p["gallery_id"], p["uploaded_by"]) for p in photos] == [
            (admin_photo, own_id, "admin"), (guest_photo, attacked_id, "guest")]
        # Every stuffed creation was refused, and the attacker holds no more than its cap, after the restart too.
        assert tally.refused["metadata"] == 60
        assert held["bytes"] <= PER_CLIENT_FILES * file_mb * MB
        # Past the restart the attacker's address is still refused, by its cap or by its byte budget: both are kept
        # in the database, so the restart forgets neither (which refuses first depends on the disk's size; the
        # budgets were per process once, and then only the cap was left after a restart).
        assert tally.accepted == held["n"]
        assert tally.refused["budget"] + tally.refused["client_cap"] > refused_before_restart
        assert tally.accepted + sum(n for kind, n in tally.refused.items() if kind.isdigit()) == 60 + 2 * 4 * 26
        assert db_growth_kb < DB_GROWTH_MAX_KB
        assert tmp_files == held["n"]
    finally:
        server.kill()
