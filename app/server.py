"""``twostage serve``: a search engine directory over HTTP (FastAPI + uvicorn, the optional extra ``serve``).

>>> app = create_app("engines/docs", api_key="s3cret")          # an ASGI app; run it with uvicorn
>>> serve("engines/docs", host="127.0.0.1", port=8000)          # or let twostage run it

Endpoints: ``POST /search``, ``POST /search/batch``, ``POST /documents`` (add or upsert), ``DELETE /documents``,
``GET /health``, ``GET /stats``, ``GET /metrics`` (Prometheus, :mod:`twostage.app.observe`), ``POST /v1/embeddings``
and ``POST /v1/rerank`` (OpenAI's and Cohere's shapes, :mod:`twostage.app.compat`), the search page at ``/`` and
the OpenAPI docs at ``/docs``. Searches run in
worker threads; concurrent ones share the query encoder's and the reranker's forward passes
(:mod:`twostage.app.batching`). Writes go through the engine's locked, atomic updates; searches keep being
answered from the old version until the new one is committed, then from the new one. Every error is a JSON body
``{"error": "..."}`` that names the problem; a server error is logged with its traceback and answered with a 500
that says nothing of the inside.
"""

from __future__ import annotations

import hmac
import json
import logging
import math
import threading
import time
import uuid
from collections import Counter, deque
from collections.abc import AsyncIterator, Callable, Iterator, Sequence
from contextlib import AbstractContextManager, asynccontextmanager, contextmanager
from dataclasses import asdict
from importlib import resources
from pathlib import Path
from typing import Annotated, Any, Literal

from twostage.engine.options import SEARCH_OPTIONS, SearchOption
from twostage.indexer.errors import (
    ConfigError,
    DataError,
    MissingDependencyError,
    PageExpiredError,
    ShardUnavailableError,
    TwostageError,
)
from twostage.indexer.records import Document, SearchResult, check_encodable, check_metadata
from twostage.indexer.versions import WriterBusyError
from twostage.indexer.work import WorkScope, WorkStopped

logger = logging.getLogger(__name__)

try:
    from fastapi import Depends, FastAPI, Request
    from fastapi.exceptions import RequestValidationError
    from fastapi.responses import HTMLResponse, JSONResponse, Response
    from pydantic import BaseModel, ConfigDict, Field, create_model, field_validator
    from starlette.exceptions import HTTPException

    from twostage.app.admission import Admission, Busy, is_expensive
    from twostage.app.budgets import Budgets, OverBudget
    from twostage.app.compat import not_blank
except ImportError as exc:  # pragma: no cover - depends on the environment
    raise MissingDependencyError("twostage serve needs FastAPI and uvicorn: "
                                 "pip install 'twostage-search[serve]'") from exc

MAX_K = 1000
MAX_BATCH = 256
MAX_DOCUMENTS = 10_000
MAX_BODY_BYTES = 16 * 1024 * 1024
MAX_QUERY_CHARS = 10_000  # characters of one query: /search's, /similar's and each of /search/batch's
REQUEST_TIMEOUT_S = 300.0  # a request still running after this long stops at its next stage boundary (503)
LOOPBACK_HOSTS = ("localhost", "127.0.0.1", "::1")
QUIET_S = 0.5  # the server is idle for bulk work once no search has run for this long
DISCONNECTED = "twostage.disconnected"  # the ASGI scope's key of the event set when the client disconnects


# ---- requests and responses ------------------------------------------------------------------------
class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


def _option_field(option: SearchOption) -> tuple[Any, Any]:
    """An HTTP request's field for a search option (:mod:`twostage.engine.options`): its type, range and help."""
    high = option.high if option.kind != "int" or option.high is None else min(option.high, MAX_K)
    kinds: dict[str, Any] = {"int": int, "float": float, "bool": bool,
                             "blend": Annotated[float, Field(ge=0, le=1)] | Literal["none"]}
    kind = Literal[option.choices] if option.kind == "choice" else kinds[option.kind]  # type: ignore[valid-type]
    return kind | None, Field(None, ge=option.low, le=high, description=option.help)


# the search options' fields, made from their one description
_SearchKnobs = create_model("_SearchKnobs", __base__=_Strict,
                            **{o.name: _option_field(o) for o in SEARCH_OPTIONS})  # type: ignore[call-overload]


class SearchOptions(_SearchKnobs):  # type: ignore[valid-type, misc]
    k: int = Field(10, ge=1, le=MAX_K, description="hits to return")
    where: dict[str, Any] | None = Field(None, description="a filter on the metadata, e.g. {\"year\": {\"$gte\": "
                                                           "2020}} (docs/filters.md)")
    offset: int = Field(0, ge=0, le=MAX_K, description="skip this many hits (a page)")
    k_retrieve: int | None = Field(None, ge=1, le=MAX_K, description="deprecated: rerank_depth's old name",
                                   json_schema_extra={"deprecated": True})
    depth: int | None = Field(None, ge=1, le=MAX_K, description="deprecated: first_stage_depth's old name",
                              json_schema_extra={"deprecated": True})
    interpolation: Annotated[float, Field(ge=0, le=1)] | Literal["none"] | None = Field(
        None, description="deprecated: rerank_blend's old name", json_schema_extra={"deprecated": True})
    full_text: bool = Field(False, description="return each hit's whole text, not only its best passage")
    like: list[Annotated[str, Field(min_length=1, max_length=1000)]] | None = Field(
        None, max_length=100, description="more like these documents (ids); left out of the hits")
    unlike: list[Annotated[str, Field(min_length=1, max_length=1000)]] | None = Field(
        None, max_length=100, description="less like these documents (ids); left out of the hits")
    include_feedback: bool | None = Field(None, description="keep the liked and unliked documents among the hits")
    diversity: bool | float | None = Field(
        None, description="maximal marginal relevance's weight of diversity, a number in [0, 1] (0: relevance alone; "
                          "true: the default)")
    group_by: str | None = Field(None, min_length=1, max_length=200, description="at most group_size hits per value "
                                 "of this metadata field; k and offset count groups")
    group_size: int | None = Field(None, ge=1, le=1000, description="hits per group (default 1)")
    explain: bool | None = Field(None, description="each hit carries how its score was made")

    @field_validator("diversity", mode="before")
    @classmethod
    def _diversity(cls, value: Any) -> Any:
        if value is None or isinstance(value, bool):
            return value
        if isinstance(value, (int, float)) and math.isfinite(value) and 0 <= value <= 1:
            return float(value)
        raise ValueError(f"must be true, false or a number from 0 to 1, got {json.dumps(value)[:40]}")

    def knobs(self) -> dict[str, Any]:
        """The search options given (None: the engine's); old field names pass as they are, mapped by the engine's
        one rename table (:data:`twostage.engine.settings.RENAMES`)."""
        given = {"rerank_depth": self.rerank_depth, "k_retrieve": self.k_retrieve, "first_stage": self.first_stage,
                 "rerank": self.rerank, "rerank_blend": self.rerank_blend, "fusion": self.fusion,
                 "dense_weight": self.dense_weight, "k_rrf": self.k_rrf, "first_stage_depth": self.first_stage_depth,
                 "depth": self.depth, "interpolation": self.interpolation, "min_relevance": self.min_relevance, "like": self.like, "unlike": self.unlike,
                 "include_feedback": self.include_feedback, "diversity": self.diversity, "group_by": self.group_by,
                 "group_size": self.group_size, "explain": self.explain, "maxsim": self.maxsim,
                 "maxsim_depth": self.maxsim_depth, "maxsim_blend": self.maxsim_blend}
        return {name: value for name, value in given.items() if value is not None}


class SearchRequest(SearchOptions):
    query: str = Field(..., min_length=1, max_length=MAX_QUERY_CHARS)
    page_token: str | None = Field(None, max_length=200, description="a result's next_page: its next k hits, "
                                                                      "from the same engine version")

    _words = field_validator("query")(classmethod(lambda cls, value: not_blank(value)))


class SimilarRequest(SearchOptions):
    id: str = Field(..., min_length=1, max_length=1000, description="the document whose likes are wanted")
    page_token: str | None = Field(None, max_length=200, description="a result's next_page")


class BatchSearchRequest(SearchOptions):
    queries: list[Annotated[str, Field(max_length=MAX_QUERY_CHARS)]] = Field(..., min_length=1, max_length=MAX_BATCH)

    @field_validator("queries")
    @classmethod
    def _each(cls, values: list[str]) -> list[str]:
        for i, q in enumerate(values):
            if not q.strip():
                raise ValueError(f"query #{i + 1} is empty; give every query some words")
            check_encodable(q, f"query #{i + 1}")
        return values


class DocumentIn(_Strict):
    id: str = Field(..., min_length=1, max_length=1000)
    text: str = ""
    title: str = ""
    metadata: dict[str, Any] = Field(default_factory=dict)


class DocumentsRequest(_Strict):
    documents: list[DocumentIn] = Field(..., min_length=1, max_length=MAX_DOCUMENTS)
    upsert: bool = Field(False, description="replace documents whose id exists (else such an id is an error)")


class DeleteRequest(_Strict):
    ids: list[str] = Field(..., min_length=1, max_length=MAX_DOCUMENTS)

    @field_validator("ids")
    @classmethod
    def _valid(cls, values: list[str]) -> list[str]:
        for i, doc_id in enumerate(values):
            check_encodable(doc_id, f"id #{i + 1}")
        return values


class PassageOut(BaseModel):
    text: str = Field(..., description="the part of the document that scored best")
    start: int = Field(..., description="where it starts in the document's text")
    end: int
    spans: list[tuple[int, int]] = Field(..., description="the query's terms in text: [start, end) pairs")


class HitOut(BaseModel):
    id: str
    rank: int
    score: float
    title: str
    passage: PassageOut
    text: str | None = None
    metadata: dict[str, Any]
    stage_scores: dict[str, float]
    group: Any = Field(None, description="the hit's value of the group_by field (a grouped search)")
    explanation: dict[str, Any] | None = Field(None, description="how the score was made (explain): the parts and "
                                                                 "their arithmetic, and the same in words (lines)")


class SearchOut(BaseModel):
    query: str
    version: str
    hits: list[HitOut]
    timings_ms: dict[str, float]
    next_page: str | None = None
    nothing_relevant: bool = Field(False, description="true when min_relevance left no hit: nothing relevant found")


class BatchSearchOut(BaseModel):
    version: str
    results: list[SearchOut]


class WriteOut(BaseModel):
    version: str
    documents: int
    changed: int


# ---- the engine a request sees ---------------------------------------------------------------------
class EngineHolder:
    """The engine version requests search, moved to the newest committed version as it appears.

    A version stays open while a request uses it; the one it replaced is closed when its last request ends, so a
    commit never pulls files from under a running search.
    """

    def __init__(self, engine: Any, check_every_s: float = 0.25, prepare: Any = None) -> None:
        self._engine = engine
        self._prepare = prepare  # called on a newer version with other models (a swap) before it is served
        self._users: Counter[int] = Counter()
        self._retired: dict[int, Any] = {}
        self._lock = threading.Lock()
        self._refreshing = threading.Lock()
        self._checked = time.monotonic()
        self.check_every_s = check_every_s

    @property
    def engine(self) -> Any:
        return self._engine

    @contextmanager
    def use(self) -> Iterator[Any]:
        self._maybe_refresh()
        with self._lock:
            engine = self._engine
            self._users[id(engine)] += 1
        try:
            yield engine
        finally:
            with self._lock:
                self._users[id(engine)] -= 1
                self._close_unused()

    def swap(self, new: Any) -> None:
        """Serve ``new`` from now on, unless a newer version is already served."""
        with self._lock:
            if new is self._engine or _number(new.version) < _number(self._engine.version):
                return
            self._retired[id(self._engine)] = self._engine
            self._engine = new
            self._close_unused()

    def _close_unused(self) -> None:
        for key, old in list(self._retired.items()):
            if self._users[key] <= 0:
                del self._retired[key], self._users[key]
                old.close()

    def refresh(self) -> None:
        """Move to the newest committed version now (``/health`` asks; searches check every ``check_every_s``)."""
        self._checked = float("-inf")
        self._maybe_refresh()

    def _maybe_refresh(self) -> None:
        now = time.monotonic()
        if now - self._checked < self.check_every_s or not self._refreshing.acquire(blocking=False):
            return
        try:
            self._checked = now
            new = self._engine.refresh()
            if new is not self._engine:
                if self._prepare is not None and not new.shares_models(self._engine):
                    self._prepare(new)  # its models load (and batch) before any request reaches it
                self.swap(new)
        except Exception:  # a version another process committed cannot be opened: keep serving this one
            logger.exception("could not open the engine's newest version; still serving %s", self._engine.version)
        finally:
            self._refreshing.release()

    def close(self) -> None:
        with self._lock:
            for old in self._retired.values():
                old.close()
            self._retired.clear()
            self._engine.close()


def _number(version: str) -> int:
    return int(version.lstrip("v") or 0)


# ---- statistics ----------------------------------------------------------------------------------------
class ServerStats:
    """Request counts and the latest latencies of each stage (a window of the last ``window`` searches)."""

    def __init__(self, window: int = 10_000) -> None:
        self.started = time.time()
        self.requests: Counter[str] = Counter()
        self.responses: Counter[str] = Counter()
        self.latency: dict[str, deque[float]] = {}
        self.window = window
        self._lock = threading.Lock()

    def count(self, route: str, status: int) -> None:
        with self._lock:
            self.requests[route] += 1
            self.responses[str(status)] += 1

    def record(self, timings_ms: dict[str, float], request_ms: float) -> None:
        with self._lock:
            for stage, ms in {**timings_ms, "request": request_ms}.items():
                self.latency.setdefault(stage, deque(maxlen=self.window)).append(ms)

    def snapshot(self) -> dict[str, Any]:
        import numpy as np

        with self._lock:
            latency = {stage: {"count": len(v), **{f"p{p}": round(float(np.percentile(list(v), p)), 3)
                                                   for p in (50, 95, 99)}}
                       for stage, v in self.latency.items() if v}
            return {"uptime_s": round(time.time() - self.started, 1), "requests": dict(self.requests),
                    "responses": dict(self.responses), "latency_ms": latency}


# ---- the app -----------------------------------------------------------------------------------------
class SafeJSONResponse(JSONResponse):
    """JSON as UTF-8, except that a body holding a lone surrogate (text no UTF-8 can carry) is written with
    ``\\uXXXX`` escapes instead of failing as a 500: every request's input is checked for them, this guards the
    answers whatever path one takes in (the server's default response class)."""

    def render(self, content: Any) -> bytes:
        try:
            return super().render(content)
        except UnicodeEncodeError:
            return json.dumps(content, ensure_ascii=True, allow_nan=False, separators=(",", ":")).encode("ascii")


def _error(status: int, message: str, headers: dict[str, str] | None = None, **extra: Any) -> JSONResponse:
    # a message may quote what the client sent: a lone surrogate in it is written as its escape, not a 500
    return SafeJSONResponse({"error": message.encode("utf-8", "backslashreplace").decode("utf-8"), **extra},
                            status_code=status, headers=headers)


class _BodyLimit:
    """Refuse a request body over ``limit`` bytes with a 413 before any of it is parsed (chunked bodies too)."""

    def __init__(self, app: Any, limit: int) -> None:
        self.app, self.limit = app, limit

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        too_big = _error(413, f"the request body is over the limit of {self.limit} bytes; send fewer documents or "
                              "queries per request")
        length = dict(scope.get("headers") or []).get(b"content-length")
        if length is not None and length.isdigit() and int(length) > self.limit:
            await too_big(scope, receive, send)
            return
        chunks, size = [], 0
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                return
            size += len(message.get("body", b""))
            if size > self.limit:
                await too_big(scope, receive, send)
                return
            chunks.append(message.get("body", b""))
            if not message.get("more_body"):
                break
        body, replayed = b"".join(chunks), False
        import anyio

        gone = anyio.Event()  # set when the client disconnects: the request's work stops (_stoppable)
        scope[DISCONNECTED] = gone

        async def replay() -> dict[str, Any]:
            nonlocal replayed
            if not replayed:
                replayed = True
                return {"type": "http.request", "body": body, "more_body": False}
            await gone.wait()
            return {"type": "http.disconnect"}

        async def watch() -> None:  # the one reader of the connection once the body is in
            while (await receive())["type"] != "http.disconnect":
                pass
            gone.set()

        async with anyio.create_task_group() as group:
            group.start_soon(watch)
            try:
                await self.app(scope, replay, send)
            finally:
                group.cancel_scope.cancel()


def _where_of(error: dict[str, Any]) -> str:
    loc = [str(p) for p in error.get("loc", ())]
    return ".".join(loc[1:] if loc[:1] == ["body"] else loc) or "body"


def _validation_message(errors: list[dict[str, Any]]) -> tuple[int, str]:
    first = errors[0] if errors else {}
    kind = first.get("type", "")
    if kind == "json_invalid":
        return 400, f"malformed JSON body: {first.get('ctx', {}).get('error', first.get('msg', ''))}"
    if kind == "missing" and _where_of(first) == "body":
        return 400, "the request needs a JSON body"
    if kind == "extra_forbidden":
        return 422, f"unknown field {_where_of(first)!r}; see /docs for the fields this endpoint takes"
    if kind == "string_unicode":  # pydantic's words for a lone surrogate in a constrained string field
        return 422, f"{_where_of(first)}: holds a lone surrogate, which is not valid Unicode; send the text as UTF-8"
    msg = first.get("msg", "invalid value").removeprefix("Value error, ")
    return 422, f"{_where_of(first)}: {msg}"


def _hit_out(hit: Any, full_text: bool) -> HitOut:
    text = hit.text or ""
    p = hit.passage
    passage = PassageOut(text=p.text, start=p.start, end=p.end, spans=list(p.spans)) if p is not None else \
        PassageOut(text=text, start=0, end=len(text), spans=[])
    return HitOut(id=hit.id, rank=hit.rank, score=hit.score, title=hit.title, passage=passage,
                  text=text if full_text else None, metadata=dict(hit.metadata), stage_scores=dict(hit.stage_scores),
                  group=hit.group, explanation=hit.explanation.to_dict() if hit.explanation is not None else None)


def _ms(timings: dict[str, float]) -> dict[str, float]:
    return {name.removesuffix("_s"): round(seconds * 1000, 3) for name, seconds in timings.items()}


def _search_out(result: SearchResult, version: str, body: SearchOptions) -> SearchOut:
    return SearchOut(query=result.query, version=version, hits=[_hit_out(h, body.full_text) for h in result.hits],
                     timings_ms=_ms(dict(result.timings)), next_page=result.next_page,
                     nothing_relevant=bool(body.min_relevance) and not result.hits)


def create_app(source: str | Path | Any, *, api_key: str | None = None, read_only: bool = False,
               batching: bool = True, max_wait_ms: float = 5.0, max_body_bytes: int = MAX_BODY_BYTES,
               verify: bool = True, device: str = "auto", ray: bool = False, ray_address: str | None = None,
               replicas: int = 1, metrics: bool = True, budgets: Budgets | None = None,
               protect_reads: bool = False, request_timeout: float | None = REQUEST_TIMEOUT_S,
               allowed_hosts: Sequence[str] | None = None, max_expensive: int = 1, expensive_wait_s: float = 10.0,
               max_searches: int = 32) -> FastAPI:
    """The HTTP app over an engine directory, single or sharded (or an open engine; ``device``: where a directory's
    models run; ``ray``: a sharded engine's shards served by Ray actors).

    ``api_key``: writes need ``Authorization: Bearer KEY`` (or ``X-API-Key: KEY``); ``read_only`` refuses writes.
    ``batching``: concurrent searches share model calls, a batch waiting at most ``max_wait_ms`` for requests
    already in flight. ``metrics``: ``GET /metrics`` in Prometheus' format (:mod:`twostage.app.observe`).
    ``budgets``: what one request may make the server do (:mod:`twostage.app.budgets`); ``protect_reads``:
    ``/stats`` and ``/metrics`` need the API key too. ``request_timeout``: seconds after which a request stops at
    its next stage boundary (a 503; None: no limit); a request whose client disconnects stops there too.
    ``allowed_hosts``: the ``Host`` names answered (others: 421; None: any), and the origins a browser's write may
    come from (a write whose ``Origin`` is another site's: 403). ``max_expensive``, ``expensive_wait_s``,
    ``max_searches``: admission of expensive requests (:mod:`twostage.app.admission`).

    Raises:
        ConfigError: an empty API key, a bad limit, ``protect_reads`` without a key, an engine that cannot open.
    """
    from twostage.app.compat import add_compat_routes
    from twostage.app.observe import ServerMetrics
    from twostage.engine.door import open_engine
    from twostage.engine.search import SearchMethods

    if api_key is not None and not api_key:
        raise ConfigError("the API key is empty; set it to a secret string or serve without one")
    if max_wait_ms < 0 or max_body_bytes <= 0:
        raise ConfigError("max_wait_ms must be >= 0 and max_body_bytes positive")
    if request_timeout is not None and not (isinstance(request_timeout, (int, float)) and request_timeout > 0
                                            and math.isfinite(request_timeout)):
        raise ConfigError(f"--request-timeout must be a positive number of seconds, got {request_timeout!r}")
    if protect_reads and api_key is None:
        raise ConfigError("protect_reads needs an API key (--api-key-env VAR): without one nothing can read /stats")
    hosts = None if allowed_hosts is None else _host_names(allowed_hosts)
    budgets = budgets or Budgets()
    opened = source if isinstance(source, SearchMethods) else open_engine(source, verify=verify, device=device,
                                                                            ray=ray, address=ray_address,
                                                                            replicas=replicas)
    stats = ServerStats()
    models = ServedModels(batching, max_wait_ms, budgets.piece)
    models.prepare(opened)
    holder = EngineHolder(opened, prepare=models.prepare)
    observed = ServerMetrics(lambda: holder.engine, models.batchers, models.load_seconds) if metrics else None
    admission = Admission(lambda: models.searches, max_expensive=max_expensive, wait_s=expensive_wait_s,
                          max_searches=max_searches)

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        yield
        admission.close()
        models.close()
        holder.close()

    app = FastAPI(title="twostage", summary="Search an engine: first stage, then reranked hits.",
                  version=_version(), lifespan=lifespan, default_response_class=SafeJSONResponse)
    app.state.holder, app.state.stats, app.state.admission = holder, stats, admission
    app.add_middleware(_BodyLimit, limit=max_body_bytes)
    if hosts is not None:
        app.add_middleware(_HostCheck, hosts=hosts)

    _add_request_log(app, stats, observed)
    _add_error_handlers(app)

    writer = _writer(read_only, api_key, hosts)
    reader = _key_check(api_key if protect_reads else None, "/stats and /metrics")

    def searching(search: bool = False) -> AbstractContextManager[Any]:
        return models.searching(holder, search)

    async def answer(request: Request, run: Callable[[], Any]) -> Any:
        """``run()`` in a worker thread, stopped when its client leaves or past the request timeout; a raised
        error as its JSON response."""
        return await _stoppable(request, lambda: _guarded(run), request_timeout)

    def run_search(queries: list[str], options: SearchOptions,
                   similar: str | None = None) -> tuple[list[SearchResult], str]:
        t = time.perf_counter()

        def run(engine: Any) -> tuple[list[SearchResult], str]:
            token = getattr(options, "page_token", None)
            if similar is not None:
                version = engine.read_page_token(token).version if token is not None else engine.version
                k = options.k if token is None or "k" in options.model_fields_set else \
                    engine.read_page_token(token).k
                return [engine.similar(similar, k, where=options.where, offset=options.offset,
                                       page_token=token, **options.knobs())], version
            if token is not None:
                pinned = engine.read_page_token(token)
                k = options.k if "k" in options.model_fields_set else pinned.k  # a token pages at its own k
                return [engine.search(queries[0], k, where=options.where, offset=options.offset,
                                      page_token=token, **options.knobs())], pinned.version
            return engine.search_batch(queries, options.k, where=options.where, offset=options.offset,
                                       **options.knobs()), engine.version

        work = None if similar is not None else holder.engine.work_of(len(queries), **options.knobs())
        if work is not None:
            budgets.check_search(work)  # a 413 before any of it runs
        if work is not None and is_expensive(work.pairs, work.queries):
            # a batch or a deep rerank: admitted behind the searches, its model calls after theirs
            def expensive() -> tuple[list[SearchResult], str]:
                with searching(False) as engine:
                    return run(engine)

            results, version = admission.run("this search", expensive)
        else:
            with searching(True) as engine:
                results, version = run(engine)
        request_ms = (time.perf_counter() - t) * 1000 / len(queries)
        for r in results:
            stats.record(_ms(dict(r.timings)), request_ms)
            if observed is not None:
                observed.observe_search(r.timings)
        return results, version

    @app.post("/search", response_model=SearchOut, summary="the k best documents for a query")
    async def search(body: SearchRequest, request: Request) -> Any:
        def run() -> Any:
            results, version = run_search([body.query], body)
            return _search_out(results[0], version, body)

        return await answer(request, run)

    @app.post("/similar", response_model=SearchOut, summary="the k documents most like a document")
    async def similar(body: SimilarRequest, request: Request) -> Any:
        def run() -> Any:
            results, version = run_search([body.id], body, similar=body.id)
            return _search_out(results[0], version, body)

        return await answer(request, run)

    @app.post("/search/batch", response_model=BatchSearchOut, summary="/search for many queries in one call")
    async def search_batch(body: BatchSearchRequest, request: Request) -> Any:
        def run() -> Any:
            results, version = run_search(list(body.queries), body)
            return BatchSearchOut(version=version, results=[_search_out(r, version, body) for r in results])

        return await answer(request, run)

    def write(change: Callable[[Any], Any], rows: Callable[[Any], int] | None = None) -> Any:
        # No lock of the server's around the change: the engine encodes new documents first and takes its own
        # writer lock only to commit (on the version current then), so a large document being encoded never
        # holds up another client's write.
        with holder.use() as engine:
            n = 0
            if rows is not None:
                n = rows(engine)
                budgets.check_count("write_rows", n, "documents: rows (passages) this write would make")
            new = admission.run("this write", lambda: change(engine)) if is_expensive(n) else change(engine)
        holder.swap(new)
        return new

    @app.post("/documents", response_model=WriteOut, dependencies=[Depends(writer)],
              summary="add documents (or replace them: upsert) in one atomic version")
    async def add_documents(body: DocumentsRequest, request: Request) -> Any:
        from twostage.indexer.passages import rows_of

        ids = [d.id for d in body.documents]
        if len(set(ids)) != len(ids):
            seen: set[str] = set()
            dup = next(i for i in ids if i in seen or seen.add(i))  # type: ignore[func-returns-value]
            return _error(422, f"documents: the id {dup!r} appears twice in this request")
        try:
            for d in body.documents:
                budgets.check_document(d.id, d.text, d.title, d.metadata)
        except OverBudget as exc:
            return _error(413, str(exc))
        try:
            docs = [Document(d.id, d.text, d.title, d.metadata) for d in body.documents]
            for doc in docs:
                check_metadata(doc.metadata, f"document {doc.id!r}: metadata")
        except DataError as exc:
            return _error(422, f"documents: {exc}")

        def run() -> Any:
            new = write(lambda engine: engine.upsert(docs) if body.upsert else engine.add(docs),
                        lambda engine: rows_of(docs, engine.settings.passages))
            return WriteOut(version=new.version, documents=len(new), changed=len(docs))

        return await answer(request, run)

    @app.delete("/documents", response_model=WriteOut, dependencies=[Depends(writer)],
                summary="delete documents by id in one atomic version")
    async def delete_documents(body: DeleteRequest, request: Request) -> Any:
        def run() -> Any:
            new = write(lambda engine: engine.delete(body.ids))
            return WriteOut(version=new.version, documents=len(new), changed=len(body.ids))

        return await answer(request, run)

    @app.get("/health", summary="whether the server answers, and the engine version it serves")
    def health() -> dict[str, Any]:
        holder.refresh()  # the version committed now, by this server or another process
        engine = holder.engine
        return {"status": "ok", "version": engine.version, "documents": len(engine)}

    @app.get("/stats", summary="engine version, document count, latency percentiles per stage, requests",
             dependencies=[Depends(reader)])
    def get_stats() -> dict[str, Any]:
        engine = holder.engine
        s = engine.settings
        return {"engine": {"path": str(engine.root), "version": engine.version, "documents": len(engine),
                           "first_stage": s.first_stage, "rerank_depth": s.rerank_depth, "rerank": engine.reranks,
                           "reranker": engine.manifest.reranker.name if engine.manifest.reranker else None,
                           "precision": engine.precision, "language": engine.language},
                "read_only": read_only, "api_key": api_key is not None, "protect_reads": protect_reads,
                "budgets": {f"max_{k}": v for k, v in asdict(budgets).items() if k != "piece"},
                "batching": {b.name: b.stats.to_dict() for b in models.batchers} if batching else None,
                **stats.snapshot()}

    add_compat_routes(app, searching, _error, answer, budgets, admission)

    @app.get("/metrics", summary="Prometheus metrics: requests, latency per stage, batches, the engine served",
             dependencies=[Depends(reader)])
    def get_metrics() -> Response:
        if observed is None:
            return _error(404, "metrics are off (the server was started with --no-metrics)")
        body, content_type = observed.exposition()
        return Response(body, media_type=content_type)

    @app.get("/", response_class=HTMLResponse, include_in_schema=False)
    def page() -> HTMLResponse:
        return HTMLResponse(_page())

    return app


class ServedModels:
    """The served engine's models: loaded (and verified) when a version is first served, not in a request; with
    ``batching``, wrapped so that concurrent searches share their forward passes, each batch waiting at most
    ``max_wait_ms`` for the searches in flight (counted by :meth:`searching`)."""

    def __init__(self, batching: bool, max_wait_ms: float, piece: int = 8) -> None:
        self.batching, self.max_wait_s, self.piece = batching, max_wait_ms / 1000, piece
        self.in_flight = 0
        self.searches = 0  # searches in flight (the embeddings and rerank routes not counted): bulk work waits
        self.last_search = float("-inf")  # when the last search ended (monotonic seconds)
        self.lock = threading.Lock()
        self.batchers: list[Any] = []  # the served version's (the list object is shared with the metrics)
        self.retired: list[Any] = []  # a swapped-out version's: closed when the app stops
        self.load_seconds: dict[str, float] = {}

    def prepare(self, engine: Any) -> None:
        loaded_encoder = None  # a BM25-only engine encodes nothing: no model to load, no batcher
        if engine.manifest.retriever is not None:
            t = time.perf_counter()
            loaded_encoder = engine.encoder
            self.load_seconds["retriever"] = time.perf_counter() - t
        t = time.perf_counter()
        loaded_reranker = engine.reranker
        if loaded_reranker is not None:
            self.load_seconds["reranker"] = time.perf_counter() - t
        loaded_late = None
        if getattr(engine.manifest, "late", None) is not None:
            t = time.perf_counter()
            loaded_late = engine.late
            self.load_seconds["late"] = time.perf_counter() - t
        if self.batching:
            from twostage.app.batching import BatchingEncoder, BatchingLate, BatchingReranker

            options = {"max_wait_s": self.max_wait_s, "expected": lambda: self.in_flight, "piece": self.piece,
                       "busy": self.busy}
            size = engine.settings.batch_size
            encoder = BatchingEncoder(loaded_encoder, batch_size=size, **options) if loaded_encoder else None
            reranker = BatchingReranker(loaded_reranker, batch_size=size, **options) if loaded_reranker else None
            late = BatchingLate(loaded_late, batch_size=size, **options) if loaded_late else None
            engine.use_models(encoder=encoder, reranker=reranker, late=late)
            self.retired.extend(self.batchers)
            self.batchers[:] = [b.batcher for b in (encoder, reranker, late) if b is not None]

    def busy(self) -> int:
        """Searches in flight, or 1 when one ended less than :data:`QUIET_S` ago (a client between two of its
        searches still counts): bulk work waits while this is not 0."""
        if self.searches:
            return self.searches
        return int(time.monotonic() - self.last_search < QUIET_S)

    @contextmanager
    def searching(self, holder: EngineHolder, search: bool = False) -> Iterator[Any]:
        """The engine ``holder`` serves now, for one request, counted in flight while it runs (``search``: also
        as a search, which bulk model work waits for)."""
        with self.lock:
            self.in_flight += 1
            self.searches += search
        try:
            with holder.use() as engine:
                if search:
                    from twostage.app.batching import serving_search

                    with serving_search():
                        yield engine
                else:
                    yield engine
        finally:
            with self.lock:
                self.in_flight -= 1
                self.searches -= search
                if search:
                    self.last_search = time.monotonic()

    def close(self) -> None:
        for b in self.batchers + self.retired:
            b.close()


async def _stoppable(request: Request, run: Callable[[], Any], timeout: float | None) -> Any:
    """``run()`` in a worker thread inside a :class:`WorkScope`: cancelled as soon as the client disconnects and past ``timeout`` seconds, the work stopping at its next stage boundary
    (:func:`twostage.indexer.work.checkpoint`), its model calls dropped from the shared batches."""
    import anyio

    scope = WorkScope(timeout)

    def work() -> Any:
        with scope:
            return run()

    gone = request.scope.get(DISCONNECTED)

    async def watch() -> None:
        if gone is not None:  # the body limit's reader of the connection says when it closes
            await gone.wait()
        else:
            while not await request.is_disconnected():
                await anyio.sleep(0.05)
        scope.cancel("its client disconnected")

    async with anyio.create_task_group() as group:
        group.start_soon(watch)
        try:
            return await anyio.to_thread.run_sync(work)
        finally:
            group.cancel_scope.cancel()


def _guarded(run: Callable[[], Any]) -> Any:
    """``run()``, or the JSON error response for what it raised (a TwostageError's own status, else a 500)."""
    try:
        return run()
    except OverBudget as exc:
        return _error(413, str(exc))
    except Busy as exc:
        return _error(503, str(exc), headers={"Retry-After": str(exc.retry_after)})
    except TwostageError as exc:
        return _twostage_error(exc)
    except Exception as exc:
        return _server_error(exc)


def _writer(read_only: bool, api_key: str | None, hosts: frozenset[str] | None = None) -> Callable[[Request], None]:
    """The dependency every write route has: refused on a read-only server, from a browser page of another site
    (its ``Origin`` neither this server nor one of ``hosts``), and without the API key when set."""
    check_key = _key_check(api_key, "writes")

    def writer(request: Request) -> None:
        if read_only:
            raise HTTPException(403, "this server is read-only (started with --read-only); writes are refused")
        origin = request.headers.get("origin")
        if origin is not None and not _same_site(origin, request.headers.get("host") or "", hosts):
            raise HTTPException(403, f"writes from a page of another site (Origin {origin[:100]!r}) are refused; "
                                     "write from this server's own page or without a browser, or start the server "
                                     "with --allowed-hosts naming that site")
        check_key(request)

    return writer


def _host_names(hosts: Sequence[str]) -> frozenset[str]:
    """``--allowed-hosts``' names, lower-cased, without ports or IPv6 brackets."""
    names = frozenset(_bare_host(h) for h in hosts)
    if not names or "" in names:
        raise ConfigError("--allowed-hosts needs host names (e.g. localhost,search.example.org), or '*' for any")
    return names


def _bare_host(host: str) -> str:
    """``host`` (a Host header's value or an origin's netloc) lower-cased, without its port or brackets."""
    host = host.strip().lower()
    if host.startswith("["):  # [::1]:8000
        return host[1:host.find("]")] if "]" in host else host
    return host.rsplit(":", 1)[0] if host.count(":") == 1 else host


def _same_site(origin: str, host: str, hosts: frozenset[str] | None) -> bool:
    """Whether a browser's ``Origin`` is this server (the ``Host`` it was asked by) or one of ``hosts``."""
    from urllib.parse import urlsplit

    try:
        netloc = urlsplit(origin).netloc
    except ValueError:
        return False
    if not netloc:  # "null" (a sandboxed page, a file) is no site of ours
        return False
    return netloc.lower() == host.lower() or (hosts is not None and ("*" in hosts or _bare_host(netloc) in hosts))


class _HostCheck:
    """Answer only requests whose ``Host`` is one of ``hosts`` (else 421): a page on another site that makes its
    own name resolve to this machine (DNS rebinding) sends its own name as ``Host`` and is refused."""

    def __init__(self, app: Any, hosts: frozenset[str]) -> None:
        self.app, self.hosts = app, hosts

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] == "http" and "*" not in self.hosts:
            host = dict(scope.get("headers") or []).get(b"host", b"").decode("latin-1")
            if _bare_host(host) not in self.hosts:
                await _error(421, f"this server answers the host names {', '.join(sorted(self.hosts))}, not "
                                  f"{host[:100]!r}; start it with --allowed-hosts naming the host you use")(
                    scope, receive, send)
                return
        await self.app(scope, receive, send)


def _key_check(api_key: str | None, what: str) -> Callable[[Request], None]:
    """A dependency refusing a request without ``api_key`` (none: every request passes)."""

    def check(request: Request) -> None:
        if api_key is None:
            return
        given = request.headers.get("x-api-key") or ""
        auth = request.headers.get("authorization") or ""
        if auth.lower().startswith("bearer "):
            given = auth[7:].strip()
        if not given or not hmac.compare_digest(given.encode("utf-8", "replace"), api_key.encode()):
            raise HTTPException(401, f"{what} need the API key: send 'Authorization: Bearer KEY' or "
                                     "'X-API-Key: KEY'", headers={"WWW-Authenticate": "Bearer"})

    return check


def _add_request_log(app: FastAPI, stats: ServerStats, observed: Any) -> None:
    """Every request counted (``/stats``, ``/metrics``), given an id echoed in ``X-Request-ID``, and logged as one
    JSON access line, however it ended."""
    from twostage.app.observe import log_access, method_label, request_id

    @app.middleware("http")
    async def count(request: Request, call_next: Any) -> Any:
        t = time.perf_counter()
        rid = request_id(request.headers.get("x-request-id"))
        status = 500
        try:
            response = await call_next(request)
            status = response.status_code
            response.headers["X-Request-ID"] = rid
            return response
        finally:  # counted and logged however the request ended (a crash is the 500 the client sees)
            seconds = time.perf_counter() - t
            route = request.scope.get("route")
            path = route.path if route is not None else "unmatched"
            stats.count(f"{method_label(request.method)} {path}", status)
            if observed is not None:
                observed.observe_request(request.method, path, status, seconds)
            log_access(rid, request.method, request.url.path, status, seconds,
                       request.client.host if request.client else None)


def _add_error_handlers(app: FastAPI) -> None:
    """Every error as one JSON object ``{"error": ...}`` with its status."""

    @app.exception_handler(RequestValidationError)
    async def invalid(request: Request, exc: RequestValidationError) -> JSONResponse:
        status, message = _validation_message(list(exc.errors()))
        return _error(status, message)

    @app.exception_handler(HTTPException)
    async def http_error(request: Request, exc: HTTPException) -> JSONResponse:
        detail = str(exc.detail)
        if exc.status_code == 400 and detail == "There was an error parsing the body":  # FastAPI's words for a
            # body its JSON parser gave up on (e.g. nested past Python's recursion limit)
            detail = "the JSON body could not be parsed (malformed, or nested too deeply: a filter nests at most 32 " \
                     "levels)"
        return SafeJSONResponse({"error": detail}, status_code=exc.status_code, headers=exc.headers)

    @app.exception_handler(Exception)
    async def crashed(request: Request, exc: Exception) -> JSONResponse:  # pragma: no cover - safety net
        return _server_error(exc)


def _twostage_error(exc: TwostageError) -> JSONResponse:
    if isinstance(exc, WriterBusyError):
        return _error(503, f"{exc}; try again later")
    if isinstance(exc, ShardUnavailableError):
        return _error(503, str(exc))
    if isinstance(exc, PageExpiredError):
        return _error(410, str(exc))
    if isinstance(exc, WorkStopped):  # past the request timeout (or its client left, and nobody reads this)
        logger.info("a request stopped: %s", exc)
        return _error(503, f"{exc}; send a smaller request, or start the server with a longer --request-timeout",
                      headers={"Retry-After": "1"})
    if isinstance(exc, (ConfigError, DataError)):
        return _error(400, str(exc))
    return _server_error(exc)


def _server_error(exc: BaseException) -> JSONResponse:
    ref = uuid.uuid4().hex[:12]
    logger.error("request %s failed", ref, exc_info=exc)
    return _error(500, f"internal server error (reference {ref}); the server log has the details")


def _page() -> str:
    return resources.files("twostage.app").joinpath("static/search.html").read_text(encoding="utf-8")


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("twostage-search")
    except PackageNotFoundError:  # pragma: no cover - running from a source tree
        return "0"


def allowed_hosts_for(host: str, given: str | Sequence[str] | None = None) -> tuple[str, ...] | None:
    """The Host names a server listening on ``host`` answers: ``given`` (comma-separated, or a list; ``*``: any),
    else the loopback names when it listens on loopback (a page on another site reaching it through DNS rebinding
    is refused), else any (None)."""
    if given is not None:
        names = given.split(",") if isinstance(given, str) else list(given)
        return tuple(_host_names(names))
    return LOOPBACK_HOSTS if _bare_host(host) in LOOPBACK_HOSTS else None


def serve(engine_dir: str | Path, *, host: str = "127.0.0.1", port: int = 8000, **options: Any) -> None:
    """Run the app with uvicorn until interrupted (``options`` as for :func:`create_app`; ``allowed_hosts``
    defaults to :func:`allowed_hosts_for` ``host``)."""
    try:
        import uvicorn
    except ImportError as exc:  # pragma: no cover - depends on the environment
        raise MissingDependencyError("twostage serve needs uvicorn: pip install 'twostage-search[serve]'") from exc
    options.setdefault("allowed_hosts", allowed_hosts_for(host))
    app = create_app(engine_dir, **options)
    uvicorn.run(app, host=host, port=port, log_level="warning", access_log=False)
