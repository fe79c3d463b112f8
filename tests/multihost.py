"""Several hosts on one machine, for the multi-host suite (issue 31): each ``picpeak-lite serve`` in a network
namespace of its own, sharing nothing but one PostgreSQL database and one bucket, as hosts behind a load balancer
do.

* :func:`refused` says why namespaces cannot be made here (not root, no ``ip``, a kernel or container that refuses
  them); the suite skips with that sentence.
* :func:`network` makes a private /24 (``10.231.X.0/24``, the first X not in use on this machine): a bridge in the
  root namespace holding the gateway address ``.1``, and per host a namespace with a veth pair whose root end is on
  the bridge and whose other end holds ``.11``, ``.12``, ... Everything is named after this run's pid, removed in
  a ``finally`` even when a test fails, and left-overs of runs that were killed are removed at the next start.
* :class:`Cluster`: the network, a PostgreSQL server of its own listening on 127.0.0.1 and the gateway (the
  namespaces' connections trusted, as the loopback's are), an s3rver process on the gateway, one bucket, and the
  hosts: :class:`harness.ServerProcess` run through ``ip netns exec``, each with its own data directory and the
  same settings (``database_url``, ``storage = "s3"``, ``public_url``), each on port 8080 of its own address;
  ``restart`` starts a killed or stopped host again.
* :func:`nginx_balancer` and :func:`caddy_balancer`: the deploy recipe's balancer config, as shipped but pointed at
  the cluster's hosts and served as plain HTTP on 127.0.0.1, in a process of its own.

Only the gateway address and the hosts' addresses are used: nothing leaves the machine.
"""

from __future__ import annotations

import contextlib
import ipaddress
import json
import os
import re
import shutil
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psycopg
from psycopg.rows import dict_row

from . import pgserver
from .harness import ADMIN_PASSWORD, REPO, WEBHOOK_SECRET, ServerProcess, WebhookReceiver
from .s3server import S3rverServer

PORT = 8080  # every host's, in its own namespace (deploy/several-hosts.md's)
NAME = "ppmh"  # every namespace and link of this suite starts with it, then the run's pid
PUBLIC_URL = "http://photos.multihost.test"  # the same on every host, as behind one load balancer


def _ip(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["ip", *args], capture_output=True, text=True, check=check)


def refused() -> str | None:
    """Why this machine cannot run the suite (a sentence for the skip), or None."""
    if os.geteuid() != 0:
        return "the multi-host suite makes network namespaces (ip netns) and needs root; run it as root to include it"
    if shutil.which("ip") is None:
        return "the multi-host suite needs iproute2's ip command"
    probe = f"{NAME}{os.getpid()}probe"
    made = _ip("netns", "add", probe, check=False)
    if made.returncode != 0:
        return f"network namespaces are refused here: {made.stderr.strip()}"
    _ip("netns", "del", probe, check=False)
    bridge = _ip("link", "add", f"{NAME}{os.getpid()}t", "type", "bridge", check=False)
    if bridge.returncode != 0:
        return f"a bridge cannot be made here: {bridge.stderr.strip()}"
    _ip("link", "del", f"{NAME}{os.getpid()}t", check=False)
    return None


def _remove_orphans() -> None:
    """Namespaces and links of runs that were killed before their ``finally`` (their pid is gone)."""
    names = _ip("netns", "list", check=False).stdout.split()
    links = re.findall(r"^\d+: ([^:@\s]+)", _ip("-o", "link", "show", check=False).stdout, re.MULTILINE)
    for name in [*names, *links]:
        found = re.match(rf"{NAME}(\d+)", name)
        if found and not Path(f"/proc/{found.group(1)}").exists():
            if name in names:
                _ip("netns", "del", name, check=False)
            else:
                _ip("link", "del", name, check=False)


def _free_subnet() -> ipaddress.IPv4Network:
    used = _ip("-o", "-4", "addr", "show", check=False).stdout + _ip("-4", "route", "show", check=False).stdout
    for third in [*range(os.getpid() % 200 + 20, 256), *range(0, 256)]:
        subnet = ipaddress.IPv4Network(f"10.231.{third}.0/24")
        if f"10.231.{third}." not in used:
            return subnet
    raise RuntimeError("no free /24 in 10.231.0.0/16")


@dataclass
class Network:
    subnet: ipaddress.IPv4Network
    gateway: str  # the root namespace's address on the bridge: PostgreSQL, the bucket and webhook receivers
    bridge: str
    namespaces: list[str]
    addresses: list[str]  # each host's address, in its namespace
    links: list[str]  # each host's end of its veth pair, in its namespace

    def cut(self, index: int) -> None:
        """Take host ``index``'s network down (its link, inside its namespace): packets neither leave nor arrive,
        and no connection of its is closed or reset, as when a host's cable or switch port goes."""
        _ip("-n", self.namespaces[index], "link", "set", self.links[index], "down")

    def restore(self, index: int) -> None:
        """Its link up again: its address and route come back, and the connections it had go on."""
        _ip("-n", self.namespaces[index], "link", "set", self.links[index], "up")


@contextlib.contextmanager
def network(hosts: int) -> Iterator[Network]:
    _remove_orphans()
    run = f"{NAME}{os.getpid()}"
    subnet = _free_subnet()
    prefix = str(subnet.network_address).rsplit(".", 1)[0]
    made = Network(subnet, f"{prefix}.1", f"{run}b", [], [], [])
    try:
        _ip("link", "add", made.bridge, "type", "bridge")
        _ip("addr", "add", f"{made.gateway}/24", "dev", made.bridge)
        _ip("link", "set", made.bridge, "up")
        for i in range(hosts):
            namespace, outer, inner = f"{run}h{i}", f"{run}v{i}", f"{run}n{i}"
            _ip("netns", "add", namespace)
            made.namespaces.append(namespace)
            _ip("link", "add", outer, "type", "veth", "peer", "name", inner)
            _ip("link", "set", inner, "netns", namespace)
            _ip("link", "set", outer, "master", made.bridge)
            _ip("link", "set", outer, "up")
            address = f"{prefix}.{11 + i}"
            _ip("-n", namespace, "addr", "add", f"{address}/24", "dev", inner)
            _ip("-n", namespace, "link", "set", inner, "up")
            _ip("-n", namespace, "link", "set", "lo", "up")
            made.addresses.append(address)
            made.links.append(inner)
        yield made
    finally:
        for i, namespace in enumerate(made.namespaces):
            _ip("netns", "del", namespace, check=False)
            _ip("link", "del", f"{run}v{i}", check=False)  # gone with its peer's namespace, unless a process holds it
        _ip("link", "del", made.bridge, check=False)


class Cluster:
    """The whole service: network, database, bucket, and ``hosts`` servers with the same ``settings``."""

    def __init__(self, root: Path, *, hosts: int = 3, settings: dict[str, Any] | None = None,
                 receiver: WebhookReceiver | None = None) -> None:
        self.root = root
        self.count = hosts
        self.settings = settings or {}
        self.receiver = receiver  # started on the gateway, every host's webhook endpoint
        self.webhook_url: str | None = None
        self.hosts: list[ServerProcess] = []
        self.urls: list[str] = []
        self.database_url = ""
        self.claimants: list[str] = []  # what photos.claimed_by says for each host's claims (worker.claimant())
        self._stack = contextlib.ExitStack()

    def __enter__(self) -> Cluster:
        try:
            self.net = self._stack.enter_context(network(self.count))
            if self.receiver is not None:
                self.receiver.host = self.net.gateway
                self._stack.enter_context(self.receiver)
                self.webhook_url = self.receiver.url
            self.postgres = pgserver.PostgresServer(listen=("127.0.0.1", self.net.gateway),
                                                    clients=(str(self.net.subnet),))
            self._stack.callback(self.postgres.stop)
            self.postgres.start()
            self.postgres.admin_sql("CREATE DATABASE multihost TEMPLATE picpeak_template")
            self.database_url = self.postgres.url("multihost", self.net.gateway)
            self.s3 = S3rverServer(host=self.net.gateway)
            self._stack.callback(self.s3.__exit__)
            self.s3.start()
            self.bucket = self.s3.new_bucket()
            for i in range(self.count):
                data_dir = self.root / f"host{i}"
                data_dir.mkdir(parents=True)
                config = self._config(data_dir, i)
                self.hosts.append(ServerProcess(data_dir, config, netns=self.net.namespaces[i],
                                                host=self.net.addresses[i], port=PORT,
                                                database_url=self.database_url))
            self._stack.callback(self._stop_hosts)
            self.token = self._token()
            self.urls = self._start_all()
            self.claimants = [f"{os.uname().nodename} pid {host.pid}" for host in self.hosts]
        except BaseException:
            self._stack.close()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        self._stack.close()

    def _config(self, data_dir: Path, index: int) -> Path:
        values = {"data_dir": str(data_dir), "database_url": self.database_url, "public_url": PUBLIC_URL,
                  **self.s3.settings_for(self.bucket), **self.settings}
        lines = [f"{key} = {json.dumps(value)}" for key, value in values.items()]
        if self.webhook_url is not None:
            lines += ["", "[[webhooks]]", f"url = {json.dumps(self.webhook_url)}",
                      f"secret = {json.dumps(WEBHOOK_SECRET)}"]
        path = self.root / f"host{index}.toml"
        path.write_text("\n".join(lines) + "\n")
        return path

    def _token(self) -> str:
        """An API token of the owner (made with it, as before a first start), from the root namespace: the
        database is the service's, whichever host asks."""
        host = self.hosts[0]
        done = subprocess.run(
            [sys.executable, "-m", "picpeak_lite", "admin", "token", "create", "--name", "multihost", "--data-dir",
             str(host.data_dir), "--config", str(host.config)], capture_output=True, text=True, timeout=120,
            env={**os.environ, "PICPEAK_ADMIN_PASSWORD": ADMIN_PASSWORD, "PICPEAK_DATABASE_URL": self.database_url,
                 "PICPEAK_WEBHOOK_ALLOW_PRIVATE": "true"})
        assert done.returncode == 0, done.stderr
        return done.stdout.strip()

    def _start_all(self) -> list[str]:
        urls = [""] * self.count
        errors: list[BaseException] = []

        def start(i: int) -> None:
            try:
                urls[i] = self.hosts[i].start()
            except BaseException as error:
                errors.append(error)

        threads = [threading.Thread(target=start, args=(i,)) for i in range(self.count)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        if errors:
            raise errors[0]
        return urls

    def _stop_hosts(self) -> None:
        for host in self.hosts:
            if host.proc is not None:
                try:
                    host.stop(timeout=60)
                except subprocess.TimeoutExpired:
                    host.kill()

    def restart(self, index: int) -> None:
        """Start host ``index`` again (after a kill or a stop), on the same address, port and data directory."""
        self.urls[index] = self.hosts[index].start()
        self.claimants[index] = f"{os.uname().nodename} pid {self.hosts[index].pid}"

    def query(self, sql: str, *args: Any) -> list[dict[str, Any]]:
        """SQL on the shared database, from the root namespace (``?`` placeholders, as our queries write them)."""
        with psycopg.connect(self.database_url, autocommit=True, row_factory=dict_row) as conn:
            return conn.execute(sql.replace("?", "%s"), args).fetchall()  # the tests' own SQL


def nginx_binary() -> str | None:
    return shutil.which("nginx") or next((p for p in ("/usr/sbin/nginx", "/usr/local/sbin/nginx")
                                          if os.access(p, os.X_OK)), None)


@contextlib.contextmanager
def nginx_balancer(cluster: Cluster, root: Path) -> Iterator[str]:
    """``deploy/nginx-several-hosts.conf`` as shipped in front of the cluster, with two changes only: its upstream
    addresses are the cluster's hosts, and its HTTPS server is a plain listener on 127.0.0.1 (no certificate, no
    redirect). Yields the balancer's URL."""
    nginx = nginx_binary()
    assert nginx is not None
    snippet = _pointed_at(cluster, (REPO / "deploy" / "nginx-several-hosts.conf").read_text(), "server ")
    port = _free_port()
    snippet = re.sub(r"server \{\s*listen 80;.*?\}\n", "", snippet, flags=re.DOTALL)
    snippet = snippet.replace("listen 443 ssl http2;", f"listen 127.0.0.1:{port};")
    snippet = re.sub(r"\n\s*ssl_certificate(_key)? [^;]+;", "", snippet)
    assert "ssl" not in snippet and "listen 80" not in snippet
    (root / "picpeak.conf").write_text(snippet)
    temp = "".join(f"    {name}_temp_path {root / name};\n" for name in ("client_body", "proxy", "fastcgi", "uwsgi",
                                                                           "scgi"))
    (root / "nginx.conf").write_text(
        f"user root;\npid {root / 'nginx.pid'};\nerror_log {root / 'error.log'};\nevents {{}}\nhttp {{\n"
        f"    access_log off;\n{temp}    include {root / 'picpeak.conf'};\n}}\n")
    with _running([nginx, "-p", str(root), "-c", str(root / "nginx.conf"), "-g", "daemon off;"], port,
                  root / "error.log") as url:
        yield url


def caddy_binary() -> str | None:
    return shutil.which("caddy")


@contextlib.contextmanager
def caddy_balancer(cluster: Cluster, root: Path) -> Iterator[str]:
    """``deploy/Caddyfile.several-hosts`` as shipped in front of the cluster, its upstream addresses the cluster's
    hosts and its site plain HTTP on 127.0.0.1 (no certificate; Caddy's admin endpoint off)."""
    caddy = caddy_binary()
    assert caddy is not None
    text = _pointed_at(cluster, (REPO / "deploy" / "Caddyfile.several-hosts").read_text(), "")
    port = _free_port()
    assert text.count("photos.example.com {") == 1
    text = text.replace("photos.example.com {", f"http://127.0.0.1:{port} {{")
    (root / "Caddyfile").write_text("{\n\tadmin off\n\tauto_https off\n}\n" + text)
    (root / "caddy.log").touch()
    with _running([caddy, "run", "--adapter", "caddyfile", "--config", str(root / "Caddyfile")], port,
                  root / "caddy.log", env={**os.environ, "HOME": str(root), "XDG_DATA_HOME": str(root / "data"),
                                           "XDG_CONFIG_HOME": str(root / "config")}) as url:
        yield url


def _pointed_at(cluster: Cluster, text: str, before: str) -> str:
    """A balancer's config with the recipe's three host addresses replaced by the cluster's."""
    shipped = list(dict.fromkeys(re.findall(r"(10\.0\.0\.\d+:8080)", text)))
    assert len(shipped) == cluster.count, shipped
    for old, new in zip(shipped, cluster.net.addresses, strict=True):
        text = text.replace(f"{before}{old}", f"{before}{new}:{PORT}")
    return text


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


@contextlib.contextmanager
def _running(command: list[str], port: int, log: Path, env: dict[str, str] | None = None) -> Iterator[str]:
    """A balancer process, once it accepts connections on 127.0.0.1:``port``; stopped after."""
    with open(log, "a") as output:
        proc = subprocess.Popen(command, stdout=output, stderr=subprocess.STDOUT, env=env)
    try:
        deadline = time.monotonic() + 60  # a hung-start stop only
        while True:
            try:
                with socket.create_connection(("127.0.0.1", port), timeout=1):
                    break
            except OSError:
                if proc.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(f"{command[0]} did not start:\n" + log.read_text()[-4000:]) from None
                time.sleep(0.05)
        yield f"http://127.0.0.1:{port}"
    finally:
        proc.terminate()
        proc.wait(30)
