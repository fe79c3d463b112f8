"""The deployment recipes the README shows (deploy/, Dockerfile) and the packaging table in pyproject.toml,
checked against the code they describe: what can be run here is run (the systemd unit's ExecStart, with its
config file, behind a simulated proxy), the rest is read and compared with pyproject and the settings."""

from __future__ import annotations

import configparser
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import tomllib
import urllib.request
from pathlib import Path
from typing import Any

import pytest

from picpeak_lite.config import load_settings

ROOT = Path(__file__).resolve().parent.parent
DEPLOY = ROOT / "deploy"
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())
SCRIPT = next(iter(PYPROJECT["project"]["scripts"]))  # picpeak-lite


def unit_exec_start() -> list[str]:
    return shlex.split(_unit_service()["ExecStart"])


def test_pyproject_lists_every_package_and_maps_templates_and_static() -> None:
    setuptools = PYPROJECT["tool"]["setuptools"]
    on_disk = sorted(".".join(p.parent.relative_to(ROOT).parts) for p in (ROOT / "picpeak_lite").rglob("__init__.py"))
    listed = setuptools["packages"]
    assert sorted(p for p in listed if p not in setuptools["package-dir"]) == on_disk
    assert setuptools["package-dir"] == {"picpeak_lite.templates": "templates", "picpeak_lite.static": "static"}
    for package, folder in setuptools["package-dir"].items():
        assert package in listed and (ROOT / folder).is_dir()
        patterns = setuptools["package-data"][package]
        matched = {p for pattern in patterns for p in (ROOT / folder).glob(pattern) if p.is_file()}
        assert matched == {p for p in (ROOT / folder).rglob("*") if p.is_file()}, folder


def test_systemd_unit_exec_start_runs_with_the_deploy_config(tmp_path: Path) -> None:
    """ExecStart, with the unit's paths moved into tmp_path, starts the server on deploy/picpeak.toml; a request
    arriving from the proxy's address with X-Forwarded-For is logged under the client's address."""
    argv = unit_exec_start()
    assert argv[0].endswith(f"/bin/{SCRIPT}")
    config = tmp_path / "etc" / "picpeak.toml"
    config.parent.mkdir()
    shutil.copy(DEPLOY / "picpeak.toml", config)
    state = tmp_path / "var"
    state.mkdir()
    args = [a.replace("/etc/picpeak/picpeak.toml", str(config)).replace("/var/lib/picpeak", str(state))
            for a in argv[1:]]
    assert str(config) in args and any(str(state) in a for a in args), args
    # The file's port 8080 may be taken on a CI box: the environment overrides the file, flags would override both.
    proc = subprocess.Popen([sys.executable, "-m", "picpeak_lite", *args], cwd=state, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            env={**os.environ, "PICPEAK_PORT": "0", "PICPEAK_ADMIN_PASSWORD": "deploy test pw"})
    assert proc.stdout is not None
    lines: list[str] = []
    for line in proc.stdout:
        lines.append(line)
        if match := re.search(r"running at (http://127\.0\.0\.1:\d+)/admin", line):
            url = match.group(1)
            break
    else:
        raise AssertionError("".join(lines))
    try:
        request = urllib.request.Request(url + "/healthz", headers={"X-Forwarded-For": "198.51.100.23"})
        with urllib.request.urlopen(request, timeout=120) as response:
            assert response.status == 200
    finally:
        proc.send_signal(signal.SIGTERM)
        out, _ = proc.communicate(timeout=60)
    printed = "".join(lines) + out
    assert proc.returncode == 0, printed
    assert f"config: {config}" in printed
    assert '198.51.100.23 "GET /healthz HTTP/1.1" 200' in printed, printed
    assert (state / "data" / "picpeak.sqlite3").exists()


@pytest.mark.skipif(shutil.which("systemd-analyze") is None, reason="systemd-analyze is not installed")
def test_systemd_unit_passes_systemd_analyze_verify(tmp_path: Path) -> None:
    # verify wants ExecStart's program to exist: point it at this venv's script of the same name.
    script = Path(sys.executable).parent / SCRIPT
    assert script.exists()
    text = (DEPLOY / "picpeak-lite.service").read_text().replace(unit_exec_start()[0], str(script))
    unit = tmp_path / "picpeak-lite.service"
    unit.write_text(text)
    result = subprocess.run(["systemd-analyze", "verify", str(unit)], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0 and not result.stderr.strip(), result.stderr


def test_proxy_snippets_match_the_deploy_config() -> None:
    settings = load_settings(DEPLOY / "picpeak.toml", environ={})
    upstream = f"{settings.host}:{settings.port}"
    assert settings.host in {p.strip() for p in settings.trusted_proxies.split(",")}
    assert settings.secure_cookies and settings.public_url.startswith("https://")
    caddy = (DEPLOY / "Caddyfile").read_text()
    assert re.search(rf"^\s*reverse_proxy {re.escape(upstream)}\b", caddy, re.MULTILINE)
    assert "max_size" not in caddy  # no body limit in front of the app's own
    nginx = (DEPLOY / "nginx.conf").read_text()
    directives = {line.strip().rstrip(";") for line in nginx.splitlines() if line.strip().endswith(";")}
    for expected in (f"proxy_pass http://{upstream}", "client_max_body_size 0", "proxy_request_buffering off",
                     "proxy_http_version 1.1", "proxy_set_header Upgrade $http_upgrade",
                     "proxy_set_header Connection $connection_upgrade",
                     "proxy_set_header X-Forwarded-For $proxy_add_x_forwarded_for"):
        assert expected in directives, expected
    assert re.search(r"map \$http_upgrade \$connection_upgrade", nginx)


def _nginx() -> str | None:
    # Debian puts it in /usr/sbin, which a non-root user's PATH may lack.
    return shutil.which("nginx") or next((p for p in ("/usr/sbin/nginx", "/usr/local/sbin/nginx")
                                          if os.access(p, os.X_OK)), None)


def test_the_nginx_snippet_passes_nginx_t(tmp_path: Path) -> None:
    """Issue 35 #1: the snippet used "http2 on;" (nginx 1.25.1+), which Debian 12's nginx 1.22 refuses, and had no
    port-80 redirect. Here Debian's nginx (in .ci/apt-packages) checks it, inside a minimal nginx.conf whose
    certificate is a self-signed one made for the test; nothing is started."""
    nginx_t(tmp_path, DEPLOY / "nginx.conf")


def test_the_several_hosts_nginx_snippet_passes_nginx_t(tmp_path: Path) -> None:
    nginx_t(tmp_path, DEPLOY / "nginx-several-hosts.conf")


def nginx_t(tmp_path: Path, path: Path) -> None:
    nginx = _nginx()
    if nginx is None:
        pytest.skip("no nginx binary (CI installs Debian's: .ci/apt-packages)")
    key, cert = tmp_path / "privkey.pem", tmp_path / "fullchain.pem"
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "2", "-subj",
                    "/CN=photos.example.com", "-keyout", str(key), "-out", str(cert)],
                   check=True, capture_output=True, timeout=120)
    snippet = path.read_text()
    snippet = snippet.replace("/etc/letsencrypt/live/photos.example.com/fullchain.pem", str(cert))
    snippet = snippet.replace("/etc/letsencrypt/live/photos.example.com/privkey.pem", str(key))
    assert str(cert) in snippet and str(key) in snippet
    (tmp_path / "picpeak.conf").write_text(snippet)
    temp = "\n".join(f"    {name}_temp_path {tmp_path / name};" for name in ("client_body", "proxy", "fastcgi",
                                                                              "uwsgi", "scgi"))
    (tmp_path / "nginx.conf").write_text(
        f"pid {tmp_path / 'nginx.pid'};\nerror_log {tmp_path / 'error.log'};\nevents {{}}\nhttp {{\n"
        f"    access_log off;\n{temp}\n    include {tmp_path / 'picpeak.conf'};\n}}\n")
    result = subprocess.run([nginx, "-t", "-p", str(tmp_path), "-c", str(tmp_path / "nginx.conf"),
                             "-g", f"error_log {tmp_path / 'error.log'};"],
                            capture_output=True, text=True, timeout=60)
    print(result.stderr)
    assert result.returncode == 0, result.stderr
    assert "syntax is ok" in result.stderr and "[warn]" not in result.stderr and "[emerg]" not in result.stderr
    # Plain HTTP is only a redirect to HTTPS, for the same name.
    redirect = re.search(r"server \{\s*listen 80;\s*server_name ([^;]+);\s*return 301 https://\$host\$request_uri;",
                         snippet)
    assert redirect and redirect.group(1) == re.search(r"listen 443 ssl http2;\s*server_name ([^;]+);",
                                                       snippet).group(1)  # type: ignore[union-attr]


def test_ci_installs_nginx_and_caddy_for_the_snippet_checks() -> None:
    packages = (ROOT / ".ci" / "apt-packages").read_text().split()
    assert "nginx" in packages and "caddy" in packages


# --- several hosts (deploy/several-hosts.md) -----------------------------------------------------------------

SEVERAL = DEPLOY / "several-hosts.md"


def several_hosts_settings(tmp_path: Path) -> Any:
    """The recipe's picpeak.toml (its one toml block), loaded as a host loads it."""
    block = SEVERAL.read_text().split("```toml\n", 1)[1].split("```", 1)[0]
    (tmp_path / "picpeak.toml").write_text(block)
    return load_settings(tmp_path / "picpeak.toml", environ={})


def test_the_several_hosts_config_shares_the_database_and_the_bucket(tmp_path: Path) -> None:
    settings = several_hosts_settings(tmp_path)
    assert settings.database_url.startswith("postgresql://") and settings.storage == "s3" and settings.s3_bucket
    assert settings.public_url.startswith("https://") and settings.secure_cookies
    assert "data_dir" not in SEVERAL.read_text().split("```toml", 1)[1].split("```", 1)[0]  # each host's own disk


def test_the_several_hosts_balancers_name_the_same_hosts_without_stickiness(tmp_path: Path) -> None:
    settings = several_hosts_settings(tmp_path)
    balancer = settings.trusted_proxies.strip()
    nginx = (DEPLOY / "nginx-several-hosts.conf").read_text()
    caddy = (DEPLOY / "Caddyfile.several-hosts").read_text()
    assert f'trusted_proxies = "{balancer}"' in nginx and f'trusted_proxies = "{balancer}"' in caddy
    upstreams = {name: body for name, body in re.findall(r"upstream (\w+) \{(.*?)\}", nginx, re.DOTALL)}
    hosts = re.findall(r"server (\S+?:\d+)", upstreams["picpeak"])
    assert len(hosts) >= 2 and all(h.endswith(f":{settings.port}") for h in hosts)
    # Any host answers any request, the PATCHes of one tus upload too (its pieces are in the bucket: tus_bytes).
    assert list(upstreams) == ["picpeak"] and "/tus" not in nginx
    assert not re.search(r"\b(ip_hash|hash|sticky)\b", nginx)
    directives = {line.strip().rstrip(";") for line in nginx.splitlines() if line.strip().endswith(";")}
    for expected in ("proxy_pass http://picpeak", "client_max_body_size 0", "proxy_request_buffering off",
                     "proxy_http_version 1.1", "proxy_set_header Upgrade $http_upgrade",
                     "proxy_set_header Connection $picpeak_connection",
                     "proxy_set_header X-Forwarded-For $proxy_add_x_forwarded_for",
                     "proxy_next_upstream error timeout"):
        assert expected in directives, expected
    assert "non_idempotent" not in nginx  # an upload a host began to read is never sent to another
    assert not re.search(r"^\s*keepalive ", nginx, re.MULTILINE)  # a stopping host refuses; it drops no upload
    proxies = re.findall(r"reverse_proxy ([^{]+)\{(.*?)\}", caddy, re.DOTALL)
    assert len(proxies) == 1
    targets, body = proxies[0]
    assert targets.split() == hosts
    assert "health_uri /healthz" in body and "max_size" not in body
    assert re.search(r"transport http \{\s*keepalive off", body)
    assert "lb_policy least_conn" in body and "lb_policy cookie" not in caddy and "@tus" not in caddy


def _caddy() -> str | None:
    return shutil.which("caddy")


@pytest.mark.parametrize("name", ["Caddyfile", "Caddyfile.several-hosts"])
def test_the_caddyfiles_adapt(name: str) -> None:
    """``caddy adapt``: the Caddyfile parses and every directive and option is one this Caddy knows (nothing is
    started, no certificate is asked for)."""
    caddy = _caddy()
    if caddy is None:
        pytest.skip("no caddy binary (CI installs Debian's: .ci/apt-packages)")
    result = subprocess.run([caddy, "adapt", "--adapter", "caddyfile", "--config", str(DEPLOY / name)],
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    assert "reverse_proxy" in result.stdout


def test_the_readme_points_to_the_several_hosts_recipe() -> None:
    readme = (ROOT / "README.md").read_text()
    section = readme.split("## Several hosts", 1)[1].split("\n## ", 1)[0]
    assert "deploy/several-hosts.md" in section and SEVERAL.exists()
    recipe = SEVERAL.read_text()
    for name in ("Caddyfile.several-hosts", "nginx-several-hosts.conf"):
        assert f"]({name})" in recipe and (DEPLOY / name).exists()


def _unit_service() -> configparser.SectionProxy:
    unit = configparser.ConfigParser(interpolation=None, strict=False)
    unit.optionxform = str  # type: ignore[assignment,method-assign]
    unit.read(DEPLOY / "picpeak-lite.service")
    return unit["Service"]


def readme_deploy_commands() -> list[list[str]]:
    """The README's deploy block as commands in order: one per line or ``&&`` step, comments and ``sudo`` off."""
    section = (ROOT / "README.md").read_text().split("## Deploying", 1)[1]
    block = section.split("```sh\n", 1)[1].split("```", 1)[0]
    commands = []
    for line in block.splitlines():
        for step in line.split("#", 1)[0].split("&&"):
            words = shlex.split(step)
            if words and words[0] == "sudo":
                words = words[1:]
            if words:
                commands.append(words)
    return commands


def test_the_readmes_deploy_steps_work_in_their_order(tmp_path: Path) -> None:
    """Issue 35 #2: the README's steps, in order, on a clean Debian machine. systemd cannot run here, so what
    each step needs from the ones before is checked: the service user before its data directory, the data
    directory (owned by that user: useradd --system makes no home, and systemd makes StateDirectory only at the
    first start) before the password is set in it, the password before ``enable --now`` starts the server;
    every picpeak-lite command and flag exists in our CLI; and the set-password step is run with its own flags
    (paths moved into tmp_path), after which the unit's ExecStart starts without generating a password."""
    from picpeak_lite.cli import cli

    service = _unit_service()
    state_dir = "/var/lib/" + service["StateDirectory"]
    user, group = service["User"], service["Group"]
    commands = readme_deploy_commands()

    def index(predicate: Any, what: str) -> int:
        found = [i for i, words in enumerate(commands) if predicate(words)]
        assert found, f"the README's deploy block has no step that {what}"
        return found[0]

    adds_user = index(lambda w: w[0] == "useradd" and w[-1] == user, f"creates the user {user}")
    assert commands[adds_user][commands[adds_user].index("--home-dir") + 1] == state_dir
    makes_dir = index(lambda w: w[:2] == ["install", "-d"] and w[-1] == state_dir, f"makes {state_dir}")
    assert commands[makes_dir][commands[makes_dir].index("-o") + 1] == user
    assert commands[makes_dir][commands[makes_dir].index("-g") + 1] == group
    sets_password = index(lambda w: "set-password" in w, "sets the admin password")
    assert commands[sets_password][:3] == ["-u", user, unit_exec_start()[0]]  # as the service's user
    installs_unit = index(lambda w: w[0] == "cp" and w[-1] == "/etc/systemd/system/", "installs the unit")
    starts = index(lambda w: w[:3] == ["systemctl", "enable", "--now"], "enables and starts the unit")
    assert adds_user < makes_dir < sets_password < starts and installs_unit < starts

    exec_start = unit_exec_start()
    for words in commands:
        at = next((i for i, word in enumerate(words) if word.endswith(f"/bin/{SCRIPT}")), None)
        if at is None:
            continue
        argv = words[at + 1:]
        command: Any = cli
        while argv and not argv[0].startswith("-"):
            assert argv[0] in command.commands, f"{SCRIPT} has no command {' '.join(words)}"
            command = command.commands[argv.pop(0)]
        options = {opt for param in command.params for opt in param.opts}
        flags = [word for word in argv if word.startswith("--")]
        assert set(flags) <= options, f"{' '.join(words)}: unknown flags {set(flags) - options}"
        # The same config and data directory as the unit's ExecStart.
        for flag in ("--config", "--data-dir"):
            assert argv[argv.index(flag) + 1] == exec_start[exec_start.index(flag) + 1], flag

    # The set-password step as written (its paths in tmp_path), on the directory made as the README makes it.
    config = tmp_path / "etc" / "picpeak.toml"
    config.parent.mkdir()
    shutil.copy(DEPLOY / "picpeak.toml", config)
    state = tmp_path / "var"
    state.mkdir()

    def moved(args: list[str]) -> list[str]:
        return [a.replace("/etc/picpeak/picpeak.toml", str(config)).replace(state_dir, str(state)) for a in args]

    step = commands[sets_password]
    args = moved(step[step.index("admin"):])
    done = subprocess.run([sys.executable, "-m", "picpeak_lite", *args, "--password-stdin"], cwd=state,
                          input="my own password 1\n", capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    proc = subprocess.Popen([sys.executable, "-m", "picpeak_lite", *moved(exec_start[1:])], cwd=state, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env={**os.environ, "PICPEAK_PORT": "0"})
    assert proc.stdout is not None
    lines = []
    for line in proc.stdout:
        lines.append(line)
        if "running at" in line:
            break
    proc.send_signal(signal.SIGTERM)
    out, _ = proc.communicate(timeout=60)
    printed = "".join(lines) + out
    assert proc.returncode == 0, printed
    assert "running at" in printed and "shown only once" not in printed, printed


def _dockerfile() -> list[tuple[str, str]]:
    text = (ROOT / "Dockerfile").read_text().replace("\\\n", " ")
    return [(line.split(None, 1)[0], line.split(None, 1)[1]) for line in text.splitlines()
            if line.strip() and not line.startswith("#")]


def dockerfile_copies() -> list[tuple[str, str]]:
    """(source, destination) of every COPY, destination relative to the build's WORKDIR."""
    copies = []
    for op, rest in _dockerfile():
        if op == "COPY":
            *sources, dest = rest.split()
            copies += [(s, s if dest == "./" else dest.removeprefix("./")) for s in sources]
    return copies


def test_dockerfile_installs_what_pyproject_builds() -> None:
    steps = _dockerfile()
    base = next(rest for op, rest in steps if op == "FROM")
    version = re.fullmatch(r"python:(\d+)\.(\d+)-slim", base)
    assert version, base
    required = re.fullmatch(r">=(\d+)\.(\d+)", PYPROJECT["project"]["requires-python"])
    assert required and tuple(map(int, version.groups())) >= tuple(map(int, required.groups()))
    copied = {source for source, _ in dockerfile_copies()}
    for source, dest in dockerfile_copies():
        assert (ROOT / source).exists() and source == dest, (source, dest)
    setuptools = PYPROJECT["tool"]["setuptools"]
    needed = {"pyproject.toml", PYPROJECT["project"]["readme"], *setuptools["package-dir"].values(),
              *{p.split(".")[0] for p in setuptools["packages"]}}
    assert needed <= copied, needed - copied
    assert any(op == "RUN" and re.search(r"\bpip install (--no-cache-dir )?\.( |$)", rest) for op, rest in steps)
    env = dict(pair.split("=", 1) for op, rest in steps if op == "ENV" for pair in rest.split())
    settings = load_settings(environ=env)
    assert settings.host == "0.0.0.0"
    exposed = [int(rest) for op, rest in steps if op == "EXPOSE"]
    assert exposed == [settings.port]
    cmd = next(rest for op, rest in steps if op == "CMD")
    assert cmd == f'["{SCRIPT}", "serve"]'
    health = next(rest for op, rest in steps if op == "HEALTHCHECK")
    assert f"http://127.0.0.1:{settings.port}/healthz" in health


def test_readme_shows_the_tested_files_verbatim() -> None:
    readme = (ROOT / "README.md").read_text()
    for path in (DEPLOY / "picpeak-lite.service", DEPLOY / "picpeak.toml", DEPLOY / "Caddyfile",
                 DEPLOY / "nginx.conf", ROOT / "Dockerfile"):
        assert path.read_text() in readme, f"README.md does not show {path.relative_to(ROOT)} as it is"


def test_ci_runs_the_readmes_test_command_and_stops_on_its_failure() -> None:
    readme = (ROOT / "README.md").read_text()
    test_it = readme.split("## Test it", 1)[1]
    command = re.search(r"```sh\n(.+?)\n```", test_it, re.DOTALL).group(1)  # type: ignore[union-attr]
    assert "\n" not in command
    ci = (ROOT / ".ci" / "run").read_text()
    assert "set -euo pipefail" in ci
    # Steps follow the test command, so it must end the script on failure itself (set -e ignores && chains).
    assert f"\n{command} || exit $?\n" in ci
    assert ci.index(command) < ci.index("tests/test_wheel.py")


def test_an_and_chain_failure_needs_the_explicit_exit(tmp_path: Path) -> None:
    """The reason for `|| exit $?` above, shown with bash itself: a failing step before the chain's last (the
    install or ruff) would be passed over by set -e alone, and with it the run stops with that step's code."""
    script = tmp_path / "run"
    script.write_text("set -euo pipefail\n(exit 5) && true || exit $?\necho reached\n")
    result = subprocess.run(["bash", str(script)], capture_output=True, text=True, timeout=60)
    assert result.returncode == 5 and "reached" not in result.stdout
    script.write_text("set -euo pipefail\n(exit 5) && true\necho reached\n")
    assert "reached" in subprocess.run(["bash", str(script)], capture_output=True, text=True, timeout=60).stdout


async def test_the_readmes_tus_loop_stops_with_the_servers_sentence_on_a_refusal(tmp_path: Path) -> None:
    """The README's curl loop, run as it is shown (with the server's address and a token put in) against a real
    server: a photo goes up and the loop ends 0; a file the server refuses ends it non-zero with the server's
    sentence. It used to print `integer expression expected` and exit 0 for a refused file."""
    if shutil.which("curl") is None:
        pytest.fail("curl is needed to run the README's loop")
    import trio

    from .factories import photo_jpeg
    from .served import serve

    readme = (ROOT / "README.md").read_text()
    script = next(block for block in re.findall(r"```sh\n(.+?)\n```", readme, re.DOTALL) if "/tus" in block)
    async with serve(tmp_path / "server") as running:
        script_path = tmp_path / "tus-upload.sh"
        script_path.write_text(script.replace("https://photos.example.com", running.url)
                               .replace("ppk_...", running.token))
        results = {}
        for name, data in (("good", photo_jpeg(4)), ("refused", b"a shot list, not a photo\n" * 100)):
            folder = tmp_path / name
            folder.mkdir()
            (folder / "IMG_0001.jpg").write_bytes(data)
            results[name] = await trio.run_process(["sh", str(script_path), "IMG_0001.jpg"], cwd=folder,
                                                   capture_stdout=True, capture_stderr=True, check=False)
    good, refused = results["good"], results["refused"]
    assert good.returncode == 0, good.stderr.decode()
    assert refused.returncode != 0, (refused.stdout + refused.stderr).decode()
    said = refused.stderr.decode()
    assert said.startswith("IMG_0001.jpg: Not a supported image"), said
    assert "integer expression" not in said and "Illegal number" not in said
    assert "IMG_0001.jpg: photo " in good.stdout.decode()
