"""The processing attempts running in this process, by claim token, so that an upload taking its photos back
can wait for the worker still busy with one of them (its derivatives go through tmp/ into derived/: removing
the files before that worker is done would leave its late writes behind).

A worker registers the token *before* its claim is written, and sets the event when the attempt is over,
whatever its outcome; so whoever sees ``status = 'processing'`` with that token in a row finds it here.
"""

from __future__ import annotations

import trio

from picpeak_lite.perrun import PerRun

_RUNNING: PerRun[dict[str, trio.Event]] = PerRun("picpeak_attempts", dict)


def running() -> dict[str, trio.Event]:
    return _RUNNING.get()


async def wait_until_over(tokens: list[str]) -> None:
    """Wait until this process's attempts under these claim tokens are over (the caller bounds the wait)."""
    for token in tokens:
        event = running().get(token)
        if event is not None:
            await event.wait()
