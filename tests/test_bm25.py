import json
from pathlib import Path

import numpy as np
import pytest

from twostage.indexer.beir import BeirDataset
from twostage.indexer.errors import ConfigError, DataError, IndexFormatError
from twostage.indexer.records import Document
from twostage.retriever.analyzer import Analyzer, AnalyzerConfig
from twostage.retriever.bm25 import BM25Config, BM25Retriever
from twostage.retriever.bm25_stats import CorpusStats


@pytest.fixture(scope="module")
def sample():
    from pathlib import Path

    ds = BeirDataset(Path(__file__).resolve().parent.parent / "data" / "sample")
    queries = [q.text for split in ("train", "test") for q in ds.split(split).queries]
    return ds.corpus, queries


@pytest.fixture(scope="module")
def bm25(sample):
    return BM25Retriever.build(sample[0])


def test_analyzer_lowercases_drops_stopwords_and_stems():
    a = Analyzer()
    assert a("The Cats were RUNNING to the gardens") == ["cat", "were", "run", "garden"]
    assert Analyzer(AnalyzerConfig(stemmer=None, stopwords=None))("The cats") == ["the", "cats"]
    assert Analyzer(AnalyzerConfig(stopwords=("cats",)))("the cats purr") == ["the", "purr"]


@pytest.mark.parametrize("config", [AnalyzerConfig(stemmer="klingon"), AnalyzerConfig(stopwords="fr"),
                                    AnalyzerConfig(token_pattern="(")])
def test_analyzer_config_errors(config):
    with pytest.raises(ConfigError):
        Analyzer(config)


def test_both_engines_rank_the_sample_the_same_way(sample, bm25):
    reference = BM25Retriever.build(sample[0], BM25Config(engine="rank-bm25"))
    for query in sample[1]:
        ours, ref = bm25.search(query, 20), reference.search(query, 20)
        assert list(ours.ids) == list(ref.ids), query
        np.testing.assert_allclose(ours.scores, ref.scores, rtol=1e-5)
    assert len(sample[1]) >= 40


def test_search_returns_best_first_and_matching_only(bm25):
    result = bm25.search("why do cats purr", k=5)
    assert result.ids[0] == "animals-01"
    assert np.all(np.diff(result.scores) <= 0) and np.all(result.scores > 0)
    assert len(bm25.search("the of and", k=5)) == 0  # only stopwords: nothing matches
    assert len(bm25.search("purr", k=1000)) < len(bm25)


def test_ties_break_by_corpus_order():
    docs = [Document(f"d{i}", "same words here") for i in range(5)] + [Document("x", "other")]
    r = BM25Retriever.build(docs).search("words", k=3)
    assert list(r.ids) == ["d0", "d1", "d2"]


@pytest.mark.parametrize("query,k", [("", 5), ("   ", 5), ("cats", 0), ("cats", -1)])
def test_bad_query_or_k(bm25, query, k):
    with pytest.raises(ConfigError):
        bm25.search(query, k)


def test_non_string_query(bm25):
    with pytest.raises(ConfigError, match="must be a string"):
        bm25.search(None, 5)  # type: ignore[arg-type]


def test_empty_corpus_and_corpus_without_terms():
    with pytest.raises(DataError, match="empty corpus"):
        BM25Retriever.build([])
    with pytest.raises(DataError, match="has a single term"):
        BM25Retriever.build([Document("a", "the"), Document("b", "")])


def test_unknown_engine_and_bad_parameters():
    with pytest.raises(ConfigError, match="unknown BM25 engine"):
        BM25Config(engine="lucene")
    with pytest.raises(ConfigError):
        BM25Config(b=2.0)


def test_save_load_round_trip(tmp_path, sample, bm25):
    bm25.save(tmp_path / "idx")
    loaded = BM25Retriever.load(tmp_path / "idx")
    assert loaded.config == bm25.config
    for query in sample[1][:20]:
        a, b = bm25.search(query, 10), loaded.search(query, 10)
        assert list(a.ids) == list(b.ids)
        np.testing.assert_array_equal(a.scores, b.scores)
    assert not list(tmp_path.glob(".idx*")), "no temporary directory left behind"


def test_save_replaces_atomically_and_leaves_no_pickle(tmp_path, bm25):
    bm25.save(tmp_path / "idx")
    bm25.save(tmp_path / "idx")
    names = sorted(p.name for p in (tmp_path / "idx").iterdir())
    assert names == ["doc_ids.json", "manifest.json", "vocab.json", "weights.data.npy", "weights.indices.npy",
                     "weights.indptr.npy"]
    for npy in (tmp_path / "idx").glob("*.npy"):
        np.load(npy, allow_pickle=False)


def test_rank_bm25_engine_cannot_be_saved(tmp_path):
    r = BM25Retriever.build([Document("a", "text here")], BM25Config(engine="rank-bm25"))
    with pytest.raises(ConfigError, match="only the bm25s engine"):
        r.save(tmp_path / "x")
    assert not (tmp_path / "x").exists()


@pytest.mark.parametrize("name", ["doc_ids.json", "vocab.json", "weights.data.npy", "weights.indptr.npy"])
def test_corrupted_or_missing_files_are_named(tmp_path, bm25, name):
    root = tmp_path / "idx"
    bm25.save(root)
    data = bytearray((root / name).read_bytes())
    data[len(data) // 2] ^= 0xFF
    (root / name).write_bytes(bytes(data))
    with pytest.raises(IndexFormatError, match=f"{name}: checksum mismatch"):
        BM25Retriever.load(root)
    (root / name).unlink()
    with pytest.raises(IndexFormatError, match=f"{name}: missing"):
        BM25Retriever.load(root)


def test_newer_format_and_bad_manifest(tmp_path, bm25):
    root = tmp_path / "idx"
    bm25.save(root)
    manifest = json.loads((root / "manifest.json").read_text())
    (root / "manifest.json").write_text(json.dumps({**manifest, "format_version": 99}))
    with pytest.raises(IndexFormatError, match="newer than this library"):
        BM25Retriever.load(root)
    (root / "manifest.json").write_text("{not json")
    with pytest.raises(IndexFormatError, match="unreadable manifest"):
        BM25Retriever.load(root)
    with pytest.raises(IndexFormatError, match="no such BM25 index"):
        BM25Retriever.load(tmp_path / "nope")


def test_bm25_manifest_lists_sizes_and_old_manifests_still_load(tmp_path):
    bm25 = BM25Retriever.build([Document("a", "rain and snow"), Document("b", "cats and dogs"),
                                Document("c", "snow in winter")])
    bm25.save(tmp_path / "idx")
    path = tmp_path / "idx" / "manifest.json"
    manifest = json.loads(path.read_text())
    assert manifest["format_version"] == 2
    assert all(set(meta) == {"sha256", "bytes"} for meta in manifest["files"].values())
    # a version-1 manifest (sha256 only) still loads, and its checksums are still checked
    manifest["format_version"] = 1
    manifest["files"] = {name: meta["sha256"] for name, meta in manifest["files"].items()}
    path.write_text(json.dumps(manifest))
    assert BM25Retriever.load(tmp_path / "idx").search("snow", 3).ids.tolist() == bm25.search("snow", 3).ids.tolist()
    with open(tmp_path / "idx" / "vocab.json", "a") as f:
        f.write(" ")
    with pytest.raises(IndexFormatError, match="checksum mismatch"):
        BM25Retriever.load(tmp_path / "idx")
    # version 2: a truncated file is caught by its size before any checksum
    bm25.save(tmp_path / "idx2")
    weights = tmp_path / "idx2" / "weights.data.npy"
    weights.write_bytes(weights.read_bytes()[:-4])
    with pytest.raises(IndexFormatError, match="bytes, the manifest says"):
        BM25Retriever.load(tmp_path / "idx2")


def test_chunked_build_scores_equal_the_in_memory_build_bit_for_bit():
    from twostage.indexer.corpus import load_corpus
    from twostage.retriever.bm25 import BM25Retriever

    sample = Path(__file__).parent.parent / "data" / "sample"
    docs = list(load_corpus(sample))
    whole = BM25Retriever.build(docs)
    passes = []

    def chunks():
        passes.append(1)
        return (docs[i:i + 37] for i in range(0, len(docs), 37))

    chunked = BM25Retriever.build_chunked(chunks)
    assert len(passes) == 2 and list(chunked.doc_ids) == list(whole.doc_ids)
    for q in ["why do cats purr", "snow and rain", "bread dough yeast", "steak"]:
        np.testing.assert_array_equal(chunked.scores(q), whole.scores(q))
    # with the statistics given (a shard's global ones), one pass
    one = BM25Retriever.build_chunked(chunks, stats=CorpusStats.of(Analyzer(AnalyzerConfig())(d.full_text)
                                                                       for d in docs))
    assert len(passes) == 3 and np.array_equal(one.scores("snow and rain"), whole.scores("snow and rain"))


def test_chunked_weights_are_scipys_csc_arrays():
    """The CSC arrays placed chunk by chunk equal scipy's csc_matrix of the same postings, dtypes included."""
    import random

    import scipy.sparse as sp

    from twostage.retriever.bm25_stats import _chunk_weights, weight_arrays_chunked

    rng = random.Random(0)
    docs = [[f"w{rng.randint(0, 300)}" for _ in range(rng.randint(0, 30))] for _ in range(2000)]
    stats = CorpusStats.of(docs)
    chunks = [docs[i:i + 137] for i in range(0, len(docs), 137)] + [[]]
    vocab, data, indices, indptr = weight_arrays_chunked(chunks, stats, 1.2, 0.6)
    seen: dict[str, int] = {}
    idf: list[float] = []
    parts, n = [], 0
    for c in chunks:
        parts.append(_chunk_weights(c, stats, 1.2, 0.6, seen, idf, n))
        n += len(c)
    rows, cols, weights = (np.concatenate([p[i] for p in parts]) for i in range(3))
    want = sp.csc_matrix((weights, (rows, cols)), shape=(n, len(seen)), dtype=np.float32)
    for got, ref in ((data, want.data), (indices, want.indices), (indptr, want.indptr)):
        assert got.dtype == ref.dtype and np.array_equal(got, ref)
    assert vocab == {**seen, "": len(seen)}
