"""twostage inside LlamaIndex: the engine as a retriever, the cross-encoder as a node postprocessor.

>>> from twostage.app.llamaindex_adapter import TwostageLlamaRetriever, TwostageNodeReranker
>>> from llama_index.core.query_engine import RetrieverQueryEngine
>>> query_engine = RetrieverQueryEngine.from_args(TwostageLlamaRetriever(engine, k=10), llm=my_llm)

Each hit becomes a ``TextNode`` (``id_`` the document's id, ``text`` its text) with its score, and metadata
``title``, ``rank``, ``stage_scores``, ``passage`` and the document's own ``metadata`` (nested). Searching is
:meth:`SearchEngine.search` itself. Needs the ``llamaindex`` extra (``llama-index-core``).
"""

from __future__ import annotations

from typing import Any

from llama_index.core.postprocessor.types import BaseNodePostprocessor
from llama_index.core.retrievers import BaseRetriever
from llama_index.core.schema import MetadataMode, NodeWithScore, QueryBundle, TextNode
from pydantic import PrivateAttr

__all__ = ["TwostageLlamaRetriever", "TwostageNodeReranker", "hit_to_node"]


def hit_to_node(hit: Any) -> NodeWithScore:
    """One engine hit as a scored LlamaIndex node."""
    meta = {"title": hit.title, "rank": int(hit.rank), "stage_scores": dict(hit.stage_scores),
            "passage": hit.passage.text if hit.passage is not None else None, "metadata": dict(hit.metadata)}
    node = TextNode(id_=hit.id, text=hit.text or "", metadata=meta,
                    excluded_embed_metadata_keys=list(meta), excluded_llm_metadata_keys=["rank", "stage_scores"])
    return NodeWithScore(node=node, score=float(hit.score))


class TwostageLlamaRetriever(BaseRetriever):
    """A :class:`~twostage.SearchEngine` as a LlamaIndex retriever: ``k`` hits per query, ``where`` a filter,
    ``search_options`` the search knobs for every call. ``vector_store_query_mode="mmr"``: diverse hits by maximal
    marginal relevance, LlamaIndex's way of saying it: ``mmr_threshold`` is relevance's weight (the engine's
    ``diversity`` is ``1 - mmr_threshold``; None: the engine's default)."""

    def __init__(self, engine: Any, k: int = 10, where: Any = None, *, vector_store_query_mode: str = "default",
                 mmr_threshold: float | None = None, **search_options: Any) -> None:
        from twostage.indexer.errors import ConfigError

        if vector_store_query_mode not in ("default", "mmr"):
            raise ConfigError(f"vector_store_query_mode must be default or mmr, got {vector_store_query_mode!r}")
        if vector_store_query_mode == "mmr":
            if mmr_threshold is not None and not 0 <= mmr_threshold <= 1:
                raise ConfigError(f"mmr_threshold must be in [0, 1], got {mmr_threshold!r}")
            search_options["diversity"] = True if mmr_threshold is None else 1.0 - mmr_threshold
        self.engine, self.k, self.where, self.search_options = engine, k, where, search_options
        super().__init__()

    def _retrieve(self, query_bundle: QueryBundle) -> list[NodeWithScore]:
        result = self.engine.search(query_bundle.query_str, k=self.k, where=self.where, **self.search_options)
        return [hit_to_node(h) for h in result.hits]


class TwostageNodeReranker(BaseNodePostprocessor):
    """Reranks nodes with a twostage cross-encoder (their text without metadata) and keeps the ``top_n`` best;
    each node's score becomes the reranker's. Build it with ``TwostageNodeReranker(reranker=CrossEncoder.load(p))``
    or :meth:`from_engine`."""

    top_n: int = 3
    batch_size: int = 32
    _reranker: Any = PrivateAttr()

    def __init__(self, reranker: Any, top_n: int = 3, batch_size: int = 32) -> None:
        super().__init__()
        self.top_n, self.batch_size = top_n, batch_size
        self._reranker = reranker

    @classmethod
    def class_name(cls) -> str:
        return "TwostageNodeReranker"

    @classmethod
    def from_engine(cls, engine: Any, top_n: int = 3) -> TwostageNodeReranker:
        from twostage.indexer.errors import ConfigError

        if engine.reranker is None:
            raise ConfigError("this engine has no reranker; build it with one, or pass a CrossEncoder")
        return cls(engine.reranker, top_n=top_n)

    def _postprocess_nodes(self, nodes: list[NodeWithScore],
                           query_bundle: QueryBundle | None = None) -> list[NodeWithScore]:
        import numpy as np

        from twostage.indexer.errors import ConfigError

        if query_bundle is None:
            raise ConfigError("TwostageNodeReranker needs the query (a QueryBundle) to rerank nodes")
        if not nodes:
            return []
        pairs = [(query_bundle.query_str, n.node.get_content(metadata_mode=MetadataMode.NONE)) for n in nodes]
        scores = self._reranker.predict(pairs, batch_size=self.batch_size)
        order = np.argsort(-np.asarray(scores), kind="stable")[: self.top_n]
        return [NodeWithScore(node=nodes[i].node, score=float(scores[i])) for i in order]
