"""From a query to reranked hits, for anything that can list first-stage candidates: one engine or many shards.

:class:`TwoStageSearch` holds the search path both :class:`~twostage.engine.search_engine.SearchEngine` and
:class:`~twostage.engine.sharded.ShardedEngine` answer with: the query is encoded once, the subclass returns
each first stage's candidates (``candidates``: one engine's indexes, or the merge of every shard's), then the
lists are fused (RRF), the reranker reads the top ``k_retrieve`` and is blended with the first stage, and the hits
are filled in from the document store.
"""

from __future__ import annotations

import hmac
import threading
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np

from twostage.engine.pages import PageToken, decode_page_token, encode_page_token, fingerprint, page_key
from twostage.indexer.engine_dir import (
    EngineManifest,
    EngineSettings,
    ModelRef,
)
from twostage.indexer.errors import ConfigError, PageExpiredError
from twostage.indexer.filters import CheckedFilter, Where, check_filter, parse_filter
from twostage.indexer.passages import by_document, split_id
from twostage.indexer.records import Document, Hit, RankedList, SearchResult
from twostage.indexer.topk import check_k
from twostage.reranker.interpolation import reorders, resolve_blend
from twostage.reranker.pipeline import rerank_lists
from twostage.retriever.hybrid import dense_weights, fuse
from twostage.retriever.precision import resolve_precision, resolve_precisions

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
    device: str = "cpu"  # where they run (resolved: cpu or cuda[:N]; twostage.retriever.device)
    weights: tuple[str, str | None] | None = None  # the sha256 of the retriever's and reranker's weights they are

    def for_manifest(self, manifest: EngineManifest) -> Models:
        """These models for a version naming ``manifest``'s models (the first version they serve claims them), or
        fresh ones on the same device when it names other weights (a version written by a model swap)."""
        weights = (manifest.retriever.sha256, manifest.reranker.sha256 if manifest.reranker else None)
        with self.lock:
            if self.weights is None:
                self.weights = weights
            if self.weights == weights:
                return self
        return Models(device=self.device, weights=weights)


class TwoStageSearch:
    """The search methods of an engine. Subclasses set ``manifest``, ``version_dir`` and ``_models`` and provide
    ``encoder``, ``documents(ids)`` and ``_candidates``."""

    manifest: EngineManifest
    root: Path
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
    def reranks(self) -> bool:
        """Whether searches rerank by default: the settings say so and the engine has a reranker."""
        return bool(self.settings.rerank and self.manifest.reranker is not None)

    @property
    def device(self) -> str:
        """Where the models run (``cpu`` or ``cuda[:N]``), chosen when the engine was opened."""
        return self._models.device

    @property
    def precision(self) -> str:
        """The precision the models run in (the settings' ``auto`` resolved), e.g. ``openvino-int8``, or
        ``retriever openvino-fp32, reranker openvino-int8`` when the two differ."""
        by_role = resolve_precisions(self.settings.precision, self._models.device)
        if self.manifest.reranker is None:  # no reranker: only the retriever's precision means anything
            return by_role["retriever"]
        if len(set(by_role.values())) == 1:
            return by_role["retriever"]
        return ", ".join(f"{role} {precision}" for role, precision in by_role.items())

    def shares_models(self, other: TwoStageSearch) -> bool:
        """Whether ``other`` searches with this engine's loaded models (a version a model swap wrote does not)."""
        return self._models is other._models

    def use_models(self, *, encoder: Any = None, reranker: Any = None) -> None:
        """Search with these objects in place of the loaded models, e.g. wrappers that batch across requests
        (:mod:`twostage.app.batching`). They must score exactly like the models they wrap; the engines that
        :meth:`refresh` and the updates return share them."""
        with self._models.lock:
            if encoder is not None:
                self._models.encoder = encoder
            if reranker is not None:
                self._models.reranker = reranker

    def _loaded(self, slot: str, ref: ModelRef, role: str, loader: Callable[..., Any]) -> Any:
        """The model in ``self._models.<slot>`` (``role`` retriever or reranker), loaded on first use (once, across
        threads) from the directory ``ref`` names, after its weights are checked against the manifest's sha256."""
        if getattr(self._models, slot) is None:
            with self._models.lock:
                if getattr(self._models, slot) is None:
                    device = self._models.device
                    precision = resolve_precision(self.settings.precision, role, device)
                    setattr(self._models, slot, loader(verified_model_dir(ref, role), precision=precision,
                                                       device=device, trust_remote_code=ref.trust_remote_code))
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

    def documents_with_passages(self, ids: Iterable[str]) -> list[tuple[Document, list[Document], list[int]]]:
        """Each document with its passages and where each starts in its text (here: whole documents)."""
        return [(d, [d], [0]) for d in self.documents(ids)]

    def passages(self, pids: Iterable[str]) -> list[Document]:  # pragma: no cover - passage engines only
        raise NotImplementedError

    def analyzer(self) -> Any:
        """The analyzer that marks query terms in a hit's passage (the engine's BM25 analyzer)."""
        from twostage.retriever.analyzer import Analyzer

        return Analyzer()

    def candidates(self, queries: list[str], vectors: np.ndarray | None, first_stage: str, n: int, where: Where,
                   timings: dict[str, float]) -> dict[str, list[RankedList]]:  # pragma: no cover - abstract
        """Each first stage's ("dense", "bm25") top ``n`` for every query, best first; adds its seconds to
        ``timings``."""
        raise NotImplementedError

    def metadata_kinds(self) -> dict[str, str]:  # pragma: no cover - abstract
        """Each metadata field's type (:data:`twostage.indexer.filters.KINDS`)."""
        raise NotImplementedError

    def search(self, query: str, k: int = 10, *, where: Where = None, offset: int = 0, page_token: str | None = None,
               **knobs: Any) -> SearchResult:
        """The ``k`` best documents for ``query``: first stage, then the reranker on the top ``k_retrieve``.

        Hits carry id, title, text, metadata, the final score and each stage's score; ``timings`` the seconds
        of each stage. ``where`` is a filter (:mod:`twostage.indexer.filters`: a JSON object such as
        ``{"year": {"$gte": 2020}}``, or a function of a Document). ``offset`` skips the first hits (a page);
        ``page_token`` is the result's ``next_page`` from the call before: the next ``k`` hits of the same query,
        filter and knobs, from the same engine version. ``knobs`` are :data:`KNOBS` for this call only.
        """
        if page_token is not None:
            if offset:
                raise ConfigError("give offset or page_token, not both (the token holds its offset)")
            self.check_where(where)  # a malformed filter is named before it is digested
            token = self.read_page_token(page_token)
            if not hmac.compare_digest(token.fingerprint, fingerprint(query, where, knobs)):
                raise ConfigError("page_token: it was given for another query, filter or settings; search again "
                                  "without it for the first page")
            with self.at_version(token.version) as pinned:
                return pinned.search_batch([query], k, where=where, offset=token.offset, **knobs)[0]
        return self.search_batch([query], k, where=where, offset=offset, **knobs)[0]

    def read_page_token(self, text: str) -> PageToken:
        """A ``next_page`` token this engine gave, its signature checked (:mod:`twostage.engine.pages`)."""
        return decode_page_token(text, page_key(self.root))

    def at_version(self, version: str) -> AbstractContextManager[TwoStageSearch]:
        """This engine as it was at ``version`` (for page tokens). Here: only the version it has open."""
        if version != self.version:
            raise PageExpiredError(f"page_token: it belongs to version {version}, the engine is now at "
                                   f"{self.version}; search again for the first page")
        return nullcontext(self)

    def search_batch(self, queries: Sequence[str], k: int = 10, *, where: Where = None, offset: int = 0,
                     **knobs: Any) -> list[SearchResult]:
        """:meth:`search` for many queries: encoded in one pass, their pairs reranked in shared batches.

        Each result's ``timings`` are the batch's seconds per stage divided by the number of queries.
        """
        from twostage.engine.highlight import hit_passage

        queries = check_queries(queries)
        ranked, stage_scores, timings, chosen = self._ranked(queries, k, where, knobs, offset)
        t = time.perf_counter()
        ids = sorted({str(d) for r in ranked for d in r.ids})
        docs = {entry[0].id: entry for entry in self.documents_with_passages(ids)}
        analyzer = self.analyzer()
        timings["fetch_s"] = time.perf_counter() - t
        n = len(queries)
        per_query = {name: seconds / n for name, seconds in timings.items()}
        per_query["total_s"] = sum(per_query.values())
        key: bytes | None = None  # the page-token key, read once a batch
        out = []
        for q, (query, r, scores) in enumerate(zip(queries, ranked, stage_scores)):
            hits = []
            for rank, (d, s) in enumerate(zip(r.ids, r.scores), offset + 1):
                doc, passages, starts = docs[str(d)]
                stages = {name: table[str(d)] for name, table in scores.items() if str(d) in table}
                best = split_id(chosen[q][str(d)])[1] if chosen is not None else None
                hits.append(Hit(doc.id, float(s), rank, stages.get("first_stage"), doc.text, doc.title,
                                dict(doc.metadata), stages, hit_passage(query, doc, passages, starts, best, analyzer)))
            following = None
            if len(hits) == k and offset + k < self.window(knobs) and not callable_where(where):
                token = PageToken(self.version, offset + k, k, fingerprint(query, where, knobs), int(time.time()))
                key = key or page_key(self.root)
                following = encode_page_token(token, key)
            out.append(SearchResult(query, tuple(hits), per_query, following))
        return out

    def ranked(self, query: str, k: int = 10, *, where: Where = None, offset: int = 0, **knobs: Any) -> RankedList:
        """Ids and final scores only (the retriever contract: ``search(query, k) -> RankedList``)."""
        return self._ranked(check_queries([query]), k, where, knobs, offset)[0][0]

    def as_retriever(self, *, first_stage: str | None = None, rerank: bool | None = None,
                     k_retrieve: int | None = None) -> EngineRetriever:
        """This engine as a plain retriever (``search`` / ``search_batch`` -> RankedList), e.g. for the harness."""
        return EngineRetriever(self, first_stage, rerank, k_retrieve)

    def window(self, knobs: Mapping[str, Any]) -> int:
        """How many hits one query ranks, and so how deep pages go: the depth (or k_retrieve, when larger and
        reranking)."""
        s, rerank = settings_for(self.settings, knobs)
        return max(s.depth, s.k_retrieve) if rerank and self.manifest.reranker is not None else s.depth

    def check_where(self, where: Where) -> Where:
        """A JSON filter parsed and checked against the metadata's fields and types (every shard's); a function
        or None as it is."""
        if where is None or callable_where(where):
            return where
        f = parse_filter(where)
        check_filter(f, self.metadata_kinds())
        return CheckedFilter(f)

    def _ranked(self, queries: list[str], k: int, where: Where, knobs: Mapping[str, Any],
                offset: int = 0) -> tuple[list[RankedList], list[StageScores], dict[str, float],
                                          list[dict[str, str]] | None]:
        """Each query's page of final ids and scores, each stage's scores, the seconds of each stage, and in a passage
        engine each query's chosen passage id by document (the one the reranker read)."""
        s, rerank = settings_for(self.settings, knobs)
        k = check_k(k)
        if isinstance(offset, bool) or not isinstance(offset, int) or offset < 0:
            raise ConfigError(f"offset must be an integer >= 0, got {offset!r}")
        where = self.check_where(where)
        reranker = self.reranker if rerank else None
        window = max(s.depth, s.k_retrieve) if reranker is not None else s.depth
        if offset >= window:
            raise ConfigError(f"offset {offset} is past the {window} hits one query ranks (the engine's depth); "
                              "raise depth (a knob), or narrow the query with a filter")
        # pages (offset > 0) read one fixed list of `window` hits, so consecutive pages never overlap or skip;
        # a first page asking for more than the window ranks deeper
        end = min(offset + k, window) if offset else k
        n_first = max(end, s.k_retrieve) if reranker is not None else end
        n = max(window, n_first)
        timings: dict[str, float] = {}
        vectors = None
        if s.first_stage in ("dense", "hybrid"):
            t = time.perf_counter()
            vectors = self.encoder.encode(queries, kind="query", batch_size=s.batch_size)
            timings["encode_s"] = time.perf_counter() - t
        lists = self.candidates(queries, vectors, s.first_stage, n, where, timings)
        chosen = None
        if s.passages.enabled:  # each stage's best passages -> documents, and which passage each one is read by
            lists, chosen = by_document(lists)
        t = time.perf_counter()
        if s.first_stage == "hybrid":
            weights = dense_weights(s.dense_weight)
            firsts = [fuse([b, d], s.fusion, k_rrf=s.k_rrf, weights=weights).truncate(n)
                      for b, d in zip(lists["bm25"], lists["dense"])]
        else:
            firsts = lists[s.first_stage]
        timings["fuse_s"] = time.perf_counter() - t
        t = time.perf_counter()
        alpha = resolve_blend(s.interpolation, reranker, s.first_stage)
        scored = reranker is not None and reorders(alpha)
        heads = sorted({str(d) for f in firsts for d in f.ids[:s.k_retrieve]}) if scored else []
        per_query = None
        if chosen is None:
            texts = {d.id: d.full_text for d in self.documents(heads)}  # one read for every query's candidates
        else:  # a document is read by its chosen passage (title in front, as the first stages read it), or whole
            # when it has at most rerank_whole_up_to words (as far as the reranker reads)
            pids = {c[str(d)] for c, f in zip(chosen, firsts) for d in f.ids[:s.k_retrieve]} if scored else set()
            if s.rerank_whole_up_to:  # one read: each candidate with its passages
                texts = {}
                for doc, passages, _ in self.documents_with_passages(heads):
                    if len(doc.text.split()) <= s.rerank_whole_up_to:
                        texts[doc.id] = doc.full_text
                    else:
                        texts.update((p.id, p.full_text) for p in passages if p.id in pids)
            else:
                texts = {p.id: p.full_text for p in self.passages(sorted(pids))}
            per_query = [lambda d, c=c: texts[d] if d in texts else texts[c[d]] for c in chosen]
        reranked = rerank_lists(reranker, queries, firsts, texts.__getitem__, k=end, k_retrieve=s.k_retrieve,
                                interpolation=alpha, batch_size=s.batch_size,
                                per_query=per_query)
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
        pages = [RankedList(r.ranked.ids[offset:end], r.ranked.scores[offset:end]) for r in reranked]
        return pages, stage_scores, timings, chosen


KNOBS = ("first_stage", "k_retrieve", "rerank", "fusion", "dense_weight", "k_rrf", "depth")


def settings_for(settings: EngineSettings, knobs: Mapping[str, Any]) -> tuple[EngineSettings, bool]:
    """The engine's settings with one call's knobs (None: the engine's), checked; and whether to rerank."""
    unknown = sorted(set(knobs) - set(KNOBS))
    if unknown:
        raise ConfigError(f"unknown search option(s) {', '.join(unknown)}; known: {', '.join(KNOBS)}")
    given = {name: value for name, value in knobs.items() if value is not None}
    rerank = given.pop("rerank", settings.rerank)
    if not isinstance(rerank, bool):
        raise ConfigError(f"rerank must be true or false, got {rerank!r}")
    if "first_stage" in given and given["first_stage"] not in ("hybrid", "dense", "bm25"):
        raise ConfigError(f"first_stage must be hybrid, dense or bm25, got {given['first_stage']!r}")
    for name in ("k_retrieve", "depth"):
        if name in given:
            given[name] = check_k(given[name])
    return (replace(settings, **given) if given else settings), rerank


def callable_where(where: Where) -> bool:
    return callable(where) and not isinstance(where, (CheckedFilter, str, Mapping))


class EngineRetriever:
    """An engine seen as a retriever: ``search(query, k)`` and ``search_batch`` -> RankedList."""

    def __init__(self, engine: TwoStageSearch, first_stage: str | None, rerank: bool | None,
                 k_retrieve: int | None) -> None:
        self.engine, self.first_stage, self.rerank, self.k_retrieve = engine, first_stage, rerank, k_retrieve

    def search(self, query: str, k: int = 10) -> RankedList:
        return self.search_batch([query], k)[0]

    def search_batch(self, queries: Sequence[str], k: int = 10) -> list[RankedList]:
        knobs = {"first_stage": self.first_stage, "rerank": self.rerank, "k_retrieve": self.k_retrieve}
        return self.engine._ranked(check_queries(queries), k, None, knobs)[0]


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
