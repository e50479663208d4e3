"""Corpus encoding on Ray: a pool of actors, each holding the bi-encoder once, encodes an engine's rows.

:class:`RayEncoder` stands in for the bi-encoder while :meth:`twostage.engine.search_engine.SearchEngine.build`
encodes the corpus (``ray_actors=N``, ``twostage build --ray-actors N``): each resumable chunk of rows is cut into
one contiguous slice per actor, the slices are encoded at once and joined back in order, so the engine written is
the one a single process writes (same rows, same order, vectors equal to float rounding). Queries and updates are
encoded by the engine's own model. Model weights must be readable by every worker (a path on shared storage, or a
name each worker can resolve).
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from twostage.indexer.errors import ConfigError

logger = logging.getLogger(__name__)


class _EncodeActor:
    """One Ray actor: loads the bi-encoder once, encodes slices of texts."""

    def __init__(self, model: str, precision: str, threads: int) -> None:
        import torch

        from twostage.retriever.biencoder import BiEncoder

        if threads:
            torch.set_num_threads(threads)
        self.encoder = BiEncoder.load(model, precision=precision)

    def encode(self, texts: list[str], batch_size: int) -> tuple[np.ndarray, int]:
        vectors = self.encoder.encode(texts, kind="document", batch_size=batch_size, allow_empty=True)
        return np.asarray(vectors, dtype=np.float32), int(getattr(self.encoder, "truncated", 0) or 0)


class RayEncoder:
    """The document side of ``encoder`` computed by ``num_actors`` Ray actors loading ``model``."""

    def __init__(self, model: str | Path, encoder: Any, *, num_actors: int = 2, cpus_per_actor: float = 1.0,
                 precision: str = "fp32", address: str | None = None, num_cpus: int | None = None) -> None:
        from twostage.indexer.ray_util import connect

        if num_actors <= 0 or cpus_per_actor <= 0:
            raise ConfigError(f"ray actors and cpus per actor must be positive, got {num_actors} and {cpus_per_actor}")
        self.encoder, self.truncated = encoder, 0
        ray = connect(address, num_cpus)
        self._ray = ray
        ref = str(Path(model).resolve()) if Path(model).exists() else str(model)
        actor = ray.remote(num_cpus=cpus_per_actor)(_EncodeActor)
        self.actors = [actor.remote(ref, precision, max(1, int(cpus_per_actor))) for _ in range(num_actors)]

    def info(self) -> Any:
        return self.encoder.info()

    def encode(self, texts: Sequence[str], kind: str = "document", batch_size: int = 32,
               allow_empty: bool = False, **_: Any) -> np.ndarray:
        if kind != "document":
            return self.encoder.encode(texts, kind=kind, batch_size=batch_size, allow_empty=allow_empty)
        texts = list(texts)
        step = -(-len(texts) // len(self.actors)) or 1
        parts = [texts[i:i + step] for i in range(0, len(texts), step)]
        done = self._ray.get([a.encode.remote(p, batch_size) for a, p in zip(self.actors, parts)])
        self.truncated = sum(t for _, t in done)
        if not done:
            return np.zeros((0, self.info().dim), dtype=np.float32)
        return np.concatenate([v for v, _ in done])

    def close(self) -> None:
        for a in self.actors:
            self._ray.kill(a)
        self.actors = []
