"""Explanations of a search's hits (``explain=True``), made from what the search path computed for one query:
each stage's candidates, the fused first stage, the reranker's scores and blend, the diversity step. The records
and their arithmetic are :mod:`twostage.indexer.records`; the formulas are :mod:`twostage.engine.fusion`'s and
:mod:`twostage.engine.steer`'s.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from twostage.engine.fusion import Reranked, dense_weights
from twostage.engine.knobs import blend_of
from twostage.engine.steer import Diversified
from twostage.indexer.passages import split_id
from twostage.indexer.records import DiversityPart, Explanation, RankedList, RerankPart, StagePart

if TYPE_CHECKING:
    from twostage.engine.plan import SearchPlan
    from twostage.engine.source import CandidateSource
    from twostage.engine.stages import SearchTrace


@dataclass(frozen=True)
class Trace:
    """What one query's search computed, as the explanations need it. ``fusion``: rrf, blend, or the stage that ranked
    alone; ``weights``: each stage's weight in a blend; ``depth``: how many of ``first`` the reranker read;
    ``reranked`` None: no reranker ran."""

    fusion: str
    lists: Mapping[str, RankedList]
    weights: Mapping[str, float]
    k_rrf: float
    first: RankedList
    reranked: Reranked | None
    depth: int
    blend: float | None
    probability: Mapping[str, float]
    diversified: Diversified | None
    diversity: float
    terms: Mapping[str, Sequence[tuple[str, float]]]
    late: Reranked | None = None  # MaxSim's reordering of ``fused`` (then ``first`` is its result)
    fused: RankedList | None = None
    late_depth: int = 0
    late_blend: float | None = None


def explain(trace: Trace, ids: Sequence[str], scores: Sequence[float]) -> dict[str, Explanation]:
    """The explanation of each hit (by id) of one query's page."""
    stages = {name: _stage_table(ranked) for name, ranked in trace.lists.items()}
    rerank = _blend_context(trace.reranked, trace.first, trace.depth, trace.blend)
    late = _blend_context(trace.late, trace.fused, trace.late_depth, trace.late_blend) \
        if trace.late is not None and trace.fused is not None else (lambda d: None)
    out = {}
    for d, score in zip(ids, scores):
        parts = []
        for name in sorted(stages):
            table, low, high = stages[name]
            found = table.get(d)
            value, rank = (found if found is not None else (None, None))
            weight = trace.weights.get(name, 1.0)
            if value is None or rank is None:
                contribution = 0.0
            elif trace.fusion == "rrf":
                contribution = 1.0 / (trace.k_rrf + rank)
            elif trace.fusion == "wsum":
                contribution = weight * float((value - low) / (high - low)) if high != low else 0.0
            else:
                contribution = value if name == trace.fusion else 0.0
            terms = tuple(trace.terms.get(d, ())) if name == "bm25" else ()
            parts.append(StagePart(name, value, rank, weight, low, high, contribution, terms))
        out[d] = Explanation(float(score), trace.fusion, tuple(parts), trace.k_rrf, rerank(d),
                             _diversity(trace, d), trace.probability.get(d), late(d))
    return out


def _stage_table(ranked: RankedList) -> tuple[dict[str, tuple[float, int]], float, float]:
    scores = np.asarray(ranked.scores, dtype=np.float64)
    table = {str(d): (float(s), rank) for rank, (d, s) in enumerate(zip(ranked.ids, scores), start=1)}
    if not len(scores):
        return table, 0.0, 0.0
    return table, float(scores.min()), float(scores.max())


def _blend_context(r: Reranked | None, first: RankedList, depth: int,
                   blend: float | None) -> Callable[[str], RerankPart | None]:
    """A function: document id -> its part in a stage that rescored the top ``depth`` of ``first`` and blended
    (the reranker, or MaxSim; None when the stage did not run or did not move it)."""
    if r is None or not r.rerank_scores:
        return lambda d: None
    head = first.truncate(depth)
    head_first = np.asarray(head.scores, dtype=np.float64)
    first_range = (float(head_first.min()), float(head_first.max())) if len(head_first) else (0.0, 0.0)
    ce = np.array(list(r.rerank_scores.values()), dtype=np.float64)
    rerank_range = (float(ce.min()), float(ce.max()))
    final = dict(zip(map(str, r.ranked.ids), np.asarray(r.ranked.scores, dtype=np.float64).tolist()))
    floor = min((final[d] for d in r.rerank_scores if d in final), default=0.0)
    below_at = {str(d): i for i, d in enumerate(first.ids[len(head):])}

    def part(d: str) -> RerankPart | None:
        if d in r.rerank_scores:
            return RerankPart(float(r.rerank_scores[d]), blend, rerank_range, first_range)
        if d in below_at:
            return RerankPart(None, blend, rerank_range, first_range, below_at[d], floor)
        return None

    return part


def _diversity(trace: Trace, d: str) -> DiversityPart | None:
    if trace.diversified is None:
        return None
    relevance, low, high, redundancy, like = trace.diversified.parts[d]
    return DiversityPart(trace.diversity, relevance, low, high, redundancy, like)


def explanations(source: CandidateSource, plan: SearchPlan, trace: SearchTrace) -> list[dict[str, Explanation]]:
    """Each query's explanations of its page's hits, from what the search path computed (:class:`~twostage.engine.
    stages.SearchTrace`): each stage's lists (``lexical``: BM25's as it found them, passages in a passage engine),
    the fused first stage, the reranked lists and probabilities, the diversified lists."""
    s, steer, stage, reranker = plan.settings, plan.steer, trace.stage, trace.reranker
    queries, lists, lexical, lexical_expansion = trace.queries, trace.lists, trace.lexical, trace.expansion
    dense_off, skip_rerank, diversified, late = trace.dense_off, trace.skip_rerank, trace.diversified, trace.late
    alpha = blend_of(s, reranker, stage) if reranker is not None else None
    bm25_w, dense_w = dense_weights(s.dense_weight)
    analyzer = source.analyzer() if "bm25" in lists else None
    out = []
    for q, page in enumerate(trace.pages):
        alone = dense_off[q] if dense_off else False
        fusion = ("bm25" if alone else s.fusion) if stage == "hybrid" else stage
        mine = {name: ls[q] for name, ls in lists.items() if not (alone and name == "dense")}
        terms: dict[str, Sequence[tuple[str, float]]] = {}
        if analyzer is not None and lexical is not None:
            weights: dict[str, float] = {}
            if lexical_expansion is None or lexical_expansion.query_text:
                for t in analyzer(queries[q]):
                    weights[t] = weights.get(t, 0.0) + 1.0
            for t, w in (lexical_expansion.terms.items() if lexical_expansion is not None else ()):
                weights[t] = weights.get(t, 0.0) + w
            row_of: dict[str, str] = {}  # each hit's BM25 row id: itself, or in a passage engine its best passage
            for pid in map(str, lexical[q].ids):
                row_of.setdefault(split_id(pid)[0] if s.passages.enabled else pid, pid)
            wanted = {str(d): row_of[str(d)] for d in page.ids if str(d) in row_of}
            matched = source.matched_terms(weights, sorted(set(wanted.values())))
            terms = {d: matched.get(r, []) for d, r in wanted.items()}
        depth = 0 if (skip_rerank and skip_rerank[q]) else s.rerank_depth
        one = Trace(fusion, mine, {"bm25": bm25_w, "dense": dense_w}, s.k_rrf, trace.firsts[q],
                    trace.reranked[q] if reranker is not None else None, depth, alpha, trace.relevance[q],
                    diversified[q] if diversified is not None else None, steer.diversity, terms,
                    late[q] if late is not None else None, trace.fused[q], s.maxsim_depth, s.maxsim_blend)
        out.append(explain(one, [str(d) for d in page.ids], page.scores.astype(float).tolist()))
    return out
