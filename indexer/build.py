"""Building an index directory from a corpus and an encoder, in chunks, resumable.

Documents are read as a stream and encoded ``chunk_size`` at a time; each chunk's vectors (``.npy``) and
documents (``.parquet``) are written to ``.INDEX_DIR.build/`` as soon as they are done, so memory stays
bounded and a killed build resumes from the chunks already encoded. The chunks then become the version's
segments (hard-linked, never loaded whole), the ANN structure is built from their memory maps, and the version
is committed atomically: beyond the ANN structure and one chunk, nothing held in memory grows with the corpus
(the vectors are read through memory maps). The search engine builds its BM25 from the same chunks, one at a time,
and a sharded engine gives each shard its rows of them (:func:`slice_chunks`).
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import shutil
from collections.abc import Callable, Iterator, Sequence
from dataclasses import asdict, replace
from pathlib import Path
from typing import Any

import numpy as np

from twostage.indexer.atomic import load_npy
from twostage.indexer.corpus import CorpusSource, iter_documents
from twostage.indexer.docstore import COLUMNS, row_document, write_table
from twostage.indexer.errors import ConfigError, DataError
from twostage.indexer.index import Index, IndexChange, link_or_copy, write_index_files, write_segment
from twostage.indexer.manifest import EncoderInfo, Segment
from twostage.indexer.records import Document
from twostage.indexer.vectors import BackendConfig, ann_from_vectors, default_params, prepare
from twostage.indexer.versions import commit, writer_lock

logger = logging.getLogger(__name__)


def _chunks(source: CorpusSource, size: int, warn_empty: bool) -> Iterator[list[Document]]:
    chunk: list[Document] = []
    for doc in iter_documents(source, warn_empty=warn_empty):
        chunk.append(doc)
        if len(chunk) == size:
            yield chunk
            chunk = []
    if chunk:
        yield chunk


def _ids_hash(docs: list[Document]) -> str:
    """A hash of everything a chunk holds (id, title, text, metadata of each document): a resumed build reuses
    a chunk only when its documents are exactly the same."""
    h = hashlib.sha256()
    for d in docs:
        h.update(json.dumps([d.id, d.title, d.text, dict(d.metadata)], sort_keys=True, default=str).encode())
        h.update(b"\n")
    return h.hexdigest()


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
                docs: list[Document], truncated: int = 0) -> None:
    """Write chunk number ``len(done)`` (vectors + documents), then record it in the build state (with how many of
    its texts were longer than the encoder reads)."""
    name = f"{len(done):06d}"
    tmp = work / f".{name}.tmp"
    write_segment(tmp, name, vectors, docs)
    (work / "segments").mkdir(exist_ok=True)
    for ext in (".npy", ".parquet"):
        os.replace(tmp / "segments" / f"{name}{ext}", work / "segments" / f"{name}{ext}")
    shutil.rmtree(tmp, ignore_errors=True)
    done.append({"name": name, "rows": len(docs), "ids": _ids_hash(docs), "truncated": truncated})
    state_tmp = work / "state.json.tmp"
    state_tmp.write_text(json.dumps({"plan": plan, "chunks": done}))
    os.replace(state_tmp, work / "state.json")


PIECE = 512  # rows encoded at a time inside a chunk: the progress bar moves every piece


def check_out_dir(out: Path, what: str = "an index directory") -> None:
    """``out`` may be created, or is already a versioned directory (CURRENT) to replace; anything else is refused."""
    if out.exists() and not out.is_dir():
        raise ConfigError(f"{out}: is a file; choose a directory for --out")
    if out.is_dir() and not (out / "CURRENT").is_file() and any(p.name != "LOCK" for p in out.iterdir()):
        raise ConfigError(f"{out}: exists and is not {what}; choose another --out")


def encode_chunks(corpus: CorpusSource, encoder: Any, work: Path, plan: dict[str, Any], done: list[dict[str, Any]], *,
                  metric: str, dim: int | None, chunk_size: int, batch_size: int, show_progress: bool,
                  unit: str = "doc", total: int | None = None,
                  counted: Callable[[Sequence[Document]], int] | None = None, warn_empty: bool = True) -> None:
    """Encode the corpus ``chunk_size`` rows (documents, or ``unit``) at a time into ``work``, skipping chunks
    already done. The progress bar counts ``unit`` against ``total`` (default: the corpus's length, where it has
    one); ``counted`` says how many units some rows are (default: one each; a passage engine counts documents).
    ``warn_empty=False``: the rows were read and checked before (a passage engine's passages), so empty ones are not
    counted in a second warning."""
    from tqdm.auto import tqdm

    bar = None
    try:
        for i, docs in enumerate(_chunks(corpus, chunk_size, warn_empty)):
            if bar is None:  # created after the first read, so that a bad file shows only its error
                if total is None and counted is None and hasattr(corpus, "__len__") \
                        and not isinstance(corpus, (str, Path)):
                    total = len(corpus)
                bar = tqdm(desc="encode corpus", unit=unit, total=total, disable=not show_progress)
            if i < len(done) and done[i]["ids"] == _ids_hash(docs) and \
                    (work / "segments" / f"{done[i]['name']}.npy").is_file():
                bar.update(counted(docs) if counted is not None else len(docs))
                continue
            del done[i:]
            texts = [d.full_text for d in docs]
            step = max(PIECE, batch_size)  # a chunk is encoded (and the bar moved) a piece at a time
            pieces, truncated = [], 0
            for start in range(0, len(texts), step):
                pieces.append(encoder.encode(texts[start:start + step], kind="document", batch_size=batch_size,
                                             allow_empty=True))
                truncated += int(getattr(encoder, "truncated", 0) or 0)  # texts cut by this call
                piece = docs[start:start + step]
                bar.update(counted(piece) if counted is not None else len(piece))
            vectors = prepare(np.concatenate(pieces) if len(pieces) > 1 else pieces[0], metric, dim,
                              f"document vectors (chunk {i})")
            dim = vectors.shape[1]
            write_chunk(work, plan, done, vectors, docs, truncated=truncated)
    except BaseException:
        if bar is not None:  # clear the bar's line so that the error is the one line the user reads
            bar.leave = False
            bar.close()
        raise
    if bar is not None:
        if bar.total is not None and bar.n < bar.total:  # fewer than counted (a folder's skipped files)
            bar.total = bar.n
            bar.refresh()
        bar.close()


def build_index(corpus: CorpusSource, encoder: Any, out: str | Path, *, backend: BackendConfig | str = "hnswlib",
                encoder_info: EncoderInfo | None = None, chunk_size: int = 4096, batch_size: int = 32,
                resume: bool = True, show_progress: bool = False) -> Index:
    """Encode ``corpus`` with ``encoder`` and write a bare dense part at ``out`` (replacing any there): the ANN
    benchmarks and the tests of the part itself build one; a user builds an engine (``SearchEngine.build``)."""
    if isinstance(backend, str):
        backend = BackendConfig(backend)
    if chunk_size <= 0:
        raise ConfigError(f"chunk_size must be positive, got {chunk_size}")
    out = Path(out)
    check_out_dir(out)
    info = encoder_info or (encoder.info() if hasattr(encoder, "info") else None)
    plan = {"encoder": asdict(info) if info else None, "metric": backend.metric, "chunk_size": chunk_size}
    work, done = start_build(out, plan, resume)
    encode_chunks(corpus, encoder, work, plan, done, metric=backend.metric, dim=info.dim if info else None,
                  chunk_size=chunk_size, batch_size=batch_size, show_progress=show_progress)
    info = info or EncoderInfo(name=type(encoder).__name__, dim=0)
    return finish_build(work, done, out, backend, info, encoder)


def slice_chunks(work: Path, done: list[dict[str, Any]], start: int, stop: int,
                 dest: Path) -> list[dict[str, Any]]:
    """Rows ``start:stop`` of the encoded chunks in ``work``, written as the chunks of ``dest`` (a shard's own build
    directory): whole chunks hard-linked, the chunks cut by a bound copied in part (only their rows read). Returns
    ``dest``'s chunk list; nothing holds the corpus."""
    import pyarrow.parquet as pq

    (dest / "segments").mkdir(parents=True, exist_ok=True)
    out: list[dict[str, Any]] = []
    row = 0
    for c in done:
        name, rows = c["name"], int(c["rows"])
        a, b = max(start, row), min(stop, row + rows)
        if a < b:
            src, dst = work / "segments" / name, dest / "segments" / name
            if (a, b) == (row, row + rows):
                for ext in (".npy", ".parquet"):
                    link_or_copy(src.with_suffix(ext), dst.with_suffix(ext))
            else:
                vectors = load_npy(src.with_suffix(".npy"), mmap=True)[a - row:b - row]
                np.save(dst.with_suffix(".npy"), np.ascontiguousarray(vectors), allow_pickle=False)
                table = pq.read_table(src.with_suffix(".parquet")).slice(a - row, b - a)
                write_table(dst.with_suffix(".parquet"), table)
            out.append({"name": name, "rows": b - a})
        row += rows
    return out


def _checked_dim(work: Path, done: list[dict[str, Any]], info: EncoderInfo) -> EncoderInfo:
    if not done or sum(int(c["rows"]) for c in done) == 0:
        raise DataError("cannot build an index over an empty corpus")
    dim = int(load_npy(work / "segments" / f"{done[0]['name']}.npy", mmap=True).shape[1])
    if info.dim != dim:
        if info.dim:
            raise DataError(f"the encoder {info.name} declares dimension {info.dim} but its vectors have {dim}")
        info = replace(info, dim=dim)
    return info


def check_unique_ids(work: Path, done: list[dict[str, Any]]) -> None:
    """No id twice across the chunks, checked with 8 bytes a document (hashes sorted; equal hashes compared)."""
    import pyarrow.parquet as pq

    ids = [pq.read_table(work / "segments" / f"{c['name']}.parquet", columns=["id"]).column("id")
           for c in done]
    hashes = np.concatenate([np.frombuffer(b"".join(hashlib.blake2b(str(i).encode(), digest_size=8).digest()
                                                    for i in col.to_pylist()), dtype=np.uint64) for col in ids])
    order = np.argsort(hashes, kind="stable")
    same = np.flatnonzero(hashes[order][1:] == hashes[order][:-1])
    if len(same):
        flat = [i for col in ids for i in col.to_pylist()]
        for a, b in zip(order[same], order[same + 1]):
            if flat[a] == flat[b]:
                raise DataError(f"duplicate document id {flat[a]!r} in the corpus")


def streamed_change(work: Path, done: list[dict[str, Any]], backend: BackendConfig,
                    info: EncoderInfo) -> tuple[IndexChange, dict[str, Any], EncoderInfo]:
    """The first version made of the encoded chunks as its segments (to be hard-linked from ``work``: nothing
    copied or held in memory; the ANN structure is built from the memory-mapped chunks), its backend parameters
    and the encoder's identity. Ids are checked unique first."""
    info = _checked_dim(work, done, info)
    check_unique_ids(work, done)
    segments, start = [], 0
    for c in done:
        segments.append(Segment(c["name"], start, int(c["rows"])))
        start += int(c["rows"])
    parts = [load_npy(work / "segments" / f"{s.name}.npy", mmap=True) for s in segments]
    logger.info("building %s over %d x %d vectors", backend.name, start, info.dim)
    ann = ann_from_vectors(backend, parts)
    params = {**default_params(backend.name, start, info.dim), **backend.params}
    return IndexChange(segments, {}, np.array([], dtype=np.int64), ann), params, info


def chunk_documents(work: Path, done: list[dict[str, Any]]) -> Iterator[list[Document]]:
    """The documents of the encoded chunks, one chunk at a time, in corpus order."""
    import pyarrow.parquet as pq

    for c in done:
        table = pq.read_table(work / "segments" / f"{c['name']}.parquet")
        columns = {name: table.column(name).to_pylist() for name in COLUMNS}
        yield [row_document(columns, r) for r in range(table.num_rows)]


def chunk_document_ids(work: Path, done: list[dict[str, Any]], passages: bool) -> Iterator[str]:
    """The document ids of the encoded chunks, in corpus order (a document cut into ``passages`` once a passage),
    reading their id column only."""
    import pyarrow.parquet as pq

    from twostage.indexer.passages import doc_id_of

    for c in done:
        ids = pq.read_table(work / "segments" / f"{c['name']}.parquet", columns=["id"]).column("id").to_pylist()
        yield from (doc_id_of(str(i)) for i in ids) if passages else (str(i) for i in ids)


def finish_build(work: Path, done: list[dict[str, Any]], out: Path, backend: BackendConfig, info: EncoderInfo,
                 encoder: Any = None) -> Index:
    """Commit the chunks as the version's segments (:func:`streamed_change`), atomically."""
    change, params, info = streamed_change(work, done, backend, info)
    check_out_dir(out)
    # a rebuild replaces the contents of an existing index directory as a new version
    with writer_lock(out), commit(out) as version:
        write_index_files(version.tmp, work, change, info, backend.metric, backend.name, params)
    del change
    shutil.rmtree(work, ignore_errors=True)
    return Index.load(out, encoder=encoder, verify=False)
