"""The ``picpeak-lite`` command. Flags become Settings; every problem is one clear line and a non-zero exit."""

from __future__ import annotations

import contextlib
import functools
import getpass
import logging
import os
import sys
import time
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any

import click
import trio

from picpeak_lite import security
from picpeak_lite.config import FIELDS, Settings, find_config_file, load_settings
from picpeak_lite.domain import accounts
from picpeak_lite.errors import (
    AppError,
    CommandFailed,
    ConfigError,
    DatabaseError,
    DatabaseUnavailable,
    StorageUnavailable,
)
from picpeak_lite.ops import bootstrap
from picpeak_lite.store import db
from picpeak_lite.store.queries import admin as admin_q

CONFIG_HELP = "Path to a picpeak.toml (default: $PICPEAK_CONFIG, else ./picpeak.toml if there is one)."
LOG_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"
log = logging.getLogger(__name__)


def _settings(config: str | None, **overrides: Any) -> Settings:
    return load_settings(find_config_file(config), overrides=overrides)


def _start_logging(settings: Settings, config: str | None) -> None:
    """Configure logging, then say in one line which config file is in force: with ./picpeak.toml read
    implicitly, a user must be able to see whether their edits are the ones running."""
    logging.basicConfig(level=settings.log_level.upper(), format=LOG_FORMAT)
    path = find_config_file(config)
    if path is None:
        log.info("config: no file (built-in defaults, PICPEAK_* environment variables and flags)")
    else:
        log.info("config: %s (then PICPEAK_* environment variables and flags)", path.resolve())


def _count(n: int, noun: str, plural: str | None = None) -> str:
    """``1 error``, ``2 errors``."""
    return f"{n} {noun if n == 1 else plural or noun + 's'}"


class _Command(click.Command):
    """Top-level help shows each command's whole short help, wrapped, never cut with "..."."""

    def get_short_help_str(self, limit: int = 45) -> str:
        return super().get_short_help_str(limit=10_000)


class _Group(click.Group):
    command_class = _Command

    def get_short_help_str(self, limit: int = 45) -> str:
        return super().get_short_help_str(limit=10_000)


_Group.group_class = _Group


@contextlib.contextmanager
def _database(config: str | None, data_dir: str | None) -> Iterator[tuple[Settings, db.Connection]]:
    """Settings and one prepared connection, for the commands that work on the database directly."""
    settings = _settings(config, data_dir=data_dir)
    bootstrap.prepare(settings)
    conn = db.connect(settings.database)
    try:
        yield settings, conn
    finally:
        conn.close()


def _run_trio(main: Callable[[], Awaitable[None]]) -> None:
    """``trio.run``, with a bad setting or data directory found inside it (first-start work runs in the server's
    nursery) raised as itself, for :func:`main` to print as one line."""
    try:
        trio.run(main)
    except* ConfigError as group:
        raise group.exceptions[0] from None


@click.group(cls=_Group, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="picpeak-lite", prog_name="picpeak-lite", message="%(prog)s %(version)s")
def cli() -> None:
    """Self-hosted photo sharing for event photographers."""


@cli.command(short_help="Run the web server and its photo workers.")
@click.option("--host", help=FIELDS["host"].metadata["help"] + " [default: 127.0.0.1]")
@click.option("--port", type=int, help=FIELDS["port"].metadata["help"] + " [default: 8080]")
@click.option("--data-dir", help=FIELDS["data_dir"].metadata["help"] + " [default: ./picpeak-data]")
@click.option("--processes", type=int, help=FIELDS["processes"].metadata["help"] + " [default: 1]")
@click.option("--config", "config", help=CONFIG_HELP)
# A serving process started by `serve --processes N` (picpeak_lite/supervisor.py): the socket it serves and where
# it says it is ready. Not for people.
@click.option("--listen-fd", type=int, hidden=True)
@click.option("--ready-fd", type=int, hidden=True)
def serve(host: str | None, port: int | None, data_dir: str | None, processes: int | None, config: str | None,
          listen_fd: int | None, ready_fd: int | None) -> None:
    """Run the web server (with its photo workers) until SIGINT or SIGTERM."""
    from picpeak_lite import server

    settings = _settings(config, host=host, port=port, data_dir=data_dir, processes=processes)
    # Bind before anything else: a port in use is then the one line printed, never one printed after (and
    # scrolling away) the generated admin password.
    if listen_fd is not None:
        listener = server.Listener(address=settings.listen_address, fds=[listen_fd])
    else:
        listener = server.bind(settings)
    _start_logging(settings, config)
    if settings.processes > 1 and listen_fd is None:
        flags = [f"--{name.replace('_', '-')}={value}" for name, value in
                 (("host", host), ("port", port), ("data_dir", data_dir), ("config", config)) if value is not None]
        _supervise(settings, listener, flags)
        return

    async def main() -> None:
        async with trio.open_nursery() as nursery:
            running = await nursery.start(functools.partial(server.run, settings, listener=listener))
            if ready_fd is not None:  # a child of `serve --processes N`: the supervisor prints the rest
                os.write(ready_fd, b"r")
                os.close(ready_fd)
                return
            if running.admin_password is not None:
                click.echo(f"Created the admin account '{settings.admin_username}' with the password: "
                           f"{running.admin_password}")
                click.echo("This password is shown only once. Change it with `picpeak-lite admin set-password`.")
            click.echo(f"PicPeak is running at {running.url}/admin  (data in {settings.data_path.resolve()})")

    _run_trio(main)
    if ready_fd is None:
        click.echo("Stopped.")


def _supervise(settings: Settings, listener: Any, flags: list[str]) -> None:
    """``serve --processes N``: the supervisor (``picpeak_lite/supervisor.py``) on the socket bound above."""
    from picpeak_lite import supervisor

    [fd] = listener.fds  # hypercorn binds one socket per address; ours is one host and port

    async def main() -> None:
        async with trio.open_nursery() as nursery:
            running = await nursery.start(supervisor.supervise, settings, fd, flags, settings.processes)
            if running.admin_password is not None:
                click.echo(f"Created the admin account '{settings.admin_username}' with the password: "
                           f"{running.admin_password}")
                click.echo("This password is shown only once. Change it with `picpeak-lite admin set-password`.")
            click.echo(f"PicPeak is running at {running.url}/admin  (data in {settings.data_path.resolve()}, "
                       f"{settings.processes} processes)")

    try:
        _run_trio(main)
    finally:
        listener.close()
    click.echo("Stopped.")


@cli.command(short_help="Extra photo workers next to a running server.")
@click.option("--config", "config", help=CONFIG_HELP)
@click.option("--data-dir", help=FIELDS["data_dir"].metadata["help"] + " [default: ./picpeak-data]")
@click.option("--workers", type=int, help=FIELDS["workers"].metadata["help"])
def worker(config: str | None, data_dir: str | None, workers: int | None) -> None:
    """Process photos (with the janitor and webhook sender) next to a running server, on the same data."""
    from picpeak_lite import server

    settings = _settings(config, data_dir=data_dir, workers=workers)
    _start_logging(settings, config)

    async def main() -> None:
        async with trio.open_nursery() as nursery:
            await nursery.start(server.run_workers, settings)
            click.echo(f"Processing photos in {settings.data_path.resolve()} with {settings.worker_count} workers")

    _run_trio(main)
    click.echo("Stopped.")


@cli.command("import", short_help="Add a folder of photos to a gallery.")
@click.argument("folder", type=click.Path(file_okay=False))
@click.option("--gallery", "slug", required=True, help="The slug of the gallery to add the photos to.")
@click.option("--config", "config", help=CONFIG_HELP)
@click.option("--data-dir", help=FIELDS["data_dir"].metadata["help"] + " [default: ./picpeak-data]")
def import_folder(folder: str, slug: str, config: str | None, data_dir: str | None) -> None:
    """Add every image in FOLDER and its subfolders (a camera card's DCIM/...) to a gallery, through the same
    checks as an upload; hidden and system folders are skipped and named; re-running skips what is already
    there. The running server (or `picpeak-lite worker`) processes them."""
    from picpeak_lite.ops.importer import ImportProgress, run_import

    settings = _settings(config, data_dir=data_dir)
    bootstrap.prepare(settings)
    interactive = sys.stderr.isatty()

    def progress(step: ImportProgress) -> None:
        width = 30
        filled = width * step.done // max(step.total, 1)
        line = f"[{'#' * filled}{'.' * (width - filled)}] {step.done}/{step.total} {step.path.name[:40]}"
        if interactive:
            click.echo("\r" + line.ljust(80), nl=False, err=True)
        elif step.done == step.total or step.done % 50 == 0:
            click.echo(line, err=True)

    summary = run_import(settings, folder, slug, progress)
    if interactive:
        click.echo(err=True)
    for path, reason in summary.errors:
        click.echo(f"  {path.name}: {reason}", err=True)
    click.echo(f"Added {summary.added}, skipped {summary.duplicates} already there, "
               f"{_count(len(summary.errors), 'error')}, {_count(summary.ignored, 'other file')} ignored.")
    if summary.skipped_folders:
        click.echo(f"Not looked in (hidden or system folders): "
                   f"{', '.join(str(p) for p in summary.skipped_folders)}.")
    if summary.errors:
        sys.exit(1)


@cli.group("gallery", short_help="Archive a gallery (originals packed, thumbnails removed) or restore it.")
def gallery_group() -> None:
    """A gallery's life after its event: archive it to free space, restore it to show it again."""


def _archive_step(action: str, slug: str, config: str | None, data_dir: str | None) -> None:
    from picpeak_lite.errors import AppError
    from picpeak_lite.ops.archiving import run

    settings = _settings(config, data_dir=data_dir)
    try:
        result = run(settings, slug, action)
    except AppError as error:
        raise CommandFailed(error.message) from None
    out = result.outcome
    sizes = ""
    if out.bytes_before is not None and out.bytes_after is not None:
        sizes = (f": {out.bytes_before} bytes stored before, {out.bytes_after} after, "
                 f"{out.bytes_before - out.bytes_after} freed")
    if action == "archive":
        click.echo(f"Archived {slug} ({_count(result.photos, 'photo')}){sizes}.")
    else:
        click.echo(f"Restored {slug} ({_count(result.photos, 'photo')}); the workers make their images again.")


@gallery_group.command("archive")
@click.argument("slug")
@click.option("--config", "config", help=CONFIG_HELP)
@click.option("--data-dir", help=FIELDS["data_dir"].metadata["help"] + " [default: ./picpeak-data]")
def gallery_archive(slug: str, config: str | None, data_dir: str | None) -> None:
    """Remove the gallery's thumbnails and web sizes and pack its originals into one archive object (each
    checked against its sha256 before the loose copy goes). Interrupted, run it again."""
    _archive_step("archive", slug, config, data_dir)


@gallery_group.command("restore")
@click.argument("slug")
@click.option("--config", "config", help=CONFIG_HELP)
@click.option("--data-dir", help=FIELDS["data_dir"].metadata["help"] + " [default: ./picpeak-data]")
def gallery_restore(slug: str, config: str | None, data_dir: str | None) -> None:
    """Unpack an archived gallery's originals (each checked against its sha256) and queue its photos for their
    images again. Interrupted, run it again."""
    _archive_step("restore", slug, config, data_dir)


@cli.command(short_help="Watch a folder and add each photo written into it to a gallery.")
@click.argument("folder", type=click.Path(file_okay=False, exists=True))
@click.option("--gallery", "slug", required=True, help="The slug of the gallery to add the photos to.")
@click.option("--polling", is_flag=True, default=None,
              help="Look for new files by polling (network mounts without file events); else chosen by itself.")
@click.option("--in-place", is_flag=True, help="Reference the originals where they are (local storage only; the "
              "folder is never changed) instead of copying them.")
@click.option("--config", "config", help=CONFIG_HELP)
@click.option("--data-dir", help=FIELDS["data_dir"].metadata["help"] + " [default: ./picpeak-data]")
def watch(folder: str, slug: str, polling: bool | None, in_place: bool, config: str | None,
          data_dir: str | None) -> None:
    """Watch FOLDER and its subfolders (tethered shooting, a camera's FTP or Wi-Fi transfer) and add each photo to
    a gallery once it is completely written, through the same checks as an upload, until interrupted. Files
    already there are taken first; each file is taken once, also across restarts. The running server (or
    `picpeak-lite worker`) processes them and shows them on the live wall."""
    from picpeak_lite.ops.hotfolder import Taken, watch_folder

    settings = _settings(config, data_dir=data_dir)
    _start_logging(settings, config)

    def taken(files: list[Taken]) -> None:
        for t in files:
            outcome = t.error or ("already in the gallery" if t.duplicate else f"photo {t.photo_id}")
            click.echo(f"{t.path}: {outcome}")

    click.echo(f"Watching {Path(folder).resolve()} for the gallery {slug} (Ctrl-C stops).")
    with contextlib.suppress(KeyboardInterrupt):  # Ctrl-C is how it stops
        _run_trio(functools.partial(watch_folder, settings, Path(folder).resolve(), slug, polling=polling,
                                    in_place=in_place, on_taken=taken))
    click.echo("Stopped.")


@cli.command(short_help="Measure photos/s, CPU per photo and memory on this machine.")
@click.option("--photos", "count", type=click.IntRange(1, 10_000), default=50, show_default=True,
              help="How many photos to make and upload.")
@click.option("--megapixels", type=click.FloatRange(0.1, 100), default=24, show_default=True,
              help="Size of each photo (a camera-like 3:2 JPEG at quality 90).")
@click.option("--temp-dir", type=click.Path(file_okay=False), help="Where to make the photos and the data "
              "directory (removed afterwards) [default: the system's temp directory].")
def bench(count: int, megapixels: float, temp_dir: str | None) -> None:
    """Measure this machine: make camera-like photos in a temp data directory, upload them to a fresh server
    on 127.0.0.1 and print photos/s, CPU per photo, time to the first complete photo and peak RSS."""
    from picpeak_lite.ops import bench as bench_run

    click.echo(f"Making {count} photos of {megapixels:g} MP and uploading them to a fresh server ...", err=True)
    result = bench_run.run(count, megapixels, workdir=Path(temp_dir) if temp_dir else None)
    for line in result.lines():
        click.echo(line)


def _progress_bar(label: str) -> Any:
    """A progress callback ``(done, total, name)`` drawing a bar on stderr (a line every 100 when not a tty)."""
    interactive = sys.stderr.isatty()

    def progress(done: int, total: int, name: str) -> None:
        width = 30
        filled = width * done // max(total, 1)
        line = f"{label} [{'#' * filled}{'.' * (width - filled)}] {done}/{total} {name[:40]}"
        if interactive:
            click.echo("\r" + line.ljust(90), nl=False, err=True)
            if done == total:
                click.echo(err=True)
        elif done == total or done % 100 == 0:
            click.echo(line, err=True)

    return progress


@cli.command(short_help="Back up the database and photos (safe while serving).")
@click.argument("directory", type=click.Path(file_okay=False))
@click.option("--config", "config", help=CONFIG_HELP)
@click.option("--data-dir", help=FIELDS["data_dir"].metadata["help"] + " [default: ./picpeak-data]")
def backup(directory: str, config: str | None, data_dir: str | None) -> None:
    """Copy the database (a consistent snapshot, safe while the server runs; pg_dump with database_url) and every
    photo into DIRECTORY, with a manifest of sha256 sums. Run it again into the same directory to update it.
    `picpeak-lite restore` makes it a working library again."""
    from picpeak_lite.ops.backup import backup as run_backup

    settings = _settings(config, data_dir=data_dir)
    summary = run_backup(settings, directory, _progress_bar("backup"))
    click.echo(f"Backed up {_count(summary.photos - summary.deleted_meanwhile, 'photo')} to {directory}: "
               f"{_count(summary.copied, 'file')} copied ({summary.bytes_copied / 1e6:.1f} MB), "
               f"{summary.kept} unchanged, "
               f"{summary.removed} removed.")
    if summary.missing_derivatives:
        were = "was" if summary.missing_derivatives == 1 else "were"
        click.echo(f"  {_count(summary.missing_derivatives, 'thumbnail')} {were} missing; after a restore, "
                   "`picpeak-lite check --repair` makes them again.", err=True)
    for photo_id in summary.missing_originals:
        click.echo(f"  photo {photo_id}: the original is missing from the data directory", err=True)
    for photo_id in summary.sha_mismatch:
        click.echo(f"  photo {photo_id}: the original differs from its recorded sha256", err=True)
    if summary.problems:
        raise click.ClickException(f"{_count(summary.problems, 'photo')} could not be backed up intact (listed above)")


@cli.command(short_help="Make a backup a working library again, in a new data directory (and database).")
@click.argument("directory", type=click.Path(file_okay=False, exists=True))
@click.option("--config", "config", help=CONFIG_HELP)
@click.option("--data-dir", help=FIELDS["data_dir"].metadata["help"] + " [default: ./picpeak-data]")
def restore(directory: str, config: str | None, data_dir: str | None) -> None:
    """Copy the backup in DIRECTORY into a new, empty data directory, verifying every file's sha256, and its
    database into place: the SQLite file, or with database_url the dump loaded by pg_restore into that new, empty
    PostgreSQL database. Photos that were processing at backup time are pending again. Then start the server."""
    from picpeak_lite.ops.restore import ENGINES
    from picpeak_lite.ops.restore import restore as run_restore

    settings = _settings(config, data_dir=data_dir)
    summary = run_restore(settings, directory, _progress_bar("restore"))
    click.echo(f"Restored {_count(summary.photos, 'photo')} from {directory} into {settings.data_path}: "
               f"{_count(summary.copied, 'file')} copied ({summary.bytes_copied / 1e6:.1f} MB), {summary.kept} "
               f"already there, the {ENGINES[summary.engine]} database loaded, {summary.released} pending again. "
               "Start the server on it.")


@cli.command(short_help="Verify every photo and the database; --repair fixes what it can.")
@click.option("--repair", is_flag=True,
              help="Queue photos with missing thumbnails again, fail rows whose original is gone, "
                   "remove orphan files.")
@click.option("--grace", type=float, default=600.0, show_default=True,
              help="Seconds before a file without a row counts as an orphan (an upload may be committing).")
@click.option("--config", "config", help=CONFIG_HELP)
@click.option("--data-dir", help=FIELDS["data_dir"].metadata["help"] + " [default: ./picpeak-data]")
def check(repair: bool, grace: float, config: str | None, data_dir: str | None) -> None:
    """Read every photo back: originals present and matching their sha256, thumbnails of complete photos
    present, no orphan files, database integrity. Exits 1 when anything is wrong."""
    from picpeak_lite.ops.check import check_data_dir

    settings = _settings(config, data_dir=data_dir)
    report = check_data_dir(settings, grace=grace, repair=repair, progress=_progress_bar("check"))
    for label, ids in (("original missing", report.missing_original), ("sha256 differs", report.sha_mismatch),
                       ("thumbnails missing", report.missing_derivatives)):
        for photo_id in ids[:50]:
            click.echo(f"  photo {photo_id}: {label}", err=True)
    for path in report.orphans[:50]:
        click.echo(f"  orphan file: {path}", err=True)
    for photo_id, source in report.vanished[:50]:
        click.echo(f"  photo {photo_id}: its original referenced in place is gone from {source}", err=True)
    click.echo(f"check: {report.summary()}")
    if repair:
        click.echo(f"repair: requeued={report.requeued} failed={report.failed_now} "
                   f"orphans_removed={report.orphans_removed}")
        if report.requeued:
            click.echo("The running server (or the next start) makes the missing thumbnails.")
    left = report.unrepaired if repair else report.problems
    if left:
        click.echo(_count(left, "problem") + (" left (a changed original needs a restore from backup)" if repair else
                                          "; `--repair` fixes missing thumbnails and orphans"), err=True)
        sys.exit(1)


@cli.group("storage", short_help="Move the photos between local storage and an S3 bucket.")
def storage_group() -> None:
    """Where photo files live (the storage setting)."""


@storage_group.command("migrate")
@click.option("--to", "to", type=click.Choice(["s3", "local"]), required=True,
              help="Where to move the library: the bucket of the s3_* settings, or the data directory.")
@click.option("--config", "config", help=CONFIG_HELP)
@click.option("--data-dir", help=FIELDS["data_dir"].metadata["help"] + " [default: ./picpeak-data]")
def storage_migrate(to: str, config: str | None, data_dir: str | None) -> None:
    """Copy every original and thumbnail into the other storage, verifying each original's sha256, then set
    `storage` in the config file. Stop the server first (the command refuses while it answers). Interrupted,
    run it again: what was copied already is kept. The old copies are left in place."""
    from picpeak_lite.ops.migrate import migrate

    settings = _settings(config, data_dir=data_dir)
    click.echo(f"Stop the server and any `picpeak-lite worker` before this runs: they keep writing to the "
               f"storage they started with ({settings.storage}).", err=True)
    summary = migrate(settings, to, find_config_file(config), _progress_bar("migrate"))
    click.echo(f"Migrated {_count(summary.objects, 'object')} from {summary.source} to {summary.target}: "
               f"{summary.copied} copied ({summary.bytes_copied / 1e6:.1f} MB), {summary.kept} already there, "
               f"{summary.orphans_skipped} orphans left behind.")
    for photo_id in summary.missing_originals:
        click.echo(f"  photo {photo_id}: the original is missing", err=True)
    for photo_id in summary.sha_mismatch:
        click.echo(f"  photo {photo_id}: the original differs from its recorded sha256", err=True)
    if summary.problems:
        raise click.ClickException(f"{_count(summary.problems, 'photo')} could not be moved intact (listed above); "
                                   "the storage setting was not changed")
    click.echo(f"storage = \"{to}\" is set in {summary.switched}; start the server. The old copies are still in "
               f"{summary.source}: remove them once all is well.")


@cli.group("db", short_help="Move the database between SQLite and PostgreSQL.")
def db_group() -> None:
    """Where the library's database lives (the database_url setting)."""


@db_group.command("migrate")
@click.option("--to", "to", required=True, help="The database to move the library to: postgresql://user:password@"
              "host:port/name (an empty database), or sqlite (the data directory's file) when on PostgreSQL.")
@click.option("--config", "config", help=CONFIG_HELP)
@click.option("--data-dir", help=FIELDS["data_dir"].metadata["help"] + " [default: ./picpeak-data]")
def db_migrate(to: str, config: str | None, data_dir: str | None) -> None:
    """Copy every table into the other engine, verify each one's rows by count and checksum, then set
    `database_url` in the config file. Stop the server first (the command refuses while it answers). Interrupted,
    run it again: it goes on from there. The old database is left as it was."""
    from picpeak_lite.ops.dbmove import move

    settings = _settings(config, data_dir=data_dir)
    click.echo("Stop the server and any `picpeak-lite worker` before this runs: whatever they write during the "
               "copy would be missing from the new database.", err=True)
    summary = move(settings, to, find_config_file(config), _progress_bar("db migrate"))
    click.echo(f"Moved {_count(summary.tables, 'table')}, {_count(summary.rows, 'row')} ({summary.copied} copied "
               f"now) in {summary.seconds:.1f} s from {summary.source} to {summary.target}; every table's rows "
               "verified.")
    click.echo(f"database_url is set in {summary.switched}; start the server. The old database is left as it was "
               f"({summary.source}): remove it once all is well.")
    if os.environ.get("PICPEAK_DATABASE_URL"):
        click.echo("PICPEAK_DATABASE_URL is set in this environment and overrides the config file: change or unset "
                   "it wherever the server is started.", err=True)


@cli.group(short_help="Manage accounts and API tokens.")
def admin() -> None:
    """Manage accounts (owner, admin, editor) and API tokens."""


def _read_new_password(password_stdin: bool, prompt: str = "New password: ") -> str:
    if password_stdin:
        password = sys.stdin.readline().rstrip("\n")
    else:
        password = getpass.getpass(prompt)
        if getpass.getpass("Repeat it: ") != password:
            raise click.ClickException("the two passwords differ")
    if len(password) < security.MIN_PASSWORD_LENGTH:
        raise click.ClickException(f"the password needs at least {security.MIN_PASSWORD_LENGTH} characters")
    return password


def _account_row(conn: db.Connection, name: str) -> db.Row:
    row = admin_q.get_user_by_name(conn, name)
    if row is None:
        raise click.ClickException(f"there is no account named {name!r}")
    return row


@admin.command("set-password")
@click.option("--account", "account", help="The account (default: the first owner).")
@click.option("--config", "config", help=CONFIG_HELP)
@click.option("--data-dir", help=FIELDS["data_dir"].metadata["help"])
@click.option("--password-stdin", is_flag=True, help="Read the new password from standard input.")
def set_password(account: str | None, config: str | None, data_dir: str | None, password_stdin: bool) -> None:
    """Set an account's password; every session of that account is logged out."""
    password = _read_new_password(password_stdin, "New admin password: " if account is None else "New password: ")
    with _database(config, data_dir) as (settings, conn), db.transaction(conn):
        now = time.time()
        user = _account_row(conn, account) if account else admin_q.first_owner(conn)
        if user is None:  # no account at all yet: this makes the first owner
            admin_q.create_user(conn, settings.admin_username, security.hash_password(password), now)
            name = settings.admin_username
        else:
            accounts.set_password(conn, user["id"], security.hash_password(password), now, accounts.CLI)
            name = user["username"]
    click.echo(f"Password changed for '{name}'.")


@admin.group()
def account() -> None:
    """Named accounts with roles: owner (everything), admin (all galleries), editor (granted galleries)."""


@account.command("add")
@click.argument("name")
@click.option("--role", type=click.Choice(accounts.ROLES), required=True, help="What the account may do.")
@click.option("--password-stdin", is_flag=True, help="Read the password from standard input.")
@click.option("--config", "config", help=CONFIG_HELP)
@click.option("--data-dir", help=FIELDS["data_dir"].metadata["help"])
def account_add(name: str, role: str, password_stdin: bool, config: str | None, data_dir: str | None) -> None:
    """Add an account (the password is asked twice, or read from standard input)."""
    password = _read_new_password(password_stdin, "Password: ")
    try:
        with _database(config, data_dir) as (_, conn), db.transaction(conn):
            accounts.add_account(conn, name, security.hash_password(password), role, time.time(), accounts.CLI)
    except AppError as error:
        raise click.ClickException(error.message) from None
    click.echo(f"Account '{name}' ({role}) added.")


@account.command("list")
@click.option("--config", "config", help=CONFIG_HELP)
@click.option("--data-dir", help=FIELDS["data_dir"].metadata["help"])
def account_list(config: str | None, data_dir: str | None) -> None:
    """List accounts: name, role, state, second factor, granted galleries (editors)."""
    with _database(config, data_dir) as (_, conn):
        rows = admin_q.list_users(conn)
    for row in rows:
        state = "disabled" if row["disabled_at"] else "active"
        factor = "totp" if row["totp_enabled_at"] else "-"
        grants = row["grants"] or "-" if row["role"] == "editor" else "all"
        click.echo(f"{row['username']}\t{row['role']}\t{state}\t{factor}\t{grants}")


def _set_disabled(name: str, disabled: bool, config: str | None, data_dir: str | None) -> None:
    try:
        with _database(config, data_dir) as (_, conn), db.transaction(conn):
            row = _account_row(conn, name)
            accounts.set_disabled(conn, row["id"], disabled, time.time(), accounts.CLI)
    except AppError as error:
        raise click.ClickException(error.message) from None


@account.command("disable")
@click.argument("name")
@click.option("--config", "config", help=CONFIG_HELP)
@click.option("--data-dir", help=FIELDS["data_dir"].metadata["help"])
def account_disable(name: str, config: str | None, data_dir: str | None) -> None:
    """Disable an account: its sessions and API tokens stop working at their next request."""
    _set_disabled(name, True, config, data_dir)
    click.echo(f"Account '{name}' disabled.")


@account.command("enable")
@click.argument("name")
@click.option("--config", "config", help=CONFIG_HELP)
@click.option("--data-dir", help=FIELDS["data_dir"].metadata["help"])
def account_enable(name: str, config: str | None, data_dir: str | None) -> None:
    """Enable a disabled account again (its old sessions stay ended)."""
    _set_disabled(name, False, config, data_dir)
    click.echo(f"Account '{name}' enabled.")


@account.command("reset-second-factor")
@click.argument("name")
@click.option("--config", "config", help=CONFIG_HELP)
@click.option("--data-dir", help=FIELDS["data_dir"].metadata["help"])
def account_reset_totp(name: str, config: str | None, data_dir: str | None) -> None:
    """Turn an account's second factor off (a lost phone and lost recovery codes): the way back in."""
    with _database(config, data_dir) as (_, conn), db.transaction(conn):
        row = _account_row(conn, name)
        admin_q.set_totp(conn, row["id"], None, None)
        accounts.CLI.record(conn, time.time(), "account.totp_disabled", detail=name)
    click.echo(f"The second factor of '{name}' is off.")


@admin.group()
def token() -> None:
    """API tokens for scripts: `Authorization: Bearer <token>`."""


@token.command("create")
@click.option("--name", required=True, help="A name to recognise the token by, e.g. 'lightroom'.")
@click.option("--account", "account", help="The account the token acts as (default: the first owner).")
@click.option("--config", "config", help=CONFIG_HELP)
@click.option("--data-dir", help=FIELDS["data_dir"].metadata["help"])
def token_create(name: str, account: str | None, config: str | None, data_dir: str | None) -> None:
    """Create a token and print it once; only its hash is stored. It acts with its account's role."""
    try:
        with _database(config, data_dir) as (settings, conn):
            if account is None and admin_q.first_owner(conn) is None:
                # Before the first start: the owner the first start would make, so the token has its account.
                password = bootstrap.ensure_admin(settings)
                if password is not None:
                    click.echo(f"Created the admin account '{settings.admin_username}' with the password: "
                               f"{password}", err=True)
            with db.transaction(conn):
                value = bootstrap.create_api_token(conn, name, time.time(), account)
    except db.ConstraintError:
        raise click.ClickException(f"a token named {name!r} exists already") from None
    click.echo(value)
    click.echo(f"Token '{name}' created. It is shown only once.", err=True)


@token.command("revoke")
@click.option("--name", required=True, help="The name of the token to revoke.")
@click.option("--config", "config", help=CONFIG_HELP)
@click.option("--data-dir", help=FIELDS["data_dir"].metadata["help"])
def token_revoke(name: str, config: str | None, data_dir: str | None) -> None:
    """Revoke a token at once."""
    with _database(config, data_dir) as (_, conn), db.transaction(conn):
        revoked = admin_q.revoke_token(conn, name, time.time())
    if not revoked:
        raise click.ClickException(f"no active token named {name!r}")
    click.echo(f"Token '{name}' revoked.")


@token.command("list")
@click.option("--config", "config", help=CONFIG_HELP)
@click.option("--data-dir", help=FIELDS["data_dir"].metadata["help"])
def token_list(config: str | None, data_dir: str | None) -> None:
    """List tokens (never their values)."""
    with _database(config, data_dir) as (_, conn):
        rows = admin_q.list_tokens(conn)
    for row in rows:
        state = "revoked" if row["revoked_at"] else "active"
        click.echo(f"{row['name']}\t{state}\t{row['username'] or '-'}")


@cli.group("email", short_help="Check the email (SMTP) settings.")
def email_group() -> None:
    """Email to clients and to you, sent through the smtp_* settings."""


@email_group.command("test")
@click.argument("address")
@click.option("--config", "config", help=CONFIG_HELP)
def email_test(address: str, config: str | None) -> None:
    """Send one test message to ADDRESS now, through the smtp_* settings (not through the outbox), and print what
    the server answered. Exits 1 when it did not take the message."""
    from picpeak_lite.domain import email as email_domain
    from picpeak_lite.errors import AppError
    from picpeak_lite.events.email import SendFailed, Smtp, send

    settings = _settings(config)
    try:
        message_id, message = email_domain.test_message(settings, address, now=time.time())
    except AppError as error:
        raise CommandFailed(error.message) from None
    smtp = Smtp.from_settings(settings)
    click.echo(f"Sending {message_id} to {address} through {smtp.host}:{smtp.port} ({smtp.security}) ...")
    try:
        answer = send(smtp, settings.email_from, address, message)
    except SendFailed as error:
        raise CommandFailed(f"the server did not take the message: {error.reason}") from None
    click.echo(f"The server answered: {answer}")


def main(argv: list[str] | None = None) -> None:
    """Entry point: no tracebacks for the user's mistakes, one line naming the problem instead."""
    try:
        cli.main(args=argv, prog_name="picpeak-lite", standalone_mode=False)
    except click.exceptions.Exit as done:
        sys.exit(done.exit_code)
    except click.exceptions.Abort:
        click.echo("Aborted.", err=True)
        sys.exit(1)
    except click.ClickException as error:
        click.echo(f"picpeak-lite: error: {error.format_message()}", err=True)
        sys.exit(2)
    except ConfigError as error:
        click.echo(f"picpeak-lite: error: {error}", err=True)
        sys.exit(2)
    except CommandFailed as error:
        click.echo(f"picpeak-lite: error: {error}", err=True)
        sys.exit(1)
    except StorageUnavailable as error:
        click.echo(f"picpeak-lite: error: {error.message}", err=True)
        sys.exit(75)  # EX_TEMPFAIL: the same command works once the bucket answers again
    except DatabaseError as error:  # e.g. PostgreSQL unreachable: psycopg's reason runs over lines, we print one
        reason = error.detail if isinstance(error, DatabaseUnavailable) else error.message
        click.echo(f"picpeak-lite: error: {' '.join(reason.split())}", err=True)
        sys.exit(1)
    except KeyboardInterrupt:
        sys.exit(130)
