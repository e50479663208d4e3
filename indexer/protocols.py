"""Plug-in points. Anything with these methods works where the library expects one."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol, Union, runtime_checkable

import numpy as np

from twostage.indexer.records import RankedList


@runtime_checkable
class Encoder(Protocol):
    """Turns texts into vectors: float32 (n, d), row i for text i. ``kind`` is "query" or "document"."""

    def encode(self, texts: Sequence[str], *, kind: str = "document", batch_size: int = 32,
               show_progress: bool = False, allow_empty: bool = False) -> np.ndarray: ...


@runtime_checkable
class Retriever(Protocol):
    """A first stage: ranks the corpus for a query text, best first.

    The one contract of every retriever (BM25, dense, hybrid, an index, shards, an engine): ``search`` returns one
    :class:`RankedList` of at most ``k`` documents (fewer, never an error, when fewer match or exist); ``k`` <= 0
    is a ConfigError. Retrievers also offer ``search_batch(queries, k) -> list[RankedList]``; the harness needs only
    ``search``.
    """

    def search(self, query: str, k: int) -> RankedList: ...


@runtime_checkable
class PairScorer(Protocol):
    """A second stage that scores (query, text) pairs, higher is better: one float per pair, in order. The engine
    gives it every query's pairs in one call (a :class:`~twostage.reranker.cross_encoder.CrossEncoder` batches them
    by length)."""

    def predict(self, pairs: Sequence[tuple[str, str]], *, batch_size: int = 32) -> np.ndarray: ...


@runtime_checkable
class QueryScorer(Protocol):
    """A second stage that scores one query's texts at a time, higher is better: one float per text, in order
    (the MaxSim stage is one)."""

    def score(self, query: str, texts: Sequence[str]) -> np.ndarray: ...


# what reranks an engine's candidates (``SearchEngine.with_reranker``, ``rerank_lists``)
Reranker = Union[PairScorer, QueryScorer]
