"""The document store: documents read a parquet row group at a time, a bounded cache, streamed passes; and the
engine's updates, which rebuild BM25 from the stored documents streamed instead of held in memory."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from twostage import Document, SearchEngine, ShardedEngine
from twostage.errors import IndexFormatError
from twostage.indexer import docstore
from twostage.indexer.docstore import DocStore
from twostage.indexer.index import write_segment
from twostage.indexer.manifest import Segment
from twostage.retriever.bm25 import BM25Retriever

DOCUMENTS_AT = DocStore.documents_at


def _docs(prefix: str, n: int) -> list[Document]:
    return [Document(f"{prefix}{i}", f"text of {prefix} number {i} word{i % 4}", f"T{i}", {"n": i, "p": prefix})
            for i in range(n)]


@pytest.fixture
def store(tmp_path, monkeypatch):
    """Two segments of 12 and 9 documents in row groups of 5: groups (5, 5, 2) and (5, 4)."""
    monkeypatch.setattr(docstore, "ROW_GROUP", 5)
    a, b = _docs("a", 12), _docs("b", 9)
    write_segment(tmp_path, "s0", np.zeros((12, 2), np.float32), a)
    write_segment(tmp_path, "s1", np.zeros((9, 2), np.float32), b)
    segments = [Segment("s0", 0, 12), Segment("s1", 12, 9)]
    return tmp_path / "segments", segments, a + b


def _count_reads(monkeypatch) -> list[tuple[int, int]]:
    reads: list[tuple[int, int]] = []
    original = DocStore._read_group

    def counted(self, seg, group, columns=docstore.COLUMNS):
        reads.append((seg, group))
        return original(self, seg, group, columns)

    monkeypatch.setattr(DocStore, "_read_group", counted)
    return reads


def test_documents_are_read_one_row_group_at_a_time(store, monkeypatch):
    segments_dir, segments, docs = store
    assert pq.read_metadata(segments_dir / "s0.parquet").num_row_groups == 3
    reads = _count_reads(monkeypatch)
    s = DocStore(segments_dir, segments)
    got = s.documents_at([20, 0, 13, 6, 0])
    assert [d.id for d in got] == ["b8", "a0", "b1", "a6", "a0"]
    assert got[0] == docs[20] and got[3].metadata == {"n": 6, "p": "a"}
    assert sorted(reads) == [(0, 0), (0, 1), (1, 0), (1, 1)]  # each group read once, the others never
    s.documents_at([1, 2, 21 - 1])
    assert len(reads) == 4  # cached


def test_the_cache_is_bounded_in_bytes(store, monkeypatch):
    segments_dir, segments, _ = store
    reads = _count_reads(monkeypatch)
    s = DocStore(segments_dir, segments, cache_bytes=1)  # room for one group only
    for _ in range(2):
        s.documents_at([0])
        s.documents_at([7])
    assert len(reads) == 4 and len(s._cache) == 1


def test_streamed_passes_hold_one_row_group_and_skip_the_cache(store):
    segments_dir, segments, docs = store
    s = DocStore(segments_dir, segments)
    rows = np.array([0, 2, 4, 5, 11, 12, 16, 17, 20])
    seen = list(s.document_chunks(rows))
    assert [list(r) for r, _ in seen] == [[0, 2, 4], [5], [11], [12, 16], [17, 20]]
    assert [d for _, part in seen for d in part] == [docs[i] for i in rows]
    assert s._cache == {}
    assert s.column("id") == [d.id for d in docs]
    mask = s.mask(lambda d: d.metadata["n"] % 2 == 0, np.arange(1, 21))
    assert mask.tolist() == [i > 0 and docs[i].metadata["n"] % 2 == 0 for i in range(21)]
    with pytest.raises(ValueError, match="ascending"):
        list(s.chunks(np.array([3, 1])))
    with pytest.raises(IndexError, match="outside"):
        s.documents_at([21])


def test_files_with_one_row_group_and_broken_files(store):
    segments_dir, segments, docs = store
    old = pa.table({"id": [d.id for d in docs[:12]], "title": [d.title for d in docs[:12]],
                    "text": [d.text for d in docs[:12]], "metadata": ['{"old": 1}'] * 12})
    pq.write_table(old, segments_dir / "s0.parquet")  # written before row groups were bounded: one group
    s = DocStore(segments_dir, segments)
    assert [d.id for d in s.documents_at([11, 3])] == ["a11", "a3"] and s.documents_at([3])[0].metadata == {"old": 1}
    (segments_dir / "s1.parquet").write_bytes(b"not parquet at all")
    with pytest.raises(IndexFormatError, match="s1.parquet: not a readable parquet file"):
        DocStore(segments_dir, segments).documents_at([15])
    pq.write_table(old.slice(0, 4), segments_dir / "s1.parquet")  # 4 rows where the manifest says 9
    with pytest.raises(IndexFormatError, match="s1.parquet: 4 documents, the manifest says 9"):
        DocStore(segments_dir, segments).documents_at([15])


def _bm25_equals_fresh(engine) -> None:
    """The engine's BM25 scores equal, bit for bit, a BM25 built in memory over its live rows (documents, or a
    passage engine's passages)."""
    ids = [str(i) for i in engine.bm25.doc_ids]
    rows = engine.passages(ids) if engine.shape.enabled else engine.documents(ids)
    fresh = BM25Retriever.build(rows, engine.bm25.config)
    assert [str(i) for i in fresh.doc_ids] == ids
    for q in ("text of a", "word1 number", "blizzard avalanche", "new document word3"):
        assert np.array_equal(engine.bm25.scores(q), fresh.scores(q))


def _watch_chunks(monkeypatch) -> list[int]:
    """The sizes of the row groups the store streams from now on (DocStore.document_chunks watched)."""
    chunks: list[int] = []
    original = DocStore.document_chunks

    def watched(self, rows):
        for at, part in original(self, rows):
            chunks.append(len(part))
            yield at, part

    monkeypatch.setattr(DocStore, "document_chunks", watched)
    return chunks


def test_updates_stream_the_stored_documents(tmp_path, monkeypatch, models):
    monkeypatch.setattr(docstore, "ROW_GROUP", 8)
    retriever, _ = models
    engine = SearchEngine.build(_docs("a", 40), tmp_path / "e", retriever=retriever, precision="fp32", chunk_size=16)
    # 3 shards of 13, 14, 13 rows over chunks of 16: each shard gets whole chunks (hard links) and cut ones
    sharded = ShardedEngine.build(_docs("a", 40), tmp_path / "s", shards=3, retriever=retriever, precision="fp32",
                                  chunk_size=16)
    for q in ("text of a number 17", "word2 number", "a31"):
        for stage in ("bm25", "dense", "hybrid"):
            got, want = sharded.search(q, k=10, first_stage=stage, rerank=False), \
                engine.search(q, k=10, first_stage=stage, rerank=False)
            assert got.ids == want.ids and [h.score for h in got.hits] == [h.score for h in want.hits]
    chunks = _watch_chunks(monkeypatch)

    def refuse(self, rows):
        raise AssertionError(f"an update asked the store for {len(rows)} documents at once")

    monkeypatch.setattr(DocStore, "documents_at", refuse)
    e2 = engine.add([Document("snow", "blizzard avalanche new document", "Snow")])
    e3 = e2.upsert([Document("a3", "volcano lava word3"), Document("a99", "a brand new document word3")])
    e4 = e3.delete(["snow", "a7", "a30"])
    s2 = sharded.add([Document("snow", "blizzard avalanche new document", "Snow")]).delete(["a7"])
    assert chunks == []  # BM25 updates from its stored postings: the kept documents are not read, nor analysed
    monkeypatch.setattr(DocStore, "documents_at", DOCUMENTS_AT)  # reading documents back for the checks
    for e in (e2, e3, e4):
        _bm25_equals_fresh(e)
    assert len(e4) == 39 and "a7" not in e4 and e4.documents(["a3"])[0].text == "volcano lava word3"
    assert all(h.id != "snow" for h in e4.search("blizzard avalanche", k=5, first_stage="bm25").hits)
    one = SearchEngine.build(_docs("a", 40), tmp_path / "one", retriever=retriever, precision="fp32",
                             passage_words=0)  # as the sharded engine
    one = one.add([Document("snow", "blizzard avalanche new document", "Snow")]).delete(["a7"])
    for q in ("blizzard avalanche", "text of a number 17", "word2"):
        assert s2.search(q, k=10, first_stage="bm25").ids == one.search(q, k=10, first_stage="bm25").ids



def test_an_engine_whose_bm25_has_no_postings_updates_from_the_store(tmp_path, monkeypatch, models):
    """An engine saved before BM25 kept its postings (format 2): an update rebuilds BM25 from the stored documents,
    streamed a row group at a time, and the new version keeps postings again."""
    import json

    from tests.test_bm25 import as_format_2
    from twostage.engine.on_disk import engine_files

    monkeypatch.setattr(docstore, "ROW_GROUP", 8)
    retriever, _ = models
    # an engine of that age holds whole documents
    engine = SearchEngine.build(_docs("a", 40), tmp_path / "e", retriever=retriever, precision="fp32",
                                passage_words=0)
    as_format_2(engine.version_dir / "bm25")
    engine_manifest = engine.version_dir / "manifest.json"  # it checksums the part manifests
    data = json.loads(engine_manifest.read_text())
    data["files"] = engine_files(engine.version_dir)
    engine_manifest.write_text(json.dumps(data))
    old = SearchEngine.load(tmp_path / "e")
    assert old.bm25.postings is None
    chunks = _watch_chunks(monkeypatch)
    new = old.add([Document("snow", "blizzard avalanche new document", "Snow")]).delete(["a7"])
    assert chunks and max(chunks) <= 8 and sum(chunks) == 40  # one pass, a row group at a time (then postings)
    assert new.bm25.postings is not None
    _bm25_equals_fresh(new)


def test_a_sharded_update_without_postings_streams_the_stores(tmp_path, monkeypatch, models):
    """Where a shard's BM25 keeps no postings (an older engine), a sharded update computes the global statistics
    and each shard's BM25 from the stored documents, and still answers as one engine."""
    retriever, _ = models
    sharded = ShardedEngine.build(_docs("a", 30), tmp_path / "s", shards=2, retriever=retriever, precision="fp32")
    original = BM25Retriever.load

    def without_postings(path):
        bm25 = original(path)
        bm25.postings = None
        return bm25

    monkeypatch.setattr(BM25Retriever, "load", staticmethod(without_postings))
    read = _watch_chunks(monkeypatch)
    s2 = sharded.add([Document("snow", "blizzard avalanche new document", "Snow")]).delete(["a7"])
    assert read  # the fallback read the stores
    monkeypatch.setattr(BM25Retriever, "load", original)
    one = SearchEngine.build(_docs("a", 30), tmp_path / "one", retriever=retriever, precision="fp32",
                             passage_words=0)  # as the sharded engine
    one = one.add([Document("snow", "blizzard avalanche new document", "Snow")]).delete(["a7"])
    for q in ("blizzard avalanche", "text of a number 17", "word2"):
        got, want = s2.search(q, k=10, first_stage="bm25"), one.search(q, k=10, first_stage="bm25")
        assert got.ids == want.ids and [h.score for h in got.hits] == [h.score for h in want.hits]
