"""``pytest --engine both``: the SQLite pass in this process and the PostgreSQL pass beside it, in a child pytest.

Why side by side and not one after the other: most of the suite's time is spent waiting (on server processes,
image children, sockets, PostgreSQL's own processes), so two passes on a 2-core CI machine take far less than
their sum. Why a child process and not two sessions in one: each pass needs its own engine for the whole run
(``tests/pgserver.py`` reads ``--engine`` at start), and pytest runs one session per process.

The PostgreSQL pass leaves out the browser tests (pages do not depend on the engine; the SQLite pass runs them)
and the tests marked ``sqlite``. Its whole output goes to ``test-artifacts/postgresql-pass.log``; when it fails,
that output is printed after this pass's own, and the run fails with its exit code; when it passes, its figures
lines are. It gets this run's other arguments, so ``-n 3`` (pytest-xdist) spreads each pass over three processes.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
LOG = ROOT / "test-artifacts" / "postgresql-pass.log"

_child: subprocess.Popen[bytes] | None = None


def _child_args(args: tuple[str, ...]) -> list[str]:
    """This run's own arguments, with ``--engine both`` taken out."""
    out: list[str] = []
    skip = False
    for arg in args:
        if skip:
            skip = False
            continue
        if arg == "--engine":
            skip = True
            continue
        if arg.startswith("--engine="):
            continue
        out.append(arg)
    return out


def start(config: Any) -> None:
    """Start the PostgreSQL pass (called once, by the controlling process, before collection)."""
    global _child
    LOG.parent.mkdir(exist_ok=True)
    command = [sys.executable, "-m", "pytest", "--engine", "postgresql", "--ignore=tests/browser",
               "-p", "no:cacheprovider", *_child_args(tuple(config.invocation_params.args))]
    with LOG.open("wb") as log:
        _child = subprocess.Popen(command, cwd=config.invocation_params.dir, stdout=log, stderr=subprocess.STDOUT,
                                  stdin=subprocess.DEVNULL, env=os.environ.copy())


def finish(session: Any, exitstatus: int) -> None:
    """Wait for the PostgreSQL pass and make its outcome part of this run's."""
    global _child
    if _child is None:
        return
    child, _child = _child, None
    if exitstatus in (2, 3):  # interrupted, or an internal error: the other pass is not wanted either
        child.terminate()
    code = child.wait()
    output = LOG.read_text(errors="replace")
    reporter = session.config.pluginmanager.get_plugin("terminalreporter")
    write = reporter.write_line if reporter is not None else print
    if reporter is not None:
        reporter.write("\n")  # the progress line of the last file is still open
    lines = output.rstrip().splitlines()
    if code != 0:
        write("")
        write("=" * 30 + " the PostgreSQL pass " + "=" * 30)
        for line in lines:
            write(line)
    else:  # its figures lines, where CI shows this run's
        figures = [line for line in lines if line.endswith(" engine=postgresql")]
        if figures:
            write("=" * 30 + " the PostgreSQL pass's figures lines " + "=" * 30)
            for line in figures:
                write(line)
    write(f"PostgreSQL pass ({LOG.relative_to(ROOT)}): exit code {code}; {lines[-1] if lines else 'no output'}")
    if code != 0 and session.exitstatus == 0:
        session.exitstatus = code
