"""From a query to reranked hits, for anything that can list first-stage candidates: one engine or many shards.

:class:`TwoStageSearch` holds the search path both :class:`~twostage.engine.search_engine.SearchEngine` and
:class:`~twostage.engine.sharded.ShardedEngine` answer with: the query is encoded once, the subclass returns
each first stage's candidates (``candidates``: one engine's indexes, or the merge of every shard's), then the
lists are fused (RRF), the reranker reads the top ``k_retrieve`` and is blended with the first stage, and the hits
are filled in from the document store.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from twostage.indexer.engine_dir import (
    EngineManifest,
    EngineSettings,
    ModelRef,
)
from twostage.indexer.errors import ConfigError
from twostage.indexer.records import Document, Hit, RankedList, SearchResult
from twostage.indexer.topk import check_k
from twostage.reranker.interpolation import blend_for, reorders
from twostage.reranker.pipeline import rerank_lists
from twostage.retriever.hybrid import dense_weights, fuse
from twostage.retriever.precision import resolve_precision, resolve_precisions

Where = Mapping[str, Any] | Callable[[Document], bool] | None
StageScores = dict[str, dict[str, float]]


def verified_model_dir(ref: ModelRef, role: str) -> Path:
    """The directory of a model the engine names, after checking its weights are the ones it was built with."""
    from twostage.retriever.weights import resolve_model, sha256_of_weights

    path = Path(ref.path) if Path(ref.path).is_dir() else resolve_model(ref.name)
    digest = sha256_of_weights(path)
    if digest != ref.sha256:
        raise ConfigError(f"{role} {ref.name!r} at {path}: its weights' sha256 {digest[:12]}... no longer matches the "
                          f"engine's {ref.sha256[:12]}...; restore that model, or rebuild the engine with it")
    return path


@dataclass
class Models:
    """Models loaded on first use (info, delete and compact never need them), once even across threads."""

    encoder: Any = None
    reranker: Any = None
    lock: threading.Lock = field(default_factory=threading.Lock)


class TwoStageSearch:
    """The search methods of an engine. Subclasses set ``manifest``, ``version_dir`` and ``_models`` and provide
    ``encoder``, ``documents(ids)`` and ``_candidates``."""

    manifest: EngineManifest
    version_dir: Path
    _models: Models
    encoder: Any

    @property
    def settings(self) -> EngineSettings:
        return self.manifest.settings

    @property
    def version(self) -> str:
        return self.version_dir.name

    @property
    def precision(self) -> str:
        """The precision the models run in (the settings' ``auto`` resolved), e.g. ``openvino-int8``, or
        ``retriever openvino-fp32, reranker openvino-int8`` when the two differ."""
        by_role = resolve_precisions(self.settings.precision)
        if len(set(by_role.values())) == 1:
            return by_role["retriever"]
        return ", ".join(f"{role} {precision}" for role, precision in by_role.items())

    def _loaded(self, slot: str, ref: ModelRef, role: str, loader: Callable[..., Any]) -> Any:
        """The model in ``self._models.<slot>`` (``role`` retriever or reranker), loaded on first use (once, across
        threads) from the directory ``ref`` names, after its weights are checked against the manifest's sha256."""
        if getattr(self._models, slot) is None:
            with self._models.lock:
                if getattr(self._models, slot) is None:
                    precision = resolve_precision(self.settings.precision, role)
                    setattr(self._models, slot, loader(verified_model_dir(ref, role), precision=precision))
        return getattr(self._models, slot)

    def _load_encoder(self) -> Any:
        """The bi-encoder, loaded (its weights verified against the manifest) on first use."""
        from twostage.retriever.biencoder import BiEncoder

        return self._loaded("encoder", self.manifest.retriever, "retriever", BiEncoder.load)

    @property
    def reranker(self) -> Any:
        """The cross-encoder (None when the engine has none), loaded and verified on first use."""
        if self.manifest.reranker is None:
            return None
        from twostage.reranker.cross_encoder import CrossEncoder

        return self._loaded("reranker", self.manifest.reranker, "reranker", CrossEncoder.load)

    def documents(self, ids: Iterable[str]) -> list[Document]:  # pragma: no cover - abstract
        raise NotImplementedError

    def candidates(self, queries: list[str], vectors: np.ndarray | None, first_stage: str, n: int, where: Where,
                   timings: dict[str, float]) -> dict[str, list[RankedList]]:  # pragma: no cover - abstract
        """Each first stage's ("dense", "bm25") top ``n`` for every query, best first; adds its seconds to
        ``timings``."""
        raise NotImplementedError

    def search(self, query: str, k: int = 10, *, where: Where = None, k_retrieve: int | None = None,
               first_stage: str | None = None, rerank: bool | None = None) -> SearchResult:
        """The ``k`` best documents for ``query``: first stage, then the reranker on the top ``k_retrieve``.

        Hits carry id, title, text, metadata, the final score and each stage's score; ``timings`` the seconds
        of each stage. ``where`` keeps documents whose metadata has the given values (or passes a function).
        """
        return self.search_batch([query], k, where=where, k_retrieve=k_retrieve, first_stage=first_stage,
                                 rerank=rerank)[0]

    def search_batch(self, queries: Sequence[str], k: int = 10, *, where: Where = None, k_retrieve: int | None = None,
                     first_stage: str | None = None, rerank: bool | None = None) -> list[SearchResult]:
        """:meth:`search` for many queries: encoded in one pass, their pairs reranked in shared batches.

        Each result's ``timings`` are the batch's seconds per stage divided by the number of queries.
        """
        queries = check_queries(queries)
        ranked, stage_scores, timings = self._ranked(queries, k, where, k_retrieve, first_stage, rerank)
        t = time.perf_counter()
        ids = sorted({str(d) for r in ranked for d in r.ids})
        docs = dict(zip(ids, self.documents(ids)))
        timings["fetch_s"] = time.perf_counter() - t
        n = len(queries)
        per_query = {name: seconds / n for name, seconds in timings.items()}
        per_query["total_s"] = sum(per_query.values())
        out = []
        for query, r, scores in zip(queries, ranked, stage_scores):
            hits = []
            for rank, (d, s) in enumerate(zip(r.ids, r.scores), 1):
                doc = docs[str(d)]
                stages = {name: table[str(d)] for name, table in scores.items() if str(d) in table}
                hits.append(Hit(doc.id, float(s), rank, stages.get("first_stage"), doc.text, doc.title,
                                dict(doc.metadata), stages))
            out.append(SearchResult(query, tuple(hits), per_query))
        return out

    def ranked(self, query: str, k: int = 10, **kw: Any) -> RankedList:
        """Ids and final scores only (the retriever contract: ``search(query, k) -> RankedList``)."""
        return self._ranked(check_queries([query]), k, kw.get("where"), kw.get("k_retrieve"),
                            kw.get("first_stage"), kw.get("rerank"))[0][0]

    def as_retriever(self, *, first_stage: str | None = None, rerank: bool | None = None,
                     k_retrieve: int | None = None) -> EngineRetriever:
        """This engine as a plain retriever (``search`` / ``search_batch`` -> RankedList), e.g. for the harness."""
        return EngineRetriever(self, first_stage, rerank, k_retrieve)

    def _ranked(self, queries: list[str], k: int, where: Where, k_retrieve: int | None, first_stage: str | None,
                rerank: bool | None) -> tuple[list[RankedList], list[StageScores], dict[str, float]]:
        s = self.settings
        rerank = s.rerank if rerank is None else rerank
        k = check_k(k)
        k_retrieve = check_k(s.k_retrieve if k_retrieve is None else k_retrieve)
        first_stage = first_stage or s.first_stage
        if first_stage not in ("hybrid", "dense", "bm25"):
            raise ConfigError(f"first_stage must be hybrid, dense or bm25, got {first_stage!r}")
        reranker = self.reranker if rerank else None
        n_first = max(k, k_retrieve) if reranker is not None else k
        n = max(s.depth, n_first) if first_stage == "hybrid" else n_first
        timings: dict[str, float] = {}
        vectors = None
        if first_stage in ("dense", "hybrid"):
            t = time.perf_counter()
            vectors = self.encoder.encode(queries, kind="query", batch_size=s.batch_size)
            timings["encode_s"] = time.perf_counter() - t
        lists = self.candidates(queries, vectors, first_stage, n, where, timings)
        t = time.perf_counter()
        if first_stage == "hybrid":
            weights = dense_weights(s.dense_weight)
            firsts = [fuse([b, d], s.fusion, k_rrf=s.k_rrf, weights=weights).truncate(n_first)
                      for b, d in zip(lists["bm25"], lists["dense"])]
        else:
            firsts = lists[first_stage]
        timings["fuse_s"] = time.perf_counter() - t
        t = time.perf_counter()
        alpha = s.interpolation if s.interpolation != "auto" else blend_for(reranker, first_stage)
        scored = reranker is not None and reorders(alpha)
        heads = sorted({str(d) for f in firsts for d in f.ids[:k_retrieve]}) if scored else []
        texts = {d.id: d.full_text for d in self.documents(heads)}  # one read for every query's candidates
        reranked = rerank_lists(reranker, queries, firsts, texts.__getitem__, k=k, k_retrieve=k_retrieve,
                                interpolation=None if alpha is None else float(alpha), batch_size=s.batch_size)
        if scored:
            timings["rerank_s"] = time.perf_counter() - t
        stage_scores = []
        for i, (first, res) in enumerate(zip(firsts, reranked)):
            scores = {name: dict(zip(map(str, ls[i].ids), ls[i].scores.astype(float).tolist()))
                      for name, ls in lists.items()}
            scores["first_stage"] = dict(zip(map(str, first.ids), first.scores.astype(float).tolist()))
            if res.rerank_scores:
                scores["rerank"] = dict(res.rerank_scores)
            stage_scores.append(scores)
        return [r.ranked for r in reranked], stage_scores, timings


class EngineRetriever:
    """An engine seen as a retriever: ``search(query, k)`` and ``search_batch`` -> RankedList."""

    def __init__(self, engine: TwoStageSearch, first_stage: str | None, rerank: bool | None,
                 k_retrieve: int | None) -> None:
        self.engine, self.first_stage, self.rerank, self.k_retrieve = engine, first_stage, rerank, k_retrieve

    def search(self, query: str, k: int = 10) -> RankedList:
        return self.search_batch([query], k)[0]

    def search_batch(self, queries: Sequence[str], k: int = 10) -> list[RankedList]:
        return self.engine._ranked(check_queries(queries), k, None, self.k_retrieve, self.first_stage,
                                   self.rerank)[0]


def check_queries(queries: Sequence[str]) -> list[str]:
    """The queries as a list, each a non-empty string (else one ConfigError naming the query)."""
    if isinstance(queries, str) or not isinstance(queries, Sequence):
        raise ConfigError("search_batch takes a list of query strings; use search for one")
    for i, q in enumerate(queries):
        if not isinstance(q, str):
            raise ConfigError(f"query #{i + 1} is {type(q).__name__}, not a string")
        if not q.strip():
            raise ConfigError(f"query #{i + 1} is empty; give it some words")
    if not queries:
        raise ConfigError("no queries given")
    return list(queries)
