"""twostage inside LangChain: the engine as a retriever, the cross-encoder as a document compressor.

>>> from twostage.app.langchain_adapter import TwostageRetriever, TwostageReranker
>>> retriever = TwostageRetriever(engine=SearchEngine.load("my-engine"), k=5)
>>> retriever.invoke("why do cats purr")[0].metadata["id"]

Each hit becomes a LangChain ``Document``: ``page_content`` is the document's text, ``id`` its id, and
``metadata`` holds ``id``, ``title``, ``score``, ``rank``, ``stage_scores`` (each stage's own score), ``passage``
(the passage that matched) and ``metadata`` (the document's own metadata, nested so no field of yours is
overwritten). Searching is :meth:`SearchEngine.search` itself: the adapter copies no search logic. Needs the
``langchain`` extra (``langchain-core``).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Literal

from langchain_core.callbacks import CallbackManagerForRetrieverRun
from langchain_core.documents import Document as LCDocument
from langchain_core.documents.compressor import BaseDocumentCompressor
from langchain_core.retrievers import BaseRetriever
from pydantic import ConfigDict, Field

__all__ = ["TwostageReranker", "TwostageRetriever", "hit_to_document"]


def hit_to_document(hit: Any) -> LCDocument:
    """One engine hit as a LangChain Document (see the module docstring for its metadata)."""
    meta = {"id": hit.id, "title": hit.title, "score": float(hit.score), "rank": int(hit.rank),
            "stage_scores": dict(hit.stage_scores), "passage": hit.passage.text if hit.passage is not None else None,
            "metadata": dict(hit.metadata)}
    return LCDocument(page_content=hit.text or "", metadata=meta, id=hit.id)


class TwostageRetriever(BaseRetriever):
    """A :class:`~twostage.SearchEngine` (or sharded engine) as a LangChain retriever.

    ``k`` hits per query; ``where`` a filter (:mod:`twostage.indexer.filters`); ``search_options`` the search
    knobs (``first_stage``, ``rerank``, ``rerank_depth``, ``like``, ``group_by``...) for every call.
    ``search_type="mmr"``: diverse hits by maximal marginal relevance, LangChain's way of saying it: ``lambda_mult``
    is relevance's weight (1: relevance alone; the engine's ``diversity`` is ``1 - lambda_mult``; None: the engine's
    default) and ``fetch_k`` the candidates it chooses from (the engine's ``first_stage_depth``).
    """

    model_config = ConfigDict(arbitrary_types_allowed=True)

    engine: Any
    k: int = 10
    where: Any = None
    search_options: dict[str, Any] = Field(default_factory=dict)
    search_type: Literal["similarity", "mmr"] = "similarity"
    lambda_mult: float | None = Field(None, ge=0, le=1)
    fetch_k: int | None = Field(None, ge=1)

    def _get_relevant_documents(self, query: str, *, run_manager: CallbackManagerForRetrieverRun) -> list[LCDocument]:
        options = dict(self.search_options)
        if self.search_type == "mmr":
            options["diversity"] = True if self.lambda_mult is None else 1.0 - self.lambda_mult
            if self.fetch_k is not None:
                options["first_stage_depth"] = self.fetch_k
        result = self.engine.search(query, k=self.k, where=self.where, **options)
        return [hit_to_document(h) for h in result.hits]


class TwostageReranker(BaseDocumentCompressor):
    """Reranks any LangChain Documents with a twostage cross-encoder and keeps the ``top_n`` best.

    Build it from a cross-encoder (``TwostageReranker(reranker=CrossEncoder.load(path))``), a directory
    (:meth:`load`) or an engine's reranker (:meth:`from_engine`). Each kept Document gets ``rerank_score`` in its
    metadata; the order is by that score, highest first (ties keep the input order).
    """

    model_config = ConfigDict(arbitrary_types_allowed=True)

    reranker: Any
    top_n: int = 3
    batch_size: int = 32

    @classmethod
    def load(cls, name_or_path: str, *, top_n: int = 3, precision: str = "auto") -> TwostageReranker:
        from twostage.models.device import resolve_precision
        from twostage.reranker.cross_encoder import CrossEncoder

        return cls(reranker=CrossEncoder.load(name_or_path, precision=resolve_precision(precision, "reranker")),
                   top_n=top_n)

    @classmethod
    def from_engine(cls, engine: Any, *, top_n: int = 3) -> TwostageReranker:
        from twostage.indexer.errors import ConfigError

        if engine.reranker is None:
            raise ConfigError("this engine has no reranker; build it with one, or use TwostageReranker.load(DIR)")
        return cls(reranker=engine.reranker, top_n=top_n)

    def compress_documents(self, documents: Sequence[LCDocument], query: str,
                           callbacks: Any = None) -> Sequence[LCDocument]:
        import numpy as np

        if not documents:
            return []
        scores = self.reranker.predict([(query, d.page_content) for d in documents], batch_size=self.batch_size)
        order = np.argsort(-np.asarray(scores), kind="stable")[: self.top_n]
        return [LCDocument(page_content=documents[i].page_content, id=documents[i].id,
                           metadata={**documents[i].metadata, "rerank_score": float(scores[i])}) for i in order]
