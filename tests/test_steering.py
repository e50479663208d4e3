"""Result lists a user steers: like / unlike / similar, diversity, grouping, and explanations that add up."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from twostage import Document, SearchEngine
from twostage.app.cli import main
from twostage.engine.steer import FEEDBACK, expansion, grouped, mmr, rocchio, split_steering
from twostage.errors import ConfigError
from twostage.indexer.beir import BeirDataset
from twostage.indexer.corpus import load_corpus
from twostage.indexer.records import RankedList

SAMPLE = Path(__file__).resolve().parent.parent / "data" / "sample"
TEST_QUERIES = [q.text for q in BeirDataset(SAMPLE).split("test").queries]


def with_fields(docs: list[Document]) -> list[Document]:
    """The sample with a second field, ``source``, that a fifth of the documents lack, and a number, ``year``."""
    out = []
    for i, d in enumerate(docs):
        meta = dict(d.metadata, year=2000 + i % 7)
        if i % 5:
            meta["source"] = f"site-{i % 4}"
        out.append(Document(d.id, d.text, d.title, meta))
    return out


@pytest.fixture(scope="module")
def engines(tmp_path_factory, models):
    """A passage engine (the default shape) and a whole-document engine, both with the reranker."""
    retriever, reranker = models
    root = tmp_path_factory.mktemp("steer")
    docs = with_fields(list(load_corpus(SAMPLE)))
    passages = SearchEngine.build(docs, root / "passages", retriever=retriever, reranker=reranker,
                                  passage_words=24, passage_stride=12)
    whole = SearchEngine.build(docs, root / "whole", retriever=retriever, reranker=reranker, passage_words=0,
                               backend="flat")
    yield passages, whole
    passages.close()
    whole.close()


OPTIONS = [{"first_stage": "hybrid", "fusion": "rrf"}, {"first_stage": "hybrid", "fusion": "wsum"},
           {"first_stage": "hybrid", "fusion": "wsum", "dense_weight": 0.8}, {"first_stage": "dense"},
           {"first_stage": "bm25"}]


@pytest.mark.parametrize("which", [0, 1])
def test_every_explanation_recomposes_the_hits_score(engines, which):
    engine = engines[which]
    checked = 0
    for options in OPTIONS:
        for rerank in (False, True):
            for extra in ({}, {"diversity": 0.3}, {"like": ["cook-01"], "unlike": ["home-05"]}):
                results = engine.search_batch(TEST_QUERIES, 10, rerank=rerank, explain=True, **options, **extra)
                for result in results:
                    assert len({h.id for h in result.hits}) == len(result.hits)  # a document once, passages or not
                    for hit in result.hits:
                        e = hit.explanation
                        assert e is not None and e.score == hit.score
                        assert abs(e.recomposed() - hit.score) <= 1e-6, (options, rerank, extra, hit.id, e)
                        assert (e.rerank is not None and e.rerank.score is not None) == ("rerank" in hit.stage_scores)
                        bm25 = next((s for s in e.stages if s.name == "bm25"), None)
                        if bm25 is not None and bm25.score is not None:  # the matched terms add up to BM25's score
                            assert sum(w for _, w in bm25.terms) == pytest.approx(bm25.score, rel=1e-5)
                        if "dense" in hit.stage_scores and e.fusion != "bm25":
                            assert next(s.score for s in e.stages if s.name == "dense") == pytest.approx(
                                hit.stage_scores["dense"], abs=1e-6)
                        checked += 1
    assert checked > 2000


def test_explanations_in_words_and_json(engines, capsys):
    engine = engines[0]
    hit = engine.search(TEST_QUERIES[0], 3, explain=True).hits[0]
    lines = hit.explanation.lines()
    assert lines[-1] == f"score: {hit.explanation.recomposed():.6f}" and any("reranker" in x for x in lines)
    data = json.loads(json.dumps(hit.to_dict()))
    assert data["explanation"]["lines"] == lines and data["explanation"]["score"] == hit.score
    assert main(["search", str(engine.root), TEST_QUERIES[0], "--k", "2", "--explain"]) == 0
    out = capsys.readouterr().out
    assert out.count("| score: ") == 2 and "| first stage" in out


def brute_force_groups(ids: list[str], values: dict[str, object], size: int) -> list[list[str]]:
    groups: dict[str, list[str]] = {}
    order: list[list[str]] = []
    for d in ids:
        v = values[d]
        if v is None:
            order.append([d])
            continue
        key = json.dumps(v)
        if key not in groups:
            groups[key] = []
            order.append(groups[key])
        if len(groups[key]) < size:
            groups[key].append(d)
    return order


@pytest.mark.parametrize("field", ["topic", "source"])
@pytest.mark.parametrize("where", [None, {"topic": {"$in": ["cook", "home", "garden"]}}, {"year": {"$gte": 2003}}])
def test_grouping_equals_brute_force_with_pages(engines, field, where):
    engine = engines[0]
    values = {d.id: d.metadata.get(field) for d in engine.iter_documents()}
    for size in (1, 2):
        for q in TEST_QUERIES[:6]:
            deep = engine.ranked(q, engine.window({}), where=where)
            want = brute_force_groups([str(d) for d in deep.ids], values, size)
            got, token = [], None
            for _ in range(100):
                r = engine.search(q, 4, where=where, group_by=field, group_size=size, page_token=token)
                got.extend(h.id for h in r.hits)
                assert all(h.group == values[h.id] for h in r.hits)
                token = r.next_page
                if token is None:
                    break
            assert got == [d for g in want for d in g], (q, field, where, size)
            assert all(d in engine for d in got)


def test_like_unlike_and_similar(engines):
    engine = engines[1]
    q = TEST_QUERIES[1]
    plain = engine.search(q, 10, rerank=False)
    liked = plain.hits[0].id
    moved = engine.search(q, 10, rerank=False, like=[liked])
    assert liked not in {h.id for h in moved.hits}
    assert liked in {h.id for h in engine.search(q, 10, rerank=False, like=[liked], include_feedback=True).hits}
    away = engine.search(q, 10, rerank=False, unlike=[plain.hits[1].id])
    assert plain.hits[1].id not in {h.id for h in away.hits}
    # the dense query is Rocchio's: an engine searched with that vector ranks as the like search's dense stage
    vec = engine.encoder.encode([q], kind="query")
    want = rocchio(vec, engine.vectors_by_id([liked])[liked][None, :], np.zeros((0, vec.shape[1]), np.float32), 1)
    dense = engine.index.search(want[0], 20)
    got = engine.ranked(q, 10, first_stage="dense", rerank=False, like=[liked])
    assert list(got.ids) == [d for d in dense.ids if d != liked][:10]
    # similar: the document's vector alone, itself left out
    sim = engine.similar(liked, 5, first_stage="dense")
    dense = engine.index.search(engine.vectors_by_id([liked])[liked], 6)
    assert [h.id for h in sim.hits] == [d for d in dense.ids if d != liked][:5]
    assert liked not in {h.id for h in engine.similar(liked, 10).hits}


def test_bm25_expansion_adds_weighted_columns(engines):
    engine = engines[1]
    bm25 = engine.bm25
    extra = {"steak": 0.5, "oven": 0.25, "notaword": 1.0}
    q = "resting cooked meat"
    want = bm25.scores(q) + 0.5 * bm25.scores("steak") + 0.25 * bm25.scores("oven")
    np.testing.assert_allclose(bm25.scores(q, extra), want, rtol=1e-6)
    np.testing.assert_allclose(bm25.term_scores({"steak": 1.0}), bm25.scores("steak"), rtol=0)
    row = int(np.argmax(bm25.scores("steak")))
    assert bm25.term_weights(["steak", "notaword"], row) == [pytest.approx(float(bm25.scores("steak")[row])), 0.0]
    strongest = bm25.strongest_terms([row], 5)  # a document's strongest terms: their BM25 weights in it
    every = bm25.strongest_terms([row], 1000)
    assert len(strongest) == 5 and min(strongest.values()) >= max(w for t, w in every.items() if t not in strongest)
    assert list(strongest.values()) == bm25.term_weights(list(strongest), row)  # exact: the index's own weights
    vocab = sorted({t for t in bm25.analyzer(engine.documents([str(bm25.doc_ids[row])])[0].full_text)})
    assert sorted(every) == vocab  # every term of the document, none else
    terms = expansion([{"a": 2.0, "b": 1.0}, {"a": 1.0, "c": 4.0}], m=2, weight=0.5)
    assert terms == {"c": 0.5, "a": pytest.approx(0.5 * 1.5 / 2.0)}


def reference_strongest(bm25, cover_texts, rows):
    """A document's terms weighed the slow way: each one's weight in its non-overlapping passages' texts analysed as
    one document (the index's document frequencies and average length), and its highest weight over every passage
    row, read term by term."""
    from collections import Counter

    counts = Counter(t for x in cover_texts for t in bm25.analyzer(x))
    p = bm25.postings
    column = {t: c for c, t in enumerate(p.terms)}
    n, length = p.num_docs, sum(counts.values())
    avgdl = float(np.asarray(p.lengths).sum()) / n
    k1, b = bm25.config.k1, bm25.config.b
    weight = {}
    for t, tf in counts.items():
        df = int(p.indptr[column[t] + 1] - p.indptr[column[t]])
        weight[t] = np.log(1 + (n - df + 0.5) / (df + 0.5)) * tf / (tf + k1 * (1 - b + b * length / avgdl))
    exact = {t: max(bm25.term_weights([t], r)[0] for r in rows) for t in weight}
    return weight, exact


def test_a_passage_documents_strongest_terms_agree_with_the_text_analysing_reference(tmp_path):
    sample = list(load_corpus(SAMPLE))  # documents of five sample documents each: several passages apiece
    docs = [Document(f"long-{i}", " ".join(d.text for d in sample[i:i + 5]), sample[i].title)
            for i in range(0, len(sample) - 5, 5)]
    engine = SearchEngine.build(docs, tmp_path / "e", retriever=None, passage_words=24, passage_stride=12)
    bm25, checked = engine.bm25, 0
    ids = [str(i) for i in bm25.doc_ids[:]]
    for doc in engine.documents(sorted({i.rsplit("\x1f", 1)[0] for i in ids})):
        rows = [r for r, i in enumerate(ids) if i.rsplit("\x1f", 1)[0] == doc.id]
        if len(rows) < 3:
            continue
        got = engine.example_features([doc.id], 6)[doc.id][1]
        step = 24 // 12  # passage_words // passage_stride: every other passage, and the last
        cover = rows[::step] if (len(rows) - 1) % step == 0 else rows[::step] + [rows[-1]]
        _, passages, _ = engine.documents_with_passages([doc.id])[0]
        by_id = {d.id: d.full_text for d in passages}
        weight, exact = reference_strongest(bm25, [by_id[ids[r]] for r in cover], rows)
        assert len(got) == min(6, len(weight))
        assert all(got[t] == pytest.approx(exact[t], rel=1e-6) for t in got)  # the exact passage weight
        cut = sorted(weight.values(), reverse=True)[min(12, len(weight)) - 1]
        assert all(weight[t] >= cut - 1e-9 for t in got)  # among the 2 m first by the whole document's weight
        assert list(got.values()) == sorted(got.values(), reverse=True)
        checked += 1
    engine.close()
    assert checked >= 30


def test_rocchio_and_mmr_units():
    q = np.array([[1.0, 0.0, 0.0]], np.float32)
    liked = np.array([[0.0, 1.0, 0.0]], np.float32)
    moved = rocchio(q, liked, np.zeros((0, 3), np.float32), 1)
    assert np.linalg.norm(moved) == pytest.approx(1.0) and moved[0, 1] / moved[0, 0] == pytest.approx(FEEDBACK.like)
    ranked = RankedList(np.array(["a", "a2", "b", "c"], dtype=object), np.array([4.0, 3.9, 2.0, 1.0]))
    vectors = np.array([[1, 0, 0], [1, 0.01, 0], [0, 1, 0], [0, 0, 1]], np.float32)
    assert list(mmr(ranked, vectors, 0.0).ranked.ids) == ["a", "a2", "b", "c"]
    out = mmr(ranked, vectors, 0.5)
    assert list(out.ranked.ids) == ["a", "b", "c", "a2"]  # the near-copy goes last
    assert np.all(np.diff(out.ranked.scores) <= 0) and out.parts["a2"][4] == "a"
    order = grouped(ranked, ["x", None, "x", "y"], 1)
    assert order == [[0], [1], [3]]


def test_bad_steering_is_one_line(engines, capsys, tmp_path):
    engine = engines[1]
    q = TEST_QUERIES[0]
    bad = [({"like": ["no-such-id"]}, "not in the engine"), ({"diversity": 1.5}, r"\[0, 1\]"),
           ({"diversity": -0.1}, r"\[0, 1\]"), ({"group_by": "colour"}, "no document has the metadata field"),
           ({"group_size": 2}, "needs group_by"), ({"like": "cook-01"}, "list of document ids"),
           ({"like": ["cook-01"], "unlike": ["cook-01"]}, "in both"), ({"explain": "yes"}, "true or false")]
    for options, message in bad:
        with pytest.raises(ConfigError, match=message):
            engine.search(q, 5, **options)
    with pytest.raises(ConfigError, match="not in the engine"):
        engine.similar("no-such-id")
    with pytest.raises(ConfigError, match="reranker"):
        engine.similar("cook-01", rerank=True)
    bm25_only = SearchEngine.build(SAMPLE, tmp_path / "bm25", retriever=None)
    with pytest.raises(ConfigError, match="without a retriever"):
        bm25_only.search(q, 5, diversity=0.3)
    assert bm25_only.search(q, 5, like=["cook-01"]).hits  # lexical feedback alone
    gone = bm25_only.delete(["cook-01"])  # (the module's engines stay whole for the other tests)
    with pytest.raises(ConfigError, match="'cook-01' is not in the engine"):
        gone.search(q, 5, like=["cook-01"])
    gone.close()
    for argv in (["--like", "nope"], ["--diversity", "2"], ["--group-by", "colour"]):
        assert main(["search", str(engine.root), q, *argv]) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and "Traceback" not in err
    assert main(["search", str(engine.root), "--similar", "cook-02", "--k", "3", "--json"]) == 0
    hits = json.loads(capsys.readouterr().out)["hits"]
    assert len(hits) == 3 and "cook-02" not in {h["id"] for h in hits}
    assert split_steering({"diversity": True})[0].diversity > 0


def test_http_carries_steering(engines):
    pytest.importorskip("fastapi")
    from fastapi.testclient import TestClient

    from twostage.app.server import create_app

    engine = engines[1]
    client = TestClient(create_app(engine))
    q = TEST_QUERIES[2]
    body = {"query": q, "k": 5, "like": ["cook-01"], "diversity": 0.2, "explain": True, "group_by": "topic"}
    got = client.post("/search", json=body).json()
    want = engine.search(q, 5, like=["cook-01"], diversity=0.2, explain=True, group_by="topic")
    assert [h["id"] for h in got["hits"]] == [h.id for h in want.hits]
    assert [h["group"] for h in got["hits"]] == [h.group for h in want.hits]
    assert all(abs(h["explanation"]["score"] - h["score"]) < 1e-9 for h in got["hits"])
    diverse = client.post("/search", json={"query": q, "k": 5, "diversity": True}).json()
    assert [h["id"] for h in diverse["hits"]] == [h.id for h in engine.search(q, 5, diversity=True).hits]
    sim = client.post("/similar", json={"id": "cook-01", "k": 3}).json()
    assert [h["id"] for h in sim["hits"]] == [h.id for h in engine.similar("cook-01", 3).hits]
    for body, status in (({"query": q, "like": ["nope"]}, 400), ({"query": q, "diversity": 2}, 422),
                         ({"query": q, "group_by": "colour"}, 400), ({"id": "nope"}, 400),
                         ({"query": q, "like": ["x"] * 101}, 422)):
        r = client.post("/similar" if "id" in body else "/search", json=body)
        assert r.status_code == status, (body, r.json())
        assert "\n" not in r.json()["error"]


def test_diverse_pages_are_one_list(engines):
    engine = engines[0]
    q = TEST_QUERIES[3]
    deep = engine.search(q, 30, diversity=0.4)
    first = engine.search(q, 10, diversity=0.4)
    second = engine.search(q, 10, diversity=0.4, page_token=first.next_page)
    assert [h.id for h in first.hits + second.hits] == [h.id for h in deep.hits[:20]]
    scores = [h.score for h in deep.hits]
    assert scores == sorted(scores, reverse=True)


def test_a_sharded_engine_steers_as_one_engine(engines, models, tmp_path):
    from twostage.engine.sharded import ShardedEngine

    retriever, reranker = models
    single = engines[1]
    docs = with_fields(list(load_corpus(SAMPLE)))
    sharded = ShardedEngine.build(docs, tmp_path / "two", shards=2, retriever=retriever, reranker=reranker,
                                  backend="flat")
    try:
        for options in ({"like": ["cook-01", "home-02"], "unlike": ["music-03"]}, {"diversity": 0.3},
                        {"group_by": "source", "group_size": 2}, {"first_stage": "bm25", "like": ["garden-04"]}):
            for q in TEST_QUERIES[:8]:
                a = sharded.search(q, 8, explain=True, **options)
                b = single.search(q, 8, explain=True, **options)
                assert [h.id for h in a.hits] == [h.id for h in b.hits], (options, q)
                np.testing.assert_allclose([h.score for h in a.hits], [h.score for h in b.hits], atol=1e-5)
                assert all(abs(h.explanation.recomposed() - h.score) <= 1e-6 for h in a.hits)
        assert [h.id for h in sharded.similar("cook-03", 5).hits] == [h.id for h in single.similar("cook-03", 5).hits]
    finally:
        sharded.close()
