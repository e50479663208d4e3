"""What the search path asks of an engine, as protocols: one engine (:class:`~twostage.engine.search_engine.
SearchEngine`) and many shards merged (:class:`~twostage.engine.sharded.ShardedEngine`) each implement them, and no
base class stands between the two.

- :class:`CandidateSource`: what the stages (:mod:`twostage.engine.stages`), steering (:mod:`twostage.engine.steer`)
  and explanations read: each first stage's candidates, the documents (whole, with their passages), token scores,
  the metadata's types, the vectors and terms steering moves a query by, and the models.
- :class:`Searchable`: a source with what the entry points (:class:`twostage.engine.search.SearchMethods`: search,
  pages, similar, rerank, views) read besides: the manifest, the directory and version, the loaded models.

Both are checked structurally (``typing.Protocol``): mypy checks each engine against them wherever one is searched,
and tests/test_engine.py that both engines hold every member.
"""

from __future__ import annotations

from collections.abc import Iterable
from contextlib import AbstractContextManager
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

import numpy as np

from twostage.indexer.filters import Where
from twostage.indexer.records import Document, RankedList

if TYPE_CHECKING:
    from twostage.engine.models import Models
    from twostage.engine.on_disk import EngineManifest
    from twostage.engine.settings import EngineSettings
    from twostage.engine.steer import Expansion

Read = tuple[Document, list[Document], list[int]]  # a document, its passages, where each starts in its text


class CandidateSource(Protocol):
    """What the stages ask of an engine: candidates, documents, token scores, steering's features and the models."""

    @property
    def settings(self) -> EngineSettings: ...

    @property
    def query_side(self) -> Any:
        """What encodes queries (the bi-encoder, or its queries without torch)."""

    @property
    def late(self) -> Any:
        """The late-interaction encoder (None: the engine has none)."""

    @property
    def reranker(self) -> Any:
        """The cross-encoder (None: the engine has none)."""

    def late_languages(self) -> tuple[str, ...] | None:
        """The languages the late-interaction model's card lists (None: every language)."""

    def analyzer(self) -> Any:
        """The BM25 analysis queries are read with (their language, the terms a hit marks)."""

    def candidates(self, queries: list[str], vectors: np.ndarray | None, first_stage: str, n: int, where: Where,
                   timings: dict[str, float], expansion: Expansion | None = None) -> dict[str, list[RankedList]]:
        """Each first stage's ("dense", "bm25") top ``n`` for every query, best first (BM25's query grown by
        ``expansion`` when given); adds its seconds to ``timings``."""

    def documents(self, ids: Iterable[str]) -> list[Document]:
        """The stored documents with these ids, whole (a KeyError names an unknown one)."""

    def documents_with_passages(self, ids: Iterable[str]) -> list[Read]:
        """Each document with its passages and where each starts in its text."""

    def passages(self, pids: Iterable[str]) -> list[Document]:
        """The passages with these ids (a passage engine's)."""

    def token_scores(self, query: np.ndarray, ids: list[str]) -> np.ndarray:
        """MaxSim of the query's token vectors (q, dim) against each of ``ids``."""

    def metadata_kinds(self) -> dict[str, str]:
        """Each metadata field's type (:data:`twostage.indexer.filters.KINDS`)."""

    def example_features(self, ids: list[str], m: int) -> dict[str, tuple[np.ndarray, dict[str, float]]]:
        """Each of these documents' vector and its ``m`` strongest BM25 terms with their weights (an unknown id is
        left out)."""

    def vectors_by_id(self, ids: list[str]) -> dict[str, np.ndarray]:
        """The dense vector of each id (a document's, or a passage's; an unknown id is left out)."""

    def matched_terms(self, terms: dict[str, float], ids: list[str]) -> dict[str, list[tuple[str, float]]]:
        """For each id BM25 holds, the weighted query terms it matched and each one's share of its score."""


class Searchable(CandidateSource, Protocol):
    """A :class:`CandidateSource` with what the entry points read besides: its manifest, directory and version, its
    loaded models, whether it is a read-only view, and the version a page token pins."""

    manifest: EngineManifest
    root: Path
    version_dir: Path
    read_only: bool

    @property
    def loaded_models(self) -> Models:
        """The models the engine searches with, shared with its views and the versions it opens."""

    @property
    def version(self) -> str: ...

    @property
    def has_reranker(self) -> bool: ...

    def at_version(self, version: str) -> AbstractContextManager[Any]:
        """The engine as it was at ``version`` (a PageExpiredError when that version is gone)."""

