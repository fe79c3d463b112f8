"""The `picpeak-lite` command in a subprocess, as a user runs it."""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import sys
import urllib.request
from pathlib import Path

import pytest

from . import pgserver


def run_cli(*args: str, env: dict[str, str] | None = None, stdin: str | None = None,
            cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "picpeak_lite", *args], capture_output=True, text=True, timeout=60,
        env={**os.environ, **pgserver.env_for(args), **(env or {})}, input=stdin, cwd=cwd,
    )


def stored_text(data_dir: Path) -> str:
    """Everything the database holds, as text: the SQLite file's bytes, or every PostgreSQL table's rows."""
    database = pgserver.database_for(data_dir)
    if database is None:
        return (data_dir / "picpeak.sqlite3").read_bytes().decode("latin-1")
    from picpeak_lite.store import db

    conn = db.connect(database)
    try:
        tables = [r["table_name"] for r in conn.execute(
            "SELECT table_name FROM information_schema.tables WHERE table_schema = current_schema()").fetchall()]
        return "\n".join(repr(conn.execute(f'SELECT * FROM "{t}"').fetchall()) for t in tables)
    finally:
        conn.close()


def start_serve(
    data_dir: Path, *extra: str, env: dict[str, str] | None = None, cwd: Path | None = None
) -> tuple[subprocess.Popen[str], str, list[str]]:
    proc = subprocess.Popen(
        [sys.executable, "-m", "picpeak_lite", "serve", "--port", "0", "--data-dir", str(data_dir), *extra],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        env={**os.environ, **pgserver.env_for(["--data-dir", str(data_dir)]), **(env or {})}, cwd=cwd,
    )
    assert proc.stdout is not None
    lines: list[str] = []
    for line in proc.stdout:
        lines.append(line)
        match = re.search(r"running at (http://127\.0\.0\.1:\d+)/admin", line)
        if match:
            return proc, match.group(1), lines
    proc.kill()
    raise AssertionError("server did not print its URL:\n" + "".join(lines))


def stop(proc: subprocess.Popen[str]) -> str:
    proc.send_signal(signal.SIGTERM)
    out, _ = proc.communicate(timeout=30)
    assert proc.returncode == 0, out
    return out


def test_serve_port_zero_prints_url_health_and_clean_sigterm(tmp_path: Path) -> None:
    data = tmp_path / "data"
    proc, url, lines = start_serve(data)
    try:
        with urllib.request.urlopen(url + "/healthz", timeout=120) as response:
            assert json.load(response) == {"status": "ok"}
    finally:
        out = stop(proc)
    printed = "".join(lines) + out
    match = re.search(r"the password: (\S+)", printed)
    assert match, printed
    assert "Traceback" not in printed and "Stopped." in printed
    # Second start: the password is never printed again.
    proc, _, lines = start_serve(data)
    assert "password" not in "".join(lines) + stop(proc)


def test_admin_password_from_environment(tmp_path: Path) -> None:
    proc, _, lines = start_serve(tmp_path / "d", env={"PICPEAK_ADMIN_PASSWORD": "from the environment"})
    out = stop(proc)
    assert "password:" not in "".join(lines) + out


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["serve", "--bogus"], "No such option"),
        (["serve", "--port", "abc"], "'abc' is not a valid integer"),
        (["serve", "--port", "99999"], "between 0 and 65535"),
        (["serve", "--config", "/nonexistent.toml"], "not found"),
        (["frobnicate"], "No such command"),
    ],
)
def test_bad_flags_print_one_line_and_exit_non_zero(args: list[str], message: str) -> None:
    result = run_cli(*args)
    assert result.returncode != 0
    assert message in result.stderr
    assert "Traceback" not in result.stderr + result.stdout
    assert len(result.stderr.strip().splitlines()) == 1, result.stderr


def test_unknown_config_key(tmp_path: Path) -> None:
    config = tmp_path / "picpeak.toml"
    config.write_text("guest_max_filez = 3\n")
    result = run_cli("serve", "--config", str(config))
    assert result.returncode == 2
    assert result.stderr.strip() == f"picpeak-lite: error: unknown setting 'guest_max_filez' in '{config}'"


def test_help_on_every_option() -> None:
    for command in (["serve"], ["admin", "set-password"], ["admin", "token", "create"],
                    ["admin", "token", "revoke"]):
        result = run_cli(*command, "--help")
        assert result.returncode == 0
        options = re.findall(r"^\s+(--[\w-]+)(.*)$", result.stdout, re.MULTILINE)
        assert options, result.stdout
        for name, rest in options:
            assert rest.strip(), f"{command} {name} has no help text"


def test_tokens_and_password_commands(tmp_path: Path) -> None:
    data = str(tmp_path / "d")
    created = run_cli("admin", "token", "create", "--name", "lightroom", "--data-dir", data)
    assert created.returncode == 0, created.stderr
    token = created.stdout.strip()
    assert token.startswith("ppk_") and len(token) > 40
    assert token not in stored_text(tmp_path / "d")  # only the hash is stored
    again = run_cli("admin", "token", "create", "--name", "lightroom", "--data-dir", data)
    assert again.returncode == 2 and "exists already" in again.stderr
    listed = run_cli("admin", "token", "list", "--data-dir", data)
    assert "lightroom\tactive" in listed.stdout
    revoked = run_cli("admin", "token", "revoke", "--name", "lightroom", "--data-dir", data)
    assert revoked.returncode == 0
    assert run_cli("admin", "token", "revoke", "--name", "lightroom", "--data-dir", data).returncode == 2
    short = run_cli("admin", "set-password", "--password-stdin", "--data-dir", data, stdin="short\n")
    assert short.returncode == 2 and "at least 8" in short.stderr
    ok = run_cli("admin", "set-password", "--password-stdin", "--data-dir", data, stdin="a long password\n")
    assert ok.returncode == 0, ok.stderr


def test_import_command_adds_then_skips(tmp_path: Path) -> None:
    from PIL import Image

    data = str(tmp_path / "d")
    folder = tmp_path / "photos"
    folder.mkdir()
    for i in range(3):
        Image.new("RGB", (64 + i, 48), (i * 40, 90, 200)).save(folder / f"img{i}.jpg", quality=90)
    (folder / "notes.txt").write_text("not a photo")
    (folder / "fake.jpg").write_text("<html>not a photo</html>")
    (folder / "DCIM" / "100CANON").mkdir(parents=True)  # a card's layout: its photos are found too
    Image.new("RGB", (80, 60), (9, 90, 20)).save(folder / "DCIM" / "100CANON" / "IMG_0030.JPG", quality=90)
    (folder / ".Trashes").mkdir()
    created = run_cli("admin", "token", "create", "--name", "t", "--data-dir", data)
    assert created.returncode == 0
    from picpeak_lite.store import db

    conn = db.connect(pgserver.database_for(tmp_path / "d") or tmp_path / "d" / "picpeak.sqlite3")
    with db.transaction(conn):
        conn.execute("INSERT INTO galleries (slug, share_token, name, created_at, updated_at) "
                     "VALUES ('wedding-abcdefgh', 't', 'W', 0, 0)")
    conn.close()
    first = run_cli("import", str(folder), "--gallery", "wedding-abcdefgh", "--data-dir", data)
    assert first.returncode == 1  # one file was not an image
    assert "Added 4, skipped 0 already there, 1 error, 1 other file ignored." in first.stdout
    assert "Not looked in (hidden or system folders): .Trashes." in first.stdout
    assert "fake.jpg: " in first.stderr
    second = run_cli("import", str(folder), "--gallery", "wedding-abcdefgh", "--data-dir", data)
    assert "Added 0, skipped 4 already there" in second.stdout
    unknown = run_cli("import", str(folder), "--gallery", "nope", "--data-dir", data)
    assert unknown.returncode == 2 and len(unknown.stderr.strip().splitlines()) == 1


def test_worker_command_starts_and_stops_on_sigterm(tmp_path: Path) -> None:
    proc = subprocess.Popen(
        [sys.executable, "-m", "picpeak_lite", "worker", "--data-dir", str(tmp_path / "d"), "--workers", "1"],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, cwd=tmp_path,
    )
    assert proc.stdout is not None
    first = proc.stdout.readline()
    assert "config: no file" in first, first  # the log line saying which config is in force comes first
    line = proc.stdout.readline()
    assert "Processing photos in" in line, line
    assert stop(proc).strip().endswith("Stopped.")


def test_version() -> None:
    from importlib.metadata import version

    result = run_cli("--version")
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == f"picpeak-lite {version('picpeak-lite')}"


@pytest.mark.parametrize("columns", ["80", "50"])
def test_top_level_help_shows_every_command_description_whole(columns: str) -> None:
    result = run_cli("--help", env={"COLUMNS": columns})
    assert result.returncode == 0
    listing = result.stdout.split("Commands:")[1]
    assert "..." not in listing, result.stdout
    commands = re.findall(r"^  (\w[\w-]*)\s+(\S.*)$", listing, re.MULTILINE)
    assert [name for name, _ in commands] == ["admin", "backup", "bench", "check", "db", "email", "gallery", "import",
                                              "restore", "serve", "storage", "watch", "worker"]
    admin = run_cli("admin", "--help", env={"COLUMNS": columns}).stdout.split("Commands:")[1]
    assert "..." not in admin and "set-password" in admin


def test_port_in_use_is_one_line_before_any_first_start_work(tmp_path: Path) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        result = run_cli("serve", "--port", str(port), "--data-dir", str(tmp_path / "d"), cwd=tmp_path)
    assert result.returncode == 2
    assert result.stderr.strip() == (
        f"picpeak-lite: error: cannot listen on 127.0.0.1:{port}: the address is already in use "
        "(is picpeak-lite already running?); choose another port with --port")
    assert result.stdout == ""  # in particular no admin password, which would be lost above the error
    assert not (tmp_path / "d").exists()


def test_picpeak_toml_in_the_working_directory_is_read_and_named(tmp_path: Path) -> None:
    (tmp_path / "picpeak.toml").write_text('port = "abc"\n')
    result = run_cli("serve", cwd=tmp_path)
    assert result.returncode == 2
    assert result.stderr.strip() == "picpeak-lite: error: setting 'port': expected a whole number (got 'abc')"
    # --config wins over the working directory's file.
    other = tmp_path / "other.toml"
    other.write_text("")
    proc, _, lines = start_serve(tmp_path / "d", "--config", str(other), cwd=tmp_path)
    out = "".join(lines) + stop(proc)
    assert f"config: {other} (then PICPEAK_* environment variables and flags)" in out
    (tmp_path / "picpeak.toml").write_text('guest_max_files = 7\n')
    proc, _, lines = start_serve(tmp_path / "d", cwd=tmp_path)
    out = "".join(lines) + stop(proc)
    assert f"config: {tmp_path / 'picpeak.toml'} (then" in out
    empty = tmp_path / "empty"
    empty.mkdir()
    proc, _, lines = start_serve(tmp_path / "d", cwd=empty)
    out = "".join(lines) + stop(proc)
    assert "config: no file (built-in defaults, PICPEAK_* environment variables and flags)" in out


@pytest.mark.parametrize(
    ("name", "value", "message"),
    [
        ("PICPEAK_PORT", "abc", "setting 'port': expected a whole number (got 'abc')"),
        ("PICPEAK_PORT", "80.5", "setting 'port': expected a whole number (got '80.5')"),
        ("PICPEAK_LEASE_SECONDS", "soon", "setting 'lease_seconds': expected a number (got 'soon')"),
    ],
)
def test_bad_numbers_in_the_environment_are_a_sentence(tmp_path: Path, name: str, value: str, message: str) -> None:
    result = run_cli("serve", env={name: value}, cwd=tmp_path)
    assert result.returncode == 2
    assert result.stderr.strip() == f"picpeak-lite: error: {message}"


def test_short_webhook_secret_error_names_the_endpoint_not_the_secret(tmp_path: Path) -> None:
    """Issue 35 #3, as the user sees it: one line naming the [[webhooks]] table and the rule, no secret."""
    config = tmp_path / "picpeak.toml"
    config.write_text("[[webhooks]]\nurl = 'https://user:pw@hooks.example.com/in'\nsecret = 'short-s3cret'\n")
    result = run_cli("serve", "--port", "0", "--config", str(config), "--data-dir", str(tmp_path / "data"))
    assert result.returncode == 2
    assert result.stderr.strip() == (
        "picpeak-lite: error: [[webhooks]] table 1 (https://hooks.example.com/in): each webhook needs a secret "
        "of at least 16 characters"
    )
    assert "short-s3cret" not in result.stderr + result.stdout
    assert "pw@" not in result.stderr
