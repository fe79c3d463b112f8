"""Module state that lives as long as one trio run: a limiter or a registry made on first use.

A plain module global would be shared by every ``trio.run`` in a process (each test runs its own), and a trio
object such as a ``CapacityLimiter`` belongs to the run that made it. A ``RunVar`` is per run; this wraps the
"get it, or make and keep it" that each such piece of state needs.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Generic, TypeVar

import trio

T = TypeVar("T")


class PerRun(Generic[T]):
    def __init__(self, name: str, make: Callable[[], T]) -> None:
        self._var: trio.lowlevel.RunVar[T] = trio.lowlevel.RunVar(name)
        self._make = make

    def get(self) -> T:
        """This run's value, made by ``make`` the first time it is asked for."""
        try:
            return self._var.get()
        except LookupError:
            value = self._make()
            self._var.set(value)
            return value
