"""QR codes for share links, made on the server with segno (the only module that imports it).

Printed on a table card, a code must scan from across a table: error correction M, a quiet zone of four
modules (the standard's minimum), and a size chosen by the caller in pixels per module.
"""

from __future__ import annotations

import io

import segno

KINDS = {"png": "image/png", "svg": "image/svg+xml"}
ERROR = "m"
BORDER = 4
MAX_SCALE = 40


def make(payload: str) -> segno.QRCode:
    return segno.make(payload, error=ERROR, micro=False)


def render(payload: str, kind: str, *, scale: int = 10) -> bytes:
    """``payload`` as a PNG or SVG QR code. ``scale`` is the size of one module in pixels (1-40)."""
    if kind not in KINDS:
        raise ValueError(f"unknown QR image kind {kind!r}")
    scale = max(1, min(MAX_SCALE, scale))
    out = io.BytesIO()
    options: dict[str, object] = {"scale": scale, "border": BORDER}
    if kind == "svg":
        options.update(xmldecl=False, svgns=True, title=payload, unit=None)
    make(payload).save(out, kind=kind, **options)
    return out.getvalue()


def matrix(payload: str) -> list[list[bool]]:
    """The modules without the quiet zone, dark = True: what a test compares a served image against."""
    return [[bool(v) for v in row] for row in make(payload).matrix]
