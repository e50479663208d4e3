"""The filter language, filtered search (k hits when k match), pages and per-request knobs."""

from __future__ import annotations

import json
import random
from pathlib import Path

import numpy as np
import pytest

from tests.harness import filters as BENCH
from twostage import Document, SearchEngine
from twostage.app.cli import main
from twostage.engine.sharded import ShardedEngine
from twostage.indexer.errors import ConfigError, FilterError, PageExpiredError
from twostage.indexer.filters import MetadataTable, kind_of, merge_kinds, parse_filter

ROOT = Path(__file__).resolve().parent.parent
WORDS = ("cat", "dog", "rain", "snow", "cook", "garden", "music", "history", "money", "star", "water", "sleep",
         "river", "stone", "light", "paper")


ROWS = [{"year": 2020, "d": "2020-01-05", "tags": ["a", "b"], "s": "x", "ok": True},
        {"year": 2019.5, "d": "2021-01-01T00:00:00Z", "tags": [], "s": "y", "ok": False},
        {},
        {"m": 1, "d": "2020-01-05T01:00:00+02:00"},
        {"m": "a", "year": None}]


def mask(f) -> list[int]:
    return MetadataTable(ROWS).mask(parse_filter(f)).astype(int).tolist()


@pytest.mark.parametrize(("f", "want"), [
    ({"year": 2020}, [1, 0, 0, 0, 0]),
    ({"year": {"$gte": 2019, "$lt": 2020}}, [0, 1, 0, 0, 0]),
    ({"year": {"$in": [2020, 1]}}, [1, 0, 0, 0, 0]),
    ({"year": {"$nin": [2020]}}, [0, 1, 1, 1, 1]),  # $nin keeps documents without the field
    ({"year": None}, [0, 0, 1, 1, 1]),  # null: absent (or null)
    ({"tags": "a"}, [1, 0, 0, 0, 0]),  # a list field: holds the value
    ({"tags": {"$in": ["b", "z"]}}, [1, 0, 0, 0, 0]),
    ({"tags": {"$ne": "a"}}, [0, 1, 1, 1, 1]),
    ({"s": {"$ne": "x"}}, [0, 1, 1, 1, 1]),
    ({"s": {"$in": ["x", None]}}, [1, 0, 1, 1, 1]),
    ({"ok": False}, [0, 1, 0, 0, 0]),
    ({"d": {"$gt": "2020-06-01"}}, [0, 1, 0, 0, 0]),
    ({"d": "2020-01-05"}, [1, 0, 0, 0, 0]),
    ({"d": {"$lt": "2020-01-05T00:30:00+01:00"}}, [0, 0, 0, 1, 0]),  # 23:00Z < 23:30Z: offsets are honoured
    ({"m": {"$exists": True}}, [0, 0, 0, 1, 1]),
    ({"$or": [{"year": 2020}, {"$not": {"s": {"$exists": True}}}]}, [1, 0, 1, 1, 1]),
    ({"$and": [{"year": {"$gt": 2000}}, {"s": "y"}]}, [0, 1, 0, 0, 0]),
    ({"year": {"$gt": 2000}, "s": "x"}, [1, 0, 0, 0, 0]),  # several keys: all hold
    ('{"s": "y"}', [0, 1, 0, 0, 0]),  # JSON text
    ({}, [1, 1, 1, 1, 1]),
])
def test_each_operator(f, want):
    assert mask(f) == want


@pytest.mark.parametrize(("f", "words"), [
    ({"d": {"$gt": 5}}, "'d' holds dates; compare it with an ISO date like \"2020-01-31\", not a number"),
    ({"year": {"$lt": "2020-01-01"}}, "where.year.$lt: 'year' holds numbers; got the string '2020-01-01'"),
    ({"nope": 1}, "no document has the field 'nope' (operator $eq); metadata fields: d, m, s, tags, ok, year"),
    ({"m": 1}, "where.m: $eq does not apply to a mixed field"),
    ({"year": {"$foo": 1}}, "where.year: unknown operator '$foo'"),
    ({"tags": {"$gt": "a"}}, "$gt does not apply to a list[string] field"),
    ({"ok": {"$lt": True}}, "compares numbers or ISO dates"),
    ({"year": [1, 2]}, "to match any of several values use $in"),
    ({"year": {"$in": 2020}}, "where.year.$in: takes a list"),
    ({"year": {"$exists": 1}}, "takes true or false"),
    ({"$or": []}, "where.$or: takes a non-empty list"),
    ({"$nor": [{"year": 1}]}, "unknown operator '$nor'"),
    ({"$not": [1]}, "where.$not: a filter is a JSON object"),
    ("{bad", "where: not JSON"),
    ({"d": {"$gt": "2020-13-45"}}, "is not a valid date"),
    ({"year": float("nan")}, "not a finite number"),
])
def test_bad_filters_name_the_field_and_operator(f, words):
    with pytest.raises(FilterError) as err:
        mask(f)
    assert words.split(" (operator")[0] in str(err.value)
    assert isinstance(err.value, ConfigError) and "\n" not in str(err.value)


def test_field_types():
    assert kind_of([1, 2.5, None]) == "number" and kind_of(["a", "b"]) == "string"
    assert kind_of(["2020-01-01", "2021-02-03T04:05:06Z"]) == "date" and kind_of(["2020-01-01", "soon"]) == "string"
    assert kind_of([["a"], []]) == "list[string]" and kind_of([[1, 2]]) == "list[number]"
    assert kind_of([1, "a"]) == "mixed" and kind_of([[1, "a"]]) == "mixed" and kind_of([{"a": 1}]) == "mixed"
    assert kind_of([True, None]) == "bool"
    assert merge_kinds([{"a": "number"}, {"a": "number", "b": "string"}, {"b": "date"}]) == \
        {"a": "number", "b": "mixed"}


# ---- filtered search ---------------------------------------------------------------------------------
def corpus(n: int, seed: int = 0) -> list[Document]:
    rng = random.Random(seed)
    return [Document(f"d{i:04d}", " ".join(rng.choice(WORDS) for _ in range(rng.randrange(4, 12))),
                     metadata=BENCH.metadata(rng)) for i in range(n)]


@pytest.fixture(scope="module")
def filtered(tmp_path_factory, models):
    retriever, reranker = models
    root = tmp_path_factory.mktemp("filtered")
    docs = corpus(600)
    flat = SearchEngine.build(docs, root / "flat", retriever=retriever, reranker=reranker, backend="flat")
    hnsw = SearchEngine.build(docs, root / "hnsw", retriever=retriever, reranker=reranker, backend="hnswlib")
    yield docs, flat, hnsw, root
    flat.close()
    hnsw.close()


def test_random_filters_equal_a_brute_force_in_pandas(filtered):
    docs, flat, _, _ = filtered
    queries = [" ".join(random.Random(i).sample(WORDS, 2)) for i in range(20)]
    result = BENCH.check_filters(flat, docs, queries, 60, seed=3)
    assert result["agree"] == {"bm25": 60, "dense": 60, "hybrid": 60}, result["first_bad"]
    assert all(result["ops"][op] > 0 for op in ("$ne", "$in", "$nin", "$gt", "$lte", "$exists", "$or", "$not"))


def test_the_brute_force_would_catch_a_wrong_filter(filtered):
    docs, flat, _, _ = filtered
    df = BENCH.frame(docs)
    keep = BENCH.pandas_mask({"year": {"$gt": 2010}}, df)
    lists = BENCH.brute_lists(flat, "cat dog", keep, 100)
    wrong = [str(i) for i in flat.ranked("cat dog", 10, where={"year": {"$gte": 2010}}, first_stage="dense",
                                         rerank=False).ids]
    right = [str(i) for i in flat.ranked("cat dog", 10, where={"year": {"$gt": 2010}}, first_stage="dense",
                                         rerank=False).ids]
    assert right == lists["dense"][:10]
    assert set(wrong) != set(right) or BENCH.pandas_mask({"year": 2010}, df).sum() == 0


def test_a_rare_filter_still_returns_k_hits_on_the_graph(filtered, monkeypatch):
    docs, flat, hnsw, _ = filtered
    import twostage.indexer.index as index_module

    monkeypatch.setattr(index_module, "EXACT_BELOW", 0)  # the graph, not the exact fallback
    for cut in (3, 30, 300):
        where = {"sel": {"$lt": cut}}
        matches = sum(d.metadata["sel"] < cut for d in docs)
        for stage in ("dense", "hybrid"):
            got = hnsw.search("cat rain", 10, where=where, first_stage=stage)
            assert len(got.hits) == min(10, matches)
            assert all(h.metadata["sel"] < cut for h in got.hits)
        exact = set(flat.ranked("cat rain", 10, where=where, first_stage="dense", rerank=False).ids)
        approx = set(hnsw.ranked("cat rain", 10, where=where, first_stage="dense", rerank=False).ids)
        assert len(exact & approx) >= 0.9 * len(exact)


def test_a_function_still_filters(filtered):
    _, flat, _, _ = filtered
    got = flat.search("cat", 5, where=lambda d: d.metadata.get("source") == "arxiv")
    assert got.hits and all(h.metadata.get("source") == "arxiv" for h in got.hits) and got.next_page is None


# ---- pages ----------------------------------------------------------------------------------------------
def test_pages_equal_one_call(filtered):
    _, flat, _, _ = filtered
    for stage in ("hybrid", "dense", "bm25"):
        want = flat.search("cat garden", 50, first_stage=stage).ids
        by_offset = [i for p in range(5) for i in flat.search("cat garden", 10, offset=10 * p, first_stage=stage).ids]
        got, token, ranks = [], None, []
        for _ in range(5):
            r = flat.search("cat garden", 10, page_token=token, first_stage=stage)
            got += r.ids
            ranks += [h.rank for h in r.hits]
            token = r.next_page
        assert got == want == by_offset and ranks == list(range(1, 51))
    where = {"year": {"$gte": 2000}}
    want = flat.search("rain", 30, where=where).ids
    assert [i for p in range(3) for i in flat.search("rain", 10, where=where, offset=10 * p).ids] == want


def test_page_errors(filtered):
    _, flat, _, _ = filtered
    first = flat.search("cat", 10)
    with pytest.raises(ConfigError, match="another query"):
        flat.search("dog", 10, page_token=first.next_page)
    with pytest.raises(ConfigError, match="another query"):
        flat.search("cat", 10, page_token=first.next_page, first_stage="bm25")
    with pytest.raises(ConfigError, match="not a token this engine gave"):
        flat.search("cat", 10, page_token="eyJhIjogMX0")
    with pytest.raises(ConfigError, match="offset or page_token"):
        flat.search("cat", 10, offset=10, page_token=first.next_page)
    with pytest.raises(ConfigError, match="offset 100 is past the 100 hits"):
        flat.search("cat", 10, offset=100)
    assert len(flat.search("cat", 20, offset=90).hits) == 10  # the last page stops at the window
    assert flat.search("cat", 10, offset=90).next_page is None
    assert flat.search("cat", 10, offset=80, first_stage_depth=200).next_page is not None


def test_a_page_token_pins_its_version(tmp_path, models):
    retriever, reranker = models
    docs = corpus(120, seed=5)
    v1 = SearchEngine.build(docs, tmp_path / "e", retriever=retriever, backend="flat")
    first = v1.search("cat", 10, first_stage="bm25")
    want = v1.search("cat", 20, first_stage="bm25").ids[10:]
    v2 = v1.add([Document("new-cat", "cat cat cat cat cat")])
    assert v2.search("cat", 1, first_stage="bm25").ids == ["new-cat"]
    page = v2.search("cat", 10, first_stage="bm25", page_token=first.next_page)
    assert page.ids == want and "new-cat" not in page.ids  # still the version the first page came from
    v1.close()
    v3 = v2.add([Document("newer", "dog")])  # v1 is no longer leased: this commit removes it
    with pytest.raises(PageExpiredError, match="no longer on disk"):
        v3.search("cat", 10, first_stage="bm25", page_token=first.next_page)
    v2.close()
    v3.close()


def test_knobs_per_request(filtered):
    _, flat, _, _ = filtered
    base = flat.ranked("cat music", 10, rerank=False)
    dense_only = flat.ranked("cat music", 10, rerank=False, fusion="wsum", dense_weight=1.0)
    assert list(dense_only.ids) == list(flat.ranked("cat music", 10, rerank=False, first_stage="dense").ids)
    assert list(flat.ranked("cat music", 10, rerank=False, k_rrf=60.0).ids) == list(base.ids)
    for knob, value, words in (("dense_weight", 3, "dense_weight must be"), ("k_rrf", -1, "k_rrf must be"),
                               ("fusion", "max", "fusion must be"), ("rerank_depth", 0, "positive integer"),
                               ("rerank", "yes", "rerank must be"), ("colour", 1, "unknown search option")):
        with pytest.raises(ConfigError, match=words):
            flat.search("cat", 5, **{knob: value})


def test_cli_filters_pages_and_knobs(filtered, capsys):
    _, _, _, root = filtered
    eng = str(root / "flat")
    assert main(["search", eng, "cat garden", "--k", "50", "--json", "--fast"]) == 0
    want = [h["id"] for h in json.loads(capsys.readouterr().out)["hits"]]
    got, token = [], None
    for _ in range(5):
        assert main(["search", eng, "cat garden", "--k", "10", "--json", "--fast",
                     *(["--page-token", token] if token else [])]) == 0
        obj = json.loads(capsys.readouterr().out)
        got += [h["id"] for h in obj["hits"]]
        token = obj["next_page"]
    assert got == want
    assert main(["search", eng, "cat", "--json", "--fast", "--where", "year>=2010", "--where",
                 '{"tags": {"$in": ["t1", "t2"]}}', "--where", "source!=arxiv", "--no-rerank"]) == 0
    hits = json.loads(capsys.readouterr().out)["hits"]
    assert hits and all(h["metadata"]["year"] >= 2010 and set(h["metadata"].get("tags", [])) & {"t1", "t2"}
                        and h["metadata"].get("source") != "arxiv" for h in hits)
    assert main(["search", eng, "cat", "--fast", "--where", "published<2005-01-01", "--k", "3"]) == 0
    assert "next page: --page-token" in capsys.readouterr().out
    for bad, words in ((["--where", "published>5"], "'published' holds dates"),
                       (["--where", "{oops"], "not JSON"),
                       (["--page-token", "x", "--offset", "3"], "--page-token continues one query"),
                       (["--k-rrf", "-2"], "k_rrf must be")):
        assert main(["search", eng, "cat", "--fast", *bad]) == 2
        err = capsys.readouterr().err
        assert words in err and err.count("\n") == 1


def test_http_filters_and_pages(filtered):
    pytest.importorskip("fastapi")
    from fastapi.testclient import TestClient

    from twostage.app.server import create_app

    _, _, _, root = filtered
    with TestClient(create_app(root / "flat", verify=False), raise_server_exceptions=False) as client:
        want = [h["id"] for h in client.post("/search", json={"query": "cat garden", "k": 50}).json()["hits"]]
        got, token = [], None
        for _ in range(5):
            obj = client.post("/search", json={"query": "cat garden", "k": 10,
                                               **({"page_token": token} if token else {})}).json()
            got += [h["id"] for h in obj["hits"]]
            token = obj["next_page"]
        assert got == want
        r = client.post("/search", json={"query": "cat", "where": {"sel": {"$lt": 100}, "published": {"$gte":
                                         "2010-01-01"}}, "rerank": False, "fusion": "wsum", "dense_weight": 0.3})
        assert r.status_code == 200 and all(h["metadata"]["sel"] < 100 for h in r.json()["hits"])
        r = client.post("/search", json={"query": "cat", "where": {"year": {"$gt": "2010"}}})
        assert r.status_code == 400 and "where.year.$gt: 'year' holds numbers" in r.json()["error"]
        r = client.post("/search/batch", json={"queries": ["cat", "dog"], "k": 5, "offset": 5})
        assert r.status_code == 200 and [h["rank"] for h in r.json()["results"][0]["hits"]] == [6, 7, 8, 9, 10]


def test_sharded_engines_filter_the_same_way(tmp_path, models):
    retriever, reranker = models
    docs = corpus(200, seed=7)
    for i, d in enumerate(docs[:5]):  # a field only a few documents (so only some shards) have
        docs[i] = Document(d.id, d.text, d.title, {**d.metadata, "rare": i})
    single = SearchEngine.build(docs, tmp_path / "one", retriever=retriever, backend="flat")
    sharded = ShardedEngine.build(docs, tmp_path / "four", shards=4, retriever=retriever, backend="flat")
    kinds = sharded.metadata_kinds()
    assert kinds["rare"] == "number" and kinds == single.metadata_kinds()
    for where in ({"rare": {"$gte": 1}}, {"rare": {"$exists": False}, "year": {"$lt": 2000}},
                  {"$or": [{"tags": "t3"}, {"published": {"$lt": "2004-01-01"}}]}):
        for stage in ("bm25", "dense", "hybrid"):
            a = sharded.ranked("cat dog", 10, where=where, first_stage=stage, rerank=False)
            b = single.ranked("cat dog", 10, where=where, first_stage=stage, rerank=False)
            assert list(a.ids) == list(b.ids)
            np.testing.assert_allclose(a.scores, b.scores, atol=1e-5)
    with pytest.raises(FilterError, match="'rare' holds numbers"):
        sharded.search("cat", 5, where={"rare": "x"})
    single.close()
    sharded.close()
