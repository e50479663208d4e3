"""Score interpolation: the reranker's score blended with the first stage's, per query.

    final(d) = alpha * minmax(rerank)(d) + (1 - alpha) * minmax(first_stage)(d)

where ``minmax`` rescales a query's candidate scores to [0, 1]. ``alpha = 1`` is pure reranking, ``alpha = 0``
the first stage's order. A small in-domain reranker is often better blended than alone; ``alpha`` is chosen on
held-out training queries (never on test) for each first stage the engine serves (BM25, dense, hybrid: their
scores differ in shape, so one weight does not fit all), and saved with the model. The choice is the smallest
``alpha`` within one standard error of the best on dev: a few dozen dev queries cannot tell apart blends that close,
and the one nearest the first stage is the one least likely to make a ranking worse than the first stage's.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from twostage.indexer.errors import ConfigError

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


def reorders(alpha: float | None) -> bool:
    """Whether the reranker's scores can move anything at this blend: at ``alpha = 0`` the first stage's order
    stays, so the pairs need not be scored at all."""
    return alpha is None or float(alpha) != 0.0


def rerank_order(first: np.ndarray, rerank: np.ndarray, alpha: float | None) -> tuple[np.ndarray, np.ndarray]:
    """The candidates' new order (best first) and their final scores (in candidate order)."""
    scores = interpolate(first, rerank, alpha)
    return order_by(scores), scores


@dataclass(frozen=True)
class InterpolationChoice:
    """The chosen ``alpha`` per first stage and overall, with the dev metric at every ``alpha`` tried.

    ``alpha`` and ``dev_by_alpha`` are over the mean of the first stages (the blend for a first stage the reranker
    was not tuned on); ``by_first_stage`` holds each first stage's own choice and curve (``(name, alpha, curve)``).
    """

    alpha: float
    dev_by_alpha: tuple[tuple[float, float], ...]
    by_first_stage: tuple[tuple[str, float, tuple[tuple[float, float], ...]], ...] = ()

    @property
    def best(self) -> float:
        return dict(self.dev_by_alpha)[self.alpha]

    def alphas(self) -> dict[str, float]:
        """first stage -> its chosen alpha."""
        return {name: alpha for name, alpha, _ in self.by_first_stage}


def one_se_blend(curve: Sequence[tuple[float, np.ndarray]]) -> float:
    """The smallest alpha whose mean is within one standard error of the best mean, the error being that of the
    per-query difference from the best alpha (the one-standard-error rule; equal means count as within)."""
    means = [float(np.mean(v)) for _, v in curve]
    best = int(np.argmax(means))
    for (alpha, values), m in sorted(zip(curve, means), key=lambda r: r[0][0]):
        diff = np.asarray(curve[best][1], dtype=np.float64) - np.asarray(values, dtype=np.float64)
        se = float(diff.std(ddof=1) / np.sqrt(len(diff))) if len(diff) > 1 else 0.0
        if m >= means[best] - se - 1e-12:
            return float(alpha)
    raise AssertionError("unreachable: the best alpha is within its own error")  # pragma: no cover


def blend_for(reranker: Any, first_stage: str | None) -> float | None:
    """The blend ``reranker`` chose on dev for ``first_stage`` (its overall choice for a first stage it was not
    tuned on; None: rank by the reranker alone)."""
    by_stage = getattr(reranker, "blends", None) or {}
    alpha = by_stage.get(first_stage, getattr(reranker, "interpolation", None))
    return None if alpha is None else float(alpha)
