import json

import numpy as np
import pytest

from tests.test_index import KeywordEncoder
from twostage.indexer.build import build_index
from twostage.indexer.errors import ConfigError, IndexFormatError
from twostage.indexer.index import Index
from twostage.indexer.records import RankedList
from twostage.indexer.shards import ShardedIndex, build_shards, merge_topk, split_contiguous


def rl(ids, scores):
    return RankedList(np.array(ids, dtype=object), np.array(scores, dtype=np.float32))


def test_merge_topk_by_hand():
    a, b, c = rl(["a1", "a2", "a3"], [0.9, 0.5, 0.1]), rl(["b1", "b2"], [0.7, 0.5]), rl([], [])
    merged = merge_topk([a, b, c], 4)
    assert list(merged.ids) == ["a1", "b1", "a2", "b2"]  # 0.5 tie: the earlier shard first
    np.testing.assert_allclose(merged.scores, [0.9, 0.7, 0.5, 0.5])
    assert list(merge_topk([b, a], 3).ids) == ["a1", "b1", "b2"]
    assert list(merge_topk([a, b], 99).ids) == ["a1", "b1", "a2", "b2", "a3"]  # fewer than k: all of them
    assert len(merge_topk([c, c], 5)) == 0
    with pytest.raises(ConfigError):
        merge_topk([a], 0)


def test_split_contiguous(corpus):
    parts = split_contiguous(list(corpus), 3)
    assert [d.id for p in parts for d in p] == corpus.ids and max(map(len, parts)) - min(map(len, parts)) <= 1
    with pytest.raises(ConfigError, match="at most one shard per document"):
        split_contiguous(list(corpus)[:2], 3)


@pytest.fixture(scope="module")
def corpus():
    from pathlib import Path

    from twostage.indexer.corpus import load_corpus

    return load_corpus(Path(__file__).resolve().parent.parent / "data" / "sample")


@pytest.fixture(scope="module")
def single_and_shards(tmp_path_factory, corpus):
    root = tmp_path_factory.mktemp("shards")
    single = build_index(corpus, KeywordEncoder(), root / "single", backend="flat")
    build_shards(corpus, KeywordEncoder(), root / "sharded", 4, backend="flat")
    return single, root / "sharded"


QUERIES = ["cat", "rain and snow", "cook garden music", "history of money", "stars in the water", "sleep"]


def test_local_shards_equal_one_exact_index(single_and_shards, corpus):
    single, path = single_and_shards
    sharded = ShardedIndex.open(path, KeywordEncoder())
    assert len(sharded) == len(corpus)
    single.attach_encoder(KeywordEncoder())
    for k in (1, 10, 60, len(corpus)):  # 60 is more than one shard holds; the keyword encoder makes many ties
        for q in QUERIES:
            want, got = single.search(q, k), sharded.search(q, k)
            assert list(got.ids) == list(want.ids), (q, k)
            np.testing.assert_array_equal(got.scores, want.scores)
    assert len(sharded.search("cat", len(corpus) + 1)) == len(corpus)  # one k rule: fewer, never an error
    doc = sharded.documents(["cook-01"])[0]
    assert doc == single.documents(["cook-01"])[0] and sharded.text("cook-01") == doc.full_text


def test_shard_manifest_errors(tmp_path, single_and_shards):
    with pytest.raises(FileNotFoundError, match="shards.json"):
        ShardedIndex.open(tmp_path, KeywordEncoder())
    header = {"format": "twostage.shards", "format_version": 1, "files": {}, "versions": {}}
    (tmp_path / "shards.json").write_text(json.dumps({**header, "shards": ["shard-000"]}))
    with pytest.raises(IndexFormatError, match="shard-000"):
        ShardedIndex.open(tmp_path, KeywordEncoder())
    (tmp_path / "shards.json").write_text(json.dumps({"shards": ["shard-000"]}))
    with pytest.raises(IndexFormatError, match="not the manifest of a shards directory"):
        ShardedIndex.open(tmp_path, KeywordEncoder())
    (tmp_path / "shards.json").write_text(json.dumps({**header, "format_version": 9, "shards": ["shard-000"]}))
    with pytest.raises(IndexFormatError, match="newer than this library reads"):
        ShardedIndex.open(tmp_path, KeywordEncoder())
    (tmp_path / "shards.json").write_text(json.dumps({**header, "shards": ["../elsewhere"]}))
    with pytest.raises(IndexFormatError, match="elsewhere"):
        ShardedIndex.open(tmp_path, KeywordEncoder())
    (tmp_path / "shards.json").write_text("{not json")
    with pytest.raises(IndexFormatError, match="not a shards manifest"):
        ShardedIndex.open(tmp_path, KeywordEncoder())
    _, path = single_and_shards
    assert isinstance(Index.load(path / "shard-001"), Index)  # each shard is a normal index directory
    manifest = json.loads((path / "shards.json").read_text())  # the common manifest shape
    assert manifest["format"] == "twostage.shards" and manifest["files"] == {} and "numpy" in manifest["versions"]
    legacy = tmp_path / "legacy"  # written before the common header: still opens
    legacy.mkdir()
    (legacy / "shards.json").write_text(json.dumps({"format": "twostage-shards/1", "shards": ["a"]}))
    (legacy / "a").symlink_to(path / "shard-000", target_is_directory=True)
    assert len(ShardedIndex.open(legacy, KeywordEncoder())) == len(Index.load(path / "shard-000"))


def test_pipeline_over_a_sharded_first_stage(single_and_shards):
    from twostage.reranker.pipeline import Pipeline

    class WordCount:  # a stand-in reranker: how often the query's first word occurs
        def score(self, query, documents, **kw):
            return np.array([d.lower().count(query.split()[0]) for d in documents], dtype=np.float32)

    _, path = single_and_shards
    sharded = ShardedIndex.open(path, KeywordEncoder())
    pipe = Pipeline(sharded, reranker=WordCount(), texts=sharded.text, k_retrieve=20, k=5)
    result = pipe.search("rain storms")
    first = sharded.search("rain storms", 20)
    assert {h.doc_id for h in result.hits} <= set(first.ids) and len(result.hits) == 5
    counts = [h.text.lower().count("rain") for h in result.hits]
    assert counts == sorted(counts, reverse=True) and counts[0] == max(
        sharded.text(d).lower().count("rain") for d in first.ids)
