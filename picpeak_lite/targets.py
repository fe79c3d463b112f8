"""Where a webhook may be sent: the rules for its URL and for the addresses it resolves to.

Sync, and free of trio and of the rest of the package, so that ``config`` can refuse a ``[[webhooks]]`` target
at load (without DNS: :func:`check_target_offline`) with the very sentence the sender would record when it
refuses the same target (``events/webhooks.py`` ``resolve_target``, with DNS, at every delivery) and the
settings page shows when one is typed in.
"""

from __future__ import annotations

import ipaddress
import socket
import urllib.parse
from typing import Any

# NAT64's well-known prefix carries an IPv4 address in its last 32 bits.
_NAT64 = ipaddress.IPv6Network("64:ff9b::/96")


class TargetRefused(Exception):
    """A webhook URL we will not connect to; the message says why, for the admin's delivery log."""


def parse_target(url: str) -> tuple[str, str, int, str]:
    """Split a webhook URL into (scheme, host, port, path) or refuse it, before anything is resolved."""
    try:
        parts = urllib.parse.urlsplit(url)
        port = parts.port
    except ValueError as error:
        raise TargetRefused(f"not a valid URL: {error}") from None
    scheme = parts.scheme.lower()
    if scheme not in ("http", "https"):
        raise TargetRefused(f"only http and https URLs are allowed, not {scheme or 'no scheme'!r}")
    if "@" in parts.netloc:
        raise TargetRefused("URLs with a user name or password are not allowed")
    host = parts.hostname
    if not host:
        raise TargetRefused("the URL has no host")
    path = parts.path or "/"
    if parts.query:
        path += "?" + parts.query
    return scheme, host, port or (443 if scheme == "https" else 80), path


def is_public_address(address: str) -> bool:
    """True when ``address`` (numeric, as getaddrinfo returns it) is on the public internet.

    ``is_global`` does most of the work (loopback, RFC 1918, link-local and the metadata service, shared
    address space, ...). IPv6 forms that carry an IPv4 address inside are judged by that IPv4 address, so
    ``::ffff:127.0.0.1`` or ``2002:7f00:1::`` cannot smuggle loopback past the check.
    """
    ip = ipaddress.ip_address(address)
    if isinstance(ip, ipaddress.IPv6Address):
        if int(ip) >> 32 == 0:  # ::, ::1 and the deprecated IPv4-compatible ::a.b.c.d
            return False
        if ip.ipv4_mapped is not None:
            return False
        if ip in _NAT64:
            return is_public_address(str(ipaddress.IPv4Address(int(ip) & 0xFFFFFFFF)))
        if ip.sixtofour is not None and not is_public_address(str(ip.sixtofour)):
            return False
        if ip.teredo is not None:
            return False
    return ip.is_global and not ip.is_multicast and not ip.is_reserved


def check_target_offline(url: str, allow_private: bool) -> None:
    """What :func:`resolve_target` refuses whatever DNS says, without asking DNS: a bad URL, a numeric address
    that is not public (in any spelling getaddrinfo reads without a lookup), a ``localhost`` name. Raises
    :class:`TargetRefused` with the same sentence the sender would record.

    For ``[[webhooks]]`` in the config, checked at load: loading must not wait on DNS (nor fail when it is down
    at boot), and a name's answer may change later anyway, so names are left to the sender, which checks every
    delivery.
    """
    _scheme, host, port, _path = parse_target(url)
    refuse_loopback_name(host, allow_private)
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_NUMERICHOST)
    except OSError:
        return  # a name
    public_addresses(host, infos, allow_private)


def refuse_loopback_name(host: str, allow_private: bool) -> None:
    """``localhost`` and ``*.localhost`` are loopback by definition (RFC 6761), whatever a resolver answers."""
    name = host.rstrip(".")
    if not allow_private and (name == "localhost" or name.endswith(".localhost")):
        raise TargetRefused(f"{host!r} is a loopback name, which is not a public address "
                            "(set webhook_allow_private to allow it)")


def public_addresses(host: str, infos: Any, allow_private: bool) -> list[str]:
    """The distinct addresses of a getaddrinfo answer, or the refusal when one of them is not public (unless
    ``allow_private``)."""
    addresses: list[str] = []
    for _family, _type, _proto, _canonname, sockaddr in infos:
        address = str(sockaddr[0])
        if address not in addresses:
            addresses.append(address)
    if not addresses:
        raise TargetRefused(f"{host!r} did not resolve to any address")
    if not allow_private:
        private = [a for a in addresses if not is_public_address(a)]
        if private:
            raise TargetRefused(
                f"{host!r} resolves to {', '.join(private)}, which is not a public address "
                "(set webhook_allow_private to allow it)"
            )
    return addresses
