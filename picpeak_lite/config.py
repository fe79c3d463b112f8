"""Settings: every key with its default and a line of help, in one frozen dataclass.

Precedence, highest first: command-line flags, environment variables (``PICPEAK_<KEY>`` in upper case), the
TOML file, the defaults below. An unknown key anywhere is an error that names it: a typo must never fall back
to a default silently. ``picpeak.toml`` at the repository root documents every key; a test keeps it in step
with this module.
"""

from __future__ import annotations

import dataclasses
import ipaddress
import math
import os
import re
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from picpeak_lite.errors import ConfigError
from picpeak_lite.i18n import LANGUAGES
from picpeak_lite.targets import TargetRefused, check_target_offline

ENV_PREFIX = "PICPEAK_"
WEBHOOK_EVENTS = ("photo.uploaded", "photo.failed", "photo.deleted", "upload.completed", "photo.approved",
                  "photo.rejected")
SMTP_SECURITY = ("starttls", "tls", "none")
WATERMARK_POSITIONS = ("top-left", "top-right", "bottom-left", "bottom-right", "center")


@dataclass(frozen=True)
class WebhookEndpoint:
    """One receiver of webhooks, from a ``[[webhooks]]`` table."""

    url: str
    secret: str = field(repr=False)  # never in a printed Settings (logs, error reports)
    events: tuple[str, ...] = WEBHOOK_EVENTS


def _setting(default: Any, help: str) -> Any:
    return field(default=default, metadata={"help": help})


@dataclass(frozen=True)
class Settings:
    # Server
    host: str = _setting("127.0.0.1", "Address to listen on.")
    port: int = _setting(8080, "Port to listen on; 0 picks a free port and prints it.")
    data_dir: str = _setting("./picpeak-data", "Folder for the SQLite database and the photo storage.")
    public_url: str = _setting("", "Base URL for share links (https://photos.example.com); empty: from the request.")
    allowed_hosts: tuple[str, ...] = _setting(
        (), "With public_url empty: the host or host:port names whose Host header share links may use.")
    secure_cookies: bool = _setting(False, "Mark cookies Secure; set this when the server is reached over HTTPS.")
    trusted_proxies: str = _setting("", "Comma-separated proxy addresses whose X-Forwarded-For is believed.")
    shutdown_grace_seconds: float = _setting(10.0, "How long in-flight requests may finish after SIGTERM.")
    max_connections: int = _setting(
        0, "Open connections at most (WebSockets included); 0: all the fd limit allows, less a reserve for files.")
    connections_per_client: int = _setting(
        256, "Open connections at most from one client address (a venue's guests may share one); "
        "trusted_proxies are exempt.")
    max_websockets: int = _setting(
        2000, "Open WebSockets at most (live pages, walls, upload progress), about 50 KB each; past it a page "
        "tries again later. 0: only max_connections bounds them.")
    min_body_rate_kb: float = _setting(
        1.0, "A request body slower than this, in KB/s over each body_rate_window_seconds, is ended with 408.")
    body_rate_window_seconds: float = _setting(
        30.0, "The window over which min_body_rate_kb is measured (the client's time; waits on the server are free).")
    log_level: str = _setting("info", "One of debug, info, warning, error.")
    # Admin
    admin_username: str = _setting("admin", "The user name of the owner account made at the first start.")
    session_days: int = _setting(14, "How long an admin login lasts.")
    login_attempts: int = _setting(5, "Failed password attempts allowed per target in one window: per device that "
                                      "gave the right password before, and per IP for all others.")
    login_window_seconds: int = _setting(900, "The throttling window for failed password attempts.")
    login_backoff_seconds: int = _setting(60, "Past login_attempts, what other devices of that IP wait after the "
                                              "last failure, doubled after each further one (at most the window).")
    audit_retention_days: int = _setting(365, "How long the audit trail (logins, gallery and account changes) is "
                                              "kept, in days.")
    # Galleries
    default_expiry_days: int = _setting(30, "Expiry for new galleries, in days (1-365).")
    archive_on_expiry: str = _setting(
        "keep", "What a new gallery does when it expires (each gallery can change it): keep (every file stays) or "
        "archive (thumbnails removed, originals packed into one archive object, restorable).")
    archive_check_seconds: int = _setting(
        300, "How often the server looks for expired galleries to archive, in seconds.")
    # Languages
    default_language: str = _setting(
        "en", "The pages' language when neither the visitor, the gallery nor the browser names one we have: "
        "en, de, nl, pt, ru, fr, es or it.")
    # Uploads
    admin_max_file_mb: int = _setting(2048, "Largest file an admin may upload, in MB.")
    admin_max_files: int = _setting(500, "Most files in one admin upload request.")
    guest_max_file_mb: int = _setting(50, "Largest file a guest may upload, in MB.")
    guest_max_files: int = _setting(20, "Most files in one guest upload request.")
    guest_max_video_mb: int = _setting(500, "Largest video a guest may upload, in MB.")
    guest_max_video_seconds: int = _setting(300, "Longest video a guest may upload, in seconds.")
    gallery_photo_cap: int = _setting(10000, "Most photos in one gallery, unless the gallery sets its own cap.")
    temp_max_age_seconds: int = _setting(3600, "Temp files older than this are swept away.")
    tus_expiry_hours: int = _setting(
        24, "Longest a resumable (tus) upload may take in all; a finished or expired one is remembered this long.")
    tus_idle_minutes: int = _setting(
        15, "An unfinished resumable (tus) upload that receives no bytes for this long expires; the page starts over.")
    tus_unfinished_mb_per_client: int = _setting(
        2048, "Most MB that guests at one client address may have announced in unfinished resumable uploads.")
    tus_unfinished_mb_per_gallery: int = _setting(
        8192, "Most MB that guests may have announced in unfinished resumable uploads in one gallery.")
    tus_finish_attempts: int = _setting(
        20, "Times the server tries to make the photo of a complete resumable upload before it gives up on it.")
    tus_bytes: str = _setting(
        "auto", 'Where unfinished resumable (tus) uploads grow: "local" (tmp/ of the host that took them), "bucket" '
        '(pieces in the S3 bucket: any host takes any PATCH) or "auto" (bucket with S3 and PostgreSQL, else local).')
    upload_lead: int = _setting(
        40, "Photos that may wait for a worker before uploads are read only as fast as workers take them; 0: no limit.")
    upload_chunk_mb: int = _setting(
        8, "Largest piece the upload pages send in one request, in MB: keep it under your proxy's body limit.")
    # Hot folders (ops/hotfolder.py)
    hot_folder_root: str = _setting(
        "", "Folder under which a gallery's hot folder may be set on its form; empty: only `picpeak-lite watch`.")
    hot_folder_settle_seconds: float = _setting(
        0.5, "A file in a hot folder is taken once its size and time have not changed for this long (and it ends).")
    # Processing
    processing_enabled: bool = _setting(True, "Process photos here; off: they wait for `picpeak-lite worker`.")
    workers: int = _setting(0, "Image children (photos made at once); 0 means one per CPU core.")
    processes: int = _setting(
        1, "Serving processes on the one port (`serve`): more receive uploads and answer guests on more cores.")
    image_nice: int = _setting(10, "OS priority (nice, 0-19) of the image children below the web server; 0: the same.")
    lease_seconds: float = _setting(60.0, "How long a claim lasts without renewal; a crash is recovered after this.")
    max_attempts: int = _setting(3, "Attempts before a photo whose image child keeps dying is given up.")
    max_pixels: int = _setting(150_000_000, "Largest image accepted, in pixels.")
    guest_max_pixels: int = _setting(50_000_000, "Largest image a guest may upload, in pixels (at most max_pixels).")
    decode_memory_mb: int = _setting(256, "Memory all image decoding in this process may use at once, in MB.")
    grid_px: int = _setting(400, "Long edge of the grid image.")
    view_px: int = _setting(1600, "Long edge of the view image.")
    jpeg_quality: int = _setting(85, "JPEG quality of derivatives (60-95).")
    decode_deadline_seconds: float = _setting(
        60.0, "Longest a photo's decode and images may take in a worker before it fails (a retry tries again).")
    video_deadline_seconds: float = _setting(120.0, "Longest a video's probe or poster may take before it fails.")
    media_children: int = _setting(2, "Video children (probe, poster, preview) this process runs at once (2 or more).")
    video_previews: bool = _setting(True, "Make a playable H.264 preview of videos browsers cannot play (HEVC).")
    # Watermark
    watermark_text: str = _setting("", "Watermark text for galleries that ask for one; empty uses the gallery name.")
    watermark_logo: str = _setting("", "Path to a PNG logo used as the watermark instead of text.")
    watermark_position: str = _setting("bottom-right", "One of " + ", ".join(WATERMARK_POSITIONS) + ".")
    watermark_opacity: float = _setting(0.5, "Watermark opacity, 0.05-1.")
    watermark_size: float = _setting(0.2, "Watermark width as a share of the image width, 0.02-1.")
    # Webhooks
    webhook_allow_private: bool = _setting(False, "Allow webhook targets on private or loopback addresses.")
    webhooks: tuple[WebhookEndpoint, ...] = _setting((), "Receivers, as [[webhooks]] tables with url, secret, events.")
    # Email (events/email.py sends; domain/email.py decides what and to whom)
    smtp_host: str = _setting("", "The SMTP server that sends mail (e.g. smtp.example.com); empty: no email is sent.")
    smtp_port: int = _setting(587, "Its port: 587 for starttls, 465 for tls, 25 for none.")
    smtp_security: str = _setting("starttls", 'How the connection is protected: "starttls", "tls" or "none".')
    smtp_user: str = _setting("", "The SMTP login; empty: no login.")
    smtp_password: str = field(  # never in a printed Settings (logs, error reports)
        default="", repr=False,
        metadata={"help": "The SMTP password; better set as PICPEAK_SMTP_PASSWORD than in this file."})
    email_from: str = _setting("", "The sender address of every message (e.g. photos@example.com).")
    email_reminder_days: int = _setting(3, "Days before a gallery expires that the client and you are reminded.")
    email_digest_minutes: int = _setting(
        60, "At most one digest of new guest uploads per gallery in this many minutes.")
    email_per_minute: int = _setting(20, "Messages sent at most per minute (a bound on what any bug or misuse sends).")
    # Disk
    low_disk_mb: int = _setting(1024, "Warn on the dashboard when free disk space falls below this, in MB.")
    # Database
    database_url: str = _setting(
        "", 'The database: empty for the SQLite file in data_dir, or "postgresql://user:password@host:port/name" '
        "(PostgreSQL 15 or newer, a database of its own) when more than one process or host shares the library.")
    # Storage
    storage: str = _setting("local", 'Where photo files live: "local" (under data_dir) or "s3" (a bucket).')
    s3_endpoint_url: str = _setting("", "The S3-compatible service's URL (MinIO, B2, Wasabi, R2); empty: AWS S3.")
    s3_bucket: str = _setting("", "The bucket that holds the photos (needed with storage = \"s3\").")
    s3_region: str = _setting("", "The bucket's region (e.g. eu-central-1); empty: the client's default.")
    s3_prefix: str = _setting("", "A folder inside the bucket for this library (e.g. \"picpeak/\"); empty: its root.")
    s3_addressing_style: str = _setting("path", 'How the bucket is named in URLs: "path" or "virtual" (bucket.host).')
    s3_access_key_id: str = _setting("", "Access key; empty: AWS_ACCESS_KEY_ID from the environment.")
    s3_secret_access_key: str = _setting("", "Secret key; empty: AWS_SECRET_ACCESS_KEY from the environment.")
    s3_timeout_seconds: float = _setting(
        5.0, "Longest wait for the bucket to connect or send the next bytes; a frozen bucket answers 503 after it.")
    s3_presigned_redirects: bool = _setting(
        False, "Send guests to a short-lived signed bucket URL (after the access check) instead of through the server.")

    @property
    def listen_address(self) -> str:
        """``host:port`` as in a URL (an IPv6 host in brackets): what the server binds, and its links' fallback."""
        return f"[{self.host}]:{self.port}" if ":" in self.host else f"{self.host}:{self.port}"

    @property
    def data_path(self) -> Path:
        return Path(self.data_dir)

    @property
    def database_path(self) -> Path:
        """The SQLite file (used when ``database_url`` is empty)."""
        return self.data_path / "picpeak.sqlite3"

    @property
    def database(self) -> str:
        """What ``store.db.connect`` and ``Database`` open: the PostgreSQL URL, or the SQLite file's path."""
        return self.database_url or str(self.database_path)

    @property
    def tus_in_bucket(self) -> bool:
        """Whether tus uploads grow as pieces in the bucket (``pipeline/tuspieces.py``): asked for, or "auto" where
        several hosts may share the service (a bucket and PostgreSQL); one host keeps its faster local disk."""
        if self.tus_bytes == "auto":
            return self.storage == "s3" and bool(self.database_url)
        return self.tus_bytes == "bucket"

    @property
    def worker_count(self) -> int:
        return self.workers or (os.cpu_count() or 1)


FIELDS = {f.name: f for f in dataclasses.fields(Settings)}


def load_settings(
    config_file: str | os.PathLike[str] | None = None,
    *,
    environ: Mapping[str, str] | None = None,
    overrides: Mapping[str, Any] | None = None,
) -> Settings:
    """Build Settings from file, environment and flags (``overrides``), highest precedence last."""
    values: dict[str, Any] = {}
    if config_file is not None:
        values.update(_read_file(Path(config_file)))
    values.update(_read_environ(os.environ if environ is None else environ))
    values.update({k: v for k, v in (overrides or {}).items() if v is not None})
    for key in values:
        if key not in FIELDS:
            raise ConfigError(f"unknown setting {key!r}")
    converted = {key: _convert(key, value) for key, value in values.items()}
    settings = Settings(**converted)
    _validate(settings)
    _check_webhook_targets(settings)
    return settings


CONFIG_FILE_NAME = "picpeak.toml"


def find_config_file(explicit: str | None, environ: Mapping[str, str] | None = None,
                     cwd: Path | None = None) -> Path | None:
    """The config file in force: ``--config``, else ``$PICPEAK_CONFIG``, else ``./picpeak.toml`` when the
    working directory has one (what a user who edits the documented file next to the data expects), else none.
    A file named explicitly must exist (``load_settings`` says so); the working-directory one is optional."""
    environ = os.environ if environ is None else environ
    named = explicit or environ.get("PICPEAK_CONFIG")
    if named:
        return Path(named)
    local = (cwd or Path.cwd()) / CONFIG_FILE_NAME
    return local if local.is_file() else None


def _check_webhook_targets(settings: Settings) -> None:
    """A ``[[webhooks]]`` target the sender would refuse whatever DNS answers (a numeric private address,
    ``localhost``, a URL with a password...) is refused here, with the sender's own sentence, instead of being
    retried for hours and refused each time. Names are checked by the sender at every delivery (their answer
    may change) and by the settings page when one is saved there; ``webhook_allow_private`` lets them through.
    """
    for endpoint in settings.webhooks:
        try:
            check_target_offline(endpoint.url, settings.webhook_allow_private)
        except TargetRefused as error:
            raise ConfigError(f"webhook {_without_userinfo(endpoint.url)!r} is refused: {error}") from None


def _read_file(path: Path) -> dict[str, Any]:
    try:
        with path.open("rb") as f:
            data = tomllib.load(f)
    except FileNotFoundError:
        raise ConfigError(f"config file {str(path)!r} not found") from None
    except tomllib.TOMLDecodeError as error:
        raise ConfigError(f"config file {str(path)!r} is not valid TOML: {error}") from None
    for key, value in data.items():
        if key not in FIELDS:
            raise ConfigError(f"unknown setting {key!r} in {str(path)!r}")
        if isinstance(value, dict):
            raise ConfigError(f"setting {key!r} in {str(path)!r} must be a value, not a table")
    return data


def _read_environ(environ: Mapping[str, str]) -> dict[str, Any]:
    values: dict[str, Any] = {}
    for name, value in environ.items():
        if not name.startswith(ENV_PREFIX) or name in _NOT_SETTINGS:
            continue
        key = name[len(ENV_PREFIX) :].lower()
        if key not in FIELDS or key == "webhooks":
            raise ConfigError(f"unknown setting in environment variable {name}")
        values[key] = value
    return values


# Environment variables with our prefix that are not settings.
_NOT_SETTINGS = {"PICPEAK_ADMIN_PASSWORD", "PICPEAK_CONFIG", "PICPEAK_DEBUG_LAG_LOG"}


def _convert(key: str, value: Any) -> Any:
    kind = FIELDS[key].type
    if key == "webhooks":
        return _convert_webhooks(value)  # its own errors: the generic "(got ...)" would print the secrets
    try:
        if kind == "bool":
            if isinstance(value, bool):
                return value
            if isinstance(value, str) and value.lower() in ("1", "true", "yes", "on"):
                return True
            if isinstance(value, str) and value.lower() in ("0", "false", "no", "off"):
                return False
            raise ValueError("expected true or false")
        if kind == "int":
            # int() of a bad string says "invalid literal for int() with base 10": not a sentence for people.
            if isinstance(value, str) and re.fullmatch(r"\s*[+-]?\d+\s*", value):
                return int(value)
            if isinstance(value, int) and not isinstance(value, bool):
                return value
            if isinstance(value, float) and value.is_integer():
                return int(value)
            raise ValueError("expected a whole number")
        if kind == "float":
            if isinstance(value, str):
                try:
                    number = float(value)
                except ValueError:
                    raise ValueError("expected a number") from None
                if math.isfinite(number):
                    return number
                raise ValueError("expected a number")
            if isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value):
                return float(value)
            raise ValueError("expected a number")
        if kind == "str":
            if not isinstance(value, str):
                raise ValueError("expected a string")
            return value
        if kind == "tuple[str, ...]":
            # A TOML list of strings, or (as environment variables must be) one comma-separated string.
            items = value.split(",") if isinstance(value, str) else value
            if not isinstance(items, list | tuple) or not all(isinstance(item, str) for item in items):
                raise ValueError("expected a list of strings")
            return tuple(item.strip() for item in items if item.strip())
    except (TypeError, ValueError) as error:
        raise ConfigError(f"setting {key!r}: {error} (got {value!r})") from None
    raise AssertionError(f"no converter for {key}")


def _convert_webhooks(value: Any) -> tuple[WebhookEndpoint, ...]:
    """The ``[[webhooks]]`` tables. A refusal names the table by its position and URL and says the rule; it
    never repeats the table's values, because one of them is the secret (config errors are printed to the
    terminal and the journal)."""
    if not isinstance(value, list):
        raise ConfigError("setting 'webhooks': expected [[webhooks]] tables")
    endpoints = []
    for number, item in enumerate(value, start=1):
        if not isinstance(item, dict):
            raise ConfigError(f"[[webhooks]] table {number}: expected a table with url, secret and events")
        url, secret = item.get("url"), item.get("secret")
        which = f"[[webhooks]] table {number}" + (f" ({_without_userinfo(url)})" if isinstance(url, str) else "")
        unknown = set(item) - {"url", "secret", "events"}
        if unknown:
            raise ConfigError(f"{which}: unknown key {sorted(unknown)[0]!r}")
        if not isinstance(url, str) or not url.startswith(("http://", "https://")):
            raise ConfigError(f"{which}: each webhook needs an http(s) url")
        if not isinstance(secret, str) or len(secret) < 16:
            raise ConfigError(f"{which}: each webhook needs a secret of at least 16 characters")
        events = item.get("events", WEBHOOK_EVENTS)
        if not isinstance(events, list | tuple) or not all(isinstance(e, str) for e in events):
            raise ConfigError(f"{which}: events must be a list of event names")
        bad = [e for e in events if e not in WEBHOOK_EVENTS]
        if bad:
            raise ConfigError(f"{which}: unknown webhook event {bad[0]!r}")
        endpoints.append(WebhookEndpoint(url=url, secret=secret, events=tuple(events)))
    return tuple(endpoints)


def _without_userinfo(url: str) -> str:
    """A URL as it may be printed: a password in it (``https://user:pass@host/``) is left out."""
    scheme, sep, rest = url.partition("://")
    if not sep:
        return url
    authority, slash, path = rest.partition("/")
    return f"{scheme}://{authority.rpartition('@')[2]}{slash}{path}"


def _validate(s: Settings) -> None:
    def require(ok: bool, key: str, what: str) -> None:
        if not ok:
            raise ConfigError(f"setting {key!r} {what} (got {getattr(s, key)!r})")

    require(0 <= s.port <= 65535, "port", "must be between 0 and 65535")
    require(s.log_level in ("debug", "info", "warning", "error"), "log_level", "must be debug, info, warning or error")
    require(1 <= s.default_expiry_days <= 365, "default_expiry_days", "must be between 1 and 365")
    require(not s.database_url or s.database_url.startswith(("postgresql://", "postgres://")), "database_url",
            "must be empty (SQLite in data_dir) or a postgresql:// URL")
    require(s.archive_on_expiry in ("keep", "archive"), "archive_on_expiry", 'must be "keep" or "archive"')
    require(s.archive_check_seconds >= 1, "archive_check_seconds", "must be at least 1")
    require(s.default_language in LANGUAGES, "default_language", "must be one of " + ", ".join(LANGUAGES))
    for key in ("admin_max_file_mb", "admin_max_files", "guest_max_file_mb", "guest_max_files", "guest_max_video_mb",
                "guest_max_video_seconds",
                "gallery_photo_cap", "max_attempts", "session_days", "login_attempts", "login_window_seconds",
                "login_backoff_seconds", "audit_retention_days",
                "tus_expiry_hours", "tus_idle_minutes", "tus_unfinished_mb_per_client",
                "tus_unfinished_mb_per_gallery", "tus_finish_attempts", "upload_chunk_mb"):
        require(getattr(s, key) >= 1, key, "must be at least 1")
    require(s.max_connections >= 0, "max_connections", "must be 0 (from the fd limit) or more")
    require(s.max_websockets >= 0, "max_websockets", "must be 0 (only max_connections) or more")
    require(s.connections_per_client >= 1, "connections_per_client", "must be at least 1")
    require(s.min_body_rate_kb >= 0, "min_body_rate_kb", "must be 0 (no minimum) or more")
    require(s.body_rate_window_seconds >= 1, "body_rate_window_seconds", "must be at least 1")
    require(0.1 <= s.hot_folder_settle_seconds <= 600, "hot_folder_settle_seconds", "must be between 0.1 and 600")
    require(s.upload_lead >= 0, "upload_lead", "must be 0 (no limit) or more")
    require(s.workers >= 0, "workers", "must be 0 (one per core) or more")
    require(1 <= s.processes <= 64, "processes", "must be from 1 to 64")
    require(0 <= s.image_nice <= 19, "image_nice", "must be between 0 (the server's own priority) and 19")
    require(s.lease_seconds >= 5, "lease_seconds", "must be at least 5")
    require(s.max_pixels >= 100, "max_pixels", "must be at least 100")
    require(s.guest_max_pixels >= 100, "guest_max_pixels", "must be at least 100")
    require(s.decode_memory_mb >= 64, "decode_memory_mb", "must be at least 64")
    require(s.decode_deadline_seconds >= 1, "decode_deadline_seconds", "must be at least 1")
    require(s.video_deadline_seconds >= 5, "video_deadline_seconds", "must be at least 5")
    require(s.media_children >= 2, "media_children", "must be at least 2 (a paused preview holds one)")
    require(64 <= s.grid_px <= s.view_px <= 8192, "grid_px", "must be between 64 and view_px (at most 8192)")
    require(60 <= s.jpeg_quality <= 95, "jpeg_quality", "must be between 60 and 95")
    require(s.watermark_position in WATERMARK_POSITIONS, "watermark_position",
            "must be one of " + ", ".join(WATERMARK_POSITIONS))
    require(0.05 <= s.watermark_opacity <= 1, "watermark_opacity", "must be between 0.05 and 1")
    require(0.02 <= s.watermark_size <= 1, "watermark_size", "must be between 0.02 and 1")
    require(s.smtp_security in SMTP_SECURITY, "smtp_security", 'must be "starttls", "tls" or "none"')
    require(1 <= s.smtp_port <= 65535, "smtp_port", "must be between 1 and 65535")
    require(1 <= s.email_reminder_days <= 60, "email_reminder_days", "must be between 1 and 60")
    require(s.email_digest_minutes >= 5, "email_digest_minutes", "must be at least 5")
    require(1 <= s.email_per_minute <= 1000, "email_per_minute", "must be between 1 and 1000")
    require(not any(c in s.email_from for c in "\r\n"), "email_from", "must be one line")
    require(s.email_from == "" or "@" in s.email_from, "email_from", "must be an email address")
    require(s.storage in ("local", "s3"), "storage", 'must be "local" or "s3"')
    require(s.tus_bytes in ("auto", "local", "bucket"), "tus_bytes", 'must be "auto", "local" or "bucket"')
    require(s.tus_bytes != "bucket" or s.storage == "s3", "tus_bytes", 'may be "bucket" only with storage = "s3"')
    require(s.storage != "s3" or bool(s.s3_bucket), "s3_bucket", 'must name a bucket when storage = "s3"')
    require(1 <= s.s3_timeout_seconds <= 300, "s3_timeout_seconds", "must be between 1 and 300")
    require(s.s3_addressing_style in ("path", "virtual"), "s3_addressing_style", 'must be "path" or "virtual"')
    require(s.s3_endpoint_url == "" or s.s3_endpoint_url.startswith(("http://", "https://")), "s3_endpoint_url",
            "must start with http:// or https://")
    require(s.public_url == "" or s.public_url.startswith(("http://", "https://")), "public_url",
            "must start with http:// or https://")
    for entry in s.allowed_hosts:
        try:
            split_host(entry)
        except ValueError:
            raise ConfigError(f"setting 'allowed_hosts': {entry!r} is not a host or host:port "
                              "(e.g. photos.example.com or 192.168.1.10:8080; no scheme, no path)") from None


HOST_NAME = re.compile(r"[a-z0-9_]([a-z0-9_-]*[a-z0-9_])?(\.[a-z0-9_]([a-z0-9_-]*[a-z0-9_])?)*")


def split_host(text: str) -> tuple[str, int | None]:
    """``host[:port]`` (a name, an IPv4 address or a bracketed IPv6 one) as (lower-case host, port or None).

    Shared by the ``allowed_hosts`` check here and by the web layer, which reads a request's Host header with it:
    anything else (a scheme, a path, user info, a bad port) is a ValueError, so it is never trusted.
    """
    text = text.strip().lower()
    if text.startswith("["):
        end = text.find("]")
        if end < 0:
            raise ValueError("unclosed [")
        host, rest = text[1:end], text[end + 1:]
        ipaddress.IPv6Address(host)  # ValueError when it is not one
    else:
        host, colon, port_text = text.partition(":")
        rest = colon + port_text
        host = host.removesuffix(".")
        if not HOST_NAME.fullmatch(host) or len(host) > 253:
            raise ValueError("not a host name")
    if not rest:
        return host, None
    port_text = rest[1:]
    if not rest.startswith(":") or not port_text.isascii() or not port_text.isdigit() or len(port_text) > 5:
        raise ValueError("not a port")
    port = int(port_text)
    if not 1 <= port <= 65535:
        raise ValueError("not a port")
    return host, port
