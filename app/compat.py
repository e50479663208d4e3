"""The endpoints other tools already speak: OpenAI's embeddings and Cohere's (and Jina's) rerank.

``POST /v1/embeddings`` takes OpenAI's request (``input``: a string or a list of strings; ``model``;
``encoding_format``: ``float`` or ``base64``, little-endian float32 as OpenAI sends it; ``dimensions`` must be the
model's if given) and answers OpenAI's shape, with the engine's retriever vectors (``BiEncoder.encode``).
``input_type`` (``query`` or ``document``, Cohere's ``search_query`` / ``search_document`` too; default
``document``) says which side of the bi-encoder reads the texts. ``POST /v1/rerank`` (and ``/v2/rerank``, the
path Cohere's v2 client calls) takes a ``query`` and ``documents`` (strings, or objects with ``text``), ``top_n``
and ``return_documents``, and answers the indices ordered by ``relevance_score``: the engine's cross-encoder score
(the sigmoid of its logit, the same number as a hit's ``stage_scores["rerank"]``). An engine with token vectors
(``twostage late``) reranks by MaxSim instead when it has no cross-encoder, or when ``model`` is ``maxsim`` or the
late-interaction model's name: the sum over the query's token vectors of their best inner product with the
document's, computed from the texts given at full precision (the engine's MaxSim stage reads its stored codes, so the
two agree to the codes' rounding), not bounded to [0, 1].

Fields these APIs define that mean nothing here (``user``, ``max_chunks_per_doc``...) are ignored, so clients
that send them work; a body of the wrong shape is a 422 naming the field, a rerank on an engine with neither a
reranker nor token vectors a 409.
"""

from __future__ import annotations

import base64
import uuid
from collections.abc import Awaitable, Callable
from contextlib import AbstractContextManager
from types import SimpleNamespace
from typing import Any, Literal

import numpy as np
from fastapi import Request
from pydantic import BaseModel, ConfigDict, Field, field_validator

from twostage.app.admission import Admission, is_expensive
from twostage.app.budgets import Budgets, pair_tokens, text_tokens
from twostage.indexer.records import check_encodable
from twostage.indexer.tokens import maxsim

MAX_INPUTS = 2048  # OpenAI's own limit on inputs a request
MAX_DOCUMENTS = 1000
MAX_CHARS = 100_000


class _Lenient(BaseModel):
    model_config = ConfigDict(extra="ignore")


def _model_name(value: str | None) -> str | None:
    """The ``model`` a client names is echoed back: valid Unicode only."""
    return None if value is None else check_encodable(value, "model")


class EmbeddingsRequest(_Lenient):
    input: str | list[str] = Field(..., description="a text or a list of texts (token arrays are not taken)")
    model: str | None = Field(None, description="echoed back; the engine's retriever encodes")
    encoding_format: Literal["float", "base64"] = "float"
    dimensions: int | None = Field(None, ge=1)
    input_type: Literal["query", "document", "search_query", "search_document"] = "document"

    _model = field_validator("model")(classmethod(lambda cls, value: _model_name(value)))

    @field_validator("input")
    @classmethod
    def _texts(cls, value: str | list[str]) -> str | list[str]:
        texts = [value] if isinstance(value, str) else value
        if not texts:
            raise ValueError("is empty; give a text or a list of texts")
        if len(texts) > MAX_INPUTS:
            raise ValueError(f"{len(texts)} texts; at most {MAX_INPUTS} a request")
        for i, t in enumerate(texts):
            if not t.strip():
                raise ValueError(f"text #{i + 1} is empty")
            if len(t) > MAX_CHARS:
                raise ValueError(f"text #{i + 1} has {len(t):,} characters; at most {MAX_CHARS:,}")
            check_encodable(t, f"text #{i + 1}")
        return value


class RerankDocument(_Lenient):
    text: str


class RerankRequest(_Lenient):
    query: str = Field(..., min_length=1, max_length=MAX_CHARS)
    documents: list[str | RerankDocument] = Field(..., min_length=1, max_length=MAX_DOCUMENTS)
    model: str | None = None
    top_n: int | None = Field(None, ge=1)
    return_documents: bool = False

    _words = field_validator("query")(classmethod(lambda cls, value: not_blank(value)))
    _model = field_validator("model")(classmethod(lambda cls, value: _model_name(value)))

    @field_validator("documents")
    @classmethod
    def _valid(cls, values: list[str | RerankDocument]) -> list[str | RerankDocument]:
        for i, d in enumerate(values):
            check_encodable(d if isinstance(d, str) else d.text, f"document #{i + 1}")
        return values

    def texts(self) -> list[str]:
        return [d if isinstance(d, str) else d.text for d in self.documents]


def not_blank(value: str) -> str:
    """A query with some words (pydantic reports the ValueError against the field)."""
    if not value.strip():
        raise ValueError("is blank; give it some words")
    return check_encodable(value, "the text")


def add_compat_routes(app: Any, searching: Callable[[], AbstractContextManager[Any]],
                      error: Callable[..., Any], answer: Callable[[Request, Callable[[], Any]], Awaitable[Any]],
                      budgets: Budgets | None = None, admission: Admission | None = None) -> None:
    """Register the routes on ``app``: ``searching()`` yields the engine a request uses, ``error(status, text)``
    makes an error response, ``await answer(request, fn)`` runs ``fn`` in a worker thread (stopped when the client
    leaves) and turns a raised error into a response; ``budgets`` bounds each request's work before it starts
    (:mod:`twostage.app.budgets`), ``admission`` runs the expensive ones behind the searches
    (:mod:`twostage.app.admission`)."""
    budgets = budgets or Budgets()

    def admitted(items: int, fn: Callable[[], Any]) -> Any:
        """``fn()``, as an expensive request when it reads more than a few items."""
        if admission is None or not is_expensive(items):
            return fn()
        return admission.run("this request", fn)

    @app.post("/v1/embeddings", summary="OpenAI-style embeddings of texts by the engine's retriever")
    async def embeddings(body: EmbeddingsRequest, request: Request) -> Any:
        texts = [body.input] if isinstance(body.input, str) else list(body.input)
        kind = "query" if body.input_type in ("query", "search_query") else "document"

        def run() -> Any:
            return admitted(len(texts), compute)

        def compute() -> Any:
            with searching() as engine:
                if engine.manifest.retriever is None:
                    return error(409, "this engine has no retriever (built BM25-only); build it with --retriever "
                                      "to serve embeddings")
                encoder = engine.encoder
                dim = int(encoder.dim) if hasattr(encoder, "dim") else None
                if body.dimensions is not None and dim is not None and body.dimensions != dim:
                    return error(422, f"dimensions: this model gives {dim}-dimensional vectors; leave out "
                                      "dimensions or ask for that many")
                budgets.check_count("embedding_texts", len(texts), "input: texts")
                tokens = text_tokens(encoder, texts, stop_over=budgets.request_tokens)
                budgets.check_count("request_tokens", tokens, "input: tokens the retriever would read")
                vectors = np.asarray(encoder.encode(texts, kind=kind, batch_size=engine.settings.batch_size),
                                     dtype=np.float32)
                name = body.model or engine.manifest.retriever.name
            data = [{"object": "embedding", "index": i,
                     "embedding": base64.b64encode(v.astype("<f4").tobytes()).decode("ascii")
                     if body.encoding_format == "base64" else v.tolist()} for i, v in enumerate(vectors)]
            return {"object": "list", "data": data, "model": name,
                    "usage": {"prompt_tokens": tokens, "total_tokens": tokens}}

        return await answer(request, run)

    async def rerank(body: RerankRequest, request: Request) -> Any:
        texts = body.texts()

        def run() -> Any:
            return admitted(len(texts), compute)

        def compute() -> Any:
            with searching() as engine:
                late = engine.manifest.late
                by_maxsim = late is not None and (engine.manifest.reranker is None
                                                  or body.model in ("maxsim", late.name))
                reranker = None if by_maxsim else engine.reranker
                if not by_maxsim and reranker is None:
                    return error(409, "this engine has no reranker; build it with --reranker (or add token vectors "
                                      "with `twostage late`) to rerank")
                budgets.check_count("rerank_documents", len(texts), "documents")
                if reranker is None:  # by MaxSim (neither model is the 409 above)
                    return maxsim_answer(engine, body, texts)
                tokens = pair_tokens(reranker, body.query, texts)
                budgets.check_count("request_tokens", tokens, "query and documents: tokens the reranker would read")
                scores = np.asarray(reranker.predict([(body.query, t) for t in texts],
                                                     batch_size=engine.settings.batch_size), dtype=np.float64)
                name = body.model or engine.manifest.reranker.name
            return ranked_answer(body, texts, scores, name, tokens)

        return await answer(request, run)

    def maxsim_answer(engine: Any, body: RerankRequest, texts: list[str]) -> Any:
        """The documents ordered by MaxSim of the engine's late-interaction model over the texts given."""
        encoder = engine.late
        reads = SimpleNamespace(tokenizer=encoder.tokenizer, max_length=encoder.config.document_length)
        tokens = text_tokens(reads, texts, stop_over=budgets.request_tokens) + encoder.config.query_length
        budgets.check_count("request_tokens", tokens, "query and documents: tokens the late-interaction model "
                                                      "would read")
        query = encoder.encode_tokens([body.query], kind="query")[0]
        docs = encoder.encode_tokens(texts, kind="document", batch_size=engine.settings.batch_size, allow_empty=True)
        bounds = np.concatenate([[0], np.cumsum([len(d) for d in docs])]).astype(np.int64)
        stacked = np.concatenate(docs) if docs else np.zeros((0, query.shape[1]), dtype=np.float32)
        scores = maxsim(query, stacked, bounds).astype(np.float64)
        return ranked_answer(body, texts, scores, body.model or engine.manifest.late.name, tokens)

    def ranked_answer(body: RerankRequest, texts: list[str], scores: np.ndarray, name: str, tokens: int) -> Any:
        """Cohere's answer: the indices best first (ties: the earlier), ``top_n`` of them."""
        order = sorted(range(len(texts)), key=lambda i: (-scores[i], i))[:body.top_n or len(texts)]
        results = [{"index": i, "relevance_score": float(scores[i]),
                    **({"document": {"text": texts[i]}} if body.return_documents else {})} for i in order]
        return {"id": uuid.uuid4().hex, "model": name, "results": results,
                "usage": {"total_tokens": tokens},
                "meta": {"api_version": {"version": "2"}, "billed_units": {"search_units": 1}}}

    app.post("/v1/rerank", summary="Cohere/Jina-style rerank of documents by the engine's cross-encoder")(rerank)
    app.post("/v2/rerank", summary="the same rerank at the path Cohere's v2 client calls")(rerank)

