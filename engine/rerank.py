"""Reranking first-stage candidate lists: the one function the engine's search path (and so every system the
harness measures, training's dev selection and ``twostage rerank`` of a run) reorders candidates with.

The top ``rerank_depth`` of each list is scored by the cross-encoder and blended with the first stage
(:mod:`twostage.engine.fusion`); the rest of the list follows in the first stage's order.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from twostage.engine.fusion import reorders, rerank_order
from twostage.indexer.errors import ConfigError
from twostage.indexer.records import RankedList


@dataclass(frozen=True)
class Reranked:
    """One query's final list and the reranker's own score of each reranked document (by id)."""

    ranked: RankedList
    rerank_scores: Mapping[str, float]


Reading = Callable[[str], "str | Sequence[str]"]  # a document id -> what the reranker reads of it


def rerank_lists(reranker: Any, queries: Sequence[str], firsts: Sequence[RankedList], text_of: Reading, *,
                 k: int, rerank_depth: int | Sequence[int], blend: float | None, batch_size: int = 32,
                 per_query: Sequence[Reading] | None = None, always_score: bool = False) -> list[Reranked]:
    """Rerank the top ``rerank_depth`` of each first-stage list; the rest of its top ``k`` follows in first-stage order.

    ``text_of`` gives the text the reranker reads for a document id, or several texts (at least one): the document
    then scores the highest of them (a passage engine reads a long document by the best passage of each first
    stage). ``per_query``, one such function per query, when the texts depend on the query. ``rerank_depth``: one
    for every query, or one per query (0: that query's list is left in its order).

    Every query's (query, text) pairs are scored in one call, so batches are shared across queries. With no
    reranker, or a blend of 0 (:func:`reorders`), the first stage's top ``k`` comes back unchanged, nothing scored
    (unless ``always_score``: the scores are wanted for themselves, e.g. a relevance threshold).
    """
    if reranker is None or (not reorders(blend) and not always_score):
        return [Reranked(first.truncate(k), {}) for first in firsts]
    depths = [rerank_depth] * len(firsts) if isinstance(rerank_depth, int) else list(rerank_depth)
    heads = [first.truncate(depth) for first, depth in zip(firsts, depths, strict=True)]
    readers = list(per_query) if per_query is not None else [text_of] * len(queries)
    pairs: list[tuple[str, str]] = []
    owner: list[int] = []  # each pair's candidate, numbered across every query's head
    bounds = [0]  # where each query's pairs start and end
    candidate = 0
    for q, head, read in zip(queries, heads, readers):
        for d in head.ids:
            got = read(str(d))
            texts = [got] if isinstance(got, str) else list(got)
            if not texts:
                raise ConfigError(f"the reranker was given no text to read for document {d!r}")
            owner += [candidate] * len(texts)
            pairs += [(q, t) for t in texts]
            candidate += 1
        bounds.append(len(pairs))
    if not pairs:
        pair_scores = np.zeros(0, dtype=np.float32)
    elif hasattr(reranker, "predict"):  # a CrossEncoder: every query's pairs in shared, length-sorted batches
        pair_scores = np.asarray(reranker.predict(pairs, batch_size=batch_size), dtype=np.float32)
    else:  # any object with score(query, texts), one query at a time
        pair_scores = np.concatenate([np.asarray(reranker.score(q, [t for _, t in pairs[a:b]]), dtype=np.float32)
                                      for q, a, b in zip(queries, bounds, bounds[1:]) if b > a])
    scores = np.full(candidate, -np.inf, dtype=np.float32)
    np.maximum.at(scores, np.asarray(owner, dtype=np.int64), pair_scores)  # a document: its best-read text
    out, at = [], 0
    for first, head in zip(firsts, heads):
        ce = scores[at:at + len(head)]
        at += len(head)
        if len(head) == 0:
            out.append(Reranked(first.truncate(k), {}))
            continue
        order, final = rerank_order(head.scores, ce, blend)
        tail = first.ids[len(head):k]
        tail_scores = float(final.min()) - 1.0 - np.arange(len(tail), dtype=np.float32)
        ranked = RankedList(np.concatenate([head.ids[order], tail]).astype(object)[:k],
                            np.concatenate([final[order], tail_scores]).astype(np.float32)[:k])
        out.append(Reranked(ranked, dict(zip(map(str, head.ids), ce.astype(float).tolist()))))
    return out
