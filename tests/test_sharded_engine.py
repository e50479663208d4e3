"""The sharded engine answers exactly as one engine: BM25 with global statistics, dense, hybrid, reranked."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from tests.test_bm25 import bm25s_reference
from twostage import Document, SearchEngine
from twostage.engine.sharded import ShardedEngine, read_sharded_manifest, shard_of
from twostage.indexer.errors import ConfigError, DataError, IndexFormatError
from twostage.indexer.versions import current_version
from twostage.retriever.analyzer import Analyzer, AnalyzerConfig
from twostage.retriever.bm25 import BM25Retriever
from twostage.retriever.bm25_stats import CorpusStats

SAMPLE = Path(__file__).parent.parent / "data" / "sample"
QUERIES = [json.loads(line)["text"] for line in (SAMPLE / "queries.jsonl").read_text().splitlines()]
STAGES = ("bm25", "dense", "hybrid")


def same_ranking(a, b, tol: float = 1e-6) -> None:
    """The same documents in the same order with the same scores, except among scores within ``tol`` of each
    other: BM25 is bit for bit, but BLAS rounds a dot product differently in a shard's smaller matrix (1 ulp), so
    dense scores agree to float32 rounding and documents that close may swap (or be cut at k differently)."""
    sa, sb = np.asarray(a.scores, dtype=np.float64), np.asarray(b.scores, dtype=np.float64)
    np.testing.assert_allclose(sa, sb, rtol=0, atol=tol)
    for i, s in enumerate(sa):
        near = np.abs(sa - s) <= 2 * tol
        if near.sum() == 1:
            assert a.ids[i] == b.ids[i], (i, a.ids[i], b.ids[i])
        elif not near[-1]:  # a near-tie group cut by k may hold different documents
            assert set(np.asarray(a.ids)[near]) == set(np.asarray(b.ids)[near])


def bm25_exact(a, b) -> None:
    np.testing.assert_array_equal(np.asarray(a.scores), np.asarray(b.scores))
    same_ranking(a, b, tol=0.0)


@pytest.fixture(scope="module")
def engines(tmp_path_factory, models):
    retriever, reranker = models
    root = tmp_path_factory.mktemp("sharded")
    single = SearchEngine.build(SAMPLE, root / "single", retriever=retriever, reranker=reranker, backend="flat",
                                passage_words=0)  # a sharded engine holds whole documents
    two = ShardedEngine.build(SAMPLE, root / "two", shards=2, retriever=retriever, reranker=reranker, backend="flat")
    four = ShardedEngine.build(SAMPLE, root / "four", shards=4, retriever=retriever, reranker=reranker,
                               backend="flat")
    yield single, two, four
    for e in (single, two, four):
        e.close()


def test_global_statistics_weights_equal_bm25s_bit_for_bit():
    from twostage.indexer.corpus import load_corpus

    docs = list(load_corpus(SAMPLE))
    analyzer = Analyzer(AnalyzerConfig())
    stats = CorpusStats.of(analyzer.analyse(d.full_text) for d in docs)
    reference = bm25s_reference(docs)  # bm25s's own index
    own = BM25Retriever.build(docs, stats=stats)  # the corpus's own statistics: bm25s's weights exactly
    parts = [BM25Retriever.build(p, stats=stats) for p in (docs[:50], docs[50:120], docs[120:])]
    local = [BM25Retriever.build(p) for p in (docs[:50], docs[50:120], docs[120:])]
    differs = False
    for q in QUERIES:
        want = reference(q)
        np.testing.assert_array_equal(own.scores(q), want)
        np.testing.assert_array_equal(np.concatenate([p.scores(q) for p in parts]), want)
        differs |= not np.array_equal(np.concatenate([p.scores(q) for p in local]), want)
    assert differs, "shards with their own statistics should score differently (else this test proves nothing)"
    with pytest.raises(DataError, match="do not cover the term"):
        BM25Retriever.build([Document("x", "an unseen word")], stats=stats)


@pytest.mark.parametrize("which", [1, 2])
def test_sharded_top10_equals_single_engine(engines, which):
    single, sharded = engines[0], engines[which]
    assert len(sharded) == len(single) == 205 and len(sharded.names) == (2, 4)[which - 1]
    for stage in STAGES:
        for q in QUERIES:
            (bm25_exact if stage == "bm25" else same_ranking)(sharded.ranked(q, 10, first_stage=stage, rerank=False),
                                                              single.ranked(q, 10, first_stage=stage, rerank=False))
    for q in QUERIES[:20]:  # after reranking (the reranker runs once, on the merged candidates)
        a, b = sharded.search(q, k=10), single.search(q, k=10)
        assert [h.id for h in a.hits] == [h.id for h in b.hits]
        np.testing.assert_allclose([h.score for h in a.hits], [h.score for h in b.hits], rtol=1e-5, atol=1e-6)
    hits = sharded.search(QUERIES[0], k=10).hits
    assert hits[0].text and {"first_stage", "rerank"} <= set(hits[0].stage_scores)
    for stage in ("bm25", "dense"):  # a hit carries a stage's score exactly when that stage found it
        found = set(sharded.ranked(QUERIES[0], 100, first_stage=stage, rerank=False).ids)
        assert all((stage in h.stage_scores) == (h.id in found) for h in hits)
    assert all({"bm25", "dense"} & set(h.stage_scores) for h in hits)


def test_each_shard_is_a_normal_engine_directory(engines):
    sharded = engines[1]
    names = read_sharded_manifest(sharded.version_dir)
    sizes = [len(SearchEngine.load(sharded.root / n)) for n, _ in names]
    assert sum(sizes) == 205 and all(s > 0 for s in sizes)


def test_updates_route_by_hash_and_stay_exact(tmp_path, models):
    retriever, _ = models
    single = SearchEngine.build(SAMPLE, tmp_path / "single", retriever=retriever, backend="flat", passage_words=0)
    sharded = ShardedEngine.build(SAMPLE, tmp_path / "sharded", shards=3, retriever=retriever, backend="flat")
    # distinct lengths: no two new documents tie exactly (tied documents added later may come in another order)
    new = [Document(f"new-{i}", "fresh bread dough rises with yeast " + "and steam " * i) for i in range(12)]
    before = [s.version for s in (SearchEngine.load(tmp_path / "sharded" / n) for n, _ in sharded.names)]
    single, sharded = single.add(new), sharded.add(new)
    for d in new:  # each new document went to the shard its id hashes to
        assert sharded.holder([d.id]) == [shard_of(d.id, 3)]
    after = [v for _, v in sharded.names]
    assert all(a != b for a, b in zip(after, before)), "every shard gets a version (BM25 statistics changed)"
    doomed = ["new-3", single.bm25.doc_ids[7]]
    single, sharded = single.delete(doomed), sharded.delete(doomed)
    changed = [Document("new-5", "steak resting juices"), Document("brand-new", "mountain boiling eggs")]
    single, sharded = single.upsert(changed), sharded.upsert(changed)
    assert len(single) == len(sharded) == 205 + 12 - 2 + 1
    assert sharded.holder(["new-5"]) == [shard_of("new-5", 3)]
    for stage in STAGES:
        for q in [*QUERIES[:15], "bread dough yeast", "steak juices"]:
            same_ranking(sharded.ranked(q, 10, first_stage=stage, rerank=False),
                         single.ranked(q, 10, first_stage=stage, rerank=False))
    with pytest.raises(DataError, match="already in the engine"):
        sharded.add([Document("new-0", "again")])
    with pytest.raises(DataError, match="unknown id 'nope'"):
        sharded.delete(["nope"])
    assert len(ShardedEngine.load(tmp_path / "sharded")) == len(single)  # the failed changes left nothing
    assert sum(SearchEngine.load(tmp_path / "sharded" / n).index.manifest.deleted for n, _ in sharded.names) == 3
    compacted = sharded.compact()  # every shard without its deleted rows; the answers stay the same
    assert [v for _, v in compacted.names] != [v for _, v in sharded.names] and len(compacted) == len(single)
    assert all(SearchEngine.load(tmp_path / "sharded" / n).index.manifest.deleted == 0 for n, _ in compacted.names)
    for stage in STAGES:
        for q in [*QUERIES[:5], "bread dough yeast", "steak juices"]:
            same_ranking(compacted.ranked(q, 10, first_stage=stage, rerank=False),
                         single.ranked(q, 10, first_stage=stage, rerank=False))


def test_a_crash_before_the_sharded_commit_keeps_the_old_version(tmp_path, models, monkeypatch):
    retriever, _ = models
    sharded = ShardedEngine.build(SAMPLE, tmp_path / "s", shards=2, retriever=retriever, backend="flat")
    pinned = list(sharded.names)
    import twostage.engine.sharded as mod

    def crash(*a, **k):
        raise KeyboardInterrupt("killed between the shard commits and the sharded commit")

    monkeypatch.setattr(mod, "_commit", crash)
    with pytest.raises(KeyboardInterrupt):
        sharded.add([Document("late", "bread")])
    monkeypatch.undo()
    reopened = ShardedEngine.load(tmp_path / "s")
    assert reopened.names == pinned and len(reopened) == 205 and reopened.holder(["late"]) == [None]
    shard = reopened.names[shard_of("late", 2)][0]
    assert current_version(tmp_path / "s" / shard).name != dict(pinned)[shard]  # the shard itself moved on
    again = reopened.add([Document("late", "bread")])  # the next write starts from the pinned versions
    assert len(again) == 206 and again.holder(["late"]) == [shard_of("late", 2)]


def test_bad_sharded_directories(tmp_path, engines):
    with pytest.raises(IndexFormatError, match="no such sharded engine"):
        ShardedEngine.load(tmp_path / "missing")
    with pytest.raises(ConfigError, match="not empty"):
        ShardedEngine.build(SAMPLE, engines[1].root, shards=2)
    import shutil

    copy = tmp_path / "copy"
    shutil.copytree(engines[1].root, copy)
    manifest = current_version(copy) / "manifest.json"
    data = json.loads(manifest.read_text())
    data["shards"][0]["name"] = "../elsewhere"
    manifest.write_text(json.dumps(data))
    with pytest.raises(IndexFormatError, match="plain name"):
        ShardedEngine.load(copy)
    data["shards"][0]["name"] = "shard-000"
    data["shards"][0]["version"] = "v999999"
    manifest.write_text(json.dumps(data))
    with pytest.raises(IndexFormatError, match="is gone"):
        ShardedEngine.load(copy)


def test_ray_shards_answer_as_local_ones(engines):
    ray = pytest.importorskip("ray")
    single, two = engines[0], engines[1]
    ray.init(address="local", num_cpus=2, include_dashboard=False, log_to_driver=False)
    try:
        remote = ShardedEngine.load(two.root, ray=True)
        assert remote.info()["remote"] and len(remote) == 205
        for stage in STAGES:
            for q in QUERIES[:10]:
                same_ranking(remote.ranked(q, 10, first_stage=stage, rerank=False),
                             single.ranked(q, 10, first_stage=stage, rerank=False))
        assert [h.id for h in remote.search(QUERIES[1], k=5).hits] == [h.id for h in single.search(QUERIES[1], k=5).hits]
        remote.close()
        import shutil

        broken = two.root.parent / "broken-ray"
        shutil.copytree(two.root, broken)
        name, version = two.names[1]
        (broken / name / version / "bm25" / "manifest.json").write_text("{}")
        with pytest.raises(IndexFormatError, match="could not be opened by its Ray actor"):
            ShardedEngine.load(broken, ray=True)
    finally:
        ray.shutdown()


def test_cli_builds_searches_and_updates_a_sharded_engine(tmp_path, models, capsys):
    from twostage.app.cli import main

    retriever, _ = models
    out = tmp_path / "eng"
    assert main(["-q", "build", "--corpus", str(SAMPLE), "--out", str(out), "--retriever", str(retriever),
                 "--backend", "flat", "--shards", "3"]) == 0
    assert "in 3 shards" in capsys.readouterr().out
    assert main(["search", str(out), "what makes dough puff up", "--k", "3", "--json"]) == 0
    hits = json.loads(capsys.readouterr().out.splitlines()[0])["hits"]
    want = ShardedEngine.load(out).search("what makes dough puff up", k=3).hits
    assert [h["id"] for h in hits] == [h.id for h in want]
    (tmp_path / "new.jsonl").write_text('{"_id": "n1", "text": "sourdough starter"}\n')
    assert main(["add", str(out), str(tmp_path / "new.jsonl")]) == 0
    assert main(["delete", str(out), "n1"]) == 0
    assert main(["info", str(out)]) == 0
    info = json.loads(capsys.readouterr().out.split("\n", 2)[-1])
    assert info["documents"] == 205 and len(info["shards"]) == 3
    assert main(["compact", str(out)]) == 0
    assert "compacted: 205 documents" in capsys.readouterr().out
    assert all(SearchEngine.load(out / f"shard-{i:03d}").index.manifest.deleted == 0 for i in range(3))
    assert main(["-q", "build", "--corpus", str(SAMPLE), "--out", str(tmp_path / "bad"), "--shards", "0"]) == 2
    assert "--shards must be a positive integer" in capsys.readouterr().err
    assert not (tmp_path / "bad").exists()


def test_serve_answers_a_sharded_engine_as_search_does(tmp_path, models, capsys):
    """#45: `twostage serve` opens engines through the one door, so a sharded engine is served (it used to fail)."""
    pytest.importorskip("fastapi")
    from fastapi.testclient import TestClient

    from twostage.app.cli import main
    from twostage.app.server import create_app

    retriever, reranker = models
    built = ShardedEngine.build(SAMPLE, tmp_path / "e", shards=2, retriever=retriever, reranker=reranker,
                                backend="flat")
    built.close()
    with TestClient(create_app(tmp_path / "e", verify=False), raise_server_exceptions=False) as client:
        for query in QUERIES[:6]:
            assert main(["search", str(tmp_path / "e"), query, "--k", "5", "--json", "--fast"]) == 0
            want = json.loads(capsys.readouterr().out)
            got = client.post("/search", json={"query": query, "k": 5}).json()
            assert [h["id"] for h in got["hits"]] == [h["id"] for h in want["hits"]]
            np.testing.assert_allclose([h["score"] for h in got["hits"]], [h["score"] for h in want["hits"]],
                                       rtol=0, atol=1e-6)
        r = client.post("/documents", json={"documents": [{"id": "zz-new", "text": "zebra zeppelin zither"}]})
        assert r.status_code == 200 and r.json()["documents"] == 206
        hits = client.post("/search", json={"query": "zebra zeppelin zither", "k": 3, "first_stage": "bm25"}).json()
        assert hits["hits"][0]["id"] == "zz-new" and hits["version"] == r.json()["version"]
        assert client.get("/health").json()["documents"] == 206
        r = client.request("DELETE", "/documents", json={"ids": ["zz-new"]})
        assert r.status_code == 200 and r.json()["documents"] == 205
