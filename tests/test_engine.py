"""The search engine: one directory, one object; documents, BM25 and the dense index always in step."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from twostage import Document, SearchEngine
from twostage.app.cli import main
from twostage.errors import ConfigError, DataError, IndexFormatError
from twostage.indexer.errors import FilterError
from twostage.indexer.passages import doc_id_of, split_id
from twostage.indexer.versions import current_version


@pytest.fixture(scope="module")
def built(tmp_path_factory, models):
    retriever, reranker = models
    path = tmp_path_factory.mktemp("engine") / "eng"
    return SearchEngine.build(Path(__file__).parent.parent / "data" / "sample", path, retriever=retriever,
                              reranker=reranker)


def parts_agree(engine: SearchEngine) -> list[str]:
    """The live document ids of the document store, BM25 and the dense index (whose rows are passages in a passage
    engine, each document's together and numbered from 0), checked to be the same."""
    live = [str(i) for i in engine.index.doc_ids[~engine.index.deleted]]
    assert [str(i) for i in engine.bm25.doc_ids] == live
    if engine.settings.passage_words:
        parts = [split_id(p) for p in live]
        assert all(n == (0 if i == 0 or parts[i - 1][0] != d else parts[i - 1][1] + 1)
                   for i, (d, n) in enumerate(parts))
        assert engine.manifest.passages == len(live)
        live = [d for d, n in parts if n == 0]
    assert engine.manifest.documents == len(live) == len(engine)
    return live


def snapshot(path: Path) -> dict[str, float]:
    return {str(p.relative_to(path)): p.stat().st_mtime for p in path.rglob("*") if p.name not in ("LOCK", "READERS")}


def test_build_and_search(built):
    result = built.search("why do cats purr", k=5)
    assert len(result.hits) == 5 and [h.rank for h in result.hits] == [1, 2, 3, 4, 5]
    hit = result.hits[0]
    assert hit.id and hit.title and hit.text and isinstance(hit.metadata, dict)
    assert {"first_stage", "rerank"} <= set(hit.stage_scores) and hit.stage_scores.keys() & {"bm25", "dense"}
    assert all(a.score >= b.score for a, b in zip(result.hits, result.hits[1:]))
    assert {"encode_s", "dense_s", "bm25_s", "rerank_s", "fetch_s", "total_s"} <= set(result.timings)
    parts_agree(built)
    info = built.info()
    assert info["documents"] == 205 and info["settings"]["first_stage"] == "hybrid" and info["reranker"]["sha256"]
    assert json.loads(json.dumps(result.to_dict()))["hits"][0]["id"] == hit.id


def test_first_stages_and_rerank_switch(built):
    for first_stage in ("bm25", "dense", "hybrid"):
        plain = built.search("snow and rain", k=10, first_stage=first_stage, rerank=False)
        # BM25 returns only documents sharing a term with the query (5 here); the others fill k
        assert len(plain.hits) == (5 if first_stage == "bm25" else 10) and "rerank" not in plain.hits[0].stage_scores
        assert "rerank_s" not in plain.timings
    bm25 = built.search("snow and rain", k=10, first_stage="bm25", rerank=False)
    want = built.bm25.search("snow and rain", 10)  # the sample's documents are one passage each
    assert bm25.ids == [doc_id_of(str(i)) for i in want.ids]


def test_search_batch_equals_one_at_a_time(built):
    queries = ["why do cats purr", "snow and rain", "how to boil an egg", "music for the piano"]
    batch = built.search_batch(queries, k=7)
    for q, r in zip(queries, batch):
        one = built.search(q, k=7)
        assert r.ids == one.ids
        np.testing.assert_allclose([h.score for h in r.hits], [h.score for h in one.hits], atol=1e-5)


def test_k_rules(built):
    assert len(built.search("cats", k=10_000, rerank=False).hits) == 205  # more than the corpus: all of it
    for bad in (0, -3):
        with pytest.raises(ConfigError, match="k must be a positive integer"):
            built.search("cats", k=bad)
    with pytest.raises(ConfigError, match="empty"):
        built.search("   ")


def test_stop_words_only_query_returns_dense_hits(built):
    result = built.search("the and of to", k=5)
    assert len(result.hits) == 5 and all("bm25" not in h.stage_scores for h in result.hits)
    assert all("dense" in h.stage_scores for h in result.hits)


def test_where_names_an_unknown_field(built):
    with pytest.raises(FilterError, match="no document has the field 'no_such_field'"):
        built.search("rain", k=5, where={"no_such_field": 1})
    assert "no_such_field" not in built.metadata_fields()


def test_add_upsert_delete_compact_keep_every_part_in_step(built, tmp_path):
    engine = SearchEngine.build([Document(f"d{i}", f"document number {i} about topic {i % 3}") for i in range(30)],
                                tmp_path / "e", retriever=built.manifest.retriever.path)
    e2 = engine.add([Document("snow-1", "blizzard snowflakes avalanche", "Snow")])
    assert len(e2) == 31 and "snow-1" in parts_agree(e2)
    assert e2.search("blizzard avalanche", k=1, first_stage="bm25").hits[0].id == "snow-1"
    assert engine.search("blizzard avalanche", k=3, first_stage="bm25").hits == ()  # the old version, unchanged
    e3 = e2.upsert([Document("d1", "volcano lava eruption"), Document("d99", "a brand new one")])
    assert len(e3) == 32 and e3.documents(["d1"])[0].text == "volcano lava eruption"
    assert e3.search("volcano lava", k=1, first_stage="bm25").hits[0].id == "d1"
    e4 = e3.delete(["snow-1", "d2"])
    assert len(e4) == 30 and "snow-1" not in parts_agree(e4)
    assert all(h.id != "snow-1" for h in e4.search("blizzard avalanche", k=30).hits)
    e5 = e4.compact()
    assert e5.index.manifest.deleted == 0 and parts_agree(e5) == parts_agree(e4)
    assert e5.search("volcano", k=3).ids == e4.search("volcano", k=3).ids
    reloaded = SearchEngine.load(tmp_path / "e")
    assert reloaded.version == e5.version and parts_agree(reloaded) == parts_agree(e5)


def test_build_with_progress_bars(built, tmp_path, capsys):
    engine = SearchEngine.build([Document(f"d{i}", f"text {i}") for i in range(50)], tmp_path / "e",
                                retriever=built.manifest.retriever.path, chunk_size=20, show_progress=True)
    assert len(engine) == 50 and "encode corpus" in capsys.readouterr().err


def test_a_build_warns_about_empty_documents_once_naming_the_documents(built, tmp_path, caplog):
    """A build reads its corpus several times (a sample for its languages and int8 scales, every document, then a
    passage engine's passages); the empty documents are counted once, by document id, not once per read."""
    import logging

    from twostage.indexer.corpus import load_corpus

    rows = [{"_id": f"d{i}", "text": f"document number {i} about topic {i % 3}. " * 30} for i in range(12)]
    rows += [{"_id": "e1", "title": "", "text": ""}, {"_id": "e2", "title": " ", "text": " "}]
    corpus = tmp_path / "corpus.jsonl"
    corpus.write_text("\n".join(json.dumps(r) for r in rows))
    for name, overrides in (("documents", {"passage_words": 0}), ("passages", {})):
        caplog.clear()
        with caplog.at_level(logging.WARNING, logger="twostage.indexer.corpus"):
            engine = SearchEngine.build(corpus, tmp_path / name, retriever=built.manifest.retriever.path, **overrides)
        said = [r.getMessage() for r in caplog.records if "neither title nor text" in r.getMessage()]
        assert said == ["2 documents have neither title nor text (kept; first: e1, e2)"], (name, said)
        assert engine.shape.enabled == (name == "passages") and {"e1", "e2"} <= set(engine.document_ids())
    caplog.clear()  # a Corpus said it when it was loaded; a build from it does not say it again
    with caplog.at_level(logging.WARNING, logger="twostage.indexer.corpus"):
        loaded = load_corpus(corpus)
        SearchEngine.build(loaded, tmp_path / "loaded", retriever=built.manifest.retriever.path)
    assert sum("neither title nor text" in r.getMessage() for r in caplog.records) == 1


def test_colliding_ids_on_add_change_nothing(built, tmp_path):
    engine = SearchEngine.build([Document(f"d{i}", f"text {i}") for i in range(10)], tmp_path / "e",
                                retriever=built.manifest.retriever.path)
    before = snapshot(tmp_path / "e")
    with pytest.raises(DataError, match="'d3' is already in the engine; use upsert"):
        engine.add([Document("new", "x"), Document("d3", "y")])
    with pytest.raises(DataError, match="unknown id"):
        engine.delete(["nope"])
    assert snapshot(tmp_path / "e") == before


def test_updates_are_computed_from_the_latest_version(built, tmp_path):
    """A stale object's update never undoes a change another object (or process) committed."""
    engine = SearchEngine.build([Document(f"d{i}", f"text {i}") for i in range(10)], tmp_path / "e",
                                retriever=built.manifest.retriever.path)
    stale = SearchEngine.load(tmp_path / "e")
    engine.add([Document("a1", "added by the first writer")])
    after = stale.delete(["d0"])  # stale still reads v1, but the change applies to v2
    assert "a1" in after and "d0" not in after and len(after) == 10
    compacted = stale.compact()
    assert "a1" in compacted and "d0" not in compacted


def test_readers_keep_their_version_until_refresh(built, tmp_path):
    engine = SearchEngine.build([Document(f"d{i}", f"text {i} apple") for i in range(10)], tmp_path / "e",
                                retriever=built.manifest.retriever.path)
    reader = SearchEngine.load(tmp_path / "e")
    for i in range(3):
        engine = engine.add([Document(f"x{i}", "apple pie")])
        engine = engine.compact()
    assert len(reader.search("apple", k=20).hits) == 10  # its version is still on disk, leased
    assert reader.documents(["d3"])[0].text == "text 3 apple"
    fresh = reader.refresh()
    assert fresh.version == current_version(tmp_path / "e").name and len(fresh) == 13


def test_bad_engine_directories(built, tmp_path, models):
    import shutil

    copy = tmp_path / "copy"
    shutil.copytree(built.root, copy)
    version = current_version(copy)
    manifest = json.loads((version / "manifest.json").read_text())
    (version / "manifest.json").write_text(json.dumps({**manifest, "format_version": 7}))
    with pytest.raises(IndexFormatError, match="format version 7 is newer"):
        SearchEngine.load(copy)
    (version / "manifest.json").write_text(json.dumps({**manifest, "files": {"../../etc/passwd": {"bytes": 1, "sha256": "x"}}}))
    with pytest.raises(IndexFormatError, match="not a plain name"):
        SearchEngine.load(copy)
    (version / "manifest.json").write_text(json.dumps({**manifest, "settings": {**manifest["settings"], "rerank_depth": "9"}}))
    with pytest.raises(IndexFormatError, match="rerank_depth"):
        SearchEngine.load(copy)
    (version / "manifest.json").write_text(json.dumps(manifest))
    (version / "bm25" / "doc_ids.json").write_text("[]")
    with pytest.raises(IndexFormatError):
        SearchEngine.load(copy)
    with pytest.raises(IndexFormatError, match="no such engine"):
        SearchEngine.load(tmp_path / "nope")


def test_reranker_whose_weights_changed_is_refused(built, tmp_path, models):
    import shutil

    _, reranker = models
    ce = tmp_path / "ce"
    shutil.copytree(reranker, ce)
    engine = SearchEngine.build([Document(f"d{i}", f"text {i}") for i in range(5)], tmp_path / "e",
                                retriever=built.manifest.retriever.path, reranker=ce)
    weights = ce / "model.safetensors"
    data = bytearray(weights.read_bytes())
    data[-10] ^= 0x01
    weights.write_bytes(bytes(data))
    with pytest.raises(ConfigError, match="sha256 .* no longer matches"):
        SearchEngine.load(tmp_path / "e").search("text", k=2)
    assert engine.search("text", k=2, rerank=False).hits  # the first stage alone does not need it


def test_untrained_reranker_is_refused_at_build(built, tmp_path, tiny_bert_dir):
    with pytest.raises(ConfigError, match="never trained"):
        SearchEngine.build([Document("a", "x")], tmp_path / "e", retriever=tiny_bert_dir, reranker=tiny_bert_dir)
    assert not (tmp_path / "e" / "CURRENT").exists()


def test_harness_hybrid_rerank_is_the_engine(built, sample_dir, models):
    from twostage.eval.harness import run_bench
    from twostage.eval.systems import SystemOptions

    retriever, reranker = models
    result = run_bench(sample_dir, "test", "hybrid+rerank,dense",
                       options=SystemOptions(engine=str(built.root)))
    run = result.systems[0].run
    for query in result.split.queries[:5]:
        assert list(run[query.id].ids[:10]) == built.search(query.text, k=10).ids


@pytest.mark.parametrize("shape", ["whole", "short-passages", "blend-fusion"])
def test_bench_engine_scores_what_search_returns_on_non_default_engines(tmp_path, sample_dir, models, shape):
    """#45: the harness used to replace an --engine's passage settings with its own defaults (ArguAna scored 0.000)."""
    from twostage.eval.harness import run_bench
    from twostage.eval.systems import SystemOptions
    from twostage.indexer.beir import BeirDataset

    retriever, reranker = models
    settings = {"whole": {"passage_words": 0}, "short-passages": {"passage_words": 12, "passage_stride": 6,
                                                                   "passage_whole_up_to": 0, "rerank_depth": 7},
                "blend-fusion": {"fusion": "wsum", "dense_weight": 0.3}}[shape]
    engine = SearchEngine.build(BeirDataset(sample_dir).corpus, tmp_path / "e", retriever=retriever,
                                reranker=reranker, **settings)
    result = run_bench(sample_dir, "test", "dense,hybrid,hybrid+rerank", options=SystemOptions(engine=str(engine.root)))
    for system in result.systems:
        stage, rerank = system.name.split("+")[0], system.name.endswith("+rerank")
        for query in result.split.queries:
            want = engine.search(query.text, k=10, first_stage=stage, rerank=rerank)
            assert list(system.run[query.id].ids[:10]) == want.ids, (system.name, query.id)
    assert result.table().loc["dense", "ndcg@10"] > 0
    engine.close()


# ---- the command line ---------------------------------------------------------------------------------------
def test_cli_build_search_update(tmp_path, sample_dir, models, capsys):
    retriever, reranker = models
    eng = tmp_path / "eng"
    assert main(["-q", "build", "--corpus", str(sample_dir), "--out", str(eng), "--retriever", str(retriever),
                 "--reranker", str(reranker)]) == 0
    assert "205 documents" in capsys.readouterr().out
    assert main(["search", str(eng), "why do cats purr", "--k", "3", "--json"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == 1
    obj = json.loads(lines[0])
    assert obj["query"] == "why do cats purr" and len(obj["hits"]) == 3 and "rerank_s" in obj["timings"]
    assert set(obj["hits"][0]) >= {"id", "score", "rank", "title", "text", "stage_scores"}
    queries = tmp_path / "q.txt"
    queries.write_text("why do cats purr\n\nsnow and rain\nhow to cook rice\n")
    assert main(["search", str(eng), "--queries", str(queries), "--json", "--k", "2"]) == 0
    assert [json.loads(x)["query"] for x in capsys.readouterr().out.splitlines()] == \
        ["why do cats purr", "snow and rain", "how to cook rice"]
    for bad, message in ((["--k", "0"], "--k must be a positive integer"), (["--where", "oops"], "expected KEY=VALUE"),
                         (["--where", "nofield=1"], "no document has the field 'nofield'"),
                         (["--where", "topic>3"], "$gt does not apply to a string field"),
                         (["--where", '{"topic": {"$in": 3}}'], "where.topic.$in: takes a list"),
                         (["--offset", "-1"], "--offset must be"), (["--dense-weight", "2"], "dense_weight must be")):
        assert main(["search", str(eng), "snow", *bad]) == 2
        err = capsys.readouterr().err
        assert message in err and err.count("\n") == 1
    extra = tmp_path / "extra.jsonl"
    extra.write_text('{"_id": "n1", "title": "New", "text": "zebra giraffe savanna"}\n')
    assert main(["add", str(eng), str(extra)]) == 0 and "206 documents" in capsys.readouterr().out
    before = snapshot(eng)
    assert main(["add", str(eng), str(extra)]) == 2
    assert "'n1' is already in the engine; use upsert" in capsys.readouterr().err and snapshot(eng) == before
    assert main(["upsert", str(eng), str(extra)]) == 0 and "206 documents" in capsys.readouterr().out
    assert main(["delete", str(eng), "n1", "cook-01"]) == 0 and "204 documents" in capsys.readouterr().out
    before = snapshot(eng)
    assert main(["delete", str(eng), "cook-01"]) == 2 and "cook-01" in capsys.readouterr().err
    assert main(["delete", str(eng), "--ids-file", str(tmp_path / "none.txt")]) == 2
    err = capsys.readouterr().err
    assert "--ids-file" in err and "no such file" in err and snapshot(eng) == before
    (tmp_path / "ids.txt").write_text("cook-03\n\ncook-04\n")
    assert main(["delete", str(eng), "--ids-file", str(tmp_path / "ids.txt")]) == 0
    assert "202 documents" in capsys.readouterr().out
    assert main(["compact", str(eng)]) == 0
    capsys.readouterr()
    assert main(["info", str(eng)]) == 0
    info = json.loads(capsys.readouterr().out)
    assert info["documents"] == 202 and info["dense"]["deleted"] == 0 and info["bm25"]["documents"] == 202


def test_cli_bad_engine_inputs(tmp_path, sample_dir, models, capsys):
    retriever, _ = models
    assert main(["search", str(tmp_path / "none"), "x"]) == 2
    assert "no such engine directory" in capsys.readouterr().err
    (tmp_path / "file").write_text("x")
    assert main(["build", "--corpus", str(sample_dir), "--out", str(tmp_path / "file"), "--retriever",
                 str(retriever)]) == 2
    assert "is a file" in capsys.readouterr().err
    assert main(["build", "--corpus", str(tmp_path / "none.jsonl"), "--out", str(tmp_path / "e"),
                 "--retriever", str(retriever)]) == 2
    assert "no such corpus" in capsys.readouterr().err


def test_queries_from_stdin(tmp_path, built):
    proc = subprocess.run([sys.executable, "-m", "twostage", "search", str(built.root), "--queries", "-", "--json",
                           "--k", "2", "--no-rerank"], input="cats\nrain\n", capture_output=True, text=True,
                          env={**os.environ, "HF_HUB_OFFLINE": "1"}, timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert [json.loads(x)["query"] for x in proc.stdout.splitlines()] == ["cats", "rain"]
    assert "Loading weights" not in proc.stderr and "LOAD REPORT" not in proc.stderr


@pytest.mark.parametrize("times", [1, 2, 10])
def test_queries_longer_than_the_reranker_max_length(built, sample_dir, tmp_path, times):
    """A pasted paragraph as the query: the reranker cuts it instead of failing (engine, a view, bench)."""
    import shutil

    from twostage.eval.harness import run_bench
    from twostage.eval.systems import SystemOptions

    reranker = built.reranker
    words = " ".join(["snow rain cats piano garden"] * (reranker.max_length * times // 5 + 1))
    assert len(reranker.tokenizer(words)["input_ids"]) > reranker.max_length * times
    result = built.search(words, k=5)
    assert len(result.hits) == 5 and "rerank" in result.hits[0].stage_scores
    assert len(built.with_settings(first_stage="bm25", rerank_depth=10).search(words, k=5).hits) == 5
    data = tmp_path / "long"
    shutil.copytree(sample_dir, data)
    lines = [json.loads(x) for x in (data / "queries.jsonl").read_text().splitlines() if x.strip()]
    (data / "queries.jsonl").write_text("".join(json.dumps({**q, "text": (q["text"] + " ") * 40 * times}) + "\n"
                                                for q in lines))
    bench = run_bench(data, "test", "hybrid+rerank", options=SystemOptions(engine=str(built.root)))
    assert len(bench.systems[0].run) == len(bench.split.queries)


def test_bench_reports_what_the_models_cut(built, sample_dir, tmp_path):
    """#46: nothing is cut silently: the report counts the queries longer than the retriever reads and those taking
    more than half of a reranker pair."""
    import shutil

    from twostage.eval.harness import run_bench
    from twostage.eval.report import render_report
    from twostage.eval.systems import SystemOptions

    data = tmp_path / "one-long"
    shutil.copytree(sample_dir, data)
    lines = [json.loads(x) for x in (data / "queries.jsonl").read_text().splitlines() if x.strip()]
    long_one = (data / "qrels" / "test.tsv").read_text().splitlines()[1].split("\t")[0]
    (data / "queries.jsonl").write_text("".join(
        json.dumps({**q, "text": (q["text"] + " ") * 60 if q["_id"] == long_one else q["text"]}) + "\n"
        for q in lines))
    bench = run_bench(data, "test", "bm25,dense,hybrid+rerank", options=SystemOptions(engine=str(built.root)))
    n = len(bench.split.queries)
    assert long_one in {q.id for q in bench.split.queries}
    reads, pair = built.encoder.config.max_length, built.reranker.max_length
    assert f"1 of {n} queries are longer than the retriever reads ({reads} tokens)" in bench.notes[1]
    assert bench.notes[2].startswith(f"1 of {n} queries take more than half of what the reranker reads ({pair} ")
    assert bench.notes[0] == built.reading()["summary"] and len(bench.notes) == 3  # each line once
    assert "## What the models cut" in render_report(bench, {})
    short = run_bench(sample_dir, "test", "dense", options=SystemOptions(engine=str(built.root)))
    assert short.notes[1].startswith(f"0 of {len(short.split.queries)} queries") and len(short.notes) == 2


def test_configure_and_tune_on_dev(built, tmp_path, sample_dir):
    import shutil

    from twostage.eval.tune import tune_engine
    from twostage.indexer.beir import BeirDataset

    shutil.copytree(built.root, tmp_path / "e")
    engine = SearchEngine.load(tmp_path / "e")
    dense = engine.configure(first_stage="dense", rerank=False, rerank_depth=5)
    assert dense.settings.first_stage == "dense" and not dense.settings.rerank and dense.version != engine.version
    assert "rerank" not in dense.search("snow", k=3).hits[0].stage_scores
    assert parts_agree(dense) == parts_agree(engine)
    with pytest.raises(ConfigError, match="rebuild the engine"):
        engine.configure(backend="flat")
    with pytest.raises(ConfigError, match="unknown engine setting"):
        engine.configure(colour="red")
    split = BeirDataset(sample_dir).split("train")
    tuned, result = tune_engine(SearchEngine.load(tmp_path / "e"), split.queries[:8], split.qrels)
    assert len(result.scores) == 6 and result.scores[0][2] >= result.scores[-1][2]
    best = result.scores[0]
    assert (tuned.settings.first_stage, tuned.settings.rerank) == (best[0], best[1]) or best[2] == next(
        v for fs, rr, v in result.scores if (fs, rr) == ("dense", False))  # a tie keeps the current settings


def test_the_engine_blends_with_each_first_stages_own_weight(built, monkeypatch):
    """The blends are the manifest's numbers, one per first stage (resolved from the reranker's dev choice when the
    engine was built): alpha 0 for bm25 keeps BM25's order and does not run the reranker at all; a first stage
    without its own weight takes rerank_blend."""
    reranker = built.reranker
    assert built.settings.rerank_blend == 0.5 and built.settings.rerank_blend_by_first_stage == {
        "hybrid": 0.5, "dense": 0.5, "bm25": 0.5}  # the test reranker's overall choice, 0.5, resolved at build
    query = "snow and rain"
    zero = built.with_settings(rerank_blend=0.5, rerank_blend_by_first_stage={"bm25": 0.0})
    with monkeypatch.context() as patch:
        patch.setattr(reranker, "predict", lambda *a, **k: pytest.fail("the reranker ran at blend 0"))
        kept = zero.search(query, k=5, first_stage="bm25")
    assert kept.ids == built.search(query, k=5, first_stage="bm25", rerank=False).ids
    assert not any("rerank" in h.stage_scores for h in kept.hits)
    alone = built.with_settings(rerank_blend_by_first_stage={"bm25": 1.0}, rerank_blend=0.5).search(
        query, k=5, first_stage="bm25")
    rerank = [h.stage_scores["rerank"] for h in alone.hits]
    assert rerank == sorted(rerank, reverse=True)
    assert zero.search(query, k=5).ids == built.search(query, k=5).ids  # hybrid: rerank_blend, as the engine's
    before = built.search(query, k=5, first_stage="bm25")
    reranker.blends = {"bm25": 0.0}  # an attribute on the model is not search policy: nothing changes
    try:
        after = built.search(query, k=5, first_stage="bm25")
        assert after.ids == before.ids and [h.score for h in after.hits] == [h.score for h in before.hits]
    finally:
        reranker.blends = {}


def test_hits_are_read_from_the_store_once(built, monkeypatch):
    """The reranker reads its candidates' documents; the hits are made from those (no second read of the page's)."""
    read: list[str] = []
    rows: list[int] = []
    whole, at = built.documents_with_passages, built.index.store.documents_at

    def counted(ids):
        read.extend(ids)
        return whole(ids)

    def counted_rows(r):
        rows.append(len(r))
        return at(r)

    monkeypatch.setattr(built, "documents_with_passages", counted)
    monkeypatch.setattr(built.index.store, "documents_at", counted_rows)
    result = built.search("why do cats purr", k=3, rerank_depth=12)
    assert len(result.hits) == 3 and all("rerank" in h.stage_scores for h in result.hits)
    assert len(read) == len(set(read)) == 12  # each of the 12 reranked documents once, the 3 hits among them
    assert {h.id for h in result.hits} <= set(read)
    assert len(rows) == 1  # one read of the store for the whole query
    read.clear()
    deeper = built.search("why do cats purr", k=15, rerank_depth=12)  # 3 hits below the rerank depth: read after
    assert len(read) == len(set(read)) == 15 and [h.id for h in deeper.hits[:3]] == [h.id for h in result.hits]


def test_the_plan_of_a_search():
    from twostage.engine.plan import EngineParts, make_plan
    from twostage.engine.settings import EngineSettings

    s = EngineSettings(first_stage_depth=100, rerank_depth=20)
    full, bare = EngineParts(True, True, True, False), EngineParts(False, False, False, False)
    p = make_plan(s, {}, 10, 0, full)
    assert (p.rerank, p.window, p.end, p.depth, p.cut, p.maxsim) == (True, 100, 10, 100, 10, False)
    p = make_plan(s, {"first_stage_depth": 30, "rerank_depth": 50}, 10, 40, full)  # a page of the rerank window
    assert (p.window, p.end, p.depth) == (50, 50, 50)
    p = make_plan(s, {"diversity": 0.5}, 10, 0, full)  # diversity reorders the whole list: nothing cut before it
    assert p.cut == p.depth == 100
    assert make_plan(s, {"rerank": False}, 200, 0, full).depth == 200  # a first page past the window ranks deeper
    with pytest.raises(ConfigError, match="offset 100 is past"):
        make_plan(s, {}, 10, 100, full)
    with pytest.raises(ConfigError, match="no reranker"):
        make_plan(s, {"rerank": True}, 10, 0, bare)
    with pytest.raises(ConfigError, match="needs a retriever"):
        make_plan(s, {}, 10, 0, bare)
    with pytest.raises(ConfigError, match="no token vectors"):
        make_plan(s, {"maxsim": True}, 10, 0, full)


def test_the_walk_of_one_search_is_short_functions(built):
    """Every function of twostage that one default search calls (models loaded) is at most 50 lines long."""
    import inspect

    import twostage

    built.search("why do cats purr", k=10)
    root = str(Path(twostage.__file__).parent)
    called = set()

    def profile(frame, event, arg):
        if event == "call" and frame.f_code.co_filename.startswith(root):
            called.add(frame.f_code)

    sys.setprofile(profile)
    try:
        built.search("why do cats purr", k=10)
    finally:
        sys.setprofile(None)
    lengths = {f"{c.co_filename[len(root) + 1:]}:{c.co_qualname}": len(inspect.getsourcelines(c)[0])
               for c in called if not c.co_name.startswith("<")}  # comprehensions count in their function
    assert "engine/stages.py:rerank_stage" in lengths and len(lengths) > 40
    long = {name: n for name, n in lengths.items() if n > 50}
    assert not long, long


def test_one_search_never_bounces_between_the_engine_and_the_search(built):
    """#82: no call from engine/search_engine.py into engine/search.py calls back into search_engine.py, nor the other
    way round (every stack of twostage functions one default search enters, models loaded, read for the two files
    with consecutive frames of one file taken as one step)."""
    import twostage

    built.search("why do cats purr", k=10)
    root = str(Path(twostage.__file__).parent)
    short = {f"{root}/engine/search_engine.py": "search_engine", f"{root}/engine/search.py": "search"}
    bounces, entered = set(), set()

    def profile(frame, event, arg):
        if event != "call" or not frame.f_code.co_filename.startswith(root):
            return
        entered.add(frame.f_code.co_filename)
        steps, f = [], frame
        while f is not None:
            name = short.get(f.f_code.co_filename)
            if name is not None and (not steps or steps[-1][0] != name):
                steps.append((name, f.f_code.co_qualname))
            f = f.f_back
        if len(steps) >= 3:  # A -> B -> A, innermost first
            bounces.add(" <- ".join(q for _, q in steps))

    sys.setprofile(profile)
    try:
        built.search("why do cats purr", k=10)
    finally:
        sys.setprofile(None)
    assert set(short) <= entered  # both were walked
    assert not bounces, bounces


def test_both_engines_implement_the_search_protocols_with_no_base_class_between_them():
    """#82: what the search path reads of an engine is a protocol (engine/source.py), which the single and the
    sharded engine each implement; the mixin that gives them the entry points declares nothing abstract and reads
    no data of its own (candidates, documents, token scores are each engine's)."""
    import inspect

    from twostage.engine.search import SearchMethods
    from twostage.engine.sharded import ShardedEngine
    from twostage.engine.source import CandidateSource, Searchable

    methods = {n for p in (CandidateSource, Searchable) for n, v in vars(p).items()
               if not n.startswith("_") and (callable(v) or isinstance(v, property))}
    declared = set(Searchable.__annotations__)  # set by each engine's __init__, declared by the mixin
    assert {"candidates", "documents", "token_scores", "at_version", "loaded_models"} <= methods
    assert declared == {"manifest", "root", "version_dir", "read_only"}
    for cls in (SearchEngine, ShardedEngine):
        assert [b for b in cls.__mro__ if b not in (cls, SearchMethods, object)] == []
        missing = sorted(n for n in methods if inspect.getattr_static(cls, n, None) is None)
        assert not missing, (cls.__name__, missing)
        assert declared <= set(SearchMethods.__annotations__)
    assert not getattr(SearchMethods, "__abstractmethods__", None)
    data = {"candidates", "documents", "documents_with_passages", "passages", "token_scores", "metadata_kinds",
            "example_features", "vectors_by_id", "matched_terms", "analyzer", "at_version"}
    assert not data & set(vars(SearchMethods))
