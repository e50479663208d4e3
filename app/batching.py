"""Cross-request batching: concurrent callers of a model share one forward pass.

A :class:`MicroBatcher` sits in front of a function that maps a list of items to a list (or array) of results of
the same length. Callers in many threads call it with their own items and block; one worker thread takes every
call waiting in the queue, waits a few milliseconds more while other requests are known to be on their way
(``expected``), runs the function once on all the items, and hands each caller its own slice. With one caller at
a time nothing waits; under load the model sees one batch instead of many small calls fighting for the cores.

:class:`BatchingEncoder` and :class:`BatchingReranker` wrap a bi-encoder and a cross-encoder this way: every
forward pass of the served models (query and document encoding, pair scoring) goes through one worker each, small
calls first and bulk calls a piece at a time, so one client's large call or bad input never stalls or fails
another's search (docs/serving.md, "Budgets").
"""

from __future__ import annotations

import itertools
import logging
import queue
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import Future
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from twostage.indexer.work import WorkScope, WorkStopped, current
from twostage.models.base import check_texts

logger = logging.getLogger(__name__)
_caller = threading.local()  # whether the calling thread serves a search (its bulk pieces never wait for searches)


@contextmanager
def serving_search() -> Iterator[None]:
    """Mark the calling thread as serving a search while the block runs: the model calls it makes are what bulk
    work waits for, never themselves held back (:class:`MicroBatcher`'s ``busy``)."""
    before = getattr(_caller, "search", False)
    _caller.search = True
    try:
        yield
    finally:
        _caller.search = before


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
    ``max_items`` bounds a batch's size. A call of more than ``bulk_over`` items (a bulk call: a large embedding or
    rerank request, a search reranking hundreds of candidates) is cut into pieces of ``piece`` items that queue
    behind every small call, so a search waits at most for the one piece being computed, never for the whole bulk
    call; while ``busy()`` says searches are running (in this model's batcher or another's: the cores are shared), a
    piece waits for them, at most ``max_defer_s`` a piece so that bulk work still moves; such a piece (of a call
    that is not a search's) holds ``defer_piece`` items, so that a search arriving meanwhile waits for little (with
    no search running, consecutive pieces are computed together, up to ``idle_piece`` items). Items carry a ``group`` (for instance
    the side of a bi-encoder): a batch holds one group, ``fn(items, group)`` computes it. When a batch of several
    callers fails, each caller is run again alone, so one bad item fails its own request only.
    """

    def __init__(self, fn: Callable[[list[Any], Any], Sequence[Any] | np.ndarray], *, name: str,
                 max_wait_s: float = 0.005, max_items: int = 1024, piece: int = 8, bulk_over: int = 64,
                 expected: Callable[[], int] | None = None, busy: Callable[[], int] | None = None,
                 max_defer_s: float = 1.0, defer_piece: int = 2, idle_piece: int = 16) -> None:
        if max_wait_s < 0 or max_items <= 0 or piece <= 0 or bulk_over <= 0:
            raise ValueError("max_wait_s must be >= 0, max_items, piece and bulk_over positive")
        self.fn, self.name, self.max_wait_s, self.max_items = fn, name, max_wait_s, max_items
        self.piece, self.bulk_over = piece, bulk_over
        self.expected, self.busy, self.max_defer_s = expected, busy, max_defer_s
        self.defer_piece, self.idle_piece = max(1, min(defer_piece, piece)), max(1, idle_piece)
        self.stats = BatchStats()
        self._queue: queue.PriorityQueue[tuple[int, int, _Call | None]] = queue.PriorityQueue()
        self._order = itertools.count()
        self._closed = False
        self._thread = threading.Thread(target=self._run, name=f"batcher-{name}", daemon=True)
        self._thread.start()

    def __call__(self, items: Sequence[Any], group: Any = None) -> Any:
        """``fn(items, group)``, computed together with whatever other callers are waiting."""
        if self._closed:
            raise RuntimeError(f"the {self.name} batcher is closed")
        items = list(items)
        scope = current()  # a request stopped meanwhile (its client gone, its deadline past) is dropped unrun
        if scope is not None:
            scope.check()
        if len(items) <= self.bulk_over:
            done: Future[Any] = Future()
            self._put(0, _Call(items, group, done, scope=scope))
            return done.result()
        pieces: list[Future[Any]] = []
        deferrable = not getattr(_caller, "search", False)
        size = self.defer_piece if deferrable else self.piece  # a search's own bulk call goes in larger pieces
        for start in range(0, len(items), size):  # bulk: after every small call, a piece at a time
            pieces.append(Future())
            self._put(1, _Call(items[start:start + size], group, pieces[-1], deferrable, scope))
        parts = [p.result() for p in pieces]
        return np.concatenate([np.asarray(p) for p in parts]) if isinstance(parts[0], np.ndarray) else \
            [x for p in parts for x in p]

    def close(self) -> None:
        """Stop the worker after the calls already queued."""
        if not self._closed:
            self._closed = True
            self._queue.put((2, next(self._order), None))
            self._thread.join(timeout=30)

    def _put(self, priority: int, call: _Call) -> None:
        self._queue.put((priority, next(self._order), call))

    def _gather(self, first: tuple[int, int, _Call | None]) -> list[_Call]:
        priority, _, call = first
        assert call is not None
        batch, size = [call], len(call.items)
        if priority > 0:
            return self._gather_idle(batch, size) if call.deferrable else batch
        deadline = time.monotonic() + self.max_wait_s
        while size < self.max_items:
            try:
                entry = self._queue.get_nowait()
            except queue.Empty:
                more = self.expected() - len(batch) if self.expected is not None else 0
                left = deadline - time.monotonic()
                if more <= 0 or left <= 0:
                    break
                try:
                    entry = self._queue.get(timeout=min(left, 0.001))
                except queue.Empty:
                    continue
            nxt = entry[2]
            if nxt is None or entry[0] != priority or nxt.group != call.group \
                    or size + len(nxt.items) > self.max_items:
                self._queue.put(entry)  # keeps its place: computed next
                break
            batch.append(nxt)
            size += len(nxt.items)
        return batch

    def _gather_idle(self, batch: list[_Call], size: int) -> list[_Call]:
        """More deferrable bulk pieces of the same group, up to ``idle_piece`` items in all, while ``busy()`` says
        no search runs (nor ran a moment ago): a write or a bulk call alone on the server goes at a model's batch
        speed; beside searches, a piece at a time."""
        while size < self.idle_piece and self.busy is not None and self.busy() == 0:
            with self._queue.mutex:
                head = self._queue.queue[0] if self._queue.queue else None
            if head is None or head[0] != 1 or head[2] is None or not head[2].deferrable \
                    or head[2].group != batch[0].group or size + len(head[2].items) > self.idle_piece:
                break
            try:
                entry = self._queue.get_nowait()
            except queue.Empty:
                break
            nxt = entry[2]
            if entry is not head or nxt is None:  # another call came first: back in the queue, this batch is done
                self._queue.put(entry)
                break
            batch.append(nxt)
            size += len(nxt.items)
        return batch

    def _run(self) -> None:
        while True:
            first = self._queue.get()
            if first[2] is None:
                return
            if first[0] > 0 and self._defer(first):
                continue
            batch = self._gather(first)
            try:
                self._compute(batch)
            except BaseException as exc:
                if len(batch) == 1:
                    if not batch[0].done.done():
                        batch[0].done.set_exception(exc)
                    continue
                logger.info("%s: a batch of %d requests failed (%s); running each alone", self.name, len(batch), exc)
                for call in batch:  # one bad item fails its own request only
                    try:
                        self._compute([call])
                    except BaseException as alone:  # noqa: BLE001 - handed to its own caller
                        if not call.done.done():
                            call.done.set_exception(alone)

    def _defer(self, piece: tuple[int, int, _Call | None]) -> bool:
        """Hold a bulk piece while searches run (at most ``max_defer_s``); True when a small call came meanwhile
        (the piece is back in the queue, behind it)."""
        if self.busy is None or piece[2] is None or not piece[2].deferrable:
            return False
        if piece[2].scope is not None and piece[2].scope.stopped:
            return False  # computed (that is, dropped) at once
        until = time.monotonic() + self.max_defer_s
        while self.busy() > 0 and time.monotonic() < until:
            if self._small_waiting():
                self._queue.put(piece)
                return True
            time.sleep(0.002)
        return False

    def _small_waiting(self) -> bool:
        with self._queue.mutex:
            return any(entry[0] == 0 for entry in self._queue.queue)

    def _compute(self, batch: list[_Call]) -> None:
        live = []
        for call in batch:  # the calls of stopped requests leave the batch unrun
            if call.done.done():
                continue
            try:
                if call.scope is not None:
                    call.scope.check()
            except WorkStopped as stopped:
                call.done.set_exception(stopped)
                continue
            live.append(call)
        if not live:
            return
        batch = live
        items = [x for call in batch for x in call.items]
        results = self.fn(items, batch[0].group)
        if len(results) != len(items):
            raise RuntimeError(f"{self.name}: {len(results)} results for {len(items)} items")
        self.stats.record(len(batch), len(items))
        at = 0
        for call in batch:
            call.done.set_result(results[at:at + len(call.items)])
            at += len(call.items)


@dataclass
class _Call:
    items: list[Any]
    group: Any
    done: Future[Any]
    deferrable: bool = False  # a bulk piece of a call that is not a search: it waits while searches run
    scope: WorkScope | None = None  # the caller's: a stopped one's call is dropped before it is computed


class _Wrapper:
    """Passes every attribute it does not define through to the wrapped model."""

    def __init__(self, model: Any) -> None:
        self.model = model

    def __getattr__(self, name: str) -> Any:
        return getattr(self.model, name)


class BatchingEncoder(_Wrapper):
    """A bi-encoder whose encoding is batched across callers, queries and documents alike (each a group of its
    own), so every forward pass of the served model goes through one worker that puts searches first. Texts are
    checked (valid Unicode) before they join a shared batch. Calls with options other than ``batch_size`` (a
    progress bar...) pass through."""

    def __init__(self, model: Any, *, batch_size: int = 32, **batcher: Any) -> None:
        super().__init__(model)
        self.batcher = MicroBatcher(lambda texts, kind: model.encode(texts, kind=kind, batch_size=batch_size,
                                                                     allow_empty=kind != "query"),
                                    name="encoder", **batcher)

    def encode(self, texts: Sequence[str], *, kind: str = "document", **kw: Any) -> np.ndarray:
        # a document may be empty (a write's, allow_empty=True): the batched call allows it for documents
        passes = {k: v for k, v in kw.items() if k != "batch_size" and not (k == "allow_empty" and kind != "query")}
        if any(passes.values()) or not len(texts):
            return self.model.encode(texts, kind=kind, **kw)
        check_texts(texts, kind, allow_empty=kind != "query")
        return np.asarray(self.batcher(texts, kind))


class BatchingReranker(_Wrapper):
    """A cross-encoder whose ``predict`` (sigmoid scores) is batched across callers; pairs are checked before they
    join a shared batch."""

    def __init__(self, model: Any, *, batch_size: int = 32, **batcher: Any) -> None:
        super().__init__(model)
        self.batcher = MicroBatcher(lambda pairs, _: model.predict(pairs, batch_size=batch_size),
                                    name="reranker", **batcher)

    def predict(self, pairs: Sequence[tuple[str, str]], **kw: Any) -> np.ndarray:
        if kw.get("activation", "sigmoid") != "sigmoid" or kw.get("show_progress") or not len(pairs):
            return self.model.predict(pairs, **kw)
        check_texts([q for q, _ in pairs], "query")
        check_texts([d for _, d in pairs], "document", allow_empty=True)
        return np.asarray(self.batcher(pairs), dtype=np.float32)

    def score(self, query: str, documents: Sequence[str], **kw: Any) -> np.ndarray:
        return self.predict([(query, d) for d in documents], **kw)


class BatchingLate(_Wrapper):
    """A late-interaction encoder whose ``encode_tokens`` is batched across callers like the bi-encoder's
    ``encode`` (queries and documents each a group of their own): a write's token vectors go a piece at a time
    behind every search."""

    def __init__(self, model: Any, *, batch_size: int = 32, **batcher: Any) -> None:
        super().__init__(model)
        self.batcher = MicroBatcher(lambda texts, group: model.encode_tokens(texts, kind=group[0], allow_empty=group[1],
                                                                             batch_size=batch_size),
                                    name="late", **batcher)

    def encode_tokens(self, texts: Sequence[str], *, kind: str = "document", allow_empty: bool = False,
                      **kw: Any) -> list[np.ndarray]:
        if any(v for k, v in kw.items() if k != "batch_size") or not len(texts):
            return self.model.encode_tokens(texts, kind=kind, allow_empty=allow_empty, **kw)
        check_texts(texts, kind, allow_empty=allow_empty)
        return list(self.batcher(texts, (kind, allow_empty)))
