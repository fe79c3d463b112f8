"""`picpeak-lite bench` on a couple of tiny photos: it runs the real server and prints every figure, each sane.
No timing bounds: only that the figures are there and make sense."""

from __future__ import annotations

import re
from pathlib import Path

from .harness import cli


def test_bench_command_prints_its_figures(tmp_path: Path) -> None:
    done = cli("bench", "--photos", "2", "--megapixels", "0.2", "--temp-dir", str(tmp_path), timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    out = done.stdout
    assert re.search(r"photos: 2 \(\d+ MB in 1 requests\); complete 2, failed 0", out), out
    for label in ("photos/s end to end", "202 for the first request, s", "last 202 -> all complete, s",
                  "server CPU per photo (upload + processing), s", "peak RSS, MB",
                  "all photos complete, s after the first byte"):
        value = re.search(re.escape(label) + r": (-?[\d.]+)", out)
        assert value is not None and float(value.group(1)) >= 0, (label, out)
    first = re.search(r"own bytes sent -> complete, first / p50 / p95, s: ([\d.-]+) / ([\d.-]+) / ([\d.-]+)", out)
    assert first is not None and float(first.group(1)) > 0, out
    assert float(re.search(r"peak RSS, MB: (\d+)", out).group(1)) > 10
    assert list(tmp_path.iterdir()) == []  # the temp data directory is gone
