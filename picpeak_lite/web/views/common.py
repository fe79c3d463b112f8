"""Small helpers shared by the views."""

from __future__ import annotations

import ipaddress

from quart import request

from picpeak_lite.web.auth import services


def client_ip() -> str:
    """The client's address for throttling.

    ``X-Forwarded-For`` is believed only when the peer is one of ``trusted_proxies``: the rightmost address
    that is not itself a trusted proxy is the client. IPv6 addresses count by their /64, since one client
    usually holds a whole /64 and could otherwise rotate addresses to get fresh attempts.
    """
    trusted = trusted_set(services().settings.trusted_proxies)
    address = real_client(request.remote_addr or "unknown", request.headers.get("X-Forwarded-For", ""), trusted)
    return throttle_key(address)


def trusted_set(trusted_proxies: str) -> frozenset[str]:
    return frozenset(p.strip() for p in trusted_proxies.split(",") if p.strip())


def real_client(peer: str, forwarded_for: str, trusted: frozenset[str]) -> str:
    """The client's address by the rule above, from the peer and the X-Forwarded-For header (also used by the
    request log, which runs outside a request context)."""
    address = peer
    if address in trusted:
        forwarded = [a.strip() for a in forwarded_for.split(",") if a.strip()]
        for hop in reversed(forwarded):
            address = hop
            if hop not in trusted:
                break
    return address


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


def base_url() -> str:
    public = services().settings.public_url
    return (public or request.host_url).rstrip("/")


def share_url(slug: str) -> str:
    return f"{base_url()}/g/{slug}"
