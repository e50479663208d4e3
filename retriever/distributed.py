"""Corpus encoding on Ray Data: the corpus read as a dataset, encoded by a pool of encoder actors, written
as the same index directory the single-machine build writes (``Index.load`` opens it).

The corpus (BEIR ``corpus.jsonl`` or a directory holding it, ``.jsonl``, ``.parquet``) is read by Ray Data;
each record is checked as :func:`twostage.indexer.corpus.document_from_record` checks it; ``map_batches`` runs
``num_actors`` actors that each load the bi-encoder once; the driver streams the encoded batches (in corpus
order) into the build's chunk files, then merges them, builds the ANN structure and commits atomically, like
:func:`twostage.indexer.build.build_index`. Model weights must be readable by every worker (a path on shared storage,
or a name each worker can resolve).
"""

from __future__ import annotations

import json
import logging
from dataclasses import asdict
from pathlib import Path
from typing import Any

import numpy as np

from twostage.indexer.build import finish_build, start_build, write_chunk
from twostage.indexer.corpus import document_from_record
from twostage.indexer.errors import ConfigError, DataError, DataNotFoundError
from twostage.indexer.index import Index
from twostage.indexer.jsonl import parse_object
from twostage.indexer.records import Document
from twostage.indexer.vectors import BackendConfig, prepare

logger = logging.getLogger(__name__)


class _EncodeActor:
    """One Ray actor: loads the bi-encoder once, encodes batches of raw corpus records."""

    def __init__(self, model: str, precision: str, batch_size: int, source: str, threads: int) -> None:
        import torch

        from twostage.retriever.biencoder import BiEncoder

        if threads:
            torch.set_num_threads(threads)
        self.encoder = BiEncoder.load(model, precision=precision)
        self.batch_size, self.source = batch_size, source

    def __call__(self, batch: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        docs = _records_to_documents(batch, self.source)
        vectors = self.encoder.encode([d.full_text for d in docs], kind="document", batch_size=self.batch_size,
                                      allow_empty=True)
        return {"id": np.array([d.id for d in docs], dtype=object),
                "title": np.array([d.title for d in docs], dtype=object),
                "text": np.array([d.text for d in docs], dtype=object),
                "metadata": np.array([json.dumps(d.metadata, sort_keys=True) for d in docs], dtype=object),
                "vector": np.asarray(vectors, dtype=np.float32)}


def _records_to_documents(batch: dict[str, np.ndarray], source: str) -> list[Document]:
    if "item" in batch:  # a jsonl line per row (ray.data.read_text names the column "text")
        return [document_from_record(parse_object(line, f"{source} ({str(line)[:60]!r})"), source)
                for line in batch["item"]]
    columns = list(batch)
    n = len(batch[columns[0]]) if columns else 0
    return [document_from_record({c: _plain(batch[c][i]) for c in columns}, source) for i in range(n)]


def _plain(value: Any) -> Any:
    return value.item() if isinstance(value, np.generic) else value


def _read_dataset(ray: Any, corpus: str | Path) -> tuple[Any, str]:
    """The corpus as a Ray dataset. Reading reserves no CPU: the encoder actors may hold every CPU of the
    cluster, and a read task waiting for one would deadlock the pipeline (seen on a 2-CPU local Ray)."""
    path = Path(corpus)
    if path.is_dir():
        path = path / "corpus.jsonl"
    if not path.exists():
        raise DataNotFoundError(f"{path}: no such corpus file (expected a BEIR directory, .jsonl or .parquet)")
    if path.suffix.lower() in (".jsonl", ".json"):
        ds = ray.data.read_text(str(path.resolve()), drop_empty_lines=True, num_cpus=0)
        return ds.rename_columns({"text": "item"}), str(path)
    if path.suffix.lower() == ".parquet":
        return ray.data.read_parquet(str(path.resolve()), num_cpus=0), str(path)
    raise DataError(f"{path}: the Ray build reads .jsonl or .parquet corpora (convert {path.suffix} first)")


def build_index_ray(corpus: str | Path, model: str | Path, out: str | Path, *,
                    backend: BackendConfig | str = "hnswlib", num_actors: int = 2, cpus_per_actor: float = 1.0,
                    chunk_size: int = 1024, batch_size: int = 32, precision: str = "fp32",
                    address: str | None = None, num_cpus: int | None = None,
                    show_progress: bool = False) -> Index:
    """Encode ``corpus`` with ``num_actors`` Ray actors running the bi-encoder ``model``; write ``out``."""
    from tqdm.auto import tqdm

    from twostage.indexer.ray_util import connect
    from twostage.retriever.biencoder import BiEncoder

    if isinstance(backend, str):
        backend = BackendConfig(backend)
    if num_actors <= 0 or chunk_size <= 0:
        raise ConfigError("num_actors and chunk_size must be positive")
    ray = connect(address, num_cpus)
    ray.data.DataContext.get_current().execution_options.preserve_order = True  # chunks in corpus order
    info = BiEncoder.load(model).info()  # the identity written in the manifest; also checks the model loads here
    model_ref = str(Path(model).resolve()) if Path(model).exists() else str(model)
    dataset, source = _read_dataset(ray, corpus)
    encoded = dataset.map_batches(
        _EncodeActor, fn_constructor_kwargs={"model": model_ref, "precision": precision, "batch_size": batch_size,
                                             "source": source, "threads": max(1, int(cpus_per_actor))},
        batch_size=chunk_size, batch_format="numpy", concurrency=num_actors, num_cpus=cpus_per_actor)
    out = Path(out)
    plan = {"encoder": asdict(info), "metric": backend.metric, "chunk_size": chunk_size, "engine": "ray"}
    work, done = start_build(out, plan, resume=False)
    bar = tqdm(desc="encode corpus (ray)", unit="doc", disable=not show_progress)
    for batch in encoded.iter_batches(batch_size=None, batch_format="numpy"):
        docs = [Document(str(i), str(x), str(t), json.loads(m))
                for i, t, x, m in zip(batch["id"], batch["title"], batch["text"], batch["metadata"])]
        vectors = prepare(np.asarray(batch["vector"], dtype=np.float32), backend.metric, info.dim,
                          f"document vectors (chunk {len(done)})")
        write_chunk(work, plan, done, vectors, docs)
        bar.update(len(docs))
    bar.close()
    return finish_build(work, done, out, backend, info, None)
