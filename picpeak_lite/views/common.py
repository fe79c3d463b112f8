"""Small helpers shared by the views."""

from __future__ import annotations

from quart import request

from ..auth import services


def client_ip() -> str:
    """The peer address. We do not trust X-Forwarded-For: a proxy setup would configure that explicitly."""
    return request.remote_addr or "unknown"


def base_url() -> str:
    public = services().settings.public_url
    return (public or request.host_url).rstrip("/")


def share_url(slug: str) -> str:
    return f"{base_url()}/g/{slug}"
