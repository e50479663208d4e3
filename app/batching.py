"""Cross-request batching: concurrent callers of a model share one forward pass.

A :class:`MicroBatcher` sits in front of a function that maps a list of items to a list (or array) of results of
the same length. Callers in many threads call it with their own items and block; one worker thread takes every
call waiting in the queue, waits a few milliseconds more while other requests are known to be on their way
(``expected``), runs the function once on all the items, and hands each caller its own slice. With one caller at
a time nothing waits; under load the model sees one batch instead of many small calls fighting for the cores.

:class:`BatchingEncoder` and :class:`BatchingReranker` wrap a bi-encoder and a cross-encoder this way: query
encoding and pair scoring are batched, everything else (document encoding, attributes) passes through.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Any

import numpy as np

logger = logging.getLogger(__name__)


@dataclass
class BatchStats:
    """What a batcher has done: model calls, caller requests and items (a mean batch is items / calls)."""

    calls: int = 0
    requests: int = 0
    items: int = 0
    largest: int = 0
    lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def record(self, requests: int, items: int) -> None:
        with self.lock:
            self.calls += 1
            self.requests += requests
            self.items += items
            self.largest = max(self.largest, requests)

    def to_dict(self) -> dict[str, float]:
        with self.lock:
            return {"model_calls": self.calls, "requests": self.requests, "items": self.items,
                    "mean_requests_per_call": self.requests / self.calls if self.calls else 0.0,
                    "largest_call_requests": self.largest}


class MicroBatcher:
    """Run ``fn`` on the items of all concurrent callers at once (see the module docstring).

    ``max_wait_s`` bounds how long a batch waits for callers that ``expected()`` says are on their way;
    ``max_items`` bounds a batch's size (a caller's items are never split).
    """

    def __init__(self, fn: Callable[[list[Any]], Sequence[Any] | np.ndarray], *, name: str,
                 max_wait_s: float = 0.005, max_items: int = 1024, expected: Callable[[], int] | None = None) -> None:
        if max_wait_s < 0 or max_items <= 0:
            raise ValueError("max_wait_s must be >= 0 and max_items positive")
        self.fn, self.name, self.max_wait_s, self.max_items = fn, name, max_wait_s, max_items
        self.expected = expected
        self.stats = BatchStats()
        self._queue: queue.Queue[tuple[list[Any], Future[Any]] | None] = queue.Queue()
        self._closed = False
        self._thread = threading.Thread(target=self._run, name=f"batcher-{name}", daemon=True)
        self._thread.start()

    def __call__(self, items: Sequence[Any]) -> Any:
        """``fn(items)``, computed together with whatever other callers are waiting."""
        if self._closed:
            raise RuntimeError(f"the {self.name} batcher is closed")
        done: Future[Any] = Future()
        self._queue.put((list(items), done))
        return done.result()

    def close(self) -> None:
        """Stop the worker after the calls already queued."""
        if not self._closed:
            self._closed = True
            self._queue.put(None)
            self._thread.join(timeout=30)

    def _gather(self, first: tuple[list[Any], Future[Any]]) -> tuple[list[tuple[list[Any], Future[Any]]], bool]:
        batch, size, stop = [first], len(first[0]), False
        deadline = time.monotonic() + self.max_wait_s
        while size < self.max_items:
            try:
                item = self._queue.get_nowait()
            except queue.Empty:
                more = self.expected() - len(batch) if self.expected is not None else 0
                left = deadline - time.monotonic()
                if more <= 0 or left <= 0:
                    break
                try:
                    item = self._queue.get(timeout=min(left, 0.001))
                except queue.Empty:
                    continue
            if item is None:
                stop = True
                break
            batch.append(item)
            size += len(item[0])
        return batch, stop

    def _run(self) -> None:
        while True:
            first = self._queue.get()
            if first is None:
                return
            batch, stop = self._gather(first)
            items = [x for its, _ in batch for x in its]
            try:
                results = self.fn(items)
                if len(results) != len(items):
                    raise RuntimeError(f"{self.name}: {len(results)} results for {len(items)} items")
            except BaseException as exc:  # every waiting caller gets the error, the worker lives on
                for _, done in batch:
                    done.set_exception(exc)
            else:
                self.stats.record(len(batch), len(items))
                at = 0
                for its, done in batch:
                    done.set_result(results[at:at + len(its)])
                    at += len(its)
            if stop:
                return


class _Wrapper:
    """Passes every attribute it does not define through to the wrapped model."""

    def __init__(self, model: Any) -> None:
        self.model = model

    def __getattr__(self, name: str) -> Any:
        return getattr(self.model, name)


class BatchingEncoder(_Wrapper):
    """A bi-encoder whose query encoding is batched across callers; document encoding passes through."""

    def __init__(self, model: Any, *, batch_size: int = 32, **batcher: Any) -> None:
        super().__init__(model)
        self.batcher = MicroBatcher(lambda texts: model.encode(texts, kind="query", batch_size=batch_size),
                                    name="encoder", **batcher)

    def encode(self, texts: Sequence[str], *, kind: str = "document", **kw: Any) -> np.ndarray:
        if kind != "query" or any(v for k, v in kw.items() if k != "batch_size") or not len(texts):
            return self.model.encode(texts, kind=kind, **kw)
        return np.asarray(self.batcher(texts))


class BatchingReranker(_Wrapper):
    """A cross-encoder whose ``predict`` (sigmoid scores) is batched across callers."""

    def __init__(self, model: Any, *, batch_size: int = 32, **batcher: Any) -> None:
        super().__init__(model)
        self.batcher = MicroBatcher(lambda pairs: model.predict(pairs, batch_size=batch_size),
                                    name="reranker", **batcher)

    def predict(self, pairs: Sequence[tuple[str, str]], **kw: Any) -> np.ndarray:
        if kw.get("activation", "sigmoid") != "sigmoid" or kw.get("show_progress") or not len(pairs):
            return self.model.predict(pairs, **kw)
        return np.asarray(self.batcher(pairs), dtype=np.float32)

    def score(self, query: str, documents: Sequence[str], **kw: Any) -> np.ndarray:
        return self.predict([(query, d) for d in documents], **kw)
