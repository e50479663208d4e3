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

from twostage.indexer.errors import ConfigError
from twostage.indexer.protocols import Retriever
from twostage.indexer.records import Hit, RankedList, SearchResult
from twostage.indexer.topk import check_k
from twostage.reranker.interpolation import blend_for, reorders, rerank_order


class Pipeline:
    """First stage (+ optional reranker). ``texts`` maps a document id to the text the reranker reads.

    ``interpolation``: ``None`` ranks by the reranker's score alone; a number ``alpha`` in [0, 1] blends it with
    the first stage's (:mod:`twostage.reranker.interpolation`); ``"auto"`` (default) uses the value chosen on dev data
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
            interpolation = blend_for(reranker, None)
        if interpolation is not None and not (isinstance(interpolation, (int, float)) and 0 <= interpolation <= 1):
            raise ConfigError(f"interpolation must be None, 'auto' or a number in [0, 1], got {interpolation!r}")
        self.interpolation = None if interpolation is None else float(interpolation)
        self._text = texts.__getitem__ if isinstance(texts, Mapping) else texts
        self.k_retrieve, self.k, self.batch_size = check_k(k_retrieve), check_k(k), batch_size
        if self.k_retrieve < self.k:
            raise ConfigError(f"k_retrieve ({k_retrieve}) must be at least k ({k}): the reranker can only "
                              "reorder what the first stage found")

    def _reranked(self, queries: Sequence[str], firsts: Sequence[RankedList], k: int,
                  k_retrieve: int) -> list[Reranked]:
        return rerank_lists(self.reranker, queries, firsts, self._text, k=k, k_retrieve=k_retrieve,
                            interpolation=self.interpolation, batch_size=self.batch_size)

    def search(self, query: str, *, k: int | None = None, k_retrieve: int | None = None) -> SearchResult:
        return self.search_batch([query], k=k, k_retrieve=k_retrieve)[0]

    def search_batch(self, queries: Sequence[str], *, k: int | None = None,
                     k_retrieve: int | None = None) -> list[SearchResult]:
        """Hits of each query; the reranker scores every query's candidates in shared batches."""
        k = check_k(self.k if k is None else k)
        k_retrieve = check_k(self.k_retrieve if k_retrieve is None else k_retrieve)
        if k_retrieve < k:
            raise ConfigError(f"k_retrieve ({k_retrieve}) must be at least k ({k})")
        t0 = time.perf_counter()
        firsts = [self.first_stage.search(q, k_retrieve) for q in queries]
        t1 = time.perf_counter()
        results = self._reranked(queries, firsts, k, k_retrieve)
        t2 = time.perf_counter()
        n = max(len(queries), 1)
        timings = {"first_stage_s": (t1 - t0) / n, **({"rerank_s": (t2 - t1) / n} if self.reranker is not None else {})}
        out = []
        for query, first, res in zip(queries, firsts, results):
            first_score = dict(zip(map(str, first.ids), first.scores.tolist()))
            hits = tuple(Hit(str(d), float(s), r + 1, first_score.get(str(d)), self._text(str(d)),
                             stage_scores={"first_stage": first_score[str(d)],
                                           **({"rerank": res.rerank_scores[str(d)]} if str(d) in res.rerank_scores else {})})
                         for r, (d, s) in enumerate(zip(res.ranked.ids, res.ranked.scores)))
            out.append(SearchResult(query, hits, timings))
        return out

    def ranked(self, query: str, k: int) -> RankedList:
        """The harness's view: the top ``k_retrieve`` reranked, then the rest of the first stage's top ``k``
        below them in its own order (so Recall@k beyond the rerank depth is the first stage's)."""
        k = check_k(k)
        first = self.first_stage.search(query, max(k, self.k_retrieve))
        return self._reranked([query], [first], k, self.k_retrieve)[0].ranked


@dataclass(frozen=True)
class Reranked:
    """One query's final list and the reranker's own score of each reranked document (by id)."""

    ranked: RankedList
    rerank_scores: Mapping[str, float]


def rerank_lists(reranker: Any, queries: Sequence[str], firsts: Sequence[RankedList], text_of: Callable[[str], str], *,
                 k: int, k_retrieve: int, interpolation: float | None, batch_size: int = 32,
                 per_query: Sequence[Callable[[str], str]] | None = None) -> list[Reranked]:
    """Rerank the top ``k_retrieve`` of each first-stage list; the rest of its top ``k`` follows in first-stage order.

    ``text_of`` gives the text the reranker reads for a document id; ``per_query``, one such function per query,
    when that text depends on the query (a passage engine reads each document by its best passage for the query).

    Every query's (query, document) pairs are scored in one call, so batches are shared across queries. With no
    reranker, or a blend of 0 (:func:`reorders`), the first stage's top ``k`` comes back unchanged, nothing scored.
    """
    if reranker is None or not reorders(interpolation):
        return [Reranked(first.truncate(k), {}) for first in firsts]
    heads = [first.truncate(k_retrieve) for first in firsts]
    readers = list(per_query) if per_query is not None else [text_of] * len(queries)
    pairs = [(q, read(str(d))) for q, head, read in zip(queries, heads, readers) for d in head.ids]
    if not pairs:
        scores = np.zeros(0, dtype=np.float32)
    elif hasattr(reranker, "predict"):  # a CrossEncoder: every query's pairs in shared, length-sorted batches
        scores = np.asarray(reranker.predict(pairs, batch_size=batch_size), dtype=np.float32)
    else:  # any object with score(query, texts), one query at a time
        scores = np.concatenate([np.asarray(reranker.score(q, [read(str(d)) for d in head.ids]), dtype=np.float32)
                                 for q, head, read in zip(queries, heads, readers) if len(head)])
    out, at = [], 0
    for first, head in zip(firsts, heads):
        ce = scores[at:at + len(head)]
        at += len(head)
        if len(head) == 0:
            out.append(Reranked(first.truncate(k), {}))
            continue
        order, final = rerank_order(head.scores, ce, interpolation)
        tail = first.ids[len(head):k]
        tail_scores = float(final.min()) - 1.0 - np.arange(len(tail), dtype=np.float32)
        ranked = RankedList(np.concatenate([head.ids[order], tail]).astype(object)[:k],
                            np.concatenate([final[order], tail_scores]).astype(np.float32)[:k])
        out.append(Reranked(ranked, dict(zip(map(str, head.ids), ce.astype(float).tolist()))))
    return out
