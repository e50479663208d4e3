"""Which requests the server runs now, and which wait or come back later: cheap searches first.

Two cores serve every client. A bulk write, a batch of searches or a rerank of hundreds of documents is worth
seconds to minutes of them; a search, milliseconds. :class:`Admission` runs at most ``max_expensive`` expensive
requests at a time (the others wait for a slot, at most ``wait_s`` seconds, then get a 503 with ``Retry-After``),
and none at all while ``max_searches`` or more searches are in flight (503 at once): under load the expensive ones
are turned away first, so the searching clients keep their latency. Searches are never held here; their model
calls already go first in the batchers (:mod:`twostage.app.batching`).

What counts as expensive is the request's own work, counted before it runs (:func:`is_expensive`).
"""

from __future__ import annotations

import math
import os
import threading
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from typing import Any, TypeVar

from twostage.indexer.errors import ConfigError
from twostage.indexer.work import current

T = TypeVar("T")

EXPENSIVE_ITEMS = 64  # texts, documents or pairs a request may hold and still be cheap (a batcher's bulk_over)
EXPENSIVE_NICE = 10  # the niceness of the threads expensive requests run in (Linux): the scheduler favours searches


class Busy(Exception):
    """An expensive request refused for now (answered 503 with ``Retry-After: retry_after`` seconds)."""

    def __init__(self, message: str, retry_after: int) -> None:
        super().__init__(message)
        self.retry_after = retry_after


def is_expensive(items: int, queries: int = 1) -> bool:
    """A request of ``queries`` queries (a batch) whose models read ``items`` texts, documents or pairs."""
    return queries > 1 or items > EXPENSIVE_ITEMS


class Admission:
    """At most ``max_expensive`` expensive requests at once, each waiting at most ``wait_s`` for its turn; none
    while ``searches()`` reports ``max_searches`` or more in flight."""

    def __init__(self, searches: Callable[[], int], *, max_expensive: int = 1, wait_s: float = 10.0,
                 max_searches: int = 32) -> None:
        if isinstance(max_expensive, bool) or not isinstance(max_expensive, int) or max_expensive <= 0:
            raise ConfigError(f"--max-expensive must be a positive whole number, got {max_expensive!r}")
        if not (isinstance(wait_s, (int, float)) and math.isfinite(wait_s) and wait_s >= 0):
            raise ConfigError(f"--expensive-wait must be a number of seconds >= 0, got {wait_s!r}")
        if isinstance(max_searches, bool) or not isinstance(max_searches, int) or max_searches <= 0:
            raise ConfigError(f"--max-searches must be a positive whole number, got {max_searches!r}")
        self.searches, self.max_expensive, self.wait_s, self.max_searches = searches, max_expensive, wait_s, \
            max_searches
        self._slots = threading.Semaphore(max_expensive)
        self._lock = threading.Lock()
        self._pool = ThreadPoolExecutor(max_workers=max_expensive, thread_name_prefix="expensive",
                                        initializer=_lower_priority)
        self.running = 0
        self.refused = 0

    def run(self, what: str, fn: Callable[[], T]) -> T:
        """``fn()`` as an expensive request: in its slot (:meth:`expensive`), on a thread of lower priority than the
        searches' (its own work, such as scoring long queries or cutting documents, yields the cores to theirs),
        inside the caller's work scope (a stopped request still stops)."""
        scope = current()

        def work() -> T:
            if scope is None:
                return fn()
            with scope:
                return fn()

        with self.expensive(what):
            return self._pool.submit(work).result()

    def close(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)

    @contextmanager
    def expensive(self, what: str) -> Iterator[None]:
        """Hold an expensive request's slot while the block runs; :class:`Busy` when none comes in time."""
        retry = max(1, math.ceil(self.wait_s))
        if self.searches() >= self.max_searches:
            self._refuse()
            raise Busy(f"{what}: the server is busy with {self.searches()} searches; this request is expensive "
                       f"and waits until it is less busy: retry in {retry} s, or send a smaller one", retry)
        if not self._slots.acquire(timeout=self.wait_s):
            self._refuse()
            raise Busy(f"{what}: {self.max_expensive} expensive request(s) already running and none finished within "
                       f"{self.wait_s:g} s; retry in {retry} s (or start the server with --max-expensive N)", retry)
        with self._lock:
            self.running += 1
        try:
            yield
        finally:
            with self._lock:
                self.running -= 1
            self._slots.release()

    def _refuse(self) -> None:
        with self._lock:
            self.refused += 1


def _lower_priority() -> Any:
    """Run the calling thread at :data:`EXPENSIVE_NICE` (a no-op where threads have no niceness of their own)."""
    try:
        os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), EXPENSIVE_NICE)
    except (AttributeError, OSError):  # pragma: no cover - not Linux
        pass
