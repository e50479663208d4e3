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
    for rows in ([0], [3, 7, 11]):  # a document's strongest terms (relevance feedback): the same from both engines
        ours, ref = bm25.strongest_terms(rows, 8), reference.strongest_terms(rows, 8)
        assert list(ours) == list(ref) and len(ours) == 8
        np.testing.assert_allclose(list(ours.values()), list(ref.values()), rtol=1e-5)


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
    assert names == ["doc_ids.json", "doc_languages.npy", "doc_lengths.npy", "manifest.json", "postings.counts.npy",
                     "vocab.json",
                     "weights.data.npy", "weights.indices.npy", "weights.indptr.npy"]
    for npy in (tmp_path / "idx").glob("*.npy"):
        np.load(npy, allow_pickle=False)


def test_rank_bm25_engine_cannot_be_saved(tmp_path):
    r = BM25Retriever.build([Document("a", "text here")], BM25Config(engine="rank-bm25"))
    with pytest.raises(ConfigError, match="only the bm25s engine"):
        r.save(tmp_path / "x")
    assert not (tmp_path / "x").exists()


@pytest.mark.parametrize("name", ["doc_ids.json", "vocab.json", "weights.data.npy", "weights.indptr.npy",
                                  "postings.counts.npy", "doc_lengths.npy"])
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
    assert manifest["format_version"] == 4
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


def bm25s_reference(docs, config=None):
    """bm25s's own index of the documents (the library computing its weights), to score against."""
    import bm25s

    config = config or BM25Config()
    analyzer = Analyzer(config.analyzer)
    model = bm25s.BM25(k1=config.k1, b=config.b, method="lucene")
    model.index([analyzer(d.full_text) for d in docs], show_progress=False)

    def scores(q: str) -> np.ndarray:
        ids = model.get_tokens_ids(analyzer(q))
        return np.asarray(model.get_scores_from_ids(ids), dtype=np.float32) if ids else np.zeros(len(docs), np.float32)

    return scores


def test_weights_are_bm25s_bit_for_bit(sample):
    docs, queries = sample
    ours, reference = BM25Retriever.build(docs), bm25s_reference(docs)
    config = BM25Config(k1=1.2, b=0.6)
    other, other_ref = BM25Retriever.build(docs, config), bm25s_reference(docs, config)
    for q in queries[:20] + ["snow and rain"]:
        assert np.array_equal(ours.scores(q), reference(q)) and np.array_equal(other.scores(q), other_ref(q))
    assert not np.array_equal(ours.scores("snow and rain"), other.scores("snow and rain"))


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
    assert len(passes) == 1 and list(chunked.doc_ids) == list(whole.doc_ids)
    for q in ["why do cats purr", "snow and rain", "bread dough yeast", "steak"]:
        np.testing.assert_array_equal(chunked.scores(q), whole.scores(q))
    one = BM25Retriever.build_chunked(chunks, stats=CorpusStats.of(Analyzer(AnalyzerConfig()).analyse(d.full_text)
                                                                       for d in docs))
    assert len(passes) == 2 and np.array_equal(one.scores("snow and rain"), whole.scores("snow and rain"))


def _random_docs(rng, n, vocab=300, first=0):
    return [[f"w{rng.randint(0, vocab)}" for _ in range(rng.randint(0, 30))] for _ in range(n)]


def test_postings_are_scipys_csc_arrays():
    """The CSC arrays placed chunk by chunk equal scipy's csc_matrix of the same postings, dtypes included, and
    the weights are the formula applied to each posting."""
    import math
    import random
    from collections import Counter

    import scipy.sparse as sp

    from twostage.retriever.bm25_stats import Postings

    rng = random.Random(0)
    docs = _random_docs(rng, 2000)
    chunks = [[(d, "en") for d in docs[i:i + 137]] for i in range(0, len(docs), 137)] + [[]]
    p = Postings.of_chunks(chunks)
    column = {t: c for c, t in enumerate(p.terms)}
    rows, cols, tfs = zip(*[(r, column[t], n) for r, d in enumerate(docs) for t, n in Counter(d).items()])
    want = sp.csc_matrix((np.array(tfs, dtype=np.int32), (rows, cols)), shape=(len(docs), len(p.terms)))
    for got, ref in ((p.counts, want.data), (p.rows, want.indices), (p.indptr, want.indptr)):
        assert got.dtype == ref.dtype and np.array_equal(got, ref)
    assert p.terms == list(dict.fromkeys(t for d in docs for t in d))  # columns in order of first occurrence
    assert np.array_equal(p.lengths, [len(d) for d in docs]) and p.vocab()[""] == len(p.terms)
    stats = CorpusStats.of((d, "en") for d in docs)
    assert p.stats() == stats
    weights = p.weights(None, 1.2, 0.6)
    idf = {t: np.float32(math.log(1 + (stats.num_docs - df + 0.5) / (df + 0.5))) for t, df in stats.doc_freqs.items()}
    avgdl = stats.total_length / stats.num_docs
    for j in rng.sample(range(len(weights)), 200):
        c = int(np.searchsorted(p.indptr, j, side="right")) - 1
        tf, dl = float(p.counts[j]), len(docs[p.rows[j]])
        assert weights[j] == np.float32(float(idf[p.terms[c]]) * (tf / (1.2 * ((1 - 0.6) + (0.6 * dl) / avgdl) + tf)))


def test_updated_postings_equal_a_fresh_build():
    """Deleting and adding documents through the postings gives, bit for bit, the index built over the documents
    left: the counts by (term, document), the lengths, and every score; terms left without a document are gone."""
    import random

    from twostage.retriever.bm25_stats import Postings

    rng = random.Random(1)
    live = [" ".join(d) or "empty" for d in _random_docs(rng, 300)]
    ids = [f"d{i}" for i in range(len(live))]
    bm25 = BM25Retriever.build([Document(i, t) for i, t in zip(ids, live)])
    next_id = len(ids)
    for step in range(6):
        keep = np.array([rng.random() > 0.2 for _ in ids])
        if step == 2:
            keep[:] = False  # everything replaced
        new = [" ".join(d) or "empty" for d in _random_docs(rng, rng.randint(1 if step == 2 else 0, 40), vocab=400)]
        new_ids = [f"d{next_id + i}" for i in range(len(new))]
        next_id += len(new)
        bm25 = bm25.updated(keep, [Document(i, t) for i, t in zip(new_ids, new)])
        live = [t for t, k in zip(live, keep) if k] + new
        ids = [i for i, k in zip(ids, keep) if k] + new_ids
        fresh = BM25Retriever.build([Document(i, t) for i, t in zip(ids, live)])
        assert list(bm25.doc_ids) == ids
        a, b = bm25.postings, fresh.postings
        assert sorted(a.terms) == sorted(b.terms) and np.array_equal(a.lengths, b.lengths) and a.stats() == b.stats()
        assert np.all(np.diff(a.indptr) > 0)  # no empty column
        for p in (a, b):
            assert all(np.all(np.diff(p.rows[p.indptr[c]:p.indptr[c + 1]]) > 0) for c in range(len(p.terms)))
        postings = {(t, int(r), int(n)) for p in (a,) for c, t in enumerate(p.terms)
                    for r, n in zip(p.rows[p.indptr[c]:p.indptr[c + 1]], p.counts[p.indptr[c]:p.indptr[c + 1]])}
        assert postings == {(t, int(r), int(n)) for c, t in enumerate(b.terms)
                            for r, n in zip(b.rows[b.indptr[c]:b.indptr[c + 1]], b.counts[b.indptr[c]:b.indptr[c + 1]])}
        for q in ["w1 w2 w3", "w17", "w350 w399 w0", "w5 w5 w120"]:
            assert np.array_equal(bm25.scores(q), fresh.scores(q))
    with pytest.raises(DataError, match="keep mask has 3 entries"):
        bm25.updated(np.ones(3, dtype=bool), [])
    with pytest.raises(DataError, match="empty corpus"):
        bm25.updated(np.zeros(len(ids), dtype=bool), [])
    assert isinstance(bm25.postings, Postings)


def as_format_2(root: Path) -> None:
    """Turn a saved BM25 directory into what format 2 wrote: no postings files."""
    manifest = json.loads((root / "manifest.json").read_text())
    manifest["format_version"] = 2
    for name in ("postings.counts.npy", "doc_lengths.npy", "doc_languages.npy"):
        del manifest["files"][name]
        (root / name).unlink()
    (root / "manifest.json").write_text(json.dumps(manifest))


def test_updates_from_saved_postings_and_older_indexes(tmp_path, sample):
    docs = sample[0]
    bm25 = BM25Retriever.build(docs[:150])
    bm25.save(tmp_path / "idx")
    loaded = BM25Retriever.load(tmp_path / "idx")
    keep = np.arange(150) % 3 != 0
    got = loaded.updated(keep, docs[150:])
    want = BM25Retriever.build([d for d, k in zip(docs, keep) if k] + list(docs[150:]))
    for q in sample[1][:10]:
        assert np.array_equal(got.scores(q), want.scores(q))
    # a format-2 index (no postings) loads and searches, and says what to do when asked to update
    root = tmp_path / "idx"
    as_format_2(root)
    old = BM25Retriever.load(root)
    assert old.postings is None and np.array_equal(old.scores("snow"), bm25.scores("snow"))
    with pytest.raises(ConfigError, match="keeps no postings"):
        old.updated(keep, [])


@pytest.mark.parametrize("damage", ["zero count", "long lengths", "float counts", "vocab gap"])
def test_crafted_postings_are_refused(tmp_path, sample, damage):
    """Files on disk are untrusted: postings that pass their checksums (rewritten with the manifest) but are not a
    well-formed matrix are a one-line IndexFormatError, at load or before an update uses them."""
    from twostage.indexer.manifest import describe_files

    root = tmp_path / "idx"
    BM25Retriever.build(sample[0]).save(root)
    if damage == "zero count":
        counts = np.load(root / "postings.counts.npy")
        counts[5] = 0
        np.save(root / "postings.counts.npy", counts)
    elif damage == "long lengths":
        np.save(root / "doc_lengths.npy", np.ones(len(sample[0]) + 1, dtype=np.int32))
    elif damage == "float counts":
        np.save(root / "postings.counts.npy", np.load(root / "postings.counts.npy").astype(np.float32))
    else:
        vocab = json.loads((root / "vocab.json").read_text())
        vocab[next(iter(vocab))] = 10**6
        (root / "vocab.json").write_text(json.dumps(vocab))
    manifest = json.loads((root / "manifest.json").read_text())
    manifest["files"] = describe_files(root, list(manifest["files"]))
    (root / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(IndexFormatError, match="rebuild"):
        BM25Retriever.load(root).updated(np.ones(len(sample[0]), dtype=bool), [Document("new", "snow")])
