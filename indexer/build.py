"""Building an index directory from a corpus and an encoder, in chunks, resumable.

Documents are read as a stream and encoded ``chunk_size`` at a time; each chunk's vectors (``.npy``) and
documents (``.parquet``) are written to ``.INDEX_DIR.build/`` as soon as they are done, so memory stays
bounded and a killed build resumes from the chunks already encoded. The chunks are then copied into one
memory-mapped segment, the ANN structure is built from it, and the version is committed atomically.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import shutil
from collections.abc import Iterator
from dataclasses import asdict, replace
from pathlib import Path
from typing import Any

import numpy as np

from indexer.corpus import CorpusSource, iter_documents
from indexer.errors import ConfigError, DataError
from indexer.index import Index, commit_version, write_segment
from indexer.manifest import EncoderInfo, Segment, read_manifest
from indexer.records import Document
from indexer.vectors import BackendConfig, FaissIndex, HnswlibIndex, default_params, prepare

logger = logging.getLogger(__name__)


def _chunks(source: CorpusSource, size: int) -> Iterator[list[Document]]:
    chunk: list[Document] = []
    for doc in iter_documents(source):
        chunk.append(doc)
        if len(chunk) == size:
            yield chunk
            chunk = []
    if chunk:
        yield chunk


def _ids_hash(docs: list[Document]) -> str:
    return hashlib.sha256("\n".join(d.id for d in docs).encode()).hexdigest()


def ann_from_vectors(backend: BackendConfig, vectors: np.ndarray, batch: int = 65536) -> Any:
    """Build the ANN structure of ``backend`` over ``vectors`` (labels = row numbers), in slices."""
    n, dim = vectors.shape
    params = {**default_params(backend.name, n, dim), **backend.params}
    if backend.name == "flat":
        return None
    if backend.name == "hnswlib":
        ann: Any = HnswlibIndex.create(backend.metric, dim, params, n)
    else:
        # k-means needs ~40-64 points per list; more only costs time
        sample = np.asarray(vectors[np.linspace(0, n - 1, min(n, max(64 * int(params.get("nlist", 1)), 4096))).astype(int)])
        ann = FaissIndex.create(backend.name, backend.metric, dim, params, sample)
    for start in range(0, n, batch):
        ann.add(np.ascontiguousarray(vectors[start:start + batch]), np.arange(start, min(n, start + batch)))
    return ann


def start_build(out: Path, plan: dict[str, Any], resume: bool) -> tuple[Path, list[dict[str, Any]]]:
    """The work directory ``.OUT.build/`` and the chunks already written for the same ``plan``."""
    work = out.parent / f".{out.name}.build"
    state_path = work / "state.json"
    done: list[dict[str, Any]] = []
    if resume and state_path.is_file():
        saved = json.loads(state_path.read_text())
        if saved.get("plan") == plan:
            done = saved["chunks"]
            logger.info("resuming the build of %s: %d chunks already encoded", out, len(done))
    else:
        shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True, exist_ok=True)
    return work, done


def write_chunk(work: Path, plan: dict[str, Any], done: list[dict[str, Any]], vectors: np.ndarray,
                docs: list[Document]) -> None:
    """Write chunk number ``len(done)`` (vectors + documents), then record it in the build state."""
    name = f"{len(done):06d}"
    tmp = work / f".{name}.tmp"
    write_segment(tmp, name, vectors, docs)
    for ext in (".npy", ".parquet"):
        os.replace(tmp / "segments" / f"{name}{ext}", work / f"{name}{ext}")
    shutil.rmtree(tmp, ignore_errors=True)
    done.append({"name": name, "rows": len(docs), "ids": _ids_hash(docs)})
    state_tmp = work / "state.json.tmp"
    state_tmp.write_text(json.dumps({"plan": plan, "chunks": done}))
    os.replace(state_tmp, work / "state.json")


def build_index(corpus: CorpusSource, encoder: Any, out: str | Path, *, backend: BackendConfig | str = "hnswlib",
                encoder_info: EncoderInfo | None = None, chunk_size: int = 4096, batch_size: int = 32,
                resume: bool = True, show_progress: bool = False) -> Index:
    """Encode ``corpus`` with ``encoder`` and write an index directory at ``out`` (replacing any there)."""
    from tqdm.auto import tqdm

    if isinstance(backend, str):
        backend = BackendConfig(backend)
    if chunk_size <= 0:
        raise ConfigError(f"chunk_size must be positive, got {chunk_size}")
    out = Path(out)
    info = encoder_info or (encoder.info() if hasattr(encoder, "info") else None)
    plan = {"encoder": asdict(info) if info else None, "metric": backend.metric, "chunk_size": chunk_size}
    work, done = start_build(out, plan, resume)
    dim = info.dim if info else None
    bar = tqdm(desc="encode corpus", unit="doc", disable=not show_progress)
    for i, docs in enumerate(_chunks(corpus, chunk_size)):
        if i < len(done) and done[i]["ids"] == _ids_hash(docs) and (work / f"{done[i]['name']}.npy").is_file():
            bar.update(len(docs))
            continue
        del done[i:]
        vectors = encoder.encode([d.full_text for d in docs], kind="document", batch_size=batch_size, allow_empty=True)
        vectors = prepare(vectors, backend.metric, dim, f"document vectors (chunk {i})")
        dim = vectors.shape[1]
        write_chunk(work, plan, done, vectors, docs)
        bar.update(len(docs))
    bar.close()
    info = info or EncoderInfo(name=type(encoder).__name__, dim=dim or 0)
    return finish_build(work, done, out, backend, info, encoder)


def finish_build(work: Path, done: list[dict[str, Any]], out: Path, backend: BackendConfig, info: EncoderInfo,
                 encoder: Any = None) -> Index:
    """Merge the chunks into one segment, build the ANN structure and commit the version atomically."""
    import pyarrow.parquet as pq

    total = sum(int(c["rows"]) for c in done)
    if total == 0:
        raise DataError("cannot build an index over an empty corpus")
    dim = int(np.load(work / f"{done[0]['name']}.npy", mmap_mode="r").shape[1])
    if info.dim != dim:
        if info.dim:
            raise DataError(f"the encoder {info.name} declares dimension {info.dim} but its vectors have {dim}")
        info = replace(info, dim=dim)
    seen: set[str] = set()
    merged = work / "merged.npy"
    vectors = np.lib.format.open_memmap(merged, mode="w+", dtype=np.float32, shape=(total, dim))
    row = 0
    docs_all: list[Document] = []
    for c in done:
        v = np.load(work / f"{c['name']}.npy", allow_pickle=False)
        vectors[row:row + len(v)] = v
        row += len(v)
        for r in pq.read_table(work / f"{c['name']}.parquet").to_pylist():
            if r["id"] in seen:
                raise DataError(f"duplicate document id {r['id']!r} in the corpus")
            seen.add(r["id"])
            docs_all.append(Document(r["id"], r["text"], r["title"], json.loads(r["metadata"])))
    vectors.flush()
    logger.info("building %s over %d x %d vectors", backend.name, total, dim)
    ann = ann_from_vectors(backend, vectors)
    params = {**default_params(backend.name, total, dim), **backend.params}
    if out.exists() and not (out / "CURRENT").is_file():
        if any(out.iterdir()):
            raise ConfigError(f"{out}: exists and is not an index directory; choose another --out")
    # a rebuild replaces the contents of an existing index directory as a new version
    version = commit_version(out, None, [Segment("000000", 0, total)], {"000000": (vectors, docs_all)},
                             np.array([], dtype=np.int64), ann, info, backend.metric, backend.name, params)
    del vectors
    shutil.rmtree(work, ignore_errors=True)
    return Index(out, version, read_manifest(version), encoder)
