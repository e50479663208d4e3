"""Sharded search: a corpus split into N index directories, queried together, results merged exactly.

Layout: ``SHARDS_DIR/shards.json`` lists the shard directories (each a normal index directory, loadable on
its own) in corpus order: shard 0 holds the first documents, shard 1 the next, and so on. A query is encoded
once, every shard returns its own top k, and :func:`merge_topk` (pure, no Ray) keeps the global top k, as
faiss's ``IndexShards`` does. Ties are broken by shard then by rank within the shard, which with contiguous
shards is corpus order: exact shards give exactly the single exact index's answer.

Shards are searched in this process (``ShardedIndex.open(..., ray=False)``) or by one Ray actor each
(``ray=True``; ``address`` joins an existing cluster).
"""

from __future__ import annotations

import itertools
import json
import logging
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from twostage.indexer.atomic import atomic_write_text
from twostage.indexer.corpus import CorpusSource, iter_documents
from twostage.indexer.errors import ConfigError, DataNotFoundError, IndexFormatError
from twostage.indexer.manifest import check_file_name, manifest_text, read_manifest_json
from twostage.indexer.records import Document, RankedList
from twostage.indexer.topk import check_k

logger = logging.getLogger(__name__)

MANIFEST = "shards.json"
FORMAT, FORMAT_VERSION = "twostage.shards", 1


def merge_topk(results: Sequence[RankedList], k: int) -> RankedList:
    """The global top ``k`` of per-shard results (each best first). Ties: earlier shard, then better rank."""
    k = check_k(k)
    results = [r for r in results if len(r)]
    if not results:
        return RankedList(np.array([], dtype=object), np.array([], dtype=np.float32))
    ids = np.concatenate([np.asarray(r.ids, dtype=object) for r in results])
    scores = np.concatenate([np.asarray(r.scores, dtype=np.float32) for r in results])
    shard = np.concatenate([np.full(len(r), i) for i, r in enumerate(results)])
    rank = np.concatenate([np.arange(len(r)) for r in results])
    order = np.lexsort((rank, shard, -scores))[:k]
    return RankedList(ids[order], scores[order])


def contiguous_bounds(n: int, shards: int) -> list[tuple[int, int]]:
    """The (start, stop) rows of ``shards`` contiguous slices of ``n`` rows, of nearly equal size, in order."""
    if shards <= 0:
        raise ConfigError(f"the number of shards must be positive, got {shards}")
    if shards > n:
        raise ConfigError(f"{shards} shards for {n} documents: use at most one shard per document")
    bounds = np.linspace(0, n, shards + 1).round().astype(int)
    return [(int(a), int(b)) for a, b in itertools.pairwise(bounds)]


def split_contiguous(documents: Sequence[Document], shards: int) -> list[list[Document]]:
    """``shards`` contiguous slices of nearly equal size, in corpus order."""
    return [list(documents[a:b]) for a, b in contiguous_bounds(len(documents), shards)]


def build_shards(corpus: CorpusSource, encoder: Any, out: str | Path, shards: int, *, backend: Any = "flat",
                 batch_size: int = 32, show_progress: bool = False) -> Path:
    """Build ``shards`` index directories under ``out`` (one process; see retriever.distributed for Ray)."""
    from twostage.indexer.build import build_index

    out = Path(out)
    docs = list(iter_documents(corpus))
    names = []
    for i, part in enumerate(split_contiguous(docs, shards)):
        name = f"shard-{i:03d}"
        build_index(part, encoder, out / name, backend=backend, batch_size=batch_size, show_progress=show_progress)
        names.append(name)
    write_manifest(out, names)
    return out


def write_manifest(out: Path, names: Sequence[str]) -> None:
    """``shards.json`` in the common manifest shape; it lists no files of its own (each shard directory checks its
    own files when opened)."""
    atomic_write_text(out / MANIFEST, manifest_text(FORMAT, FORMAT_VERSION, {}, shards=list(names)))


def shard_paths(path: str | Path) -> list[Path]:
    """The shard directories ``shards.json`` lists, in order, each checked to be an index directory."""
    path = Path(path)
    f = path / MANIFEST
    if not f.is_file():
        raise DataNotFoundError(f"{path}: no {MANIFEST}; build shards with `twostage index shard`")
    try:
        raw = json.loads(f.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError):
        raise IndexFormatError(f"{f}: not a shards manifest; rebuild with `twostage index shard`") from None
    legacy = isinstance(raw, dict) and raw.get("format") == "twostage-shards/1"  # written before the common header
    data = raw if legacy else read_manifest_json(path, FORMAT, FORMAT_VERSION, "a shards directory",
                                                 "`twostage index shard`", name=MANIFEST)
    names = data.get("shards")
    if not isinstance(names, list) or not names or not all(isinstance(n, str) for n in names):
        raise IndexFormatError(f"{f}: shards must be a non-empty list of directory names; rebuild the shards")
    for name in names:
        check_file_name(name, f)
    missing = [n for n in names if not (path / n / "CURRENT").is_file()]
    if missing:
        raise IndexFormatError(f"{path}: shard(s) {', '.join(missing)} listed in {MANIFEST} are not index directories")
    return [path / n for n in names]


class _LocalShard:
    def __init__(self, path: str) -> None:
        from twostage.indexer.index import Index

        self.index = Index.load(path)

    def search(self, vectors: np.ndarray, k: int, kw: dict[str, Any]) -> list[tuple[list[str], list[float]]]:
        out = self.index.search_batch(vectors, k, **kw)  # a shard may hold fewer than k
        return [([str(i) for i in r.ids], [float(s) for s in r.scores]) for r in out]

    def documents(self, ids: Sequence[str]) -> list[Document]:
        return self.index.documents([i for i in ids if i in self.index])

    def size(self) -> int:
        return len(self.index)


class ShardedIndex:
    """Shards searched together; ``search(query, k)`` returns one :class:`RankedList` (a first stage)."""

    def __init__(self, shards: list[Any], encoder: Any, *, remote: bool, ray: Any = None) -> None:
        self._shards, self.encoder, self.remote, self._ray = shards, encoder, remote, ray
        self._size = sum(self._call("size"))

    @classmethod
    def open(cls, path: str | Path, encoder: Any, *, ray: bool = False, address: str | None = None,
             num_cpus: int | None = None, cpus_per_shard: float | None = None) -> ShardedIndex:
        """Open the shards at ``path``; with ``ray``, one actor per shard holding ``cpus_per_shard`` CPUs (default:
        one, or an equal share of the cluster when it has fewer CPUs than shards, so every actor can start)."""
        paths = shard_paths(path)
        if not ray:
            return cls([_LocalShard(str(p)) for p in paths], encoder, remote=False)
        from twostage.indexer.ray_util import connect

        ray_mod = connect(address, num_cpus)
        cluster_cpus = float(ray_mod.cluster_resources().get("CPU", 1.0))
        if cpus_per_shard is None:
            cpus_per_shard = min(1.0, cluster_cpus / len(paths))
        if cpus_per_shard * len(paths) > cluster_cpus:
            raise ConfigError(f"{len(paths)} shard actors x {cpus_per_shard} CPUs need more than the cluster's "
                              f"{cluster_cpus:g} CPUs: they would wait forever; lower cpus_per_shard")
        actor = ray_mod.remote(num_cpus=cpus_per_shard)(_LocalShard)
        shards = [actor.remote(str(p.resolve())) for p in paths]
        return cls(shards, encoder, remote=True, ray=ray_mod)

    def __len__(self) -> int:
        return self._size

    def _call(self, method: str, *args: Any) -> list[Any]:
        if self.remote:
            return self._ray.get([getattr(s, method).remote(*args) for s in self._shards])
        return [getattr(s, method)(*args) for s in self._shards]

    def search_vectors(self, vectors: np.ndarray, k: int = 10, **kw: Any) -> list[RankedList]:
        k = check_k(k)  # more than the shards hold returns them all, as every retriever does
        per_shard = self._call("search", np.ascontiguousarray(vectors, dtype=np.float32), k, kw)
        return [merge_topk([RankedList(np.array(ids, dtype=object), np.array(s, dtype=np.float32))
                            for ids, s in (shard[q] for shard in per_shard)], k) for q in range(len(vectors))]

    def search(self, query: str, k: int = 10, **kw: Any) -> RankedList:
        if self.encoder is None:
            raise ConfigError("this sharded index has no encoder: pass one to ShardedIndex.open")
        return self.search_batch([query], k, **kw)[0]

    def search_batch(self, queries: Sequence[str], k: int = 10, **kw: Any) -> list[RankedList]:
        if self.encoder is None:
            raise ConfigError("this sharded index has no encoder: pass one to ShardedIndex.open")
        return self.search_vectors(self.encoder.encode(list(queries), kind="query"), k, **kw)

    def documents(self, ids: Sequence[str]) -> list[Document]:
        found = {d.id: d for part in self._call("documents", list(ids)) for d in part}
        return [found[i] for i in ids if i in found]

    def text(self, doc_id: str) -> str:
        docs = self.documents([doc_id])
        if not docs:
            raise KeyError(doc_id)
        return docs[0].full_text

    def close(self) -> None:
        if self.remote:
            for s in self._shards:
                self._ray.kill(s)
            self._shards = []
