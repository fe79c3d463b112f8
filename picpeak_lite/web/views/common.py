"""Small helpers shared by the views."""

from __future__ import annotations

import ipaddress
from urllib.parse import urlsplit

from quart import request

from picpeak_lite.config import Settings, split_host
from picpeak_lite.web.auth import services


def client_ip() -> str:
    """The client's address for throttling.

    ``X-Forwarded-For`` is believed only when the peer is one of ``trusted_proxies``: the rightmost address
    that is not itself a trusted proxy is the client. IPv6 addresses count by their /64, since one client
    usually holds a whole /64 and could otherwise rotate addresses to get fresh attempts.
    """
    trusted = {p.strip() for p in services().settings.trusted_proxies.split(",") if p.strip()}
    address = request.remote_addr or "unknown"
    if address in trusted:
        forwarded = [a.strip() for a in request.headers.get("X-Forwarded-For", "").split(",") if a.strip()]
        for hop in reversed(forwarded):
            address = hop
            if hop not in trusted:
                break
    return throttle_key(address)


def throttle_key(address: str) -> str:
    try:
        ip = ipaddress.ip_address(address)
    except ValueError:
        return address
    if isinstance(ip, ipaddress.IPv6Address):
        if ip.ipv4_mapped is not None:
            return str(ip.ipv4_mapped)
        return str(ipaddress.ip_network(f"{ip}/64", strict=False))
    return str(ip)


LOOPBACK_NAMES = ("localhost", "127.0.0.1", "::1")
WILDCARD_HOSTS = ("0.0.0.0", "::", "")
DEFAULT_PORTS = {"http": 80, "https": 443}


def base_url() -> str:
    """Where share links, QR codes and ``og:`` tags point: ``public_url``, else a trusted origin.

    The Host header is the client's to choose: reflected as it is, ``Host: evil.example`` put
    ``http://evil.example/g/<slug>`` into a page a shared cache could hand to everyone. So the request's own
    origin is used only when its Host is one the server answers to anyway (see :func:`host_trusted`); any other
    Host gets the address the server listens on.
    """
    svc = services()
    public = svc.settings.public_url
    if public:
        return public.rstrip("/")
    local = _local_address()
    if host_trusted(request.host, request.scheme, svc.settings.allowed_hosts, svc.bind_url, local):
        return request.host_url.rstrip("/")
    return fallback_url(svc.bind_url, local)


def _local_address() -> tuple[str, int] | None:
    """The address this connection arrived on (the ASGI ``server``), which the client cannot choose."""
    server = request.server
    if isinstance(server, tuple | list) and len(server) == 2 and isinstance(server[1], int):
        return str(server[0]).lower(), server[1]
    return None


def host_trusted(host_header: str, scheme: str, allowed: tuple[str, ...], bind_url: str,
                 local: tuple[str, int] | None) -> bool:
    """Whether a Host header names this server: an ``allowed_hosts`` entry (``host`` on any port, or
    ``host:port``), the bind address (with its localhost / 127.0.0.1 / ::1 forms when it is a loopback or
    wildcard address), or the address the connection arrived on. A bind port of 0 (not bound yet, as under
    a test client) matches any port."""
    try:
        host, port = split_host(host_header)
    except ValueError:
        return False
    port = port if port is not None else DEFAULT_PORTS.get(scheme, 80)
    for entry in allowed:
        entry_host, entry_port = split_host(entry)
        if entry_host == host and entry_port in (None, port):
            return True
    bind = urlsplit(bind_url)
    bind_host = (bind.hostname or "").lower()
    names = {bind_host, *LOOPBACK_NAMES} if bind_host in (*LOOPBACK_NAMES, *WILDCARD_HOSTS) else {bind_host}
    if host in names and bind.port in (0, port):
        return True
    return local is not None and local == (host, port)


def fallback_url(bind_url: str, local: tuple[str, int] | None) -> str:
    """The bind URL; for a wildcard bind (0.0.0.0, ::), which no browser can open, the address the connection
    arrived on instead."""
    bind = urlsplit(bind_url)
    if (bind.hostname or "") in WILDCARD_HOSTS and local is not None:
        host = f"[{local[0]}]" if ":" in local[0] else local[0]
        return f"{bind.scheme}://{host}:{local[1]}"
    return bind_url.rstrip("/")


def describe_links(settings: Settings, bind_url: str) -> str:
    """One line for the start-up log: how share links are made, so that a wrong link is explained at once."""
    if settings.public_url:
        return f"share links use public_url {settings.public_url.rstrip('/')}"
    bind = urlsplit(bind_url)
    bind_host = (bind.hostname or "").lower()
    names = [bind_host, *[n for n in LOOPBACK_NAMES if n != bind_host]] if bind_host in (
        *LOOPBACK_NAMES, *WILDCARD_HOSTS) else [bind_host]
    trusted = [f"[{n}]:{bind.port}" if ":" in n else f"{n}:{bind.port}" for n in names]
    trusted += list(settings.allowed_hosts)
    fallback = "the address the connection arrived on" if bind_host in WILDCARD_HOSTS else bind_url.rstrip("/")
    return (f"share links use the request's Host when it is one of {', '.join(trusted)} (or the address the "
            f"connection arrived on); any other Host gets {fallback}. Set public_url (or allowed_hosts) for the "
            f"address guests use")


def share_url(slug: str) -> str:
    return f"{base_url()}/g/{slug}"
