"""A unit of work that can be stopped: a deadline and a cancel flag, checked at the boundaries of long work.

A caller that serves someone who may leave (an HTTP request whose client disconnects, a request with a time limit)
runs the work inside a :class:`WorkScope`; the library calls :func:`checkpoint` between the stages of a search,
between the pieces of an encoding and before a write commits, and a stopped scope raises :class:`WorkStopped`
there. Nothing is left half done: a search has no state to undo, and a write stopped before its commit changes
nothing on disk (its temporary version is removed).

>>> scope = WorkScope(deadline_s=30)
>>> with scope:              # in the thread that does the work
...     engine.search("a query")
>>> scope.cancel("the client disconnected")   # from any thread: the work stops at its next checkpoint

Outside any scope :func:`checkpoint` costs a thread-local read and never raises.
"""

from __future__ import annotations

import threading
import time
from types import TracebackType

from twostage.indexer.errors import WorkStopped

__all__ = ["WorkScope", "WorkStopped", "checkpoint", "current"]

_local = threading.local()


class WorkScope:
    """A deadline (``deadline_s`` seconds from now; None: none) and a cancel flag for the work run inside it."""

    def __init__(self, deadline_s: float | None = None) -> None:
        if deadline_s is not None and not deadline_s > 0:
            raise ValueError(f"deadline_s must be positive, got {deadline_s!r}")
        self.limit_s = deadline_s
        self.deadline = None if deadline_s is None else time.monotonic() + deadline_s
        self._reason: str | None = None

    def cancel(self, reason: str = "cancelled") -> None:
        """Stop the work at its next checkpoint (thread-safe; the first reason given is kept)."""
        if self._reason is None:
            self._reason = reason

    @property
    def stopped(self) -> str | None:
        """Why the work must stop (cancelled, or past its deadline), or None while it may go on."""
        if self._reason is not None:
            return self._reason
        if self.deadline is not None and time.monotonic() > self.deadline:
            return f"it ran past its time limit of {self.limit_s:g} s"
        return None

    def check(self) -> None:
        reason = self.stopped
        if reason is not None:
            raise WorkStopped(f"the work was stopped: {reason}", timed_out=self._reason is None)

    def __enter__(self) -> WorkScope:
        stack = getattr(_local, "stack", None)
        if stack is None:
            stack = _local.stack = []
        stack.append(self)
        return self

    def __exit__(self, kind: type[BaseException] | None, value: BaseException | None,
                 tb: TracebackType | None) -> None:
        _local.stack.pop()


def current() -> WorkScope | None:
    """The innermost scope the calling thread runs in (None outside any)."""
    stack = getattr(_local, "stack", None)
    return stack[-1] if stack else None


def checkpoint() -> None:
    """Raise :class:`WorkStopped` when the calling thread's scope was cancelled or is past its deadline."""
    stack = getattr(_local, "stack", None)
    if stack:
        for scope in stack:
            scope.check()
