"""Vector search structures behind one interface. Labels are row numbers; scores are higher-is-better.

Backends (by name): ``flat`` (exact, numpy), ``faiss-flat``, ``faiss-hnsw``, ``faiss-ivf``, ``faiss-ivfpq``,
``hnswlib``, and the compressed ones, whose codes stand in memory for the candidate search while the float32
vectors stay memory-mapped on disk and are read only to rescore each query's top ``rescore x k`` candidates
exactly (``Index.search``): ``faiss-hnsw-sq8`` and ``faiss-ivf-sq8`` (int8 scalar codes, 1 byte a dimension),
``faiss-binary`` (the signs, 1 bit a dimension, searched by Hamming distance in an HNSW graph) and
``faiss-ivfpq`` (product codes). Metrics: ``cosine`` (vectors L2-normalised, then inner product), ``ip`` (inner product),
``l2`` (the score is the negated squared Euclidean distance). Files are the libraries' own binary formats
(faiss ``write_index``, hnswlib ``save_index``) or ``.npy``, never pickle.
"""

from __future__ import annotations

import math
import struct
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import numpy as np

from twostage.indexer.errors import ConfigError, IndexFormatError
from twostage.indexer.records import top_k

BACKENDS = ("flat", "faiss-flat", "faiss-hnsw", "faiss-ivf", "faiss-ivfpq", "hnswlib", "faiss-hnsw-sq8",
            "faiss-ivf-sq8", "faiss-binary")
# candidates rescored with the exact vectors, as a multiple of k (benchmarks/results/scale.md)
RESCORE = {"faiss-ivfpq": 10, "faiss-hnsw-sq8": 3, "faiss-ivf-sq8": 3, "faiss-binary": 10}
METRICS = ("cosine", "ip", "l2")


@dataclass(frozen=True)
class BackendConfig:
    """A backend and its parameters (those unset get defaults from the corpus size)."""

    name: str = "hnswlib"
    metric: str = "cosine"
    params: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.name not in BACKENDS:
            raise ConfigError(f"unknown backend {self.name!r}; use one of {', '.join(BACKENDS)}")
        if self.metric not in METRICS:
            raise ConfigError(f"unknown metric {self.metric!r}; use one of {', '.join(METRICS)}")


def default_params(name: str, n: int, dim: int) -> dict[str, Any]:
    """Sensible parameters for ``n`` vectors of ``dim`` dimensions."""
    rescore = {"rescore": RESCORE[name]} if name in RESCORE else {}
    if name in ("faiss-hnsw", "hnswlib", "faiss-hnsw-sq8", "faiss-binary"):
        # measured: recall@10 0.98 on 1M x 384 (benchmarks/results/ann-synthetic.md)
        return {"M": 32 if name == "faiss-binary" else 16, "ef_construction": 100, "ef_search": 256, **rescore}
    if name in ("faiss-ivf", "faiss-ivfpq", "faiss-ivf-sq8"):
        nlist = int(max(1, min(65536, 2 * math.sqrt(max(n, 1)))))
        p: dict[str, Any] = {"nlist": nlist, "nprobe": max(1, min(nlist, 32)), **rescore}
        if name == "faiss-ivfpq":  # 8 dimensions per sub-quantizer: 48 bytes for 384-d vectors
            m = next(m for m in (dim // 8, dim // 4, dim // 2, 1) if m >= 1 and dim % m == 0)
            p.update(pq_m=m, pq_bits=int(min(8, max(1, math.log2(max(n, 2))))))  # PQ trains 2**bits centroids
        return p
    return {}


def prepare(vectors: np.ndarray, metric: str, dim: int | None = None, what: str = "vectors") -> np.ndarray:
    """float32, C-contiguous, finite, of the right width; normalised for the cosine metric."""
    v = np.ascontiguousarray(np.asarray(vectors, dtype=np.float32))
    if v.ndim != 2:
        raise ConfigError(f"{what} must be a 2-D array (n, dim), got shape {v.shape}")
    if dim is not None and v.shape[1] != dim:
        raise ConfigError(f"{what} have dimension {v.shape[1]} but the index has {dim}; use the index's encoder")
    bad = ~np.isfinite(v).all(axis=1)
    if bad.any():
        raise ConfigError(f"{what} row {int(np.flatnonzero(bad)[0])} has NaN or infinite values")
    if metric == "cosine":
        norms = np.linalg.norm(v, axis=1, keepdims=True)
        if (norms == 0).any():
            raise ConfigError(f"{what} row {int(np.flatnonzero(norms[:, 0] == 0)[0])} is all zeros; cosine needs a direction")
        v = v / norms
    return v


class VectorIndex(Protocol):
    """What the index directory needs from a search structure."""

    def add(self, vectors: np.ndarray, labels: np.ndarray) -> None: ...
    def search(self, queries: np.ndarray, k: int, params: dict[str, Any]) -> tuple[np.ndarray, np.ndarray]: ...
    def save(self, path: Path) -> None: ...


def similarity(queries: np.ndarray, vectors: np.ndarray, metric: str) -> np.ndarray:
    """(queries, vectors) scores, higher is better: the inner product, or -|q - v|^2 for ``l2``.

    Each score is the same bits whatever else is in the matrices: numpy's einsum computes every dot product on its
    own, where BLAS rounds a row differently by its place in the matrix and the number of queries (1 ulp; measured:
    a 102-row slice and the 205-row whole, one query and a batch). Exact search then gives one engine's answer in
    every shard and one query's answer in every batch. The price: a batch does not share reads of the vectors
    (32 queries x 200k x 384: 0.53 s against BLAS's 0.07 s on 2 cores; one query costs the same, 17 ms).
    """
    scores = np.einsum("qd,nd->qn", queries, vectors)
    if metric == "l2":  # -|q - v|^2 = 2 q.v - |q|^2 - |v|^2
        scores = 2 * scores - np.sum(queries**2, 1)[:, None] - np.sum(vectors**2, 1)[None]
    return scores


class FlatIndex:
    """Exact search with numpy over an (optionally memory-mapped) matrix; labels are its rows."""

    def __init__(self, metric: str, vectors: np.ndarray | None = None, dim: int = 0) -> None:
        self.metric = metric
        self.vectors = vectors if vectors is not None else np.empty((0, dim), dtype=np.float32)

    def add(self, vectors: np.ndarray, labels: np.ndarray) -> None:
        if len(labels) and labels[0] != len(self.vectors):
            raise ConfigError("the flat index adds rows in order")
        self.vectors = np.vstack([np.asarray(self.vectors), vectors])

    def search(self, queries: np.ndarray, k: int, params: dict[str, Any]) -> tuple[np.ndarray, np.ndarray]:
        scores = similarity(queries, np.asarray(self.vectors), self.metric)
        k = min(k, scores.shape[1])
        labels = np.empty((len(queries), k), dtype=np.int64)
        out = np.empty((len(queries), k), dtype=np.float32)
        for i, row in enumerate(scores):
            labels[i], out[i] = top_k(row, k)
        return labels, out

    def save(self, path: Path) -> None:  # the embeddings file is the index
        pass


class FaissIndex:
    def __init__(self, index: Any, metric: str) -> None:
        self.index, self.metric = index, metric

    @classmethod
    def create(cls, name: str, metric: str, dim: int, params: dict[str, Any], train: np.ndarray) -> FaissIndex:
        import faiss

        fm = faiss.METRIC_L2 if metric == "l2" else faiss.METRIC_INNER_PRODUCT
        if name == "faiss-flat":
            spec = "Flat"
        elif name == "faiss-hnsw":
            spec = f"HNSW{int(params['M'])},Flat"
        elif name == "faiss-ivf":
            spec = f"IVF{int(params['nlist'])},Flat"
        elif name == "faiss-hnsw-sq8":
            spec = f"HNSW{int(params['M'])},SQ8"
        elif name == "faiss-ivf-sq8":
            spec = f"IVF{int(params['nlist'])},SQ8"
        else:
            spec = f"IVF{int(params['nlist'])},PQ{int(params['pq_m'])}x{int(params['pq_bits'])}"
        index = faiss.index_factory(dim, spec, fm)
        if name in ("faiss-hnsw", "faiss-hnsw-sq8"):
            index.hnsw.efConstruction = int(params["ef_construction"])
        if not index.is_trained:  # IVF lists, PQ and SQ8 codebooks
            if len(train) < int(params.get("nlist", 1)):
                raise ConfigError(f"{name} needs at least nlist={params['nlist']} vectors to train, got {len(train)}")
            index.train(train)
        return cls(faiss.IndexIDMap2(index), metric)

    def add(self, vectors: np.ndarray, labels: np.ndarray) -> None:
        self.index.add_with_ids(vectors, labels.astype(np.int64))

    def search(self, queries: np.ndarray, k: int, params: dict[str, Any]) -> tuple[np.ndarray, np.ndarray]:
        import faiss

        inner = faiss.downcast_index(self.index.index)
        if hasattr(inner, "hnsw"):
            inner.hnsw.efSearch = max(int(params.get("ef_search", 128)), k)
        if hasattr(inner, "nprobe"):
            inner.nprobe = int(params.get("nprobe", 32))
        scores, labels = self.index.search(queries, k)
        if self.metric == "l2":
            scores = -scores
        return labels, scores

    def save(self, path: Path) -> None:
        import faiss

        faiss.write_index(self.index, str(path))

    @classmethod
    def load(cls, path: Path, metric: str, dim: int | None = None, count: int | None = None) -> FaissIndex:
        import faiss

        if dim is not None and count is not None:
            check_faiss_header(path, dim, count)
        try:
            return cls(faiss.read_index(str(path)), metric)
        except RuntimeError as exc:
            raise IndexFormatError(f"{path}: faiss cannot read it ({str(exc).splitlines()[0][:200]}); rebuild the index") from None


class BinaryIndex:
    """Sign bits (1 bit a dimension) in a faiss binary HNSW graph; the score is minus the Hamming distance, a
    coarse stand-in that the index rescores with the exact vectors."""

    def __init__(self, index: Any) -> None:
        self.index = index

    @classmethod
    def create(cls, dim: int, params: dict[str, Any]) -> BinaryIndex:
        import faiss

        if dim % 8:
            raise ConfigError(f"faiss-binary needs a dimension divisible by 8, got {dim}")
        inner = faiss.IndexBinaryHNSW(dim, int(params["M"]))
        inner.hnsw.efConstruction = int(params["ef_construction"])
        return cls(faiss.IndexBinaryIDMap2(inner))

    @staticmethod
    def codes(vectors: np.ndarray) -> np.ndarray:
        return np.packbits(np.asarray(vectors) > 0, axis=1)

    def add(self, vectors: np.ndarray, labels: np.ndarray) -> None:
        self.index.add_with_ids(self.codes(vectors), labels.astype(np.int64))

    def search(self, queries: np.ndarray, k: int, params: dict[str, Any]) -> tuple[np.ndarray, np.ndarray]:
        import faiss

        faiss.downcast_IndexBinary(self.index.index).hnsw.efSearch = max(int(params.get("ef_search", 128)), k)
        dist, labels = self.index.search(self.codes(queries), k)
        return labels, -dist.astype(np.float32)

    def save(self, path: Path) -> None:
        import faiss

        faiss.write_index_binary(self.index, str(path))

    @classmethod
    def load(cls, path: Path, dim: int, count: int) -> BinaryIndex:
        import faiss

        check_faiss_header(path, dim, count, binary=True)
        try:
            return cls(faiss.read_index_binary(str(path)))
        except RuntimeError as exc:
            raise IndexFormatError(f"{path}: faiss cannot read it ({str(exc).splitlines()[0][:200]}); rebuild the index") from None


class HnswlibIndex:
    def __init__(self, index: Any, metric: str, build_threads: int = 0, search_threads: int = 1) -> None:
        self.index, self.metric = index, metric
        self.build_threads, self.search_threads = build_threads, search_threads

    @classmethod
    def create(cls, metric: str, dim: int, params: dict[str, Any], capacity: int) -> HnswlibIndex:
        import hnswlib

        index = hnswlib.Index(space="l2" if metric == "l2" else "ip", dim=dim)
        index.init_index(max_elements=max(capacity, 1), M=int(params["M"]), ef_construction=int(params["ef_construction"]),
                         random_seed=int(params.get("seed", 100)), allow_replace_deleted=False)
        return cls(index, metric, int(params.get("build_threads", 0)), int(params.get("search_threads", 1)))

    def add(self, vectors: np.ndarray, labels: np.ndarray) -> None:
        need = self.index.get_current_count() + len(vectors)
        if need > self.index.get_max_elements():
            self.index.resize_index(max(need, int(self.index.get_max_elements() * 1.5)))
        # one thread gives the same graph every time; big builds use every core (param build_threads)
        threads = int(self.build_threads) if self.build_threads else (1 if need < 50_000 else -1)
        self.index.add_items(vectors, labels.astype(np.int64), num_threads=threads)

    def search(self, queries: np.ndarray, k: int, params: dict[str, Any]) -> tuple[np.ndarray, np.ndarray]:
        self.index.set_ef(max(int(params.get("ef_search", 128)), k))
        k = min(k, self.index.get_current_count())
        try:
            threads = int(params.get("search_threads", self.search_threads))
            labels, dist = self.index.knn_query(queries, k=k, num_threads=threads)
        except RuntimeError:  # the graph cannot return k results (k close to the count): callers go exact
            return np.empty((len(queries), 0), dtype=np.int64), np.empty((len(queries), 0), dtype=np.float32)
        scores = -dist if self.metric == "l2" else 1.0 - dist
        return labels.astype(np.int64), scores.astype(np.float32)

    def save(self, path: Path) -> None:
        self.index.save_index(str(path))

    @classmethod
    def load(cls, path: Path, metric: str, dim: int, count: int) -> HnswlibIndex:
        import hnswlib

        check_hnswlib_file(path, dim, count)  # hnswlib trusts its file: a crafted one could crash the process
        index = hnswlib.Index(space="l2" if metric == "l2" else "ip", dim=dim)
        try:
            index.load_index(str(path), max_elements=max(count, 1))
        except (RuntimeError, ValueError) as exc:
            raise IndexFormatError(f"{path}: hnswlib cannot read it ({exc}); rebuild the index") from None
        if index.get_current_count() != count:
            raise IndexFormatError(f"{path}: holds {index.get_current_count()} vectors, the manifest says {count}")
        return cls(index, metric)


def check_faiss_header(path: Path, dim: int, count: int, binary: bool = False) -> None:
    """The faiss file is the IDMap2 index this library writes, of the manifest's dimension and count (checked
    before faiss reads it; faiss checks the rest of its format itself and raises)."""
    size, magic = (20, b"IBM2") if binary else (16, b"IxM2")  # binary: d in bits, code size, count
    try:
        with open(path, "rb") as fh:
            head = fh.read(size)
    except OSError as exc:
        raise IndexFormatError(f"{path}: cannot be read ({exc.strerror}); restore or rebuild the index") from None
    if len(head) < size or head[:4] != magic:
        raise IndexFormatError(f"{path}: not a faiss {'binary ' if binary else ''}IDMap2 index file; restore or "
                               "rebuild the index")
    d, n = struct.unpack("<iq", head[4:8] + head[size - 8:size])
    if binary and struct.unpack("<i", head[8:12])[0] * 8 != d:
        raise IndexFormatError(f"{path}: a binary faiss index whose code size does not match its dimension")
    if d != dim or n != count:
        raise IndexFormatError(f"{path}: a faiss index of {n} x {d} vectors, the manifest says {count} x {dim}; "
                               "restore or rebuild the index")


_READS = {"hnswlib": "hnswlib>=0.8", "faiss": "faiss-cpu>=1.8"}  # module -> the distribution whose files are checked


def module_provider(module: str) -> str:
    """The installed distribution whose file ``import module`` loads, with its version ("chroma-hnswlib 0.7.6");
    every distribution that claims the module when none owns that file; the module's name when none claims it."""
    import importlib
    from importlib import metadata

    names = sorted(set(metadata.packages_distributions().get(module, [])))
    where = getattr(importlib.import_module(module), "__file__", None)
    loaded = Path(where).resolve() if where else None
    for name in names:
        dist = metadata.distribution(name)
        if loaded and any(Path(str(dist.locate_file(f))).resolve() == loaded for f in dist.files or ()):
            return f"{name} {dist.version}"
    return ", ".join(f"{n} {metadata.version(n)}" for n in names) or module


def verify_saved(ann: Any, path: Path, dim: int, count: int) -> None:
    """Read back the header of an ANN file just written. With little space left, a file that does not read back is
    a short write (an ENOSPC OSError, as the disk's own); with room to spare, the installed library wrote a layout
    this module does not check (another build, e.g. chroma-hnswlib installed as ``hnswlib``): a ConfigError naming
    it and what to install."""
    import shutil

    try:
        if isinstance(ann, HnswlibIndex):
            check_hnswlib_file(path, dim, count)
        elif isinstance(ann, (FaissIndex, BinaryIndex)):
            check_faiss_header(path, dim, count, binary=isinstance(ann, BinaryIndex))
    except IndexFormatError:
        module = "hnswlib" if isinstance(ann, HnswlibIndex) else "faiss"
        if shutil.disk_usage(path.parent).free < 64 * 2**20:
            raise OSError(28, "the ANN file was not written completely (is the disk full?)", str(path)) from None
        raise ConfigError(f"{path}: the installed {module} ({module_provider(module)}) wrote an index file that "
                          f"does not read back in the format twostage checks and loads; install "
                          f"'{_READS[module]}' in its place, or choose another --backend (nothing was committed)"
                          ) from None


_CHECK_ROWS = 65_536  # rows of an hnswlib file's level 0 checked at a time
_HNSW_HEADER = struct.Struct("<QQQQQQiIQQQdQ")  # hnswlib's saveIndex: offsets, counts, sizes, levels, M, mult, ef


def check_hnswlib_file(path: Path, dim: int, count: int) -> None:
    """Check an ``ann.hnswlib`` file completely before hnswlib reads it: the header against the manifest's
    dimension and count, every size, and every neighbour id and label in range. Raises IndexFormatError."""

    def bad(what: str) -> IndexFormatError:
        return IndexFormatError(f"{path}: not a valid hnswlib index for {count} x {dim} vectors ({what}); "
                                "restore or rebuild the index")

    try:
        size = path.stat().st_size
        with open(path, "rb") as fh:
            head = fh.read(_HNSW_HEADER.size)
    except OSError as exc:
        raise IndexFormatError(f"{path}: cannot be read ({exc.strerror}); restore or rebuild the index") from None
    if len(head) < _HNSW_HEADER.size:
        raise bad("shorter than its header")
    (offset0, max_elements, cur, per_element, label_offset, offset_data, max_level, entry, max_m, max_m0, m, _mult,
     _ef) = _HNSW_HEADER.unpack(head)
    links0 = max_m0 * 4 + 4
    if offset0 != 0 or cur != count or max_elements < cur:
        raise bad(f"it holds {cur} vectors")
    if not 2 <= m <= 4096 or max_m != m or max_m0 != 2 * m:
        raise bad(f"M={m}, maxM={max_m}, maxM0={max_m0}")
    if offset_data != links0 or label_offset != links0 + 4 * dim or per_element != links0 + 4 * dim + 8:
        raise bad("element layout does not match the dimension")
    if count and (not 0 <= max_level < 64 or entry >= count):
        raise bad(f"top level {max_level}, entry point {entry}")
    body = _HNSW_HEADER.size + count * per_element
    if size < body + 4 * count:
        raise bad(f"{size} bytes, too short")
    if count:
        level0 = np.memmap(path, dtype=np.uint8, mode="r", offset=_HNSW_HEADER.size, shape=(count, per_element))
        for start in range(0, count, _CHECK_ROWS):  # in slices: the check's copies stay bounded
            rows = level0[start:start + _CHECK_ROWS]
            links = np.ascontiguousarray(rows[:, :links0]).view(np.uint32)
            n_links = links[:, 0] & 0xFFFF
            if n_links.max() > max_m0:
                raise bad("a neighbour list is longer than maxM0")
            used = np.arange(max_m0)[None, :] < n_links[:, None]
            if (links[:, 1:][used] >= count).any():
                raise bad("a neighbour id is out of range")
            labels = np.ascontiguousarray(rows[:, label_offset:label_offset + 8]).view(np.int64)
            if labels.min() < 0 or labels.max() >= count:
                raise bad("a label is not a row number")
        del level0, rows
    if (size - body) % 4:
        raise bad("the upper levels are truncated")
    tail = np.memmap(path, dtype=np.uint32, mode="r", offset=body, shape=((size - body) // 4,)) \
        if size > body else np.zeros(0, dtype=np.uint32)
    per_level = (max_m + 1)
    at = 0
    for _ in range(count):
        if at >= len(tail):
            raise bad("the upper levels are truncated")
        words = int(tail[at])
        at += 1
        if words:
            if words % (4 * per_level) or words // (4 * per_level) > max_level or at + words // 4 > len(tail):
                raise bad("an element's upper levels do not fit the header")
            lists = np.asarray(tail[at:at + words // 4]).reshape(-1, per_level)
            if len(lists) * per_level * 4 != words:
                raise bad("the upper levels are truncated")
            n = lists[:, 0] & 0xFFFF
            if n.max() > max_m or (lists[:, 1:][np.arange(max_m)[None, :] < n[:, None]] >= count).any():
                raise bad("an upper-level neighbour list is out of range")
            at += words // 4
    if at != len(tail):
        raise bad(f"{(len(tail) - at) * 4} bytes after the last element")


def ann_from_vectors(backend: BackendConfig, vectors: np.ndarray | list[np.ndarray], batch: int = 65536) -> Any:
    """Build the ANN structure of ``backend`` over ``vectors`` (labels = row numbers), in slices. ``vectors`` may
    be a list of (memory-mapped) parts, the rows of one after the other's."""
    parts = vectors if isinstance(vectors, list) else [vectors]
    n, dim = sum(len(p) for p in parts), parts[0].shape[1]
    params = {**default_params(backend.name, n, dim), **backend.params}
    if backend.name == "flat":
        return None
    if backend.name == "hnswlib":
        ann: Any = HnswlibIndex.create(backend.metric, dim, params, n)
    elif backend.name == "faiss-binary":
        ann = BinaryIndex.create(dim, params)
    else:
        # k-means needs ~40-64 points per list; more only costs time
        rows = np.linspace(0, n - 1, min(n, max(64 * int(params.get("nlist", 1)), 4096))).astype(int)
        starts = np.cumsum([0, *(len(p) for p in parts)])
        part = np.searchsorted(starts, rows, side="right") - 1
        sample = np.concatenate([np.asarray(parts[i][rows[part == i] - starts[i]]) for i in np.unique(part)])
        ann = FaissIndex.create(backend.name, backend.metric, dim, params, sample)
    offset = 0
    for part in parts:
        for start in range(0, len(part), batch):
            stop = min(len(part), start + batch)
            ann.add(np.ascontiguousarray(part[start:stop]), np.arange(offset + start, offset + stop))
        offset += len(part)
    return ann


def open_ann(path: Path, backend: str, metric: str, dim: int, count: int) -> Any:
    """Load the ANN file of ``backend`` (checked against the manifest's dimension and count first)."""
    if backend == "hnswlib":
        return HnswlibIndex.load(path, metric, dim, count)
    if backend == "faiss-binary":
        return BinaryIndex.load(path, dim, count)
    ann = FaissIndex.load(path, metric, dim, count)
    if ann.index.ntotal != count or ann.index.d != dim:
        raise IndexFormatError(f"{path}: {ann.index.ntotal} x {ann.index.d}, the manifest says {count} x {dim}; "
                               "restore or rebuild the index")
    return ann


def ann_file(backend: str) -> str:
    """The ANN structure's file name in a version directory."""
    return "ann.hnswlib" if backend == "hnswlib" else "ann.faiss"
