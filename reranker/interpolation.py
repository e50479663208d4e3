"""Score interpolation: the reranker's score blended with the first stage's, per query.

    final(d) = alpha * minmax(rerank)(d) + (1 - alpha) * minmax(first_stage)(d)

where ``minmax`` rescales a query's candidate scores to [0, 1]. ``alpha = 1`` is pure reranking, ``alpha = 0``
the first stage's order. A small in-domain reranker is often better blended than alone; ``alpha`` is chosen on
held-out training queries (never on test) and saved with the model.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from twostage.indexer.errors import ConfigError
from twostage.indexer.records import Qrels, Query, RankedList

GRID = tuple(round(a, 2) for a in np.linspace(0.0, 1.0, 11))


def minmax(x: np.ndarray) -> np.ndarray:
    x = np.asarray(x, dtype=np.float64)
    span = float(x.max() - x.min()) if len(x) else 0.0
    return np.zeros_like(x) if span == 0 else (x - x.min()) / span


def interpolate(first: np.ndarray, rerank: np.ndarray, alpha: float | None) -> np.ndarray:
    """Blended scores (float32); ``alpha=None`` returns the reranker's scores unchanged."""
    if alpha is None:
        return np.asarray(rerank, dtype=np.float32)
    if not 0.0 <= alpha <= 1.0:
        raise ConfigError(f"interpolation alpha must be in [0, 1], got {alpha}")
    return (alpha * minmax(rerank) + (1.0 - alpha) * minmax(first)).astype(np.float32)


def order_by(scores: np.ndarray) -> np.ndarray:
    """Best first; equal scores keep their first-stage order."""
    return np.lexsort((np.arange(len(scores)), -np.asarray(scores)))


def rerank_order(first: np.ndarray, rerank: np.ndarray, alpha: float | None) -> tuple[np.ndarray, np.ndarray]:
    """The candidates' new order (best first) and their final scores (in candidate order)."""
    scores = interpolate(first, rerank, alpha)
    return order_by(scores), scores


@dataclass(frozen=True)
class InterpolationChoice:
    """The chosen ``alpha`` and the dev metric at every ``alpha`` tried (mean over the first stages)."""

    alpha: float
    dev_by_alpha: tuple[tuple[float, float], ...]

    @property
    def best(self) -> float:
        return dict(self.dev_by_alpha)[self.alpha]


def select_interpolation(model: Any, first_stages: Mapping[str, Any], queries: Sequence[Query], qrels: Qrels,
                         texts: Mapping[str, str], depth: int, metric: Callable[[Qrels, dict[str, RankedList]], float],
                         grid: Sequence[float] = GRID) -> InterpolationChoice:
    """Score each first stage's top ``depth`` once, then try every ``alpha`` of ``grid`` (ties: the larger)."""
    if not queries:
        raise ConfigError("choosing the interpolation needs held-out queries")
    cached = []
    for fs in first_stages.values():
        per_query = {}
        for q in queries:
            first = fs.search(q.text, depth)
            rerank = model.score(q.text, [texts[str(d)] for d in first.ids]) if len(first) else np.zeros(0)
            per_query[q.id] = (first, rerank)
        cached.append(per_query)
    results = []
    for alpha in grid:
        values = []
        for per_query in cached:
            run = {}
            for qid, (first, rerank) in per_query.items():
                order, scores = rerank_order(first.scores, rerank, float(alpha))
                run[qid] = RankedList(first.ids[order], scores[order])
            values.append(float(metric(qrels, run)))
        results.append((float(alpha), float(np.mean(values))))
    best = max(results, key=lambda r: (round(r[1], 10), r[0]))
    return InterpolationChoice(best[0], tuple(results))
