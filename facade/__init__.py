"""twostage: retrieve, then rerank. The public API in one place.

>>> from twostage import SearchEngine
>>> engine = SearchEngine.build("corpus.jsonl", "engines/docs", retriever="all-MiniLM-L6-v2")
>>> engine.search("why do cats purr", k=10).hits[0]

The layers below are importable too (``twostage.indexer``, ``twostage.retriever``, ``twostage.reranker``,
``twostage.eval``); everything a user needs is re-exported here. Heavy dependencies (torch, transformers)
load on first use, so ``import twostage`` stays fast.
"""

from __future__ import annotations

from importlib import import_module
from typing import TYPE_CHECKING, Any

__all__ = [
    # records and errors
    "Document", "Query", "Hit", "Passage", "RankedList", "Judgment", "Qrels",
    "TwostageError", "DataError", "DataNotFoundError", "ConfigError", "IndexFormatError", "MissingDependencyError",
    "WriterBusyError", "ModelNotFoundError", "UntrainedHeadError", "FilterError", "PageExpiredError",
    # corpora and data sets
    "Corpus", "load_corpus", "iter_documents", "BeirDataset",
    # the models and BM25 (building blocks: twostage.retriever.hybrid, twostage.indexer.index, ...)
    "BM25Retriever", "BiEncoder", "CrossEncoder", "SearchResult",
    # the engine
    "SearchEngine", "EngineSettings", "ShardedEngine", "open_engine",
    # training and evaluation
    "RetrieverRecipe", "train_retriever", "RerankerConfig", "train_reranker_on", "run_bench", "evaluate",
    "adapt", "AdaptRecipe",
]

_WHERE = {
    "Document": "indexer.records", "Query": "indexer.records", "Hit": "indexer.records", "Passage": "indexer.records",
    "RankedList": "indexer.records", "Judgment": "indexer.records", "Qrels": "indexer.records",
    "TwostageError": "indexer.errors", "DataError": "indexer.errors", "DataNotFoundError": "indexer.errors",
    "ConfigError": "indexer.errors", "IndexFormatError": "indexer.errors", "MissingDependencyError": "indexer.errors",
    "WriterBusyError": "indexer.errors", "ModelNotFoundError": "indexer.errors", "UntrainedHeadError": "indexer.errors",
    "FilterError": "indexer.errors", "PageExpiredError": "indexer.errors",
    "Corpus": "indexer.corpus", "load_corpus": "indexer.corpus", "iter_documents": "indexer.corpus",
    "BeirDataset": "indexer.beir",
    "BM25Retriever": "retriever.bm25", "BiEncoder": "retriever.biencoder",
    "CrossEncoder": "reranker.cross_encoder", "SearchResult": "indexer.records",
    "SearchEngine": "engine.search_engine", "EngineSettings": "indexer.engine_dir",
    "ShardedEngine": "engine.sharded", "open_engine": "engine.door",
    "RetrieverRecipe": "retriever.recipe", "train_retriever": "retriever.recipe",
    "RerankerConfig": "reranker.training", "train_reranker_on": "engine.training",
    "run_bench": "eval.harness", "evaluate": "eval.metrics",
    "adapt": "app.adapt", "AdaptRecipe": "app.adapt",
}

if TYPE_CHECKING:  # pragma: no cover - for type checkers and IDEs
    from twostage.app.adapt import AdaptRecipe, adapt
    from twostage.engine.search_engine import SearchEngine
    from twostage.engine.door import open_engine
    from twostage.engine.sharded import ShardedEngine
    from twostage.eval.harness import run_bench
    from twostage.eval.metrics import evaluate
    from twostage.indexer.beir import BeirDataset
    from twostage.indexer.corpus import Corpus, iter_documents, load_corpus
    from twostage.indexer.engine_dir import EngineSettings
    from twostage.indexer.errors import (
        ConfigError,
        DataError,
        DataNotFoundError,
        FilterError,
        IndexFormatError,
        MissingDependencyError,
        ModelNotFoundError,
        PageExpiredError,
        TwostageError,
        UntrainedHeadError,
        WriterBusyError,
    )
    from twostage.indexer.records import Document, Hit, Judgment, Passage, Qrels, Query, RankedList, SearchResult
    from twostage.reranker.cross_encoder import CrossEncoder
    from twostage.engine.training import train_reranker_on
    from twostage.reranker.training import RerankerConfig
    from twostage.retriever.biencoder import BiEncoder
    from twostage.retriever.bm25 import BM25Retriever
    from twostage.retriever.recipe import RetrieverRecipe, train_retriever


def __getattr__(name: str) -> Any:
    where = _WHERE.get(name)
    if where is None:
        raise AttributeError(f"module 'twostage' has no attribute {name!r}")
    value = getattr(import_module(f"twostage.{where}"), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
