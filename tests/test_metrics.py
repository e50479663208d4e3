"""The harness's metrics against pytrec_eval (the trec_eval C code), an independent implementation."""

import numpy as np
import pytest
import pytrec_eval

from twostage.eval.harness import measure_system
from twostage.eval.metrics import DEFAULT_METRICS, evaluate
from twostage.indexer.beir import QrelsCheck, Split
from twostage.indexer.errors import ConfigError
from twostage.indexer.records import Judgment, Qrels, Query, RankedList

# our name -> (measure asked of trec_eval, key of its answer, depth the run is cut to first)
TREC = {
    "ndcg@10": ("ndcg_cut.10", "ndcg_cut_10", None),
    "ndcg@3": ("ndcg_cut.3", "ndcg_cut_3", None),
    "mrr@10": ("recip_rank", "recip_rank", 10),
    "recall@10": ("recall.10", "recall_10", None),
    "recall@100": ("recall.100", "recall_100", None),
    "map@100": ("map_cut.100", "map_cut_100", None),
    "map@5": ("map_cut.5", "map_cut_5", None),
    "p@10": ("P.10", "P_10", None),
}


def fixed_collection(seed: int = 7):
    """200 documents, 40 graded queries; a run of distinct scores with some queries empty or missing."""
    rng = np.random.default_rng(seed)
    docs = [f"d{i}" for i in range(200)]
    judgments, lists = [], {}
    for q in range(40):
        qid = f"q{q}"
        judged = rng.choice(200, size=rng.integers(1, 15), replace=False)
        for d in judged:
            judgments.append(Judgment(qid, docs[d], int(rng.integers(0, 4))))
        if not any(j.grade > 0 for j in judgments if j.query_id == qid):
            judgments.append(Judgment(qid, docs[judged[0]], 1))
        if q % 13 == 5:
            continue  # no run at all for this query
        depth = 0 if q % 17 == 3 else int(rng.integers(1, 150))
        order = rng.permutation(200)[:depth]
        # relevant documents near the top sometimes, so metrics are not all near zero
        bonus = np.array([3.0 if any(j.doc_id == docs[d] and j.grade > 0 for j in judgments if j.query_id == qid) else 0.0 for d in order])
        scores = rng.random(depth) + bonus * rng.random(depth)
        idx = np.argsort(-scores, kind="stable")
        lists[qid] = RankedList(np.array([docs[d] for d in order[idx]], dtype=object), scores[idx])
    return Qrels(judgments), lists


def trec_eval(qrels: Qrels, lists: dict, metrics) -> dict[str, dict[str, float]]:
    """Per-query values from pytrec_eval; queries without a run score 0 (trec_eval -c)."""
    out: dict[str, dict[str, float]] = {q: dict.fromkeys(metrics, 0.0) for q in qrels.query_ids}
    for ours in metrics:
        asked, key, cut = TREC[ours]
        run = {q: {str(d): float(s) for d, s in zip(r.ids[:cut], r.scores[:cut])} for q, r in lists.items() if len(r)}
        for q, values in pytrec_eval.RelevanceEvaluator(qrels.to_dict(), {asked}).evaluate(run).items():
            out[q][ours] = values[key]
    return out


class FixedSystem:
    """Answers each query (whose text is its id) with a fixed ranked list."""

    def __init__(self, lists):
        self.lists = lists

    def search(self, query: str, k: int) -> RankedList:
        return self.lists.get(query, RankedList(np.array([], dtype=object), np.array([]))).truncate(k)


def test_every_metric_equals_trec_eval_through_the_harness():
    qrels, lists = fixed_collection()
    metrics = [*DEFAULT_METRICS, "p@10", "ndcg@3", "map@5"]
    # The harness searches by query text; here the text is the id so FixedSystem can answer.
    split = Split("test", tuple(Query(q, q) for q in qrels.query_ids), qrels, QrelsCheck())
    result = measure_system("fixed", FixedSystem(lists), split, k=150, metrics=metrics)
    reference = trec_eval(qrels, lists, metrics)
    assert len(result.per_query) == 40
    for m in metrics:
        ours = result.per_query[m]
        theirs = np.array([reference[q][m] for q in ours.index])
        np.testing.assert_allclose(ours.to_numpy(), theirs, atol=1e-6, err_msg=m)
        assert theirs.std() > 0, f"{m} is constant on the fixture; the comparison would prove little"


def test_ties_follow_the_list_order():
    qrels = Qrels([Judgment("q", "b", 1)])
    tied = RankedList(np.array(["a", "b", "c"], dtype=object), np.array([1.0, 1.0, 1.0]))
    assert evaluate(qrels, {"q": tied}, ["mrr@10"])["mrr@10"].iloc[0] == pytest.approx(0.5)
    swapped = RankedList(np.array(["b", "a", "c"], dtype=object), np.array([1.0, 1.0, 1.0]))
    assert evaluate(qrels, {"q": swapped}, ["mrr@10"])["mrr@10"].iloc[0] == pytest.approx(1.0)


def test_ignore_identical_ids():
    qrels = Qrels([Judgment("q1", "d2", 1)])
    ranked = RankedList(np.array(["q1", "d2"], dtype=object), np.array([2.0, 1.0]))
    assert evaluate(qrels, {"q1": ranked}, ["mrr@10"])["mrr@10"].iloc[0] == pytest.approx(0.5)
    assert evaluate(qrels, {"q1": ranked}, ["mrr@10"], ignore_identical_ids=True)["mrr@10"].iloc[0] == pytest.approx(1.0)


def test_queries_without_results_score_zero_and_count():
    qrels = Qrels([Judgment("q1", "d1", 1), Judgment("q2", "d2", 1)])
    table = evaluate(qrels, {"q1": RankedList(np.array(["d1"], dtype=object), np.array([1.0]))}, ["recall@10"])
    assert table["recall@10"].to_dict() == {"q1": 1.0, "q2": 0.0}


@pytest.mark.parametrize("name", ["ndcg", "ndcg@0", "f1@10", "recall@x"])
def test_unknown_metric(name):
    with pytest.raises(ConfigError, match="unknown metric"):
        evaluate(Qrels([Judgment("q", "d", 1)]), {}, [name])
