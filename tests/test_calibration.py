"""The reranker's score as a probability of relevance (Platt scaling on dev pairs) and min_relevance: "nothing
relevant" in Python, the CLI and HTTP."""

import json
from pathlib import Path

import numpy as np
import pytest

from twostage.app.cli import main
from twostage.engine.calibration import (
    calibrate,
    expected_calibration_error,
    fit_platt,
    probability,
    reliability,
)
from twostage.engine.search_engine import SearchEngine
from twostage.indexer.errors import ConfigError

SAMPLE = Path(__file__).resolve().parents[1] / "data" / "sample"


def test_platt_recovers_a_known_calibration_and_lowers_the_error():
    rng = np.random.default_rng(0)
    scores = rng.uniform(0.01, 0.99, 20_000)
    true_p = probability(scores, (2.0, -1.5))  # the relevance rate the scores really mean
    labels = (rng.uniform(size=len(scores)) < true_p).astype(float)
    fitted = fit_platt(scores, labels)
    assert fitted.a == pytest.approx(2.0, abs=0.1) and fitted.b == pytest.approx(-1.5, abs=0.1)
    assert fitted.pairs == 20_000 and fitted.positives == int(labels.sum())
    raw, calibrated = expected_calibration_error(scores, labels), expected_calibration_error(
        probability(scores, fitted.params), labels)
    assert calibrated < 0.02 < raw
    bins = reliability(probability(scores, fitted.params), labels)
    assert sum(n for _, _, n in bins) == 20_000 and all(abs(p - o) < 0.05 for p, o, n in bins if n > 500)
    with pytest.raises(ConfigError, match="relevant and non-relevant"):
        fit_platt(scores[:10], np.zeros(10))


@pytest.fixture()
def engine(tmp_path, models):
    retriever, reranker = models
    built = SearchEngine.build(SAMPLE, tmp_path / "e", retriever=retriever, reranker=reranker)
    yield built
    built.close()


def test_calibrated_engine_says_nothing_relevant(engine, tmp_path, capsys):
    with pytest.raises(ConfigError, match="calibrated reranker"):
        engine.search("why do cats purr", 5, min_relevance=0.5)
    calibrated, fitted, said = calibrate(engine, SAMPLE, "test")
    assert "judged test queries" in said and fitted.pairs > 0
    assert calibrated.settings.rerank_calibration == fitted.params
    saved = json.loads((calibrated.version_dir / "manifest.json").read_text())["settings"]["rerank_calibration"]
    assert saved == list(fitted.params)
    hits = calibrated.search("why do cats purr", 10).hits
    reranked = [h for h in hits if "rerank" in h.stage_scores]
    assert reranked and all(0 < h.stage_scores["relevance"] < 1 for h in reranked)
    expected = probability(np.array([h.stage_scores["rerank"] for h in reranked]), fitted.params)
    assert [h.stage_scores["relevance"] for h in reranked] == pytest.approx(expected.tolist())
    threshold = float(np.median(expected))
    kept = calibrated.search("why do cats purr", 10, min_relevance=threshold).hits
    assert kept and all(h.stage_scores["relevance"] >= threshold for h in kept)
    assert [h.id for h in kept] == [h.id for h in hits if h.stage_scores.get("relevance", -1) >= threshold]
    assert calibrated.search("why do cats purr", 10, min_relevance=1.0).hits == ()  # nothing relevant
    # the CLI: fit, then search with a threshold nothing reaches
    assert main(["calibrate", str(engine.root), "--data", str(SAMPLE), "--split", "test"]) == 0
    assert "calibrated" in capsys.readouterr().out
    assert main(["search", str(engine.root), "why do cats purr", "--min-relevance", "1"]) == 0
    assert "nothing relevant" in capsys.readouterr().out


def test_http_min_relevance(engine):
    from fastapi.testclient import TestClient

    from twostage.app.server import create_app

    calibrate(engine, SAMPLE, "test")
    client = TestClient(create_app(engine.root), raise_server_exceptions=False)
    some = client.post("/search", json={"query": "why do cats purr", "k": 5}).json()
    assert some["hits"] and some["nothing_relevant"] is False and "relevance" in some["hits"][0]["stage_scores"]
    none = client.post("/search", json={"query": "why do cats purr", "k": 5, "min_relevance": 1.0}).json()
    assert none["hits"] == [] and none["nothing_relevant"] is True
    bad = client.post("/search", json={"query": "cats", "min_relevance": 2})
    assert bad.status_code == 422 and "min_relevance" in bad.text


def test_calibration_on_the_rerankers_training_split_uses_only_its_held_out_queries(engine, tmp_path):
    from twostage.engine.calibration import calibration_queries
    from twostage.reranker.cross_encoder import CrossEncoder

    ce = CrossEncoder.load(engine.manifest.reranker.path)
    ce.save(tmp_path / "ce", training={"data": str(SAMPLE), "split": "train", "dev_queries": ["q01"]})
    other = SearchEngine.build(SAMPLE, tmp_path / "e2", retriever=engine.manifest.retriever.path,
                               reranker=tmp_path / "ce")
    queries, qrels, said = calibration_queries(other, SAMPLE, "train")
    assert [q.id for q in queries] == ["q01"] and "held out" in said
    assert len(calibration_queries(other, SAMPLE, "test")[0]) > 1
    other.close()
