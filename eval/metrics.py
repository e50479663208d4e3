"""Ranking metrics with trec_eval semantics, computed by ranx.

Supported names: ``ndcg@k`` (linear gain, as trec_eval's ``ndcg_cut``), ``mrr@k`` (reciprocal rank of the
first relevant document within k), ``recall@k``, ``map@k`` (trec_eval's ``map_cut``: precision at each
relevant rank within k, divided by the number of relevant documents), ``p@k`` / ``precision@k``.

The order of a ranked list is the one the system gave (ties were already broken by the system), so scores
are replaced by ranks before ranx sees them. A document is relevant when its grade is > 0. A query with no
result at all scores 0 on every metric.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence

import numpy as np
import pandas as pd

from twostage.indexer.errors import ConfigError
from twostage.indexer.records import Qrels, RankedList

DEFAULT_METRICS = ("ndcg@10", "mrr@10", "recall@10", "recall@100", "map@100")
_FAMILIES = {"ndcg": "ndcg", "mrr": "mrr", "recall": "recall", "map": "map", "p": "precision", "precision": "precision"}
_PATTERN = re.compile(r"^([a-z]+)@(\d+)$")


def ranx_name(metric: str) -> str:
    """The ranx name of a metric (``p@10`` -> ``precision@10``); unknown names are a ConfigError."""
    m = _PATTERN.match(metric.lower())
    if not m or m.group(1) not in _FAMILIES or int(m.group(2)) <= 0:
        raise ConfigError(f"unknown metric {metric!r}; use one of ndcg@k, mrr@k, recall@k, map@k, p@k with k > 0")
    return f"{_FAMILIES[m.group(1)]}@{int(m.group(2))}"


def evaluate(
    qrels: Qrels,
    run: Mapping[str, RankedList],
    metrics: Sequence[str] = DEFAULT_METRICS,
    *,
    ignore_identical_ids: bool = False,
    rel_level: int = 1,
) -> pd.DataFrame:
    """Per-query metrics: one row per query of ``qrels`` that has a relevant document, one column per metric.

    ``ignore_identical_ids`` drops a retrieved document whose id equals the query id (ArguAna, Quora).
    ``rel_level``: the lowest grade that counts as relevant (trec_eval's ``-l``; graded qrels such as TREC DL use
    2): below it a document is not relevant to recall, precision, MAP and MRR, while nDCG keeps every positive grade
    as its gain, as trec_eval does; a query with no judgment at or above it is left out.
    """
    import ranx

    rel_level = check_rel_level(rel_level)
    # trec_eval's -l applies to the binary measures; nDCG keeps every positive grade as its gain
    names = [ranx_name(m) + (f"-l{rel_level}" if rel_level != 1 and not m.lower().startswith("ndcg") else "")
             for m in metrics]
    query_ids = [q for q in qrels.query_ids if any(g >= rel_level for g in qrels.grades(q).values())]
    run_dict: dict[str, dict[str, float]] = {}
    for qid in query_ids:
        ranked = run.get(qid)
        if ranked is None:
            continue
        ids = [str(d) for d in ranked.ids if not (ignore_identical_ids and str(d) == qid)]
        if ids:
            run_dict[qid] = {d: float(len(ids) - r) for r, d in enumerate(dict.fromkeys(ids))}
    table = pd.DataFrame(0.0, index=pd.Index(query_ids, name="query_id"), columns=list(metrics))
    if run_dict:
        qrels_dict = {q: {d: g for d, g in qrels.grades(q).items()} for q in run_dict}
        ranx_run = ranx.Run(run_dict)
        ranx.evaluate(ranx.Qrels(qrels_dict), ranx_run, names, return_mean=True)
        for metric, name in zip(metrics, names):
            per_query = ranx_run.scores[name]
            table.loc[list(per_query.keys()), metric] = np.fromiter(per_query.values(), dtype=float)
    return table


def check_rel_level(rel_level: int) -> int:
    if isinstance(rel_level, bool) or not isinstance(rel_level, int) or rel_level < 1:
        raise ConfigError(f"rel_level must be an integer >= 1 (the lowest relevant grade), got {rel_level!r}")
    return rel_level


def ndcg10_by_query(qrels: Qrels, run: Mapping[str, RankedList]) -> np.ndarray:
    """nDCG@10 of each query of ``qrels`` (in its order): the dev metric training selects epochs (by the mean) and
    blends (by the mean and the spread) by."""
    return evaluate(qrels, run, ["ndcg@10"])["ndcg@10"].to_numpy(dtype=np.float64)


def mean_ndcg10(qrels: Qrels, run: Mapping[str, RankedList]) -> float:
    """Mean nDCG@10 over the queries of ``qrels``."""
    return float(ndcg10_by_query(qrels, run).mean())


def mean(table: pd.DataFrame) -> dict[str, float]:
    return {m: float(table[m].mean()) for m in table.columns}


def recall_curve(qrels: Qrels, run: Mapping[str, RankedList], ks: Iterable[int] = range(1, 101), *,
                 rel_level: int = 1) -> np.ndarray:
    """Mean recall@k for each k in ``ks``."""
    ks = list(ks)
    table = evaluate(qrels, run, [f"recall@{k}" for k in ks], rel_level=rel_level)
    return table.mean().to_numpy()
