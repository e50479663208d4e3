"""Fusion: how the engine combines scores, in one place. The first stage fuses BM25's and dense's lists; the second
stage blends the reranker's scores with the first stage's. Both normalise a query's scores the same way:

    minmax(s)(d) = (s(d) - min s) / (max s - min s)        (0 for every candidate when all scores are equal)

First stage, ``rrf`` (reciprocal rank fusion, Cormack et al., 2009; k_rrf = 60):

    score(d) = sum over first stages r of 1 / (k_rrf + rank_r(d))       (rank from 1; absent = no term)

First stage, ``wsum`` (ranx's ``wsum`` after ``min-max``, which the tests check it against):

    score(d) = sum over first stages r of w_r * minmax(s_r)(d)          (absent = 0)

Second stage, the rerank blend (``alpha``: the engine setting ``rerank_blend``; None ranks by the reranker alone):

    final(d) = alpha * minmax(rerank)(d) + (1 - alpha) * minmax(first_stage)(d)

Equal fused scores keep the order of first appearance. ``alpha`` is chosen on held-out training queries (never on
test) for each first stage the engine serves (their scores differ in shape, so one weight does not fit all): the
smallest ``alpha`` within one standard error of the best on dev (:func:`one_se_blend`), as a few dozen dev queries
cannot tell apart blends that close, and the one nearest the first stage is the least likely to rank worse than it.

Reranking first-stage candidate lists (:func:`rerank_lists`): the one function the engine's search path (and so
every system the harness measures, training's dev selection and ``twostage rerank`` of a run) reorders candidates
with.

The top ``rerank_depth`` of each list is scored by the cross-encoder and blended with the first stage
(above); the rest of the list follows in the first stage's order.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from twostage.engine.settings import FUSIONS
from twostage.indexer.errors import ConfigError
from twostage.indexer.records import RankedList

if TYPE_CHECKING:
    from twostage.indexer.protocols import Reranker

GRID = tuple(round(a, 2) for a in np.linspace(0.0, 1.0, 11))  # the rerank blends tried on dev


def minmax(x: np.ndarray) -> np.ndarray:
    """A query's scores rescaled to [0, 1] (float64); all zeros when they are all equal."""
    x = np.asarray(x, dtype=np.float64)
    span = float(x.max() - x.min()) if len(x) else 0.0
    return np.zeros_like(x) if span == 0 else (x - x.min()) / span


# ---- the first stage: lists fused ----------------------------------------------------------------------------
def rrf(lists: Sequence[RankedList], k_rrf: float = 60.0) -> RankedList:
    """Fuse ranked lists by reciprocal rank."""
    scores: dict[str, float] = {}
    for ranked in lists:
        for rank, doc in enumerate(ranked.ids, start=1):
            scores[str(doc)] = scores.get(str(doc), 0.0) + 1.0 / (k_rrf + rank)
    return _ranked(scores)


def wsum(lists: Sequence[RankedList], weights: Sequence[float]) -> RankedList:
    """Fuse ranked lists by a weighted sum of their min-max normalised scores."""
    if len(weights) != len(lists):
        raise ConfigError(f"wsum needs one weight per list: {len(lists)} lists, {len(weights)} weights")
    scores: dict[str, float] = {}
    for ranked, w in zip(lists, weights):
        if not len(ranked):
            continue
        for doc, value in zip(ranked.ids, minmax(ranked.scores)):
            scores[str(doc)] = scores.get(str(doc), 0.0) + float(w) * float(value)
    return _ranked(scores)


def _ranked(scores: dict[str, float]) -> RankedList:
    ids = list(scores)
    values = np.array([scores[d] for d in ids], dtype=np.float64)
    order = np.lexsort((np.arange(len(ids)), -values))
    return RankedList(np.array([ids[i] for i in order], dtype=object), values[order].astype(np.float32))


def fuse(lists: Sequence[RankedList], fusion: str = "rrf", *, k_rrf: float = 60.0,
         weights: Sequence[float] | None = None) -> RankedList:
    """``rrf`` or ``wsum`` (``weights``: one per list; equal weights when None)."""
    if fusion == "rrf":
        return rrf(lists, k_rrf)
    if fusion == "wsum":
        return wsum(lists, weights if weights is not None else [1.0 / len(lists)] * len(lists))
    raise ConfigError(f"fusion must be {' or '.join(FUSIONS)}, got {fusion!r}")


def dense_weights(dense_weight: float) -> tuple[float, float]:
    """(BM25's weight, dense's weight) of a two-way weighted sum whose dense weight is ``dense_weight``."""
    if isinstance(dense_weight, bool) or not isinstance(dense_weight, (int, float)) or not 0 <= dense_weight <= 1:
        raise ConfigError(f"the dense weight of a wsum fusion must be a number in [0, 1], got {dense_weight!r}")
    return 1.0 - float(dense_weight), float(dense_weight)


# ---- the second stage: the reranker's scores blended with the first stage's ------------------------------------
def interpolate(first: np.ndarray, rerank: np.ndarray, alpha: float | None) -> np.ndarray:
    """Blended scores (float32); ``alpha=None`` returns the reranker's scores unchanged."""
    if alpha is None:
        return np.asarray(rerank, dtype=np.float32)
    if not 0.0 <= alpha <= 1.0:
        raise ConfigError(f"the rerank blend must be in [0, 1], got {alpha}")
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


def gated_best_blend(curve: Sequence[tuple[float, np.ndarray]]) -> float:
    """Of the alphas whose per-query gain over the smallest alpha (the first stage alone) is more than one standard
    error of that gain, the one with the best mean (equal means: the smallest); none of them: the smallest alpha
    (the stage off)."""
    ordered = sorted(curve, key=lambda r: r[0])
    first = np.asarray(ordered[0][1], dtype=np.float64)
    best, best_mean = float(ordered[0][0]), float(first.mean())
    for alpha, values in ordered[1:]:
        gain = np.asarray(values, dtype=np.float64) - first
        se = float(gain.std(ddof=1) / np.sqrt(len(gain))) if len(gain) > 1 else 0.0
        if float(gain.mean()) > se + 1e-12 and float(np.mean(values)) > best_mean + 1e-12:
            best, best_mean = float(alpha), float(np.mean(values))
    return best


BLEND_RULES = {"one_se": one_se_blend, "gated_best": gated_best_blend}  # how a stage's weight is chosen on dev


MAXSIM_RULE = "gated_best"  # the name in BLEND_RULES of the rule that chooses MaxSim's weight on dev


def maxsim_rule(curve: Sequence[tuple[float, np.ndarray]]) -> float:
    """MaxSim's weight from its dev curve (each weight with one value a query): the :data:`MAXSIM_RULE`,
    :func:`gated_best_blend`, which held up better than :func:`one_se_blend` on dev queries it did not see
    (benchmarks/results/late-rules-*.md: +0.003 on NFCorpus dev, +0.010 on SciFact's held-out train queries, over
    200 random halvings each)."""
    return BLEND_RULES[MAXSIM_RULE](curve)


def maxsim_depth_rule(curves: Sequence[tuple[int, Sequence[tuple[float, np.ndarray]]]],
                      rule: Callable[[Sequence[tuple[float, np.ndarray]]], float] = maxsim_rule) -> int:
    """MaxSim's depth from its dev curve at each depth tried (the engine's own first): the depth whose weight by
    ``rule`` (:func:`maxsim_rule`; a reranker's depth: its own rule) scores the highest mean on dev, another depth
    only where that is strictly higher than the first's (ties keep the first). On NFCorpus's dev, with the one
    command's 128-token models, reading the top 100 instead of 50 scored 0.393 against 0.391 at the same weight,
    0.7 (benchmarks/results/one_command_nfcorpus.md)."""
    if not curves:
        raise ValueError("maxsim_depth_rule needs a curve at one depth at least")
    best, best_mean = curves[0][0], -np.inf
    for depth, curve in curves:
        weight = rule(curve)
        mean = float(np.mean(dict(curve)[weight]))
        if mean > best_mean + 1e-12:
            best, best_mean = depth, mean
    return int(best)


ELSEWHERE_MAX = 0.5  # MaxSim's most weight over a corpus its dev queries did not search: level with the first stage


def maxsim_elsewhere(curve: Sequence[tuple[float, np.ndarray]]) -> float:
    """MaxSim's weight for a corpus its dev queries did not search: the smallest weight within one standard error of
    dev's best (:func:`one_se_blend`), never above :func:`maxsim_rule`'s (off where that is off) nor above
    :data:`ELSEWHERE_MAX`, where MaxSim and the first stage weigh the same. The part of the weight dev cannot tell
    from less is the part least likely to carry over; and off the dev corpus a stage whose weight only that corpus
    chose never outvotes the first stage, whose BM25 half is what carries between collections. The standard error
    alone did not hold back enough: the dense-negatives SciFact model's steep dev curve (0.738 at 0.0 rising to 0.786
    at 1.0) gave 0.9, which lost 0.012 on Cranfield, where 0.4 with the model before it gained 0.003
    (benchmarks/results/one_command_scifact.md; Cranfield informed this cap, so it is not evidence for it). On
    NFCorpus's dev, which SciFact's dev never saw, 0.5 keeps 0.0088 of the 0.0136 that dev's best weight there
    (0.7) gains over the first stage with that model, and 0.0080 of 0.0109 with the one before it
    (benchmarks/results/late-rules-nfcorpus-scifact-dense-negatives.md, late-rules-nfcorpus-scifact-models.md)."""
    return min(one_se_blend(curve), maxsim_rule(curve), ELSEWHERE_MAX)


# The reranker's weight over a corpus its dev queries did not search: off (a search may still ask for it). A
# cross-encoder trained on one collection's judgements did not earn its place on another's dev: the SciFact reranker
# over NFCorpus's dev queries (324, which SciFact's dev never saw) gains +0.0005 +- 0.0013 at its best weights (0.1,
# 0.2) and loses from 0.3 on (-0.0004 at 0.3, the weight SciFact's dev chose; -0.0546 alone); both rules choose 0.0
# there (benchmarks/results/rerank-elsewhere-nfcorpus-scifact.md). MaxSim's gain does travel, capped (ELSEWHERE_MAX).
RERANK_ELSEWHERE = 0.0


@dataclass(frozen=True)
class Reranked:
    """One query's final list and the reranker's own score of each reranked document (by id)."""

    ranked: RankedList
    rerank_scores: Mapping[str, float]


Reading = Callable[[str], "str | Sequence[str]"]  # a document id -> what the reranker reads of it


def score_heads(reranker: Reranker, queries: Sequence[str], heads: Sequence[RankedList], readers: Sequence[Reading],
                batch_size: int) -> np.ndarray:
    """The reranker's score of every query's head candidates, one after another: each (query, text) pair of every
    query scored in one call (a document read by several texts scores the highest)."""
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
    elif hasattr(reranker, "predict"):  # a PairScorer (a CrossEncoder): the pairs in shared, length-sorted batches
        pair_scores = np.asarray(reranker.predict(pairs, batch_size=batch_size), dtype=np.float32)
    else:  # a QueryScorer: score(query, texts), one query at a time
        pair_scores = np.concatenate([np.asarray(reranker.score(q, [t for _, t in pairs[a:b]]), dtype=np.float32)
                                      for q, a, b in zip(queries, bounds, bounds[1:]) if b > a])
    scores = np.full(candidate, -np.inf, dtype=np.float32)
    np.maximum.at(scores, np.asarray(owner, dtype=np.int64), pair_scores)  # a document: its best-read text
    return scores


def rerank_lists(reranker: Reranker | None, queries: Sequence[str], firsts: Sequence[RankedList], text_of: Reading, *,
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
    scores = score_heads(reranker, queries, heads, readers, batch_size)
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
