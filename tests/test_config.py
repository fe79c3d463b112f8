from __future__ import annotations

import re
import tempfile
import tomllib
from pathlib import Path

import pytest

from picpeak_lite.config import FIELDS, Settings, load_settings, split_host
from picpeak_lite.errors import ConfigError

ROOT = Path(__file__).resolve().parent.parent


def test_defaults_need_no_file() -> None:
    settings = load_settings(environ={})
    assert settings == Settings()
    assert (settings.host, settings.port, settings.data_dir) == ("127.0.0.1", 8080, "./picpeak-data")


def test_precedence_flags_over_environment_over_file(tmp_path: Path) -> None:
    config = tmp_path / "picpeak.toml"
    config.write_text('port = 9000\nhost = "0.0.0.0"\nguest_max_files = 7\n')
    env = {"PICPEAK_PORT": "9100", "PICPEAK_GUEST_MAX_FILES": "9"}
    settings = load_settings(config, environ=env, overrides={"port": 9200, "host": None})
    assert settings.port == 9200  # flag
    assert settings.guest_max_files == 9  # environment beats file
    assert settings.host == "0.0.0.0"  # file beats default; a flag left unset does not override


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("prot = 9000\n", "unknown setting 'prot'"),
        ("port = 'abc'\n", "setting 'port'"),
        ("port = 70000\n", "between 0 and 65535"),
        ("processing_enabled = 'maybe'\n", "setting 'processing_enabled'"),
        ("[server]\nport = 1\n", "unknown setting 'server'"),
        ("port = \n", "not valid TOML"),
        ("[[webhooks]]\nurl = 'ftp://x'\nsecret = '0123456789abcdef'\n", "http(s) url"),
        ("[[webhooks]]\nurl = 'https://x'\nsecret = '0123456789abcdef'\nevents = ['photo.eaten']\n",
         "unknown webhook event 'photo.eaten'"),
        ("[[webhooks]]\nurl = 'http://127.0.0.1/x'\nsecret = '0123456789abcdef'\n",
         "webhook 'http://127.0.0.1/x' is refused: '127.0.0.1' resolves to 127.0.0.1, which is not a public address "
         "(set webhook_allow_private to allow it)"),
        ("[[webhooks]]\nurl = 'http://localhost:8000/x'\nsecret = '0123456789abcdef'\n",
         "is refused: 'localhost' is a loopback name"),
        ("allowed_hosts = ['https://photos.example.com']\n", "'https://photos.example.com' is not a host"),
        ("allowed_hosts = ['photos.example.com/g']\n", "is not a host or host:port"),
        ("allowed_hosts = ['photos.lan:0']\n", "'photos.lan:0' is not a host"),
        ("allowed_hosts = ['user@photos.lan']\n", "is not a host"),
        ("allowed_hosts = [8080]\n", "setting 'allowed_hosts': expected a list of strings"),
    ],
)
def test_bad_config_names_the_problem(tmp_path: Path, text: str, message: str) -> None:
    config = tmp_path / "picpeak.toml"
    config.write_text(text)
    with pytest.raises(ConfigError, match=re.escape(message)):
        load_settings(config, environ={})


def test_unknown_environment_variable_is_an_error() -> None:
    with pytest.raises(ConfigError, match="PICPEAK_PROT"):
        load_settings(environ={"PICPEAK_PROT": "1"})
    # The admin password variable is read by bootstrap, not a setting; it must not be refused.
    load_settings(environ={"PICPEAK_ADMIN_PASSWORD": "x" * 10})


def test_missing_file_is_an_error(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="not found"):
        load_settings(tmp_path / "nope.toml", environ={})


def test_webhooks_from_file(tmp_path: Path) -> None:
    config = tmp_path / "picpeak.toml"
    config.write_text(
        "[[webhooks]]\nurl = 'https://hooks.example.com/x'\nsecret = '0123456789abcdef'\n"
        "events = ['photo.uploaded']\n"
    )
    (endpoint,) = load_settings(config, environ={}).webhooks
    assert endpoint.url == "https://hooks.example.com/x"
    assert endpoint.events == ("photo.uploaded",)


def test_example_config_documents_every_key_with_its_default() -> None:
    """picpeak.toml at the repo root lists every setting, commented, with the default value."""
    text = (ROOT / "picpeak.toml").read_text()
    for name, field in FIELDS.items():
        if name == "webhooks":
            assert "[[webhooks]]" in text
            continue
        match = re.search(rf"^# ?{name} = (.+)$", text, re.MULTILINE)
        assert match, f"picpeak.toml does not document {name!r}"
        documented = tomllib.loads(f"v = {match.group(1)}")["v"]
        if isinstance(documented, list):
            documented = tuple(documented)  # a TOML list is a tuple in the frozen Settings
        assert documented == field.default, f"{name}: documented {documented!r}, default {field.default!r}"
    # Uncommenting everything yields a valid file with the defaults.
    names = "|".join(name for name in FIELDS if name != "webhooks")
    uncommented = re.sub(rf"^# ?((?:{names}) = )", r"\1", text, flags=re.MULTILINE)
    assert load_settings(environ={}) == _load_text(uncommented)


def _load_text(text: str) -> Settings:
    with tempfile.NamedTemporaryFile("w", suffix=".toml", delete=False) as f:
        f.write(text)
    return load_settings(f.name, environ={})


def test_allowed_hosts_from_the_file_and_the_environment(tmp_path: Path) -> None:
    config = tmp_path / "picpeak.toml"
    config.write_text('allowed_hosts = ["Photos.LAN", "192.168.1.10:8080", "[fd00::1]:8443"]\n')
    assert load_settings(config, environ={}).allowed_hosts == ("Photos.LAN", "192.168.1.10:8080", "[fd00::1]:8443")
    env = {"PICPEAK_ALLOWED_HOSTS": " photos.lan , 192.168.1.10:8080,,"}
    assert load_settings(environ=env).allowed_hosts == ("photos.lan", "192.168.1.10:8080")
    assert load_settings(environ={}).allowed_hosts == ()


def test_split_host_reads_host_and_port() -> None:
    assert split_host("Photos.LAN") == ("photos.lan", None)
    assert split_host("photos.lan.:8080") == ("photos.lan", 8080)
    assert split_host("[::1]:8080") == ("::1", 8080) and split_host("[FD00::1]") == ("fd00::1", None)
    for bad in ("", "a b", "x:", "x:65536", "x:-1", "[::1]x", "[::1", "[x]:1", "a/b", "a@b", "a:1:2", "-a"):
        with pytest.raises(ValueError):
            split_host(bad)


def test_short_webhook_secret_is_named_by_its_endpoint_never_printed(tmp_path: Path) -> None:
    """Issue 35 #3: the error used to end in "(got [{'url': ..., 'secret': 'tooshort-s3cret'}])", the secret
    on the terminal and in the journal. It names the table by position and URL, and the rule."""
    config = tmp_path / "picpeak.toml"
    config.write_text(
        "[[webhooks]]\nurl = 'https://hooks.example.com/ok'\nsecret = 'a-long-enough-secret-1'\n"
        "[[webhooks]]\nurl = 'https://hooks.example.com/short'\nsecret = 'tooshort-s3cret'\n"
    )
    with pytest.raises(ConfigError) as caught:
        load_settings(config, environ={})
    message = str(caught.value)
    assert message == ("[[webhooks]] table 2 (https://hooks.example.com/short): each webhook needs a secret of "
                       "at least 16 characters")
    assert "tooshort-s3cret" not in message and "a-long-enough-secret-1" not in message


def test_a_loaded_webhook_secret_is_not_in_the_settings_repr(tmp_path: Path) -> None:
    config = tmp_path / "picpeak.toml"
    config.write_text("[[webhooks]]\nurl = 'https://hooks.example.com/x'\nsecret = 'the-real-secret-value'\n")
    settings = load_settings(config, environ={})
    assert settings.webhooks[0].secret == "the-real-secret-value"
    assert "the-real-secret-value" not in repr(settings)
