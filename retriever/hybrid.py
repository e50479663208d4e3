"""Hybrid first stage: reciprocal rank fusion (RRF) of several retrievers.

    score(d) = sum over retrievers r of 1 / (k_rrf + rank_r(d))       (rank from 1; absent = no term)

(Cormack et al., 2009; k_rrf = 60.) Each retriever contributes its top ``depth``; equal fused scores keep the
order of first appearance.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from twostage.indexer.errors import ConfigError
from twostage.indexer.protocols import Retriever
from twostage.indexer.records import RankedList
from twostage.indexer.topk import check_k


def rrf(lists: Sequence[RankedList], k_rrf: float = 60.0) -> RankedList:
    """Fuse ranked lists by reciprocal rank."""
    scores: dict[str, float] = {}
    for ranked in lists:
        for rank, doc in enumerate(ranked.ids, start=1):
            scores[str(doc)] = scores.get(str(doc), 0.0) + 1.0 / (k_rrf + rank)
    ids = list(scores)
    values = np.array([scores[d] for d in ids], dtype=np.float64)
    order = np.lexsort((np.arange(len(ids)), -values))
    return RankedList(np.array([ids[i] for i in order], dtype=object), values[order].astype(np.float32))


class HybridRetriever:
    """RRF of several first stages (e.g. BM25 and dense); ``search`` returns the fused top k."""

    def __init__(self, retrievers: Sequence[Retriever], *, depth: int = 100, k_rrf: float = 60.0) -> None:
        if len(retrievers) < 2:
            raise ConfigError("a hybrid retriever fuses at least two retrievers")
        self.retrievers, self.depth, self.k_rrf = list(retrievers), check_k(depth), k_rrf

    def search(self, query: str, k: int = 10) -> RankedList:
        k = check_k(k)
        lists = [r.search(query, max(self.depth, k)) for r in self.retrievers]
        return rrf(lists, self.k_rrf).truncate(k)

    def search_batch(self, queries: Sequence[str], k: int = 10) -> list[RankedList]:
        """:meth:`search` for many queries (each retriever's own ``search_batch`` when it has one)."""
        k = check_k(k)
        depth = max(self.depth, k)
        per_retriever = [r.search_batch(list(queries), depth) if hasattr(r, "search_batch")
                         else [r.search(q, depth) for q in queries] for r in self.retrievers]
        return [rrf(lists, self.k_rrf).truncate(k) for lists in zip(*per_retriever)]
