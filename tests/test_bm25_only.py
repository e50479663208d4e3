"""An engine built without a retriever: BM25 only (with a reranker: BM25's candidates reranked), through the same
search path, document store, updates, CLI and HTTP as any engine; the harness's bm25+rerank is one."""

from __future__ import annotations

import json

import numpy as np
import pytest

from twostage.app.cli import main
from twostage.engine.search_engine import SearchEngine
from twostage.indexer.beir import BeirDataset
from twostage.indexer.errors import ConfigError, IndexFormatError
from twostage.indexer.records import Document


@pytest.fixture(scope="module")
def bm25_engine(tmp_path_factory, models):
    from tests.conftest import ROOT

    root = tmp_path_factory.mktemp("bm25-only") / "engine"
    return SearchEngine.build(BeirDataset(ROOT / "data" / "sample").corpus, root, retriever=None, reranker=models[1])


def test_a_bm25_only_engine_searches_reranks_and_updates(bm25_engine, models):
    from twostage.retriever.bm25 import BM25Retriever

    e = bm25_engine
    assert e.manifest.retriever is None and e.settings.first_stage == "bm25" and e.reranks
    on_disk = json.loads((e.version_dir / "manifest.json").read_text())
    assert on_disk["retriever"] is None and on_disk["settings"]["first_stage"] == "bm25"
    assert e.info()["retriever"] is None and "searched" in e.info()["reading"]["summary"]
    result = e.search("why do cats purr", 5)
    assert len(result.hits) == 5 and all({"bm25", "rerank"} <= set(h.stage_scores) for h in result.hits)
    plain = e.search("why do cats purr", 5, rerank=False)  # without the reranker: BM25's own order and scores
    bm25 = BM25Retriever.build(list(e.iter_documents())).search("why do cats purr", 5)
    assert plain.ids == list(bm25.ids)
    for stage in ("hybrid", "dense"):
        with pytest.raises(ConfigError, match=f"first_stage {stage} needs a retriever.*--retriever"):
            e.search("cats", 3, first_stage=stage)
    added = e.add([Document("new-1", "purring cats purr because cats purr", title="Purring")])
    assert "new-1" in added and added.search("cats purr", 1, rerank=False).ids == ["new-1"]
    gone = added.delete(["new-1"])
    assert "new-1" not in gone and len(gone) == len(e)
    again = SearchEngine.load(e.root)  # opens from disk, every file verified
    assert again.search("why do cats purr", 5).ids == gone.search("why do cats purr", 5).ids


def test_build_refuses_a_dense_first_stage_without_a_retriever(tmp_path):
    docs = [Document("a", "one text"), Document("b", "another text")]
    with pytest.raises(ConfigError, match="first_stage dense needs a retriever"):
        SearchEngine.build(docs, tmp_path / "e", retriever=None, first_stage="dense")
    assert not (tmp_path / "e" / "CURRENT").exists()
    from twostage.engine.sharded import ShardedEngine

    with pytest.raises(ConfigError, match="sharded engine needs a retriever"):
        ShardedEngine.build(docs, tmp_path / "s", shards=2, retriever=None)  # type: ignore[arg-type]
    assert not (tmp_path / "s").exists()


def test_a_manifest_without_a_retriever_must_search_bm25(bm25_engine, tmp_path):
    import shutil

    copy = tmp_path / "copy"
    shutil.copytree(bm25_engine.root, copy, ignore=shutil.ignore_patterns("LOCK"))
    path = SearchEngine.load(copy).version_dir / "manifest.json"
    data = json.loads(path.read_text())
    data["settings"]["first_stage"] = "hybrid"
    path.write_text(json.dumps(data))
    with pytest.raises(IndexFormatError, match="without a retriever must search with first_stage bm25"):
        SearchEngine.load(copy, verify=False)
    other = json.loads((SearchEngine.load(bm25_engine.root).version_dir / "manifest.json").read_text())
    other["retriever"] = {"name": "m", "path": "/nowhere", "sha256": "0" * 64}  # a retriever, but no vectors
    path.write_text(json.dumps(other))
    with pytest.raises(IndexFormatError, match="names a retriever but the dense part holds 0-d vectors"):
        SearchEngine.load(copy, verify=False)
    del data["retriever"]  # a missing entry is damage, not "no retriever"
    data["settings"]["first_stage"] = "bm25"
    path.write_text(json.dumps(data))
    with pytest.raises(IndexFormatError, match="retriever"):
        SearchEngine.load(copy, verify=False)


def test_bench_bm25_rerank_is_a_bm25_only_engine(models, sample_dir, tmp_path):
    """Without a retriever, bench's bm25+rerank is a BM25-only engine's search (over whole documents, so that it
    reranks the bm25 system's own list): same ids, same scores."""
    from twostage.eval.run import Run

    assert main(["-q", "bench", "--data", str(sample_dir), "--systems", "bm25+rerank", "--reranker-model",
                 str(models[1]), "--out", str(tmp_path / "o")]) == 0
    run = Run.from_trec(tmp_path / "o" / "runs" / "bm25+rerank.trec")
    ds = BeirDataset(sample_dir)
    engine = SearchEngine.build(ds.corpus, tmp_path / "e", retriever=None, reranker=models[1], passage_words=0)
    queries = {q.id: q.text for q in ds.split("test").queries}
    for qid, ranked in run.items():
        hits = engine.search(queries[qid], 100).hits
        assert list(ranked.ids) == [h.doc_id for h in hits]
        np.testing.assert_allclose(ranked.scores, [h.score for h in hits], rtol=1e-5, atol=1e-6)


def test_cli_builds_and_searches_a_bm25_only_engine(models, sample_dir, tmp_path, capsys):
    out = tmp_path / "e"
    assert main(["-q", "build", "--corpus", str(sample_dir), "--out", str(out), "--retriever", "none",
                 "--reranker", str(models[1])]) == 0
    said = capsys.readouterr().out
    assert "first stage bm25" in said and f"second stage: reranker {models[1]} (top 20, " in said
    # the build summary says what the second stage does: nothing to say of a reranker without one, and plainly
    # when a blend of 0.0 switches it off
    for i, (extra, want) in enumerate(((["--rerank-blend", "0"], "switched off: its weight after bm25 is 0.0"),
                                       (["--rerank-blend", "0.3"], "(top 20, weight 0.3 against bm25)"))):
        assert main(["-q", "build", "--corpus", str(sample_dir), "--out", str(tmp_path / f"e2{i}"), "--retriever", "none",
                     "--reranker", str(models[1]), *extra]) == 0
        assert want in capsys.readouterr().out
    assert main(["-q", "build", "--corpus", str(sample_dir), "--out", str(tmp_path / "e3"), "--retriever",
                 "none"]) == 0
    said = capsys.readouterr().out
    assert "second stage: no reranker" in said and "the reranker" not in said
    assert main(["info", str(tmp_path / "e20")]) == 0
    assert json.loads(capsys.readouterr().out)["second_stage"].startswith(f"reranker {models[1]}, switched off")
    assert main(["search", str(out), "why do cats purr", "--k", "3", "--json"]) == 0
    assert len(json.loads(capsys.readouterr().out)["hits"]) == 3
    # timings named in the unit they hold, and a batch's timings once, not under every query
    queries = tmp_path / "q.txt"
    queries.write_text("why do cats purr\nsnow and rain\nhow to cook rice\n")
    assert main(["search", str(out), "--queries", str(queries), "--k", "2"]) == 0
    lines = [x for x in capsys.readouterr().out.splitlines() if " ms" in x]
    assert len(lines) == 1 and lines[0].startswith("3 queries searched together, per query: ")
    assert "bm25 " in lines[0] and "_s " not in lines[0]
    for extra, said in ((["--first-stage", "dense"], "first_stage dense needs a retriever"),
                        (["--shards", "2"], "--retriever none builds one BM25-only engine")):
        assert main(["-q", "build", "--corpus", str(sample_dir), "--out", str(tmp_path / "x"), "--retriever", "none",
                     *extra]) == 2
        assert said in capsys.readouterr().err
    assert not (tmp_path / "x" / "CURRENT").exists()


def test_http_serves_a_bm25_only_engine(bm25_engine):
    pytest.importorskip("fastapi")
    from fastapi.testclient import TestClient

    from twostage.app.server import create_app

    with TestClient(create_app(bm25_engine, batching=False), raise_server_exceptions=False) as http:
        got = http.post("/search", json={"query": "why do cats purr", "k": 3})
        assert got.status_code == 200
        assert [h["id"] for h in got.json()["hits"]] == bm25_engine.search("why do cats purr", 3).ids
        refused = http.post("/v1/embeddings", json={"input": "cats", "model": "x"})
        assert refused.status_code == 409 and "no retriever" in refused.json()["error"]
        reranked = http.post("/v1/rerank", json={"query": "cats", "documents": ["cats purr", "dogs bark"]})
        assert reranked.status_code == 200 and len(reranked.json()["results"]) == 2


def test_rerank_of_given_lists_is_the_engines_own(bm25_engine, models, sample_dir, tmp_path):
    """engine.rerank (what `twostage rerank` of a run uses) on the engine's own first-stage list equals its search."""
    e = SearchEngine.build(BeirDataset(sample_dir).corpus, tmp_path / "e", retriever=None, reranker=models[1],
                           passage_words=0)
    q = "why do cats purr"
    first = e.ranked(q, 30, rerank=False)
    again = e.rerank([q], [first])[0]
    hits = e.search(q, 30).hits
    assert list(again.ids) == [h.doc_id for h in hits]
    np.testing.assert_allclose(again.scores, [h.score for h in hits], rtol=1e-6)
    alone = e.rerank([q], [first], rerank_blend="none")[0]  # a knob for this call: the reranker alone
    assert list(alone.ids[:e.settings.rerank_depth]) != list(again.ids[:e.settings.rerank_depth]) or \
        not np.allclose(alone.scores, again.scores)
    with pytest.raises(ConfigError, match="1 queries but 0 candidate lists"):
        e.rerank([q], [])
    with pytest.raises(ConfigError, match="passage_words 0"):
        bm25_engine.rerank([q], [first])


def test_swap_on_a_bm25_only_engine(models, sample_dir, tmp_path):
    """A new reranker is swapped in as on any engine; a new retriever needs a build (it would add a dense index)."""
    from twostage.eval.swap import swap

    root = tmp_path / "e"
    SearchEngine.build(BeirDataset(sample_dir).corpus, root, retriever=None, reranker=models[1])
    d = swap(root, reranker=models[1], qrels=sample_dir, split="train")
    assert d.promoted and SearchEngine.load(root).manifest.retriever is None
    with pytest.raises(ConfigError, match="BM25-only engine; give it a retriever with a new build"):
        swap(root, retriever=models[0], qrels=sample_dir, split="train")
    assert [p.name for p in tmp_path.iterdir()] == ["e"]  # nothing staged is left behind


def test_rerank_run_checks_the_blend_before_building(models, sample_dir, monkeypatch):
    from twostage.eval.rerank_run import rerank_run
    from twostage.eval.run import Run
    from twostage.indexer.records import RankedList

    built = []
    monkeypatch.setattr(SearchEngine, "build", classmethod(lambda cls, *a, **k: built.append(1)))
    ds = BeirDataset(sample_dir)
    qid = next(iter(ds.split("test").queries)).id
    run = Run("bm25", {qid: RankedList(np.array([next(iter(ds.corpus)).id], dtype=object),
                                       np.array([1.0], dtype=np.float32))})
    with pytest.raises(ConfigError, match="rerank_blend must be auto, none or a number in"):
        rerank_run(run, sample_dir, models[1], rerank_blend=2.0)
    assert not built
