"""Choosing an engine's search settings on held-out queries (never on a test split).

Which first stage, and whether the reranker earns its place, depends on the collection and on how well each model
was trained: on a tiny collection a fine-tuned bi-encoder alone can beat any reranker trained on the same few
queries. :func:`tune_engine` scores every (first stage, rerank) pair on dev queries and keeps the engine's default
unless another is strictly better. :func:`tune_fusion` chooses how the hybrid first stage fuses BM25 and dense
(RRF, or a score blend and its dense weight) on dev queries; :func:`tune_engine` applies it first when there are
enough dev queries (``MIN_FUSION_QUERIES``: a weight chosen on a handful of queries is noise).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

from twostage.engine.settings import FIRST_STAGES, EngineSettings
from twostage.indexer.errors import ConfigError
from twostage.indexer.records import Qrels, Query, RankedList

FUSION_GRID = tuple(round(0.1 * i, 1) for i in range(1, 10))  # dense weights tried for the blend
MIN_FUSION_QUERIES = 50

if TYPE_CHECKING:
    from twostage.engine.search_engine import SearchEngine


@dataclass(frozen=True)
class FusionChoice:
    """The chosen fusion (``rrf``, or ``wsum`` with ``dense_weight``) and the dev metric of every candidate,
    (fusion, dense weight, value) in the order tried."""

    fusion: str
    dense_weight: float
    metric: str
    scores: tuple[tuple[str, float, float], ...]

    def lines(self) -> list[str]:
        return [f"{f}{f' {w:g}' if f == 'wsum' else ''}: {v:.4f}" for f, w, v in self.scores]


def tune_fusion(queries: Sequence[Query], qrels: Qrels, bm25: Sequence[RankedList], dense: Sequence[RankedList], *,
                metric: str = "ndcg@10", current: EngineSettings | None = None,
                grid: Sequence[float] = FUSION_GRID) -> FusionChoice:
    """Score RRF and a blend at each dense weight of ``grid`` on ``queries`` (their BM25 and dense top lists, in
    order); the current fusion wins ties, then RRF, then the weight nearest 0.5."""
    from twostage.engine.fusion import dense_weights, fuse
    from twostage.eval.metrics import evaluate
    from twostage.eval.run import Run

    current = current or EngineSettings()
    if not queries:
        raise ConfigError("tuning the fusion needs held-out queries with judgments")
    if not len(queries) == len(bm25) == len(dense):
        raise ConfigError(f"tune_fusion needs one BM25 and one dense list per query: {len(queries)} queries, "
                          f"{len(bm25)} and {len(dense)} lists")
    qrels = qrels.subset(q.id for q in queries)
    candidates = [("rrf", current.dense_weight)] + [("wsum", float(w)) for w in grid]
    scores = []
    for fusion, w in candidates:
        fused = {q.id: fuse([b, d], fusion, k_rrf=current.k_rrf, weights=dense_weights(w))
                 for q, b, d in zip(queries, bm25, dense)}
        scores.append((fusion, w, float(evaluate(qrels, Run(fusion, fused), [metric])[metric].mean())))

    def rank(c: tuple[str, float, float]) -> tuple[float, bool, bool, float]:
        is_current = c[0] == current.fusion and (c[0] == "rrf" or c[1] == current.dense_weight)
        return (round(c[2], 10), is_current, c[0] == "rrf", -abs(c[1] - 0.5))

    best = max(scores, key=rank)
    return FusionChoice(best[0], best[1], metric, tuple(scores))


@dataclass(frozen=True)
class TuneResult:
    """The chosen settings and the dev metric of every candidate, (first stage, rerank, value), best first."""

    settings: EngineSettings
    metric: str
    scores: tuple[tuple[str, bool, float], ...]
    fusion: FusionChoice | None = None  # None: too few dev queries to choose the fusion on

    def lines(self) -> list[str]:
        return [f"{fs}{'+rerank' if rr else ''}: {v:.4f}" for fs, rr, v in self.scores]


def tune_engine(engine: SearchEngine, queries: Sequence[Query], qrels: Qrels, *, metric: str = "ndcg@10",
                apply: bool = True) -> tuple[Any, TuneResult]:
    """Score each first stage with and without the reranker on ``queries``; keep the best (the current
    settings win ties). With ``apply`` the engine gets a new version with those settings."""
    from twostage.eval.metrics import evaluate
    from twostage.eval.run import Run

    if not queries:
        raise ConfigError("tuning needs held-out queries with judgments")
    qrels = qrels.subset(q.id for q in queries)  # a judged query missing from the run would count as 0
    current = engine.settings
    fusion = None
    if len(queries) >= MIN_FUSION_QUERIES:
        texts = [q.text for q in queries]
        by_stage = {fs: engine.as_retriever(first_stage=fs, rerank=False).search_batch(texts, current.first_stage_depth)
                    for fs in ("bm25", "dense")}
        fusion = tune_fusion(queries, qrels, by_stage["bm25"], by_stage["dense"], metric=metric, current=current)
        tuned = replace(current, fusion=fusion.fusion, dense_weight=fusion.dense_weight)
        if tuned != current:
            # with apply, a new version; else a view that scores the rest with the tuned fusion, nothing written
            engine = engine.configure(tuned) if apply else engine.with_settings(fusion=tuned.fusion,
                                                                                   dense_weight=tuned.dense_weight)
            current = tuned
    candidates = [(fs, rr) for fs in FIRST_STAGES for rr in ((True, False) if engine.manifest.reranker else (False,))]
    texts = [q.text for q in queries]
    scores = []
    for fs, rr in candidates:
        lists = engine.as_retriever(first_stage=fs, rerank=rr).search_batch(texts, 10)
        run = Run(f"{fs}{'+rerank' if rr else ''}", {q.id: r for q, r in zip(queries, lists)})
        scores.append((fs, rr, float(evaluate(qrels, run, [metric])[metric].mean())))
    default = next(v for fs, rr, v in scores if fs == current.first_stage and rr == (current.rerank and
                                                                                      engine.manifest.reranker is not None))
    best = max(scores, key=lambda c: c[2])
    chosen = replace(current, first_stage=best[0], rerank=best[1]) if best[2] > default else current
    ordered = tuple(sorted(scores, key=lambda c: -c[2]))
    result = TuneResult(chosen, metric, ordered, fusion)
    if apply and chosen != current:
        engine = engine.configure(chosen)
    return engine, result
