"""Start a real `picpeak-lite serve` subprocess for a benchmark: port 0, an API token, the URL it prints."""

from __future__ import annotations

import contextlib
import os
import re
import subprocess
import sys
import threading
from pathlib import Path

PASSWORD = "bench password 123"


def _drop_output(proc: subprocess.Popen[str]) -> None:
    with contextlib.suppress(ValueError, OSError):
        for _ in proc.stdout or ():
            pass


def start_server(data: Path, env: dict[str, str] | None = None) -> tuple[subprocess.Popen[str], str, str]:
    """Returns (process, base URL, API token). The caller terminates the process."""
    token = subprocess.run(
        [sys.executable, "-m", "picpeak_lite", "admin", "token", "create", "--name", "bench", "--data-dir", str(data)],
        capture_output=True, text=True, check=True,
    ).stdout.strip()
    proc = subprocess.Popen(
        [sys.executable, "-m", "picpeak_lite", "serve", "--port", "0", "--data-dir", str(data)],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        env={**os.environ, "PICPEAK_ADMIN_PASSWORD": PASSWORD, **(env or {})},
    )
    assert proc.stdout is not None
    for line in proc.stdout:
        match = re.search(r"running at (http://127\.0\.0\.1:\d+)/admin", line)
        if match:
            # Keep reading (and dropping) the request log: a full pipe would stop the server mid-benchmark.
            threading.Thread(target=_drop_output, args=(proc,), daemon=True).start()
            return proc, match.group(1), token
    raise SystemExit("server did not start")
