"""Hybrid first stage: fusion of several retrievers' top ``depth`` lists, by rank or by score.

``rrf``, reciprocal rank fusion (Cormack et al., 2009; k_rrf = 60):

    score(d) = sum over retrievers r of 1 / (k_rrf + rank_r(d))       (rank from 1; absent = no term)

``blend``, a weighted sum of min-max normalised scores (ranx's ``wsum`` after ``min-max``, which the tests check it
against):

    score(d) = sum over retrievers r of w_r * (s_r(d) - min_r) / max(max_r - min_r, 1e-9)   (absent = 0)

where min_r and max_r are the lowest and highest score of r's list for that query. Equal fused scores keep the
order of first appearance.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from twostage.indexer.engine_dir import FUSIONS
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


def blend(lists: Sequence[RankedList], weights: Sequence[float]) -> RankedList:
    """Fuse ranked lists by a weighted sum of their min-max normalised scores."""
    if len(weights) != len(lists):
        raise ConfigError(f"blend needs one weight per list: {len(lists)} lists, {len(weights)} weights")
    scores: dict[str, float] = {}
    for ranked, w in zip(lists, weights):
        if not len(ranked):
            continue
        s = ranked.scores.astype(np.float64)
        low = float(s.min())
        norm = (s - low) / max(float(s.max()) - low, 1e-9)
        for doc, value in zip(ranked.ids, norm):
            scores[str(doc)] = scores.get(str(doc), 0.0) + float(w) * float(value)
    ids = list(scores)
    values = np.array([scores[d] for d in ids], dtype=np.float64)
    order = np.lexsort((np.arange(len(ids)), -values))
    return RankedList(np.array([ids[i] for i in order], dtype=object), values[order].astype(np.float32))


def fuse(lists: Sequence[RankedList], fusion: str = "rrf", *, k_rrf: float = 60.0,
         weights: Sequence[float] | None = None) -> RankedList:
    """``rrf`` or ``blend`` (``weights``: one per list; equal weights when None)."""
    if fusion == "rrf":
        return rrf(lists, k_rrf)
    if fusion == "blend":
        return blend(lists, weights if weights is not None else [1.0 / len(lists)] * len(lists))
    raise ConfigError(f"fusion must be {' or '.join(FUSIONS)}, got {fusion!r}")


def dense_weights(dense_weight: float) -> tuple[float, float]:
    """(BM25's weight, dense's weight) of a two-way blend whose dense weight is ``dense_weight``."""
    if isinstance(dense_weight, bool) or not isinstance(dense_weight, (int, float)) or not 0 <= dense_weight <= 1:
        raise ConfigError(f"the dense weight of a blend must be a number in [0, 1], got {dense_weight!r}")
    return 1.0 - float(dense_weight), float(dense_weight)


class HybridRetriever:
    """Fusion (:func:`fuse`) of several first stages (e.g. BM25 and dense); ``search`` returns the fused top k."""

    def __init__(self, retrievers: Sequence[Retriever], *, depth: int = 100, k_rrf: float = 60.0,
                 fusion: str = "rrf", weights: Sequence[float] | None = None) -> None:
        if len(retrievers) < 2:
            raise ConfigError("a hybrid retriever fuses at least two retrievers")
        if weights is not None and len(weights) != len(retrievers):
            raise ConfigError(f"one weight per retriever: {len(retrievers)} retrievers, {len(weights)} weights")
        if fusion not in FUSIONS:
            raise ConfigError(f"fusion must be {' or '.join(FUSIONS)}, got {fusion!r}")
        self.retrievers, self.depth, self.k_rrf = list(retrievers), check_k(depth), k_rrf
        self.fusion, self.weights = fusion, None if weights is None else tuple(float(w) for w in weights)

    def search(self, query: str, k: int = 10) -> RankedList:
        k = check_k(k)
        lists = [r.search(query, max(self.depth, k)) for r in self.retrievers]
        return fuse(lists, self.fusion, k_rrf=self.k_rrf, weights=self.weights).truncate(k)

    def search_batch(self, queries: Sequence[str], k: int = 10) -> list[RankedList]:
        """:meth:`search` for many queries (each retriever's own ``search_batch`` when it has one)."""
        k = check_k(k)
        depth = max(self.depth, k)
        per_retriever = [r.search_batch(list(queries), depth) if hasattr(r, "search_batch")
                         else [r.search(q, depth) for q in queries] for r in self.retrievers]
        return [fuse(lists, self.fusion, k_rrf=self.k_rrf, weights=self.weights).truncate(k)
                for lists in zip(*per_retriever)]
