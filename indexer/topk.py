"""Deterministic top-k selection over a score vector (ties broken by row number, lowest first)."""

from __future__ import annotations

import numpy as np

from twostage.indexer.errors import ConfigError


def check_k(k: int) -> int:
    if isinstance(k, bool) or not isinstance(k, (int, np.integer)) or k <= 0:
        raise ConfigError(f"k must be a positive integer, got {k!r}")
    return int(k)


def top_k(scores: np.ndarray, k: int, *, positive_only: bool = False) -> tuple[np.ndarray, np.ndarray]:
    """Rows and scores of the ``k`` highest scores, best first; equal scores keep row order.

    With ``positive_only`` rows whose score is not > 0 are left out (a lexical retriever's non-matches),
    so fewer than ``k`` rows may come back.
    """
    k = check_k(k)
    scores = np.asarray(scores)
    rows = np.flatnonzero(scores > 0) if positive_only else np.arange(len(scores))
    sub = scores[rows]
    if k < len(rows):
        kth = np.partition(sub, len(sub) - k)[len(sub) - k]
        keep = sub >= kth
        rows, sub = rows[keep], sub[keep]
    order = np.lexsort((rows, -sub))[:k]
    return rows[order], sub[order]
