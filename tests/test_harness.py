import json

import numpy as np
import pandas as pd
import pytest

from twostage.eval.harness import run_bench
from twostage.eval.report import write_outputs
from twostage.eval.run import Run
from twostage.indexer.errors import ConfigError
from twostage.indexer.records import RankedList
from twostage.retriever.bm25 import BM25Retriever

METRIC_KEYS = {"ndcg@10", "mrr@10", "recall@10", "recall@100", "map@100", "latency_ms_p50", "latency_ms_p95"}


@pytest.fixture(scope="module")
def sample_result():
    from pathlib import Path

    return run_bench(Path(__file__).resolve().parent.parent / "data" / "sample", "test", "bm25,rank-bm25")


def test_outputs_are_complete(tmp_path, sample_result):
    out = write_outputs(sample_result, tmp_path / "out", {"command": "twostage bench ..."})
    metrics = json.loads((out / "metrics.json").read_text())
    assert set(metrics) == {"bm25", "rank-bm25"}
    assert METRIC_KEYS <= set(metrics["bm25"])
    assert 0 < metrics["bm25"]["ndcg@10"] <= 1 and metrics["bm25"]["latency_ms_p50"] > 0
    per_query = pd.read_csv(out / "per_query.csv", dtype={"query_id": str})
    n = len(sample_result.split.queries)
    assert len(per_query) == 2 * n
    # the means in metrics.json are the means of the per-query rows
    bm25_rows = per_query[per_query.system == "bm25"]
    assert bm25_rows["ndcg@10"].mean() == pytest.approx(metrics["bm25"]["ndcg@10"], abs=1e-6)
    report = (out / "report.md").read_text()
    assert "**" in report and "paired two-sided t-test" in report and "rank-bm25 | ndcg@10" in report
    assert (out / "recall_at_k.png").read_bytes()[:4] == b"\x89PNG"
    run = Run.from_trec(out / "runs" / "bm25.trec")
    assert len(run) == n
    first = sample_result.split.queries[0].id
    assert list(run[first].ids) == list(sample_result.systems[0].run[first].ids)


def test_engines_score_the_same_and_recall_curve_rises(sample_result):
    table = sample_result.table()
    assert table.loc["bm25", "ndcg@10"] == pytest.approx(table.loc["rank-bm25", "ndcg@10"], abs=1e-9)
    curve = sample_result.recall_curves([1, 5, 10, 100])["bm25"]
    assert np.all(np.diff(curve) >= 0) and curve[-1] == pytest.approx(table.loc["bm25", "recall@100"])


def test_significance_finds_a_real_difference(sample_dir):
    bm25 = BM25Retriever.build(__import__("twostage.indexer.corpus", fromlist=["x"]).load_corpus(sample_dir))

    class Worse:
        """BM25 with the first and second results swapped: worse, and on every query."""

        def search(self, query, k):
            r = bm25.search(query, k)
            ids = np.array([*r.ids[1:2], *r.ids[:1], *r.ids[2:]], dtype=object)
            return RankedList(ids, r.scores)

    result = run_bench(sample_dir, "train", {"bm25": bm25, "worse": Worse()})
    sig = result.significance("bm25").set_index("metric")
    assert sig.loc["mrr@10", "delta"] < 0 and sig.loc["mrr@10", "p_value"] < 0.05
    assert sig.loc["recall@100", "p_value"] == 1.0  # same documents, same recall


def test_refuses_to_replace_a_directory_of_other_files(tmp_path, sample_result):
    (tmp_path / "mine.txt").write_text("keep me")
    with pytest.raises(ConfigError, match="not benchmark outputs"):
        write_outputs(sample_result, tmp_path)
    assert (tmp_path / "mine.txt").read_text() == "keep me"


def test_rewrite_replaces_previous_outputs(tmp_path, sample_result):
    write_outputs(sample_result, tmp_path / "o")
    write_outputs(sample_result, tmp_path / "o")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["o"]


@pytest.mark.parametrize("systems", ["bm25,colbert", "", "all,bm25"])
def test_unknown_systems(sample_dir, systems):
    with pytest.raises(ConfigError, match="unknown system"):
        run_bench(sample_dir, "test", systems)


def test_k_too_small_for_recall_at_100(sample_dir):
    with pytest.raises(ConfigError, match="k >= 100"):
        run_bench(sample_dir, "test", "bm25", k=10)


def test_dense_systems_share_one_encoding_of_the_corpus(sample_dir, tiny_bert_dir, monkeypatch):
    from twostage.engine.search_engine import SearchEngine
    from twostage.eval.systems import SystemOptions

    calls = []
    real = SearchEngine.build.__func__

    def counting(cls, corpus, path, **kw):
        calls.append(len(corpus))
        return real(cls, corpus, path, **kw)

    monkeypatch.setattr(SearchEngine, "build", classmethod(counting))
    result = run_bench(sample_dir, "test", "dense,hybrid", options=SystemOptions(retriever_model=str(tiny_bert_dir)))
    assert len(calls) == 1  # hybrid and dense are views of one engine: the corpus is encoded once
    dense, hybrid = result.systems
    assert dense.summary()["ndcg@10"] >= 0 and len(hybrid.run) == len(dense.run)
    result = run_bench(sample_dir, "test", "dense", options=SystemOptions(retriever_model=str(tiny_bert_dir),
                                                                          precision="bf16"))
    assert len(calls) == 2  # another corpus object or other settings: encoded again
