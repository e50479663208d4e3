"""The index directory: embeddings, an ANN structure and the documents, built once, loaded, updated.

    INDEX_DIR/
      CURRENT                  the name of the live version, replaced atomically (os.replace)
      v000001/manifest.json    format, versions, encoder identity, metric, backend, segments, checksums
      v000001/segments/000000.npy, .parquet   float32 vectors and (id, title, text, metadata) per row
      v000001/ann.hnswlib | ann.faiss          the search structure; its labels are row numbers
      v000001/deleted.npy      tombstoned row numbers (when any)

Every change writes a complete new version (unchanged segment files are hard links, not copies), fsyncs
it, then points CURRENT at it. A process killed at any moment leaves CURRENT naming a complete version.
"""

from __future__ import annotations

import json
import logging
import os
import re
import shutil
import threading
import uuid
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from indexer.atomic import fsync_dir
from indexer.errors import ConfigError, DataError, IndexFormatError
from indexer.manifest import EncoderInfo, Manifest, Segment, describe_files, read_manifest, verify_files
from indexer.records import Document, RankedList
from indexer.topk import check_k
from indexer.vectors import (BackendConfig, FaissIndex, FlatIndex, HnswlibIndex, prepare)

logger = logging.getLogger(__name__)
_VERSION = re.compile(r"^v(\d{6})$")
EXACT_BELOW = 20_000  # filtered searches over at most this many allowed rows are exact


def _versions() -> dict[str, str]:
    from importlib.metadata import PackageNotFoundError, version

    out = {}
    for pkg in ("twostage", "numpy", "faiss-cpu", "hnswlib", "pyarrow"):
        try:
            out[pkg] = version(pkg)
        except PackageNotFoundError:
            pass
    return out


def current_version(root: Path) -> Path:
    pointer = root / "CURRENT"
    if not pointer.is_file():
        raise IndexFormatError(f"{root}: no CURRENT file; not an index directory (build one with `twostage index build`)")
    name = pointer.read_text(encoding="utf-8").strip()
    if not _VERSION.match(name) or not (root / name).is_dir():
        raise IndexFormatError(f"{pointer}: names {name!r}, which is not a version directory here; restore the index")
    return root / name


def write_segment(dir: Path, name: str, vectors: np.ndarray, docs: Sequence[Document]) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    (dir / "segments").mkdir(parents=True, exist_ok=True)
    np.save(dir / "segments" / f"{name}.npy", np.ascontiguousarray(vectors, dtype=np.float32), allow_pickle=False)
    table = pa.table({"id": [d.id for d in docs], "title": [d.title for d in docs], "text": [d.text for d in docs],
                      "metadata": [json.dumps(dict(d.metadata), sort_keys=True, default=str) for d in docs]})
    pq.write_table(table, dir / "segments" / f"{name}.parquet")


class Index:
    """A loaded index directory. Build with :func:`indexer.build.build_index`; open with :meth:`load`."""

    def __init__(self, root: Path, version_dir: Path, manifest: Manifest, encoder: Any = None) -> None:
        import pyarrow.parquet as pq

        self.root, self.version_dir, self.manifest = root, version_dir, manifest
        self._lock = threading.Lock()
        vectors = []
        for seg in manifest.segments:
            path = version_dir / "segments" / f"{seg.name}.npy"
            try:
                v = np.load(path, mmap_mode="r", allow_pickle=False)
            except (ValueError, OSError) as exc:
                raise IndexFormatError(f"{path}: not a readable .npy file ({exc}); restore or rebuild the index") from None
            if v.shape != (seg.rows, manifest.encoder.dim) or v.dtype != np.float32:
                raise IndexFormatError(f"{path}: shape {v.shape} {v.dtype}, the manifest says ({seg.rows}, "
                                       f"{manifest.encoder.dim}) float32; restore or rebuild the index")
            vectors.append(v)
        self._vectors = vectors
        ids: list[str] = []
        for seg in manifest.segments:
            path = version_dir / "segments" / f"{seg.name}.parquet"
            try:
                col = pq.read_table(path, columns=["id"]).column("id").to_pylist()
            except Exception as exc:  # noqa: BLE001 - pyarrow raises several types on a broken file
                raise IndexFormatError(f"{path}: not a readable parquet file ({str(exc)[:200]}); restore or rebuild") from None
            if len(col) != seg.rows:
                raise IndexFormatError(f"{path}: {len(col)} documents, the manifest says {seg.rows}")
            ids.extend(col)
        self.doc_ids = np.asarray(ids, dtype=object)
        self._row = {d: i for i, d in enumerate(ids)}
        self.deleted = np.zeros(len(ids), dtype=bool)
        if manifest.deleted:
            rows = np.load(version_dir / "deleted.npy", allow_pickle=False)
            if len(rows) != manifest.deleted or (len(rows) and (rows.min() < 0 or rows.max() >= len(ids))):
                raise IndexFormatError(f"{version_dir / 'deleted.npy'}: does not match the manifest; restore or rebuild")
            self.deleted[rows] = True
        self._live_row = {d: i for i, d in enumerate(ids) if not self.deleted[i]}
        self._ann = self._open_ann()
        self._docs: Any = None
        self._metadata: list[dict[str, Any]] | None = None
        self._stacked: np.ndarray | None = None
        self.encoder = None
        if encoder is not None:
            self.attach_encoder(encoder)

    # ---- opening ---------------------------------------------------------------------------
    @classmethod
    def load(cls, path: str | Path, *, encoder: Any = None, verify: bool = True) -> Index:
        """Open an index directory: manifest first, then every file's size (and sha256 when ``verify``)."""
        root = Path(path)
        if not root.is_dir():
            raise IndexFormatError(f"{root}: no such index directory")
        for attempt in range(3):
            version_dir = current_version(root)
            try:
                manifest = read_manifest(version_dir)
                verify_files(version_dir, manifest, checksums=verify)
                return cls(root, version_dir, manifest, encoder)
            except IndexFormatError:
                # a writer switched CURRENT and removed this version while we read it: read the new one
                if attempt == 2 or current_version(root) == version_dir:
                    raise
        raise AssertionError("unreachable")

    def _open_ann(self) -> Any:
        m, d = self.manifest, self.version_dir
        if m.backend == "flat":
            return None
        if m.backend == "hnswlib":
            return HnswlibIndex.load(d / "ann.hnswlib", m.metric, m.encoder.dim, m.rows)
        ann = FaissIndex.load(d / "ann.faiss", m.metric)
        if ann.index.ntotal != m.rows or ann.index.d != m.encoder.dim:
            raise IndexFormatError(f"{d / 'ann.faiss'}: {ann.index.ntotal} x {ann.index.d}, the manifest says "
                                   f"{m.rows} x {m.encoder.dim}; restore or rebuild the index")
        return ann

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
        return doc_id in self._live_row

    @property
    def dim(self) -> int:
        return self.manifest.encoder.dim

    def vectors(self) -> np.ndarray:
        """Every row's vector: the memory map itself with one segment, else the segments stacked once."""
        if len(self._vectors) == 1:
            return self._vectors[0]
        if self._stacked is None:
            self._stacked = np.vstack(self._vectors)
        return self._stacked

    def documents(self, ids: Iterable[str]) -> list[Document]:
        """The stored documents with these ids (live ones only; an unknown id is a KeyError naming it)."""
        import pyarrow.parquet as pq

        if self._docs is None:
            frames = [pq.read_table(self.version_dir / "segments" / f"{s.name}.parquet").to_pandas()
                      for s in self.manifest.segments]
            import pandas as pd

            self._docs = pd.concat(frames, ignore_index=True)
        out = []
        for doc_id in ids:
            row = self._live_row.get(doc_id)
            if row is None:
                raise KeyError(f"document id {doc_id!r} is not in the index")
            r = self._docs.iloc[row]
            out.append(Document(r["id"], r["text"], r["title"], json.loads(r["metadata"])))
        return out

    def _metadata_mask(self, where: Mapping[str, Any] | Callable[[Document], bool]) -> np.ndarray:
        if self._metadata is None:
            self.documents([])  # loads the store
            self._metadata = [json.loads(m) for m in self._docs["metadata"]]
        metas = self._metadata
        if callable(where):
            docs = [Document(i, t, ti, m) for i, t, ti, m in zip(self._docs["id"], self._docs["text"], self._docs["title"], metas)]
            return np.array([bool(where(d)) for d in docs])
        return np.array([all(m.get(k) == v for k, v in where.items()) for m in metas])

    def search(self, queries: str | Sequence[str] | np.ndarray, k: int = 10, *,
               where: Mapping[str, Any] | Callable[[Document], bool] | None = None,
               ef_search: int | None = None, nprobe: int | None = None) -> list[RankedList]:
        """The ``k`` best live documents for each query (texts need an attached encoder, or pass vectors).

        ``where`` keeps documents whose metadata has the given values (or for which a function is true).
        Scores are similarities: higher is better, whatever the backend's own convention.
        """
        k = check_k(k)
        if isinstance(queries, str):
            queries = [queries]
        if isinstance(queries, np.ndarray):
            vectors = queries
        else:
            if self.encoder is None:
                raise ConfigError("text queries need the index's encoder: Index.load(path, encoder=...) or attach_encoder")
            vectors = self.encoder.encode(list(queries), kind="query")
        q = prepare(vectors, self.manifest.metric, self.dim, "query vectors")
        allowed = ~self.deleted if where is None else (~self.deleted & self._metadata_mask(where))
        n_allowed = int(allowed.sum())
        if where is None and k > n_allowed:
            raise ConfigError(f"k={k} is larger than the index ({n_allowed} live documents)")
        params = dict(self.manifest.params)
        params.update({k_: v for k_, v in (("ef_search", ef_search), ("nprobe", nprobe)) if v is not None})
        excluded = len(allowed) - n_allowed
        if self._ann is None or (where is not None and n_allowed <= EXACT_BELOW):
            return self._exact(q, min(k, n_allowed), allowed)
        fetch = min(len(allowed), k + excluded)
        with self._lock:
            labels, scores = self._ann.search(q, fetch, params)
        out = []
        for i, (lab, sc) in enumerate(zip(labels, scores)):
            keep = (lab >= 0) & allowed[np.clip(lab, 0, None)]
            lab, sc = lab[keep], sc[keep]
            if len(lab) < min(k, n_allowed):  # the graph missed some: fall back to exact search for this query
                out.extend(self._exact(q[i:i + 1], min(k, n_allowed), allowed))
                continue
            order = np.lexsort((lab, -sc))[:k]
            out.append(RankedList(self.doc_ids[lab[order]], sc[order].astype(np.float32)))
        return out

    def _exact(self, q: np.ndarray, k: int, allowed: np.ndarray) -> list[RankedList]:
        rows = np.flatnonzero(allowed)
        if k == 0:
            return [RankedList(np.array([], dtype=object), np.array([], dtype=np.float32)) for _ in q]
        flat = FlatIndex(self.manifest.metric, np.asarray(self.vectors())[rows])
        labels, scores = flat.search(q, k, {})
        return [RankedList(self.doc_ids[rows[lab]], sc) for lab, sc in zip(labels, scores)]

    def info(self) -> dict[str, Any]:
        m = self.manifest
        return {"path": str(self.root), "version": self.version_dir.name, "documents": m.live, "rows": m.rows,
                "deleted": m.deleted, "dim": m.encoder.dim, "metric": m.metric, "backend": m.backend,
                "params": m.params, "encoder": m.encoder.__dict__, "segments": len(m.segments),
                "bytes": sum(f["bytes"] for f in m.files.values()), "versions": m.versions}

    # ---- writing ---------------------------------------------------------------------------
    def _commit(self, segments: list[Segment], new_segments: Mapping[str, tuple[np.ndarray, Sequence[Document]]],
                deleted: np.ndarray, ann: Any) -> Index:
        """Write a complete new version beside the current one and switch CURRENT to it."""
        version = commit_version(self.root, self.version_dir, segments, new_segments, deleted, ann, self.manifest.encoder,
                                 self.manifest.metric, self.manifest.backend, dict(self.manifest.params))
        return Index(self.root, version, read_manifest(version), self.encoder)

    def _encode_docs(self, docs: Sequence[Document], encoder: Any, batch_size: int) -> np.ndarray:
        enc = encoder or self.encoder
        if enc is None:
            raise ConfigError("adding documents needs the index's encoder (pass encoder= or attach_encoder)")
        if encoder is not None:
            self.attach_encoder(encoder)
        return enc.encode([d.full_text for d in docs], kind="document", batch_size=batch_size, allow_empty=True)

    def add(self, documents: Iterable[Document], *, encoder: Any = None, batch_size: int = 32) -> Index:
        """Append documents (new ids only) and return the updated index; the old version stays intact until then."""
        return self._add(documents, self.deleted, encoder, batch_size)

    def _add(self, documents: Iterable[Document], deleted: np.ndarray, encoder: Any, batch_size: int) -> Index:
        from indexer.corpus import iter_documents

        docs = list(iter_documents(documents))
        live = {d for d, r in self._row.items() if not deleted[r]}
        dup = next((d.id for d in docs if d.id in live), None)
        if dup is not None:
            raise DataError(f"document id {dup!r} is already in the index; use upsert to replace it")
        vectors = prepare(self._encode_docs(docs, encoder, batch_size), self.manifest.metric, self.dim, "document vectors")
        start = self.manifest.rows
        name = f"{len(self.manifest.segments):06d}-{uuid.uuid4().hex[:6]}"
        ann = self._ann_copy()
        if ann is not None:
            ann.add(vectors, np.arange(start, start + len(docs)))
        segments = [*self.manifest.segments, Segment(name, start, len(docs))]
        return self._commit(segments, {name: (vectors, docs)}, np.flatnonzero(deleted), ann)

    def delete(self, ids: Iterable[str]) -> Index:
        """Tombstone documents by id (an unknown or already deleted id is an error naming it)."""
        ids = list(ids)
        missing = [i for i in ids if i not in self._live_row]
        if missing:
            raise DataError(f"cannot delete {len(missing)} unknown id(s): {', '.join(map(repr, missing[:5]))}")
        deleted = self.deleted.copy()
        deleted[[self._live_row[i] for i in ids]] = True
        if not (~deleted).any():
            raise DataError("deleting every document would leave an empty index; build a new one instead")
        return self._commit(list(self.manifest.segments), {}, np.flatnonzero(deleted), self._ann_for_commit())

    def upsert(self, documents: Iterable[Document], *, encoder: Any = None, batch_size: int = 32) -> Index:
        """Replace documents with these ids (old rows are tombstoned) and add the new ones, in one version."""
        docs = list(documents)
        deleted = self.deleted.copy()
        deleted[[self._live_row[d.id] for d in docs if d.id in self._live_row]] = True
        return self._add(docs, deleted, encoder, batch_size)

    def compact(self) -> Index:
        """Rewrite the index without tombstoned rows, in one segment, rebuilding the ANN structure."""
        from indexer.build import ann_from_vectors

        live = np.flatnonzero(~self.deleted)
        vectors = np.asarray(self.vectors())[live]
        docs = self.documents(self.doc_ids[live])
        ann = ann_from_vectors(BackendConfig(self.manifest.backend, self.manifest.metric, self.manifest.params), vectors)
        name = f"{0:06d}-{uuid.uuid4().hex[:6]}"
        return self._commit([Segment(name, 0, len(live))], {name: (vectors, docs)}, np.array([], dtype=np.int64), ann)

    def _ann_copy(self) -> Any:
        """A writable copy of the ANN structure (the live one keeps serving readers)."""
        if self._ann is None:
            return None
        tmp = self.root / f".ann-copy-{uuid.uuid4().hex[:8]}"
        try:
            self._ann.save(tmp)
            m = self.manifest
            if m.backend == "hnswlib":
                return HnswlibIndex.load(tmp, m.metric, m.encoder.dim, m.rows)
            return FaissIndex.load(tmp, m.metric)
        finally:
            tmp.unlink(missing_ok=True)

    def _ann_for_commit(self) -> Any:
        return None if self._ann is None else _Unchanged(self.version_dir, self.manifest.backend)


class _Unchanged:
    """An ANN file carried over to the next version as a hard link."""

    def __init__(self, version_dir: Path, backend: str) -> None:
        self.path = version_dir / ("ann.hnswlib" if backend == "hnswlib" else "ann.faiss")

    def save(self, path: Path) -> None:
        _link_or_copy(self.path, path)


def _link_or_copy(src: Path, dst: Path) -> None:
    try:
        os.link(src, dst)
    except OSError:
        shutil.copy2(src, dst)


def commit_version(root: Path, previous: Path | None, segments: list[Segment],
                   new_segments: Mapping[str, tuple[np.ndarray, Sequence[Document]]], deleted: np.ndarray, ann: Any,
                   encoder: EncoderInfo, metric: str, backend: str, params: dict[str, Any]) -> Path:
    """Write version N+1 completely (hard-linking unchanged segments), fsync it, then switch CURRENT."""
    root.mkdir(parents=True, exist_ok=True)
    numbers = [int(m.group(1)) for p in root.iterdir() if (m := _VERSION.match(p.name))]
    name = f"v{max(numbers, default=0) + 1:06d}"
    tmp = root / f".{name}.tmp-{uuid.uuid4().hex[:8]}"
    (tmp / "segments").mkdir(parents=True)
    try:
        for seg in segments:
            if seg.name in new_segments:
                vectors, docs = new_segments[seg.name]
                write_segment(tmp, seg.name, vectors, docs)
            else:
                for ext in (".npy", ".parquet"):
                    _link_or_copy(previous / "segments" / f"{seg.name}{ext}", tmp / "segments" / f"{seg.name}{ext}")  # type: ignore[operator]
        files = [f"segments/{s.name}{ext}" for s in segments for ext in (".npy", ".parquet")]
        if ann is not None:
            ann_name = "ann.hnswlib" if backend == "hnswlib" else "ann.faiss"
            ann.save(tmp / ann_name)
            files.append(ann_name)
        if len(deleted):
            np.save(tmp / "deleted.npy", np.asarray(deleted, dtype=np.int64), allow_pickle=False)
            files.append("deleted.npy")
        manifest = Manifest(encoder, metric, backend, params, tuple(segments), int(len(deleted)),
                            describe_files(tmp, files), _versions())
        (tmp / "manifest.json").write_text(manifest.to_json(), encoding="utf-8")
        for dirpath, _, names in os.walk(tmp):
            for n in names:
                with open(os.path.join(dirpath, n), "rb") as fh:
                    os.fsync(fh.fileno())
            fsync_dir(Path(dirpath))
        os.rename(tmp, root / name)
        fsync_dir(root)
        pointer = root / f".CURRENT.tmp-{uuid.uuid4().hex[:8]}"
        with open(pointer, "w", encoding="utf-8") as fh:
            fh.write(name + "\n")
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(pointer, root / "CURRENT")
        fsync_dir(root)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    _collect_garbage(root, keep=name)
    return root / name


def _collect_garbage(root: Path, keep: str) -> None:
    """Remove old versions and leftovers of interrupted writes (never the version CURRENT names)."""
    for p in root.iterdir():
        if p.name in (keep, "CURRENT"):
            continue
        if _VERSION.match(p.name) or p.name.startswith((".v", ".CURRENT.tmp", ".ann-copy")):
            shutil.rmtree(p, ignore_errors=True) if p.is_dir() else p.unlink(missing_ok=True)
