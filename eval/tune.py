"""Choosing an engine's search settings on held-out queries (never on a test split).

Which first stage, and whether the reranker earns its place, depends on the collection and on how well each model
was trained: on a tiny collection a fine-tuned bi-encoder alone can beat any reranker trained on the same few
queries. :func:`tune_engine` scores every (first stage, rerank) pair on dev queries and keeps the engine's default
unless another is strictly better.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any

from twostage.indexer.engine_dir import FIRST_STAGES, EngineSettings
from twostage.indexer.errors import ConfigError
from twostage.indexer.records import Qrels, Query


@dataclass(frozen=True)
class TuneResult:
    """The chosen settings and the dev metric of every candidate, (first stage, rerank, value), best first."""

    settings: EngineSettings
    metric: str
    scores: tuple[tuple[str, bool, float], ...]

    def lines(self) -> list[str]:
        return [f"{fs}{'+rerank' if rr else ''}: {v:.4f}" for fs, rr, v in self.scores]


def tune_engine(engine: Any, queries: Sequence[Query], qrels: Qrels, *, metric: str = "ndcg@10",
                apply: bool = True) -> tuple[Any, TuneResult]:
    """Score each first stage with and without the reranker on ``queries``; keep the best (the current
    settings win ties). With ``apply`` the engine gets a new version with those settings."""
    from twostage.eval.metrics import evaluate
    from twostage.eval.run import Run

    if not queries:
        raise ConfigError("tuning needs held-out queries with judgments")
    qrels = qrels.subset(q.id for q in queries)  # a judged query missing from the run would count as 0
    current = engine.settings
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
    result = TuneResult(chosen, metric, ordered)
    if apply and chosen != current:
        engine = engine.configure(chosen)
    return engine, result
