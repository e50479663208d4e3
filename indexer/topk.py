"""Deterministic top-k selection over a score vector (ties broken by row number, lowest first), and the exact merge
of per-shard top-k lists."""

from __future__ import annotations

import itertools
from collections.abc import Sequence

import numpy as np

from twostage.indexer.errors import ConfigError
from twostage.indexer.records import RankedList


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


def merge_topk(results: Sequence[RankedList], k: int) -> RankedList:
    """The global top ``k`` of per-shard results (each best first). Ties: earlier shard, then better rank, which with
    contiguous shards is corpus order: exact shards give exactly one exact index's answer."""
    k = check_k(k)
    results = [r for r in results if len(r)]
    if not results:
        return RankedList(np.array([], dtype=object), np.array([], dtype=np.float32))
    ids = np.concatenate([np.asarray(r.ids, dtype=object) for r in results])
    scores = np.concatenate([np.asarray(r.scores, dtype=np.float32) for r in results])
    shard = np.concatenate([np.full(len(r), i) for i, r in enumerate(results)])
    rank = np.concatenate([np.arange(len(r)) for r in results])
    order = np.lexsort((rank, shard, -scores))[:k]
    return RankedList(ids[order], scores[order])


def contiguous_bounds(n: int, shards: int) -> list[tuple[int, int]]:
    """The (start, stop) rows of ``shards`` contiguous slices of ``n`` rows, of nearly equal size, in order."""
    if shards <= 0:
        raise ConfigError(f"the number of shards must be positive, got {shards}")
    if shards > n:
        raise ConfigError(f"{shards} shards for {n} documents: use at most one shard per document")
    bounds = np.linspace(0, n, shards + 1).round().astype(int)
    return [(int(a), int(b)) for a, b in itertools.pairwise(bounds)]
