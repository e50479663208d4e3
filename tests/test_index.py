import json
import threading

import numpy as np
import pytest

from twostage.indexer.build import build_index
from twostage.indexer.errors import ConfigError, DataError, IndexFormatError
from twostage.indexer.index import Index, current_version
from twostage.indexer.manifest import EncoderInfo
from twostage.indexer.records import Document
from twostage.indexer.vectors import BACKENDS, RESCORE, BackendConfig


class KeywordEncoder:
    """One dimension per keyword plus a small constant, so every text has a direction."""

    words = ("cat", "dog", "rain", "snow", "cook", "garden", "music", "history", "money", "star", "water", "sleep")

    def __init__(self, name="kw"):
        self.name = name

    def encode(self, texts, kind="document", batch_size=32, **kw):
        return np.array([[t.lower().count(w) for w in self.words] + [0.05] for t in texts], dtype=np.float32)

    def info(self):
        return EncoderInfo(self.name, len(self.words) + 1, weights_sha256=self.name)


class TableEncoder:
    """Looks vectors up by text: for exact checks against numpy on random data."""

    def __init__(self, table):
        self.table = table

    def encode(self, texts, kind="document", batch_size=32, **kw):
        return np.stack([self.table[t] for t in texts])


def _commit(index, make):
    """One change of a bare dense part, as the engine commits its own (EngineWriter.commit_change): under the writer
    lock, on the version current now, in a new version; the part has no write methods of its own."""
    from twostage.indexer.versions import commit, writer_lock

    with writer_lock(index.root):
        base = index if current_version(index.root) == index.version_dir else index.refresh()
        change = make(base)
        with commit(index.root) as version:
            base.write(version.tmp, change)
    return Index.load(index.root, encoder=index.encoder, verify=False)


def add(index, docs, replace=False):
    vectors = index.encode_documents(docs)
    return _commit(index, lambda base: base.change_add(docs, vectors, replace=replace))


def upsert(index, docs):
    return add(index, docs, replace=True)


def delete(index, ids):
    return _commit(index, lambda base: base.change_delete(list(ids)))


def compact(index):
    return _commit(index, lambda base: base.change_compact())


@pytest.fixture(scope="module")
def corpus():
    from pathlib import Path

    from twostage.indexer.corpus import load_corpus

    return load_corpus(Path(__file__).resolve().parent.parent / "data" / "sample")


@pytest.fixture
def built(tmp_path, corpus):
    return build_index(corpus, KeywordEncoder(), tmp_path / "idx", backend="hnswlib", chunk_size=50)


def random_corpus(n=1500, dim=24, seed=0):
    rng = np.random.default_rng(seed)
    centers = rng.normal(size=(20, dim))
    vecs = (centers[rng.integers(0, 20, n)] + 0.3 * rng.normal(size=(n, dim))).astype(np.float32)
    docs = [Document(f"d{i}", f"text {i}") for i in range(n)]
    return docs, vecs, TableEncoder({d.text: v for d, v in zip(docs, vecs)})


@pytest.mark.parametrize("backend", BACKENDS)
def test_every_backend_agrees_with_exact_search(tmp_path, backend):
    docs, vecs, enc = random_corpus()
    params = {"nprobe": 16, **({"pq_m": 12} if backend == "faiss-ivfpq" else {})} if backend.startswith("faiss-ivf") else {}
    build_index(docs, enc, tmp_path / backend, backend=BackendConfig(backend, "cosine", params),
                        encoder_info=EncoderInfo("table", 24))
    queries = vecs[:50] + 0.05
    normed = vecs / np.linalg.norm(vecs, axis=1, keepdims=True)
    qn = queries / np.linalg.norm(queries, axis=1, keepdims=True)
    exact = np.argsort(-(qn @ normed.T), axis=1)[:, :10]
    got = Index.load(tmp_path / backend).search_batch(queries, 10)
    recall = np.mean([len(set(r.ids) & {f"d{i}" for i in e}) / 10 for r, e in zip(got, exact)])
    assert recall >= 0.95, (backend, recall)  # the lossy codes (PQ, int8, bits) are rescored exactly
    for r in got:
        assert np.all(np.diff(r.scores) <= 1e-6)  # similarities, best first
    if backend in RESCORE:  # the scores are the exact similarities of the returned documents
        rows = np.array([[int(d[1:]) for d in r.ids] for r in got])
        np.testing.assert_allclose([r.scores for r in got], np.einsum("qd,qkd->qk", qn, normed[rows]), atol=1e-5)
        unscored = Index.load(tmp_path / backend)
        unscored.manifest.params["rescore"] = 0
        coarse = unscored.search_batch(queries, 10)
        assert not np.allclose([r.scores for r in coarse], [r.scores for r in got], atol=1e-4)
    if backend in ("flat", "faiss-flat"):
        np.testing.assert_allclose(got[0].scores, np.sort(qn[0] @ normed.T)[::-1][:10], atol=1e-5)


def test_l2_scores_are_negated_distances(tmp_path):
    docs, vecs, enc = random_corpus(300)
    for backend in ("flat", "hnswlib", "faiss-flat"):
        index = build_index(docs, enc, tmp_path / backend, backend=BackendConfig(backend, "l2"))
        r = index.search(vecs[:1], 3)
        assert r.ids[0] == "d0" and r.scores[0] == pytest.approx(0.0, abs=1e-4) and r.scores[1] < 0


def test_build_writes_the_documented_layout(built, tmp_path):
    v = current_version(tmp_path / "idx")
    names = sorted(p.relative_to(v).as_posix() for p in v.rglob("*") if p.is_file())
    # one segment per build chunk (50 documents here), committed as they were encoded
    chunks = [f"segments/{i:06d}{ext}" for i in range(5) for ext in (".npy", ".parquet")]
    assert names == sorted(["READERS", "ann.hnswlib", "manifest.json", *chunks])
    manifest = json.loads((v / "manifest.json").read_text())
    assert [s["rows"] for s in manifest["segments"]] == [50, 50, 50, 50, 5]
    assert manifest["counts"] == {"rows": 205, "deleted": 0, "live": 205, "dim": 13}
    assert manifest["encoder"]["name"] == "kw" and set(manifest["files"]) == set(names) - {"manifest.json", "READERS"}
    assert not list(tmp_path.glob(".idx.build"))  # the work directory is gone


def test_text_search_needs_a_matching_encoder(built, tmp_path):
    loaded = Index.load(tmp_path / "idx")
    with pytest.raises(ConfigError, match="encoder"):
        loaded.search("rain", 3)
    with pytest.raises(ConfigError, match="other weights"):
        loaded.attach_encoder(KeywordEncoder("another"))
    class Unnormalised(KeywordEncoder):
        def info(self):
            return EncoderInfo("kw", 13, weights_sha256="kw", normalize=False)

    with pytest.raises(ConfigError, match="normalisation False"):
        loaded.attach_encoder(Unnormalised())
    loaded.attach_encoder(KeywordEncoder())
    assert loaded.search("rain and snow", 3).ids[0] in {d for d in loaded.doc_ids}
    with pytest.raises(ConfigError, match="dimension 5 but the index has 13"):
        loaded.search(np.ones((1, 5), dtype=np.float32), 3)


@pytest.mark.parametrize("k", [0, -1, 2.5, True])
def test_bad_k(built, k):
    with pytest.raises(ConfigError):
        built.search("rain", k)


def test_k_larger_than_the_index_returns_every_document(built):
    assert len(built.search("rain", 10_000)) == 205  # the one k rule of every retriever: fewer, never an error
    assert len(built.search("rain", 10_000, where={"topic": "cook"})) == sum(d.startswith("cook") for d in built.doc_ids)


def test_nan_vectors_are_refused(built, tmp_path):
    with pytest.raises(ConfigError, match="NaN"):
        built.search(np.full((1, 13), np.nan, dtype=np.float32), 3)

    class NanEncoder(KeywordEncoder):
        def encode(self, texts, **kw):
            v = super().encode(texts)
            v[0, 0] = np.inf
            return v

    with pytest.raises(ConfigError, match="row 0 has NaN or infinite"):
        build_index([Document("a", "x")], NanEncoder(), tmp_path / "nan")
    assert not (tmp_path / "nan" / "CURRENT").exists()


def test_updates(built, tmp_path):
    index = add(built, [Document("new", "rain rain snow snow snow", metadata={"topic": "weather"})])
    assert len(index) == 206 and index.search("snow rain", 1).ids[0] == "new"
    with pytest.raises(DataError, match="'new' is already in the index"):
        add(index, [Document("new", "x")])
    index = delete(index, ["new", "weather-07"])
    for r in index.search_batch(["snow rain", "snowflakes"], 204):
        assert "new" not in r.ids and "weather-07" not in r.ids and len(r) == 204
    assert len(index.search("snow rain", 10)) == 10  # still k live results
    with pytest.raises(DataError, match="unknown id"):
        delete(index, ["new"])  # deleted documents never come back
    index = upsert(index, [Document("weather-01", "cat cat cat cat dog")])
    assert index.search("cat cat cat cat dog", 1).ids[0] == "weather-01"
    assert index.documents(["weather-01"])[0].text == "cat cat cat cat dog"
    queries = ["cat", "rain", "music"]
    before = [r.scores.round(5).tolist() for r in index.search_batch(queries, 5)]
    compacted = compact(index)
    assert compacted.manifest.deleted == 0 and compacted.manifest.rows == len(index) == 204
    # a rebuilt graph may pick other documents among equal scores (this encoder makes many ties)
    after = [list(r.ids) for r in compacted.search_batch(queries, 5)]
    assert [r.scores.round(5).tolist() for r in compacted.search_batch(queries, 5)] == before
    reloaded = Index.load(tmp_path / "idx", encoder=KeywordEncoder())
    assert [list(r.ids) for r in reloaded.search_batch(queries, 5)] == after
    # old versions stay while an object reads them; once released, the next commit removes them
    for old in (built, index, compacted):
        old.close()
    final = delete(reloaded, ["cook-02"])
    reloaded.close()
    final.close()
    base = Index.load(tmp_path / "idx")
    final = compact(base)  # base still reads its version while the commit collects the others
    assert sorted(p.name for p in (tmp_path / "idx").iterdir()) == ["CURRENT", "LOCK", base.version_dir.name,
                                                                    final.version_dir.name]


def test_metadata_filter(built):
    r = built.search("rain and snow", 10, where={"topic": "cook"})
    assert len(r) > 0 and all(d.startswith("cook-") for d in r.ids)
    r = built.search("rain", 5, where=lambda d: d.id.endswith("1"))
    assert all(d.endswith("1") for d in r.ids)


@pytest.mark.parametrize("target", ["manifest.json", "segments/000000.npy", "segments/000000.parquet",
                                    "ann.hnswlib", "deleted.npy"])
@pytest.mark.parametrize("damage", ["truncate", "flip"])
def test_corruption_is_a_clear_error(tmp_path, corpus, target, damage):
    index = delete(build_index(corpus, KeywordEncoder(), tmp_path / "idx", chunk_size=100), ["cook-01"])
    path = index.version_dir / target
    data = bytearray(path.read_bytes())
    if damage == "truncate":
        data = data[: len(data) // 2]
    else:
        data[len(data) // 3] ^= 0x40
    path.write_bytes(bytes(data))
    with pytest.raises(IndexFormatError, match=target.split("/")[-1] if target != "manifest.json" else "manifest"):
        Index.load(tmp_path / "idx")


def test_missing_files_and_newer_format(tmp_path, built):
    v = built.version_dir
    manifest = json.loads((v / "manifest.json").read_text())
    (v / "manifest.json").write_text(json.dumps({**manifest, "format_version": 9}))
    with pytest.raises(IndexFormatError, match="newer than this library"):
        Index.load(tmp_path / "idx")
    (v / "manifest.json").write_text(json.dumps(manifest))
    (v / "ann.hnswlib").unlink()
    with pytest.raises(IndexFormatError, match="ann.hnswlib: missing"):
        Index.load(tmp_path / "idx")
    (tmp_path / "idx" / "CURRENT").write_text("v999999\n")
    with pytest.raises(IndexFormatError, match="not a version directory"):
        Index.load(tmp_path / "idx")
    with pytest.raises(IndexFormatError, match="no such index"):
        Index.load(tmp_path / "nope")


def test_build_resumes_from_encoded_chunks(tmp_path, corpus):
    calls = []

    class Counting(KeywordEncoder):
        def encode(self, texts, **kw):
            calls.append(len(texts))
            if len(calls) == 3:
                raise KeyboardInterrupt("killed")
            return super().encode(texts)

    with pytest.raises(KeyboardInterrupt):
        build_index(corpus, Counting(), tmp_path / "idx", chunk_size=50)
    assert not (tmp_path / "idx").exists()
    calls.clear()
    build_index(corpus, KeywordEncoder(), tmp_path / "idx", chunk_size=50)
    class Recording(KeywordEncoder):
        def encode(self, texts, **kw):
            calls.append(len(texts))
            return super().encode(texts)

    with pytest.raises(KeyboardInterrupt):
        build_index(corpus, Counting(), tmp_path / "idx2", chunk_size=50)
    calls.clear()
    build_index(corpus, Recording(), tmp_path / "idx2", chunk_size=50)
    assert calls == [50, 50, 5]  # the two chunks done before the kill are not encoded again


def test_concurrent_searches_equal_serial(built):
    rng = np.random.default_rng(0)
    queries = [" ".join(rng.choice(KeywordEncoder.words, 3)) for _ in range(500)]
    serial = [(list(r.ids), r.scores.tolist()) for r in (built.search(q, 5) for q in queries)]
    results: dict[int, list] = {}

    def worker(t):
        results[t] = [(list(r.ids), r.scores.tolist()) for r in (built.search(q, 5) for q in queries)]

    threads = [threading.Thread(target=worker, args=(t,)) for t in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(results) == 8 and all(results[t] == serial for t in range(8))


def test_resume_reuses_only_chunks_whose_documents_are_the_same(tmp_path):
    """A build that failed on a bad record and is rerun after fixing the file holds the corrected texts."""
    corpus = tmp_path / "c.jsonl"
    records = [{"_id": f"d{i}", "text": f"rain number {i}"} for i in range(1, 6)] + [{"_id": "d6", "text": 7}]
    corpus.write_text("".join(json.dumps(r) + "\n" for r in records))
    with pytest.raises(DataError, match="d6"):
        build_index(corpus, KeywordEncoder(), tmp_path / "idx", chunk_size=2)
    records[5]["text"] = "snow number 6"
    records[0]["text"] = "cat cat cat dog"
    corpus.write_text("".join(json.dumps(r) + "\n" for r in records))
    index = build_index(corpus, KeywordEncoder(), tmp_path / "idx", chunk_size=2)
    assert index.documents(["d1"])[0].text == "cat cat cat dog"
    index.attach_encoder(KeywordEncoder())
    assert index.search("cat dog", 1).ids[0] == "d1"


def test_crafted_hnswlib_file_with_a_matching_checksum_is_a_clear_error(built, tmp_path, monkeypatch):
    """hnswlib trusts its file; the index checks it first, so a crafted graph is an error, never a crash."""
    import random
    import shutil

    from twostage.indexer.atomic import sha256_file

    shutil.copytree(tmp_path / "idx", tmp_path / "evil")
    v = current_version(tmp_path / "evil")
    ann = v / "ann.hnswlib"
    original = ann.read_bytes()
    manifest = json.loads((v / "manifest.json").read_text())

    def plant(data: bytes) -> None:
        ann.write_bytes(data)
        manifest["files"]["ann.hnswlib"] = {"sha256": sha256_file(ann), "bytes": len(data)}
        (v / "manifest.json").write_text(json.dumps(manifest))

    header = 96
    per_element = int.from_bytes(original[24:32], "little")
    neighbour = bytearray(original)
    neighbour[header + 4: header + 8] = (10**9).to_bytes(4, "little")  # first neighbour of row 0 -> far away
    late = bytearray(original)  # the same in row 150, which a sliced check reaches in a later slice
    late[header + 150 * per_element + 4: header + 150 * per_element + 8] = (10**9).to_bytes(4, "little")
    count = bytearray(original)
    count[16:24] = (10**6).to_bytes(8, "little")  # cur_element_count
    from twostage.indexer import vectors

    for rows_per_check in (vectors._CHECK_ROWS, 7):
        monkeypatch.setattr(vectors, "_CHECK_ROWS", rows_per_check)
        for data in (bytes(neighbour), bytes(late), bytes(count), original[:500], original + b"\0" * 8):
            plant(data)
            with pytest.raises(IndexFormatError, match="not a valid hnswlib index"):
                Index.load(tmp_path / "evil")
    rng = random.Random(0)
    for _ in range(200):  # random damage: a clear error or a working index, never a crash
        data = bytearray(original)
        for _ in range(rng.choice([1, 8])):
            data[rng.randrange(len(data))] = rng.randrange(256)
        plant(bytes(data))
        try:
            Index.load(tmp_path / "evil", encoder=KeywordEncoder()).search("rain", 5)
        except IndexFormatError:
            pass


def test_binary_index_file_is_checked_before_faiss_reads_it(tmp_path):
    docs, _, enc = random_corpus(n=300)
    build_index(docs, enc, tmp_path / "b", backend="faiss-binary", encoder_info=EncoderInfo("table", 24))
    Index.load(tmp_path / "b", verify=False).close()
    ann = current_version(tmp_path / "b") / "ann.faiss"
    data = bytearray(ann.read_bytes())
    data[12:20] = (10**6).to_bytes(8, "little")  # a count the manifest does not say
    ann.write_bytes(bytes(data))
    with pytest.raises(IndexFormatError, match="ann.faiss: a faiss index of 1000000 x 24"):
        Index.load(tmp_path / "b", verify=False)
    with pytest.raises(ConfigError, match="divisible by 8"):
        build_index(docs[:10], TableEncoder({d.text: np.ones(12, np.float32) for d in docs[:10]}), tmp_path / "c",
                    backend="faiss-binary", encoder_info=EncoderInfo("table", 12))


def test_a_duplicate_id_in_another_chunk_is_refused_and_nothing_is_written(tmp_path):
    docs = [Document(f"d{i}", "cat rain") for i in range(120)] + [Document("d7", "dog")]
    with pytest.raises(DataError, match="duplicate document id 'd7'"):
        build_index(docs, KeywordEncoder(), tmp_path / "idx", chunk_size=50)
    assert not (tmp_path / "idx" / "CURRENT").exists()


def test_filtered_exact_search_reads_rows_across_segments(built):
    rows = np.array([0, 49, 50, 51, 204, 120])
    np.testing.assert_array_equal(built.rows(rows), np.vstack([np.asarray(v) for v in built._vectors])[rows])
    got = built.search("rain snow", 5, where={"topic": "weather"})
    assert len(got) == 5 and all(d.metadata["topic"] == "weather" for d in built.documents(got.ids))


def test_compaction_copies_the_live_rows_one_segment_at_a_time(tmp_path, monkeypatch):
    from twostage.indexer import index as index_module

    docs, vecs, encoder = random_corpus(n=300)
    index = build_index(docs, encoder, tmp_path / "idx", backend="faiss-hnsw-sq8", chunk_size=64)
    gone = [f"d{i}" for i in range(0, 300, 7)]
    index = upsert(delete(index, gone), [Document("d1", "text 1"), Document("extra", "text 2")])
    live = index.doc_ids[~index.deleted]
    want_vectors, want_docs = index.rows(np.flatnonzero(~index.deleted)), index.documents(live)
    monkeypatch.setattr(index_module, "COMPACT_ROWS", 40)
    made: list[int] = []
    original = index_module.write_segment

    def watched(directory, name, vectors, docs_):
        made.append(len(docs_))
        return original(directory, name, vectors, docs_)

    monkeypatch.setattr(index_module, "write_segment", watched)
    compacted = compact(index)
    assert max(made) == 40 and sum(made) == len(live) == 300 - len(gone) + 1
    m = compacted.manifest
    assert m.deleted == 0 and [s.rows for s in m.segments] == made and [s.start for s in m.segments] == \
        list(range(0, len(live), 40))
    assert list(compacted.doc_ids) == list(live) and compacted.documents(live) == want_docs
    np.testing.assert_array_equal(compacted.rows(np.arange(len(live))), want_vectors)
    exact = Index.load(tmp_path / "idx", encoder=encoder)
    queries = vecs[[3, 50, 120]]
    for got, ref in zip(exact.search_batch(queries, 10), index.search_batch(queries, 10)):
        assert list(got.ids) == list(ref.ids)


def foreign_hnswlib_save(self, path):
    """An hnswlib build that writes another layout (chroma-hnswlib installed as ``hnswlib`` does): same length,
    different bytes."""
    self.index.save_index(str(path))
    data = bytearray(path.read_bytes())
    data[40:48] = (2**40).to_bytes(8, "little")  # a header count twostage's check refuses
    path.write_bytes(bytes(data))


def test_an_ann_library_writing_another_layout_is_named_not_blamed_on_the_disk(tmp_path, corpus, monkeypatch):
    from twostage.indexer.vectors import HnswlibIndex

    monkeypatch.setattr(HnswlibIndex, "save", foreign_hnswlib_save)
    with pytest.raises(ConfigError, match=r"installed hnswlib \(hnswlib 0\.\d.*'hnswlib>=0\.8'.*--backend") as err:
        build_index(corpus, KeywordEncoder(), tmp_path / "idx", backend="hnswlib", chunk_size=50)
    assert "disk" not in str(err.value)
    assert not (tmp_path / "idx" / "CURRENT").exists()  # nothing committed


def test_an_ann_file_that_does_not_read_back_on_a_full_disk_is_a_disk_error(tmp_path, corpus, monkeypatch):
    import errno
    import shutil
    from collections import namedtuple

    from twostage.indexer.vectors import HnswlibIndex

    monkeypatch.setattr(HnswlibIndex, "save", foreign_hnswlib_save)
    usage = namedtuple("usage", "total used free")
    monkeypatch.setattr(shutil, "disk_usage", lambda path: usage(10**9, 10**9 - 1000, 1000))
    with pytest.raises(OSError) as err:
        build_index(corpus, KeywordEncoder(), tmp_path / "idx", backend="hnswlib", chunk_size=50)
    assert err.value.errno == errno.ENOSPC and "disk full" in str(err.value)
