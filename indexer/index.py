"""The engine's dense part: embeddings, an ANN structure and the rows, in one versioned directory.

An engine (:mod:`twostage.engine`) writes it, through the changes here (:meth:`Index.change_add` and the others),
inside its own versions; there is no second write path beside the engine's. The layout:

    INDEX_DIR/
      CURRENT                  the name of the live version, replaced atomically (os.replace)
      v000001/manifest.json    format, versions, encoder identity, metric, backend, segments, checksums
      v000001/segments/000000.npy, .parquet   float32 vectors and (id, title, text, metadata) per row
      v000001/ann.hnswlib | ann.faiss          the search structure; its labels are row numbers (compressed
                                               backends: their codes, rescored with the memory-mapped vectors)
      v000001/deleted.npy      tombstoned row numbers (when any)

Every change writes a complete new version (unchanged segment files are hard links, not copies), fsyncs
it, then points CURRENT at it. A process killed at any moment leaves CURRENT naming a complete version.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import threading
import uuid
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from twostage.indexer.atomic import load_npy
from twostage.indexer.docstore import DocStore, IdMap, read_ids, write_documents
from twostage.indexer.errors import ConfigError, DataError, IndexFormatError
from twostage.indexer.filters import CheckedFilter, MetadataTable, Where, parse_filter
from twostage.indexer.manifest import (
    EncoderInfo,
    Manifest,
    Segment,
    describe_files,
    library_versions,
    read_manifest,
    verify_files,
)
from twostage.indexer.records import Document, RankedList, check_k
from twostage.indexer.vectors import (
    BackendConfig,
    FlatIndex,
    ann_file,
    ann_from_vectors,
    open_ann,
    prepare,
    similarity,
    verify_saved,
)
from twostage.indexer.versions import Lease, current_version as _current_version, open_current

logger = logging.getLogger(__name__)
EXACT_BELOW = 20_000  # filtered searches over at most this many allowed rows are exact
COMPACT_ROWS = 65_536  # rows per segment written by a compaction (one such segment is in memory at a time)


def current_version(root: Path) -> Path:
    """The live version directory of an index directory."""
    return _current_version(root, "an engine's dense part (an engine builds it: `twostage build`)")


def write_segment(dir: Path, name: str, vectors: np.ndarray, docs: Sequence[Document]) -> None:
    (dir / "segments").mkdir(parents=True, exist_ok=True)
    np.save(dir / "segments" / f"{name}.npy", np.ascontiguousarray(vectors, dtype=np.float32), allow_pickle=False)
    write_documents(dir / "segments" / f"{name}.parquet", docs)


class Index:
    """A loaded dense part: an engine's ``dense/`` (its versions are the engine's), or a bare directory the tests
    and the ANN benchmarks build with :func:`twostage.indexer.build.build_index`; open with :meth:`load`."""

    def __init__(self, root: Path, version_dir: Path, manifest: Manifest, encoder: Any = None,
                 lease: Lease | None = None) -> None:
        self.root, self.version_dir, self.manifest = root, version_dir, manifest
        self._lease = lease  # keeps this version on disk while the object lives (indexer.versions)
        self._lock = threading.Lock()
        vectors = []
        for seg in manifest.segments:
            path = version_dir / "segments" / f"{seg.name}.npy"
            try:
                v = load_npy(path, mmap=True)
            except (ValueError, OSError) as exc:
                raise IndexFormatError(f"{path}: not a readable .npy file ({exc}); restore or rebuild the index") from None
            if v.shape != (seg.rows, manifest.encoder.dim) or v.dtype != np.float32:
                raise IndexFormatError(f"{path}: shape {v.shape} {v.dtype}, the manifest says ({seg.rows}, "
                                       f"{manifest.encoder.dim}) float32; restore or rebuild the index")
            vectors.append(v)
        self._vectors = vectors
        self._starts = np.cumsum([0, *(len(v) for v in vectors)])[:-1]
        import pyarrow as pa

        columns = []
        for seg in manifest.segments:
            path = version_dir / "segments" / f"{seg.name}.parquet"
            col = read_ids(path)
            if len(col) != seg.rows:
                raise IndexFormatError(f"{path}: {len(col)} documents, the manifest says {seg.rows}")
            columns.extend(col.chunks)
        self.doc_ids = IdMap(pa.chunked_array(columns, pa.string()) if columns else pa.chunked_array([], pa.string()))
        self.deleted = np.zeros(len(self.doc_ids), dtype=bool)
        if manifest.deleted:
            rows = load_npy(version_dir / "deleted.npy")
            if len(rows) != manifest.deleted or (len(rows) and (rows.min() < 0 or rows.max() >= len(self.doc_ids))):
                raise IndexFormatError(f"{version_dir / 'deleted.npy'}: does not match the manifest; restore or rebuild")
            self.deleted[rows] = True
        self._ann = self._open_ann()
        self.store = DocStore(version_dir / "segments", manifest.segments)
        self._metadata: MetadataTable | None = None
        self.encoder = None
        if encoder is not None:
            self.attach_encoder(encoder)

    # ---- opening ---------------------------------------------------------------------------
    @classmethod
    def load(cls, path: str | Path, *, encoder: Any = None, verify: bool = True) -> Index:
        """Open an index directory: manifest first, then every file's size (and sha256 when ``verify``).

        The opened version stays on disk while this object lives, whatever other processes commit;
        :meth:`refresh` moves to the newest version.
        """
        root = Path(path)
        if not root.is_dir():
            raise IndexFormatError(f"{root}: no such index directory")
        return open_current(root, lambda version_dir, lease: cls.open_version(root, version_dir, encoder, verify, lease),
                            "an engine's dense part (an engine builds it: `twostage build`)")

    @classmethod
    def open_version(cls, root: Path, version_dir: Path, encoder: Any = None, verify: bool = True,
                     lease: Lease | None = None) -> Index:
        """Open one version directory (its manifest checked, then its files)."""
        manifest = read_manifest(version_dir)
        verify_files(version_dir, manifest.files, checksums=verify)
        return cls(root, version_dir, manifest, encoder, lease)

    def refresh(self, *, verify: bool = False) -> Index:
        """This index at the newest committed version (``self`` when nothing changed)."""
        if current_version(self.root) == self.version_dir:
            return self
        return Index.load(self.root, encoder=self.encoder, verify=verify)

    def close(self) -> None:
        """Release this version (a later commit may then remove it from disk)."""
        if self._lease is not None:
            self._lease.release()

    def _open_ann(self) -> Any:
        m = self.manifest
        return None if m.backend == "flat" else open_ann(self.version_dir / ann_file(m.backend), m.backend, m.metric,
                                                          m.encoder.dim, m.rows)

    def attach_encoder(self, encoder: Any) -> None:
        """Use ``encoder`` for text queries; it must be the one the index was built with."""
        info = encoder.info() if hasattr(encoder, "info") else None
        want = self.manifest.encoder
        if info is not None:
            if info.dim != want.dim:
                raise ConfigError(f"encoder {info.name!r} makes {info.dim}-d vectors; this index holds {want.dim}-d "
                                  f"vectors of {want.name!r}")
            for field_, label in (("pooling", "pooling"), ("normalize", "normalisation")):
                mine, theirs = getattr(info, field_), getattr(want, field_)
                if mine != "" and theirs != "" and mine != theirs:
                    raise ConfigError(f"encoder {info.name!r} uses {label} {mine!r} but this index was built with "
                                      f"{theirs!r}; its scores would not be comparable")
            if info.weights_sha256 and want.weights_sha256 and info.weights_sha256 != want.weights_sha256:
                raise ConfigError(f"encoder {info.name!r} has other weights than {want.name!r}, which built this "
                                  "index; load the index's model or rebuild the index")
        self.encoder = encoder

    # ---- reading ---------------------------------------------------------------------------
    def __len__(self) -> int:
        return self.manifest.live

    def __contains__(self, doc_id: object) -> bool:
        """Whether ``doc_id`` is a live (not deleted) document of this version."""
        return isinstance(doc_id, str) and self.doc_ids.live_rows([doc_id], self.deleted)[0] is not None

    @property
    def dim(self) -> int:
        return self.manifest.encoder.dim

    def rows(self, rows: np.ndarray) -> np.ndarray:
        """The vectors of these rows, read from the memory-mapped segments (nothing else is loaded)."""
        out = np.empty((len(rows), self.dim), dtype=np.float32)
        seg = np.searchsorted(self._starts, rows, side="right") - 1
        for s in np.unique(seg):
            at = seg == s
            out[at] = self._vectors[s][rows[at] - self._starts[s]]
        return out

    def documents(self, ids: Iterable[str]) -> list[Document]:
        """The stored documents with these ids (live ones only; an unknown id is a KeyError naming it). Only the
        row groups that hold them are read (:class:`~twostage.indexer.docstore.DocStore`)."""
        ids = list(ids)
        rows = self.doc_ids.live_rows(ids, self.deleted)
        missing = next((i for i, r in zip(ids, rows) if r is None), None)
        if missing is not None:
            raise KeyError(f"document id {missing!r} is not in the index")
        return self.store.documents_at(rows)

    def metadata_table(self) -> MetadataTable:
        """The live documents' metadata as typed Arrow columns (the metadata column alone, read once)."""
        if self._metadata is None:
            live = ~self.deleted
            column = self.store.column("metadata")
            distinct: dict[str, int] = {}  # a document's passages carry the same JSON: parsed and held once
            rows: list[dict[str, Any]] = []
            index = np.empty(len(column), dtype=np.int64)
            for i, m in enumerate(column):
                text = m if live[i] else "{}"
                j = distinct.get(text)
                if j is None:
                    j = distinct[text] = len(rows)
                    rows.append(json.loads(text))
                index[i] = j
            self._metadata = MetadataTable(rows, index)
        return self._metadata

    def _metadata_mask(self, where: Where) -> np.ndarray:
        if isinstance(where, CheckedFilter):  # checked by the engine against every shard's fields
            return self.metadata_table().mask(where.filter, checked=True)
        if callable(where):  # every live document streamed through the function, a row group at a time
            return self.store.mask(where, np.flatnonzero(~self.deleted))
        return self.metadata_table().mask(parse_filter(where))

    def search(self, query: str | np.ndarray, k: int = 10, *,
               where: Where = None,
               ef_search: int | None = None, nprobe: int | None = None) -> RankedList:
        """The ``k`` best live documents for one query (a text, which needs the attached encoder, or a vector).

        Fewer than ``k`` come back when fewer documents are live (or pass ``where``), as with every retriever.
        """
        if isinstance(query, np.ndarray) and (query.ndim == 1 or (query.ndim == 2 and len(query) == 1)):
            query = query.reshape(1, -1)
        elif isinstance(query, str):
            query = [query]  # type: ignore[assignment]
        else:
            raise ConfigError(f"search takes one query (a string or a 1-d vector); use search_batch for "
                              f"{type(query).__name__}")
        return self.search_batch(query, k, where=where, ef_search=ef_search, nprobe=nprobe)[0]

    def search_batch(self, queries: Sequence[str] | np.ndarray, k: int = 10, *,
                     where: Where = None,
                     ef_search: int | None = None, nprobe: int | None = None) -> list[RankedList]:
        """:meth:`search` for many queries (texts encoded in one pass, or an (n, dim) array of vectors).

        ``where`` keeps documents whose metadata has the given values (or for which a function is true).
        Scores are similarities: higher is better, whatever the backend's own convention.
        """
        k = check_k(k)
        if isinstance(queries, str):
            raise ConfigError("search_batch takes a list of queries; use search for one")
        if isinstance(queries, np.ndarray):
            vectors = queries
        else:
            if self.encoder is None:
                raise ConfigError("text queries need the index's encoder: Index.load(path, encoder=...) or attach_encoder")
            vectors = self.encoder.encode(list(queries), kind="query")
        q = prepare(vectors, self.manifest.metric, self.dim, "query vectors")
        allowed = self.allowed(where)
        n_allowed = int(allowed.sum())
        k = min(k, n_allowed)
        if k == 0:
            return [RankedList(np.array([], dtype=object), np.array([], dtype=np.float32)) for _ in q]
        params = dict(self.manifest.params)
        params.update({k_: v for k_, v in (("ef_search", ef_search), ("nprobe", nprobe)) if v is not None})
        excluded = len(allowed) - n_allowed
        if self._ann is None or (where is not None and n_allowed <= EXACT_BELOW):
            return self._exact(q, k, allowed)
        return self._graph_search(q, k, allowed, params, excluded)

    def _graph_search(self, q: np.ndarray, k: int, allowed: np.ndarray, params: dict[str, Any],
                      excluded: int) -> list[RankedList]:
        """The ANN structure's top ``k`` allowed rows for each query vector (rescored by the exact vectors when the
        codes are compressed); a query the graph leaves short is searched exactly."""
        n_allowed = len(allowed) - excluded
        rescore = int(params.get("rescore", 0))
        want = max(k, k * rescore)
        out: list[RankedList | None] = [None] * len(q)
        todo = np.arange(len(q))
        # A filter (or tombstones) hides part of the graph: ask it for enough neighbours that k allowed ones are
        # expected among them (twice the share they hide), four times more for the queries still short, then
        # exact search for any query the graph still leaves short.
        fetch = min(len(allowed), int(np.ceil(want * len(allowed) / n_allowed * (2 if excluded else 1))))
        for _ in range(2):
            assert self._ann is not None
            with self._lock:
                labels, scores = self._ann.search(q[todo], fetch, params)
            short = []
            for i, lab, sc in zip(todo, labels, scores):
                keep = (lab >= 0) & allowed[np.clip(lab, 0, None)]
                lab, sc = lab[keep], sc[keep]
                if len(lab) < k:
                    short.append(i)
                    continue
                if rescore:  # compressed codes found the candidates; the exact vectors order them
                    sc = similarity(q[i:i + 1], self.rows(lab), self.manifest.metric)[0].astype(np.float32)
                order = np.lexsort((lab, -sc))[:k]
                out[i] = RankedList(self.doc_ids[lab[order]], sc[order].astype(np.float32))
            todo = np.array(short, dtype=np.int64)
            if not len(todo) or fetch >= len(allowed):
                break
            fetch = min(len(allowed), fetch * 4)
        if len(todo):  # the graph missed some: exact search for these queries
            for i, r in zip(todo, self._exact(q[todo], k, allowed)):
                out[i] = r
        return out  # type: ignore[return-value]

    def allowed(self, where: Where = None) -> np.ndarray:
        """A boolean mask over rows: live and (when given) passing ``where``."""
        return ~self.deleted if where is None else (~self.deleted & self._metadata_mask(where))

    def metadata_fields(self) -> set[str]:
        """Every metadata key some live document has."""
        return set(self.metadata_table().kinds)

    def metadata_kinds(self) -> dict[str, str]:
        """Each metadata field's type (:data:`twostage.indexer.filters.KINDS`), over the live documents."""
        return dict(self.metadata_table().kinds)

    def _exact(self, q: np.ndarray, k: int, allowed: np.ndarray) -> list[RankedList]:
        rows = np.flatnonzero(allowed)
        flat = FlatIndex(self.manifest.metric, self.rows(rows))
        labels, scores = flat.search(q, k, {})
        return [RankedList(self.doc_ids[rows[lab]], sc) for lab, sc in zip(labels, scores)]

    def info(self) -> dict[str, Any]:
        m = self.manifest
        return {"path": str(self.root), "version": self.version_dir.name, "documents": m.live, "rows": m.rows,
                "deleted": m.deleted, "dim": m.encoder.dim, "metric": m.metric, "backend": m.backend,
                "params": m.params, "encoder": m.encoder.__dict__, "segments": len(m.segments),
                "bytes": sum(f["bytes"] for f in m.files.values()), "versions": m.versions}


    # ---- writing ---------------------------------------------------------------------------
    # Each update is computed as an IndexChange from the version current under the writer lock, written into a
    # new version directory (write_index_files) and committed; the engine writes the same change into its own
    # version together with BM25 (twostage.engine.search_engine).
    def encode_documents(self, docs: Sequence[Document], encoder: Any = None, batch_size: int = 32) -> np.ndarray:
        """Vectors of ``docs`` by the index's encoder (checked: finite, the index's width, normalised)."""
        enc = encoder or self.encoder
        if enc is None:
            raise ConfigError("adding documents needs the index's encoder (pass encoder= or attach_encoder)")
        if encoder is not None:
            self.attach_encoder(encoder)
        vectors = enc.encode([d.full_text for d in docs], kind="document", batch_size=batch_size, allow_empty=True)
        return prepare(vectors, self.manifest.metric, self.dim, "document vectors")

    def change_add(self, docs: Sequence[Document], vectors: np.ndarray, *, replace: bool = False,
                   drop: Sequence[str] = ()) -> IndexChange:
        """The change that appends ``docs`` (new ids only, unless ``replace`` tombstones the old rows first) and
        tombstones the live rows of the ids ``drop`` (a replaced document's passages that are no more)."""
        deleted = self.deleted.copy()
        live = self.doc_ids.live_rows([d.id for d in docs], self.deleted)
        if drop:
            deleted[[r for r in self.doc_ids.live_rows(list(drop), self.deleted) if r is not None]] = True
        if replace:
            deleted[[r for r in live if r is not None]] = True
        else:
            dup = next((d.id for d, r in zip(docs, live) if r is not None), None)
            if dup is not None:
                raise DataError(f"document id {dup!r} is already in the index; use upsert to replace it")
        if len(vectors) != len(docs):
            raise DataError(f"{len(docs)} documents but {len(vectors)} vectors")
        start = self.manifest.rows
        name = f"{len(self.manifest.segments):06d}-{uuid.uuid4().hex[:6]}"
        ann = self._ann_copy()
        if ann is not None and len(docs):
            ann.add(vectors, np.arange(start, start + len(docs)))
        segments = [*self.manifest.segments, Segment(name, start, len(docs))]
        return IndexChange(segments, {name: (vectors, list(docs))}, np.flatnonzero(deleted), ann)

    def change_delete(self, ids: Sequence[str]) -> IndexChange:
        """The change that tombstones ``ids`` (an unknown or already deleted id is an error naming it)."""
        live = self.doc_ids.live_rows(list(ids), self.deleted)
        missing = [i for i, r in zip(ids, live) if r is None]
        if missing:
            raise DataError(f"cannot delete {len(missing)} unknown id(s): {', '.join(map(repr, missing[:5]))}")
        deleted = self.deleted.copy()
        deleted[live] = True
        if not (~deleted).any():
            raise DataError("deleting every document would leave an empty index; build a new one instead")
        return IndexChange(list(self.manifest.segments), {}, np.flatnonzero(deleted), self._ann_for_commit())

    def change_unchanged(self) -> IndexChange:
        """The change that changes nothing (every file hard-linked into the next version)."""
        return IndexChange(list(self.manifest.segments), {}, np.flatnonzero(self.deleted), self._ann_for_commit())

    def change_compact(self) -> IndexChange:
        """The change that rewrites the index without tombstoned rows, with a new ANN structure: the live rows are
        copied in segments of at most :data:`COMPACT_ROWS` rows, one segment in memory at a time, and the ANN
        structure is built from the written segments' memory maps."""
        live = np.flatnonzero(~self.deleted)
        tag = uuid.uuid4().hex[:6]
        segments, new = [], {}
        for i, start in enumerate(range(0, len(live), COMPACT_ROWS)):
            rows = live[start:start + COMPACT_ROWS]
            name = f"{i:06d}-{tag}"
            segments.append(Segment(name, start, len(rows)))
            new[name] = lambda rows=rows: (self.rows(rows), [d for _, part in self.store.document_chunks(rows)
                                                             for d in part])
        m = self.manifest
        ann = None if m.backend == "flat" else AnnFromSegments(BackendConfig(m.backend, m.metric, m.params))
        return IndexChange(segments, new, np.array([], dtype=np.int64), ann)

    def write(self, directory: Path, change: IndexChange) -> None:
        """Write this index with ``change`` applied into ``directory`` (unchanged files hard-linked)."""
        m = self.manifest
        write_index_files(directory, self.version_dir, change, m.encoder, m.metric, m.backend, dict(m.params))

    def _ann_copy(self) -> Any:
        """A writable copy of the ANN structure (the live one keeps serving readers)."""
        if self._ann is None:
            return None
        tmp = self.root / f".ann-copy-{uuid.uuid4().hex[:8]}"
        try:
            self._ann.save(tmp)
            m = self.manifest
            return open_ann(tmp, m.backend, m.metric, m.encoder.dim, m.rows)
        finally:
            tmp.unlink(missing_ok=True)

    def _ann_for_commit(self) -> Any:
        return None if self._ann is None else _Unchanged(self.version_dir, self.manifest.backend)


SegmentData = tuple[np.ndarray, Sequence[Document]]


@dataclass
class IndexChange:
    """What the next version of an index holds: its segments (new ones with their data, or a function that makes
    it when the segment is written, so that only one is in memory at a time), tombstones, ANN."""

    segments: list[Segment]
    new_segments: Mapping[str, SegmentData | Callable[[], SegmentData]]
    deleted: np.ndarray
    ann: Any  # an object with save(path), an AnnFromSegments, or None for the flat backend


@dataclass(frozen=True)
class AnnFromSegments:
    """An ANN structure to build, once the version's segments are written, from their memory-mapped vectors."""

    config: BackendConfig


class _Unchanged:
    """An ANN file carried over to the next version as a hard link."""

    def __init__(self, version_dir: Path, backend: str) -> None:
        self.path = version_dir / ann_file(backend)

    def save(self, path: Path) -> None:
        link_or_copy(self.path, path)


def link_or_copy(src: Path, dst: Path) -> None:
    """Hard-link ``src`` to ``dst`` (the file never changes once written), or copy it across file systems."""
    try:
        os.link(src, dst)
    except OSError:
        shutil.copy2(src, dst)


def write_index_files(directory: Path, previous: Path | None, change: IndexChange, encoder: EncoderInfo, metric: str,
                      backend: str, params: dict[str, Any]) -> None:
    """Write a complete index version into ``directory`` (hard-linking unchanged segments from ``previous``)."""
    (directory / "segments").mkdir(parents=True, exist_ok=True)
    for seg in change.segments:
        if seg.name in change.new_segments:
            data = change.new_segments[seg.name]
            vectors, docs = data() if callable(data) else data
            write_segment(directory, seg.name, vectors, docs)
            del vectors, docs, data
        else:
            if previous is None:
                raise ConfigError(f"segment {seg.name} is neither new nor in a previous version")
            for ext in (".npy", ".parquet"):
                link_or_copy(previous / "segments" / f"{seg.name}{ext}", directory / "segments" / f"{seg.name}{ext}")
    files = [f"segments/{s.name}{ext}" for s in change.segments for ext in (".npy", ".parquet")]
    ann = change.ann
    if isinstance(ann, AnnFromSegments):
        ann = ann_from_vectors(ann.config, [load_npy(directory / "segments" / f"{s.name}.npy", mmap=True)
                                       for s in change.segments])
    if ann is not None:
        ann_name = ann_file(backend)
        ann.save(directory / ann_name)
        verify_saved(ann, directory / ann_name, encoder.dim, sum(s.rows for s in change.segments))
        files.append(ann_name)
    if len(change.deleted):
        np.save(directory / "deleted.npy", np.asarray(change.deleted, dtype=np.int64), allow_pickle=False)
        files.append("deleted.npy")
    manifest = Manifest(encoder, metric, backend, params, tuple(change.segments), int(len(change.deleted)),
                        describe_files(directory, files), library_versions())
    (directory / "manifest.json").write_text(manifest.to_json(), encoding="utf-8")
