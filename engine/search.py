"""From a query to reranked hits, for anything that can list first-stage candidates: one engine or many shards.

The search path is a set of functions over a :class:`~twostage.engine.source.Searchable` (:func:`search`,
:func:`search_batch`, :func:`ranked_trace`, :func:`similar`, :func:`rerank_given`): the query is encoded once, the
source returns each first stage's candidates (one engine's indexes, or the merge of every shard's), the stages fuse,
rerank and page them (:mod:`twostage.engine.stages`), and the hits are filled in from the documents the reranker read.
:class:`SearchMethods` gives both engines these as methods, and the model properties they share; it holds no state and
declares nothing abstract: what it reads of an engine is the protocol.

:meth:`SearchMethods.with_settings` and :meth:`SearchMethods.with_reranker` give read-only views of an engine (other
settings, another reranker object) that share its loaded models and its version: the harness measures systems, and
training chooses the reranker's epoch and blend, through such views, so what is measured and tuned is what the
engine serves.
"""

from __future__ import annotations

import copy
import hmac
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from twostage.engine.fusion import reorders
from twostage.engine.knobs import blend_of, settings_for
from twostage.engine.models import Models, NoRetriever, query_encoder
from twostage.engine.on_disk import EngineManifest
from twostage.engine.pages import PageToken, decode_page_token, encode_page_token, fingerprint, page_key
from twostage.engine.plan import EngineParts, make_plan
from twostage.engine.settings import EngineSettings, with_changes
from twostage.engine.source import CandidateSource, Searchable
from twostage.engine.stages import Read, SearchTrace, StageScores
from twostage.engine.stages import rerank as stage_rerank
from twostage.engine.stages import run as run_stages
from twostage.engine.steer import Steering, split_steering
from twostage.indexer.errors import ConfigError, DataError
from twostage.indexer.filters import CheckedFilter, Where, check_filter, parse_filter
from twostage.indexer.passages import split_id
from twostage.indexer.records import Hit, RankedList, SearchResult, check_encodable, check_k
from twostage.models.device import resolve_precisions

if TYPE_CHECKING:
    from twostage.indexer.protocols import Reranker

class SearchMethods:
    """The entry points and model properties both engines share (a mixin: no state of its own, nothing abstract).

    What they read of the engine is the :class:`~twostage.engine.source.Searchable` protocol, which
    :class:`~twostage.engine.search_engine.SearchEngine` and :class:`~twostage.engine.sharded.ShardedEngine` each
    implement: the methods take ``self`` as that protocol and hand it to the functions of this module, so the search
    path never calls back into a subclass it does not name."""

    manifest: EngineManifest
    root: Path
    version_dir: Path
    _models: Models
    encoder: Any
    read_only: bool = False  # a view (with_settings, with_reranker): it searches, it never writes or releases

    @property
    def loaded_models(self) -> Models:
        """The models this engine searches with (loaded on first use), shared with its views and the versions it
        opens."""
        return self._models

    def with_settings(self, **changes: Any) -> Any:
        """A read-only view of this engine with other search settings (the :class:`EngineSettings` names; old names
        mapped with a DeprecationWarning), sharing its version and loaded models. The engine itself is unchanged;
        :meth:`configure` writes settings into a new version."""
        view = copy.copy(self)
        view.manifest = replace(self.manifest, settings=with_changes(self.settings, changes, "with_settings"))
        view.read_only = True
        return view

    def with_reranker(self, reranker: Reranker) -> Any:
        """A read-only view of this engine that reranks with ``reranker`` (a :class:`~twostage.indexer.protocols.
        PairScorer`, ``predict(pairs, batch_size=)``, or a ``QueryScorer``, ``score(query, texts)``), e.g. a model
        being trained, scored through the engine's path."""
        view = copy.copy(self)
        view._models = Models(encoder=self.encoder, reranker=reranker, late=self._models.late,
                              requested_device=self._models.device_as_known, weights=self._models.weights,
                              parent=self._models)  # the late encoder, loaded once for the engine and its views
        view.read_only = True
        return view

    def check_writable(self) -> None:
        if self.read_only:
            raise ConfigError("this engine object is a read-only view (with_settings / with_reranker); write "
                                "through the engine it was made from")

    @property
    def settings(self) -> EngineSettings:
        return self.manifest.settings

    @property
    def version(self) -> str:
        return self.version_dir.name

    @property
    def has_reranker(self) -> bool:
        """Whether the engine has a reranker (named in its manifest, or given to a view)."""
        return self.manifest.reranker is not None or self._models.reranker is not None

    @property
    def reranks(self) -> bool:
        """Whether searches rerank by default: the settings say so and the engine has a reranker."""
        return bool(self.settings.rerank and self.has_reranker)

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

    def shares_models(self, other: Searchable) -> bool:
        """Whether ``other`` searches with this engine's loaded models (a version a model swap wrote does not)."""
        return self._models is other.loaded_models

    def use_models(self, *, encoder: Any = None, reranker: Any = None, late: Any = None) -> None:
        """Search with these objects in place of the loaded models, e.g. wrappers that batch across requests
        (:mod:`twostage.app.batching`). They must score exactly like the models they wrap; the engines that
        :meth:`refresh` and the updates return share them."""
        with self._models.lock:
            if encoder is not None:
                self._models.encoder = encoder
            if reranker is not None:
                self._models.reranker = reranker
            if late is not None:
                self._models.late = late

    def loaded_encoder(self) -> Any:
        """The bi-encoder, loaded (its weights verified against the manifest) on first use."""
        from twostage.retriever.biencoder import BiEncoder

        if self.manifest.retriever is None:  # built BM25-only: zero-width vectors, nothing to load
            if self._models.encoder is None:
                self._models.encoder = NoRetriever()
            return self._models.encoder
        return self._models.loaded("encoder", self.manifest.retriever, "retriever", BiEncoder.load,
                                   self.settings.precision)

    @property
    def query_side(self) -> Any:
        """What encodes queries: the bi-encoder once it is loaded, before that its queries without torch where its
        OpenVINO export allows (:func:`~twostage.engine.models.query_encoder`: a cold search in about a second),
        else the bi-encoder, loaded now."""
        if self.manifest.retriever is not None and self._models.encoder is None:
            fast = query_encoder(self._models, self.manifest.retriever, self.settings.precision)
            if fast is not None:
                return fast
        return self.loaded_encoder()  # queries need no dense index attached (the engine's ``encoder`` attaches it)

    @property
    def reranker(self) -> Any:
        """The cross-encoder (None when the engine has none), loaded and verified on first use."""
        if self._models.reranker is not None:  # loaded, or given (use_models, with_reranker)
            return self._models.reranker
        if self.manifest.reranker is None:
            return None
        from twostage.reranker.cross_encoder import CrossEncoder

        return self._models.loaded("reranker", self.manifest.reranker, "reranker", CrossEncoder.load,
                                   self.settings.precision)

    @property
    def late(self) -> Any:
        """The late-interaction encoder (None when the engine has none), loaded and verified on first use, in the
        retriever's precision."""
        if self._models.late is not None:
            return self._models.late
        if self.manifest.late is None:
            return None
        return self._models.loaded("late", self.manifest.late, "retriever", load_late, self.settings.precision)

    @property
    def language(self: Searchable) -> str:
        """The lexical analysis in words: ``auto (de, en)``, ``zh``, or the English one of older engines."""
        return str(self.analyzer().config.described)

    def late_languages(self) -> tuple[str, ...] | None:
        """The languages the late-interaction model's card lists (None: no such model, or its card does not say:
        every language), read once per model."""
        ref = self.manifest.late
        if ref is None:
            return None
        cached = self.__dict__.get("_late_languages")
        if cached is None or cached[0] != ref.sha256:
            from twostage.models.model_card import model_languages

            cached = (ref.sha256, model_languages(ref.path) if Path(ref.path).is_dir() else None)
            self.__dict__["_late_languages"] = cached
        return cached[1]

    # ---- the entry points: each hands the engine, as a Searchable, to this module's functions ------------------
    def search(self: Searchable, query: str, k: int = 10, *, where: Where = None, offset: int = 0,
               page_token: str | None = None, **knobs: Any) -> SearchResult:
        """The ``k`` best documents for ``query``: first stage, then the reranker on the top ``rerank_depth``.

        Hits carry id, title, text, metadata, the final score and each stage's score; ``timings`` the seconds
        of each stage. ``where`` is a filter (:mod:`twostage.indexer.filters`: a JSON object such as
        ``{"year": {"$gte": 2020}}``, or a function of a Document). ``offset`` skips the first hits (a page);
        ``page_token`` is the result's ``next_page`` from the call before: the next ``k`` hits of the same query,
        filter and knobs, from the same engine version. ``knobs`` are :data:`KNOBS` for this call only, and the
        steering options (:mod:`twostage.engine.steer`, docs/steering.md): ``like`` / ``unlike`` (document ids: the
        query moves towards / away from them; they are left out of the hits unless ``include_feedback``),
        ``diversity`` (maximal marginal relevance's weight in [0, 1], or True for the default), ``group_by`` (a
        metadata field; ``group_size`` hits per value; ``k`` and ``offset`` then count groups) and ``explain`` (each
        hit carries how its score was made).

        Raises:
            ConfigError: an empty query, ``k`` or ``offset`` out of range, an unknown option or one asking for a part
                the engine lacks (a reranker, token vectors, a retriever), a page token of another search.
            FilterError: ``where`` is malformed or names a field no document has.
            PageExpiredError: ``page_token`` belongs to a version no longer on disk.
        """
        return search(self, query, k, where=where, offset=offset, page_token=page_token, **knobs)

    def search_batch(self: Searchable, queries: Sequence[str], k: int = 10, *, where: Where = None, offset: int = 0,
                     **knobs: Any) -> list[SearchResult]:
        """:meth:`search` for many queries: encoded in one pass, their pairs reranked in shared batches.

        Each result's ``timings`` are the batch's seconds per stage divided by the number of queries.
        """
        return search_batch(self, queries, k, where=where, offset=offset, **knobs)

    def ranked(self: Searchable, query: str, k: int = 10, *, where: Where = None, offset: int = 0,
               **knobs: Any) -> RankedList:
        """Ids and final scores only (the retriever contract: ``search(query, k) -> RankedList``)."""
        return ranked_trace(self, check_queries([query]), k, where, knobs, offset).pages[0]

    def similar(self: Searchable, doc_id: str, k: int = 10, *, where: Where = None, offset: int = 0,
                page_token: str | None = None, **knobs: Any) -> SearchResult:
        """The ``k`` documents most like the document ``doc_id`` (itself left out unless ``include_feedback``): its
        vector as the dense query and its strongest terms as BM25's (:mod:`twostage.engine.steer`). The reranker,
        which judges answers to a question, does not run; the result's query is the document's title (or its first
        words). ``knobs``: the stage knobs and steering options of :meth:`search`."""
        return similar(self, doc_id, k, where=where, offset=offset, page_token=page_token, **knobs)

    def rerank(self: Searchable, queries: Sequence[str], candidates: Sequence[RankedList],
               **knobs: Any) -> list[RankedList]:
        """First-stage lists from elsewhere (a run file's: one per query, every document in this engine) reranked by
        this engine's own reranking: each list's top ``rerank_depth`` read by the reranker as the engine reads a
        document (whole: an engine built with ``passage_words=0``) and blended with the list's scores by the
        engine's blend; the rest follow in their order. ``knobs``: :data:`KNOBS` for this call (``rerank_depth``,
        ``rerank_blend``...)."""
        return rerank_given(self, queries, candidates, **knobs)

    def work_of(self: Searchable, queries: int, **knobs: Any) -> SearchWork:
        """What searching ``queries`` queries with ``knobs`` asks of the models, counted before any of it runs (a
        server's budgets): the (query, candidate) pairs the cross-encoder scores and the candidates MaxSim reads,
        at most, summed over the queries (the first stage may find fewer candidates)."""
        return work_of(self, queries, **knobs)

    def as_retriever(self: Searchable, *, first_stage: str | None = None, rerank: bool | None = None,
                     rerank_depth: int | None = None, maxsim: bool | None = None) -> EngineRetriever:
        """This engine as a plain retriever (``search`` / ``search_batch`` -> RankedList), e.g. for the harness."""
        return EngineRetriever(self, first_stage, rerank, rerank_depth, maxsim)

    def read_page_token(self, text: str) -> PageToken:
        """A ``next_page`` token this engine gave, its signature checked (:mod:`twostage.engine.pages`)."""
        return decode_page_token(text, page_key(self.root))

    def window(self, knobs: Mapping[str, Any]) -> int:
        """How many hits one query ranks, and so how deep pages go: the first stage's depth (or the rerank depth,
        when larger and reranking)."""
        s, rerank = settings_for(self.settings, split_steering(knobs)[1])
        return max(s.first_stage_depth, s.rerank_depth) if rerank and self.has_reranker else s.first_stage_depth

    def check_where(self: Searchable, where: Where) -> Where:
        """A JSON filter parsed and checked against the metadata's fields and types (every shard's); a function
        or None as it is."""
        return check_where(self, where)

    def parts(self: Searchable) -> EngineParts:
        """What this engine holds that a search's plan depends on."""
        return parts_of(self)


# ---- the search path over a Searchable (the methods above call these) --------------------------------------------
def search(engine: Searchable, query: str, k: int = 10, *, where: Where = None, offset: int = 0,
           page_token: str | None = None, **knobs: Any) -> SearchResult:
    """:meth:`SearchMethods.search`: a first page, or the page a token names (from the version it pins)."""
    if page_token is not None:
        if offset:
            raise ConfigError("give offset or page_token, not both (the token holds its offset)")
        check_where(engine, where)  # a malformed filter is named before it is digested
        token = decode_page_token(page_token, page_key(engine.root))
        if k != token.k:
            raise ConfigError(f"page_token: it pages {token.k} hits at a time; ask for k={token.k} with it (or "
                              "search again without it for a first page of another size)")
        if not hmac.compare_digest(token.fingerprint, fingerprint(query, where, knobs)):
            raise ConfigError("page_token: it was given for another query, filter or settings; search again "
                              "without it for the first page")
        with engine.at_version(token.version) as pinned:
            return search_batch(pinned, [query], k, where=where, offset=token.offset, **knobs)[0]
    return search_batch(engine, [query], k, where=where, offset=offset, **knobs)[0]


def search_batch(engine: Searchable, queries: Sequence[str], k: int = 10, *, where: Where = None, offset: int = 0,
                 **knobs: Any) -> list[SearchResult]:
    """:meth:`SearchMethods.search_batch`: the stages' trace, then the hits from the documents the reranker read
    (the rest of the pages' documents read now, once)."""
    queries = check_queries(queries)
    trace = ranked_trace(engine, queries, k, where, knobs, offset)
    t = time.perf_counter()
    docs = dict(trace.read)  # what the reranker read, whole; the rest of the pages' documents read now
    missing = sorted({str(d) for r in trace.pages for d in r.ids} - set(docs))
    docs.update((entry[0].id, entry) for entry in engine.documents_with_passages(missing))
    trace.timings["fetch_s"] = time.perf_counter() - t
    n = len(queries)
    per_query = {name: seconds / n for name, seconds in trace.timings.items()}
    per_query["total_s"] = sum(per_query.values())
    key: bytes | None = None  # the page-token key, read once a batch
    out, analyzer = [], engine.analyzer()
    for q, (query, scores) in enumerate(zip(queries, trace.stage_scores)):
        hits = tuple(hits_of(trace, q, scores, docs, offset, analyzer))
        following = None
        if trace.more[q] and not callable_where(where):
            token = PageToken(engine.version, offset + k, k, fingerprint(query, where, knobs), int(time.time()))
            key = key or page_key(engine.root)
            following = encode_page_token(token, key)
        out.append(SearchResult(query, hits, per_query, following))
    return out


def ranked_trace(engine: Searchable, queries: list[str], k: int, where: Where, knobs: Mapping[str, Any],
                 offset: int = 0) -> SearchTrace:
    """Each query's page of final ids and scores, with what the hits carry: the plan made once, then every
    stage (:mod:`twostage.engine.stages`)."""
    plan = make_plan(engine.settings, knobs, k, offset, parts_of(engine))
    where = check_where(engine, where)
    check_steering(engine, plan.steer)
    return run_stages(engine, plan, queries, query_languages(engine, queries, plan.settings), where)


def parts_of(engine: Searchable) -> EngineParts:
    """What ``engine`` holds that a search's plan depends on."""
    m = engine.manifest
    return EngineParts(m.retriever is not None, m.reranker is not None, engine.has_reranker, m.late is not None)


def similar(engine: Searchable, doc_id: str, k: int = 10, *, where: Where = None, offset: int = 0,
            page_token: str | None = None, **knobs: Any) -> SearchResult:
    """:meth:`SearchMethods.similar`: the document's title (or first words) searched with it as the liked one."""
    if not isinstance(doc_id, str) or not doc_id:
        raise ConfigError(f"similar takes a document id (a non-empty string), got {doc_id!r}")
    if knobs.get("rerank") is True:
        raise ConfigError("similar: the reranker scores answers to a query, not likeness to a document; search "
                          "similar documents without rerank")
    if knobs.get("like") or knobs.get("similar") is not None:
        raise ConfigError("similar: the document is the query; add other liked documents with search(like=...)")
    try:
        doc = engine.documents([doc_id])[0]
    except KeyError:
        raise ConfigError(f"similar: document {doc_id!r} is not in the engine (deleted, or never added)") from None
    text = doc.title.strip() or " ".join(doc.text.split()[:12]) or doc_id
    return search(engine, text, k, where=where, offset=offset, page_token=page_token,
                  **{**knobs, "like": [doc_id], "similar": True, "rerank": False})


def work_of(engine: Searchable, queries: int, **knobs: Any) -> SearchWork:
    """:meth:`SearchMethods.work_of`: the pairs and MaxSim candidates of ``queries`` searches, at most."""
    steer, rest = split_steering(knobs)
    s, rerank = settings_for(engine.settings, rest)
    pairs = 0
    if rerank and engine.manifest.reranker is not None:
        alpha = blend_of(s, engine.loaded_models.reranker, s.first_stage) if s.rerank_blend != "auto" else None
        if reorders(alpha) or s.min_relevance > 0:
            pairs = queries * s.rerank_depth
    maxsim = queries * s.maxsim_depth if s.maxsim and engine.manifest.late is not None and not steer.similar \
        else 0
    return SearchWork(queries, pairs, maxsim)


def check_where(engine: CandidateSource, where: Where) -> Where:
    """``where`` parsed and checked against the source's metadata (:meth:`SearchMethods.check_where`)."""
    if where is None or callable_where(where):
        return where
    f = parse_filter(where)
    check_filter(f, engine.metadata_kinds())
    return CheckedFilter(f)


def check_steering(engine: Searchable, steer: Steering) -> None:
    """The steering options against this engine: a field to group by some document has, vectors to diversify
    with."""
    if steer.group_by is not None:
        kinds = engine.metadata_kinds()
        if steer.group_by not in kinds:
            raise ConfigError(f"group_by: no document has the metadata field {steer.group_by!r}; fields: "
                              f"{', '.join(sorted(kinds)) or 'none'}")
    if (steer.diversity > 0 or steer.similar) and engine.manifest.retriever is None:
        raise ConfigError(("diversity" if steer.diversity > 0 else "similar") + " compares the documents' dense "
                          "vectors, and this engine was built without a retriever (BM25 only); rebuild it with "
                          "--retriever")


def query_languages(engine: CandidateSource, queries: list[str], s: EngineSettings) -> list[str] | None:
    """Each query's language as the engine's analysis reads it, when a model's languages make it matter."""
    if s.language is None or (s.dense_languages is None and s.rerank_languages is None
                              and (not s.maxsim or engine.late_languages() is None)):
        return None
    analyzer = engine.analyzer()
    return [analyzer.language_of(q) for q in queries]


def rerank_given(engine: Searchable, queries: Sequence[str], candidates: Sequence[RankedList],
                 **knobs: Any) -> list[RankedList]:
    """:meth:`SearchMethods.rerank`: lists from elsewhere through the engine's reranking."""
    queries = check_queries(queries)
    if len(candidates) != len(queries):
        raise ConfigError(f"rerank: {len(queries)} queries but {len(candidates)} candidate lists; give one each")
    s, _ = settings_for(engine.settings, knobs)
    if s.passages.enabled:
        raise ConfigError("rerank: lists from elsewhere name whole documents; rerank them with an engine built "
                          "with passage_words 0")
    if engine.reranker is None:
        raise ConfigError("this engine has no reranker; build it with --reranker")
    end = check_k(max(len(c) for c in candidates) or 1)
    reranked, _, _ = stage_rerank(engine, queries, list(candidates), None, s, engine.reranker, end, {})
    return [r.ranked for r in reranked]


@dataclass(frozen=True)
class SearchWork:
    """What one search call asks of the models (:meth:`SearchMethods.work_of`)."""

    queries: int
    pairs: int  # (query, candidate) pairs the cross-encoder scores
    maxsim: int  # candidates MaxSim reads


def load_late(path: Path, *, precision: str, **kwargs: Any) -> Any:
    """The late-interaction encoder in ``path`` (:class:`~twostage.retriever.late.LateEncoder`) in ``precision``;
    an int8 precision reads as its fp32 one (token vectors are not calibrated)."""
    from twostage.retriever.late import LateEncoder

    precision = {"openvino-int8": "openvino-fp32", "int8": "fp32"}.get(precision, precision)
    return LateEncoder.load(path, precision=precision, **kwargs)


def hits_of(trace: SearchTrace, q: int, scores: StageScores, docs: Mapping[str, Read], offset: int,
            analyzer: Any) -> Iterable[Hit]:
    """Query ``q``'s page as hits, each filled in from its document in ``docs`` (with its passages: the one shown is
    its best, with the query's terms marked)."""
    from twostage.indexer.passages import hit_passage

    page, reads = trace.pages[q], trace.reads
    for rank, (d, score) in enumerate(zip(page.ids, page.scores), offset + 1):
        doc, passages, starts = docs[str(d)]
        stages = {name: table[str(d)] for name, table in scores.items() if str(d) in table}
        best = split_id(reads[q][str(d)][0])[1] if reads is not None else None
        yield Hit(doc.id, float(score), rank, stages.get("first_stage"), doc.text, doc.title, dict(doc.metadata),
                  stages, hit_passage(trace.queries[q], doc, passages, starts, best, analyzer),
                  trace.groups[q].get(str(d)) if trace.groups is not None else None,
                  trace.explanations[q][str(d)] if trace.explanations is not None else None)


def callable_where(where: Where) -> bool:
    return callable(where) and not isinstance(where, (CheckedFilter, str, Mapping))


class EngineRetriever:
    """An engine seen as a retriever: ``search(query, k)`` and ``search_batch`` -> RankedList."""

    def __init__(self, engine: Searchable, first_stage: str | None, rerank: bool | None,
                 rerank_depth: int | None, maxsim: bool | None = None) -> None:
        self.engine, self.first_stage, self.rerank, self.rerank_depth = engine, first_stage, rerank, rerank_depth
        self.maxsim = maxsim

    def search(self, query: str, k: int = 10) -> RankedList:
        return self.search_batch([query], k)[0]

    def search_batch(self, queries: Sequence[str], k: int = 10) -> list[RankedList]:
        return ranked_trace(self.engine, check_queries(queries), k, None, self.knobs()).pages

    def knobs(self) -> dict[str, Any]:
        return {"first_stage": self.first_stage, "rerank": self.rerank, "rerank_depth": self.rerank_depth,
                "maxsim": self.maxsim}

    def reading_notes(self, queries: Sequence[str]) -> list[str]:
        """What this system's models cut of the engine's documents and of ``queries``
        (:func:`twostage.engine.reading.reading_notes`)."""
        from twostage.engine.reading import reading_notes

        s, rerank = settings_for(self.engine.settings, self.knobs())
        return reading_notes(self.engine, queries, dense=s.first_stage != "bm25",
                             rerank=rerank and self.engine.has_reranker)


def ids_to_delete(ids: Iterable[str]) -> list[str]:
    """The ids of a delete as a list: at least one, each a string of valid Unicode (else one ConfigError)."""
    ids = list(ids)
    if not ids:
        raise ConfigError("no ids to delete")
    for i in ids:
        if not isinstance(i, str):
            raise ConfigError("document ids to delete must be strings")
        try:
            check_encodable(i, f"document id {i[:40]!r} to delete")
        except DataError as exc:
            raise ConfigError(str(exc)) from None
    return ids


def check_queries(queries: Sequence[str]) -> list[str]:
    """The queries as a list, each a non-empty string (else one ConfigError naming the query)."""
    if isinstance(queries, str) or not isinstance(queries, Sequence):
        raise ConfigError("search_batch takes a list of query strings; use search for one")
    for i, q in enumerate(queries):
        if not isinstance(q, str):
            raise ConfigError(f"query #{i + 1} is {type(q).__name__}, not a string")
        if not q.strip():
            raise ConfigError(f"query #{i + 1} is empty; give it some words")
        try:
            check_encodable(q, f"query #{i + 1}")
        except DataError as exc:
            raise ConfigError(str(exc)) from None
    if not queries:
        raise ConfigError("no queries given")
    return list(queries)
