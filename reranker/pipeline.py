"""The two-stage search pipeline: a first stage finds ``k_retrieve`` candidates, a cross-encoder reranks them.

The same object answers users (``search`` -> hits with text and per-stage timings) and the harness
(``search(query, k)`` shape through :meth:`ranked`).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from indexer.errors import ConfigError
from indexer.protocols import Retriever
from indexer.records import Hit, RankedList
from indexer.topk import check_k
from reranker.interpolation import rerank_order


@dataclass(frozen=True)
class SearchResult:
    """Hits of one query, best first, with the seconds spent in each stage."""

    query: str
    hits: tuple[Hit, ...]
    timings: Mapping[str, float]


class Pipeline:
    """First stage (+ optional reranker). ``texts`` maps a document id to the text the reranker reads.

    ``interpolation``: ``None`` ranks by the reranker's score alone; a number ``alpha`` in [0, 1] blends it with
    the first stage's (:mod:`reranker.interpolation`); ``"auto"`` (default) uses the value chosen on dev data
    and saved with the reranker, if any.

    >>> pipe = Pipeline(bm25, reranker=ce, texts=lambda i: corpus.get(i).full_text, k_retrieve=100, k=10)
    >>> result = pipe.search("why do cats purr")
    >>> result.hits[0].doc_id, result.hits[0].score, result.hits[0].first_stage_score, result.timings
    """

    def __init__(self, first_stage: Retriever, *, reranker: Any = None, texts: Callable[[str], str] | Mapping[str, str],
                 k_retrieve: int = 100, k: int = 10, batch_size: int = 32,
                 interpolation: float | None | str = "auto") -> None:
        self.first_stage, self.reranker = first_stage, reranker
        if interpolation == "auto":
            interpolation = getattr(reranker, "interpolation", None)
        if interpolation is not None and not (isinstance(interpolation, (int, float)) and 0 <= interpolation <= 1):
            raise ConfigError(f"interpolation must be None, 'auto' or a number in [0, 1], got {interpolation!r}")
        self.interpolation = None if interpolation is None else float(interpolation)
        self._text = texts.__getitem__ if isinstance(texts, Mapping) else texts
        self.k_retrieve, self.k, self.batch_size = check_k(k_retrieve), check_k(k), batch_size
        if self.k_retrieve < self.k:
            raise ConfigError(f"k_retrieve ({k_retrieve}) must be at least k ({k}): the reranker can only "
                              "reorder what the first stage found")

    def _rerank(self, query: str, candidates: RankedList) -> tuple[np.ndarray, np.ndarray]:
        """The new order of ``candidates`` (equal scores keep first-stage order) and their final scores: the
        reranker's, or blended with the first stage's when ``interpolation`` is set."""
        scores = self.reranker.score(query, [self._text(str(d)) for d in candidates.ids], batch_size=self.batch_size)
        return rerank_order(candidates.scores, scores, self.interpolation)

    def _run(self, query: str, k: int, k_retrieve: int) -> tuple[RankedList, np.ndarray | None, dict[str, float]]:
        t0 = time.perf_counter()
        first = self.first_stage.search(query, k_retrieve)
        t1 = time.perf_counter()
        timings = {"first_stage_s": t1 - t0}
        if self.reranker is None or len(first) == 0:
            return first.truncate(k), None, timings
        order, scores = self._rerank(query, first)
        order = order[:k]
        timings["rerank_s"] = time.perf_counter() - t1
        return RankedList(first.ids[order], scores[order]), first.scores[order], timings

    def search(self, query: str, *, k: int | None = None, k_retrieve: int | None = None) -> SearchResult:
        k, k_retrieve = check_k(k or self.k), check_k(k_retrieve or self.k_retrieve)
        if k_retrieve < k:
            raise ConfigError(f"k_retrieve ({k_retrieve}) must be at least k ({k})")
        ranked, first_scores, timings = self._run(query, k, k_retrieve)
        hits = tuple(Hit(str(d), float(s), r + 1, None if first_scores is None else float(first_scores[r]),
                         self._text(str(d))) for r, (d, s) in enumerate(zip(ranked.ids, ranked.scores)))
        return SearchResult(query, hits, timings)

    def search_batch(self, queries: Sequence[str], **kw: Any) -> list[SearchResult]:
        return [self.search(q, **kw) for q in queries]

    def ranked(self, query: str, k: int) -> RankedList:
        """The harness's view: the top ``k_retrieve`` reranked, then the rest of the first stage's top ``k``
        below them in its own order (so Recall@k beyond the rerank depth is the first stage's)."""
        k = check_k(k)
        first = self.first_stage.search(query, max(k, self.k_retrieve))
        head = first.truncate(self.k_retrieve)
        if self.reranker is None or len(head) == 0:
            return first.truncate(k)
        order, scores = self._rerank(query, head)
        tail = first.ids[len(head):k]
        tail_scores = float(scores.min()) - 1.0 - np.arange(len(tail), dtype=np.float32)
        return RankedList(np.concatenate([head.ids[order], tail]).astype(object),
                          np.concatenate([scores[order], tail_scores]).astype(np.float32))
