"""twostage: retrieve, then rerank. The names a user needs, in one place.

>>> from twostage import SearchEngine
>>> engine = SearchEngine.build("corpus.jsonl", "engines/docs", retriever="all-MiniLM-L6-v2")
>>> engine.search("why do cats purr", k=10).hits[0]

Errors: :mod:`twostage.errors` (every one a :class:`TwostageError`). The layers below are importable for
everything else (``twostage.indexer``, ``twostage.retriever``, ``twostage.reranker``, ``twostage.engine``,
``twostage.eval``). Heavy dependencies (torch, transformers) load on first use, so ``import twostage`` stays fast.
"""

from __future__ import annotations

import importlib as _importlib
import typing as _typing
import warnings as _warnings

__all__ = [
    # records
    "Document", "Hit", "SearchResult", "RankedList", "Qrels", "TwostageError",
    # the plug-in points (typing.Protocol): what an encoder, a retriever and a reranker provide
    "Encoder", "Retriever", "Reranker",
    # corpora and data sets
    "load_corpus", "BeirDataset",
    # the engine
    "SearchEngine", "ShardedEngine", "open_engine", "EngineSettings",
    # the models and BM25
    "BM25Retriever", "BiEncoder", "CrossEncoder",
    # training and evaluation
    "train", "RetrieverRecipe", "RerankerConfig", "adapt", "AdaptRecipe",
    "run_bench", "evaluate",
]

_WHERE = {
    "Document": "indexer.records", "Hit": "indexer.records", "RankedList": "indexer.records",
    "Qrels": "indexer.records", "SearchResult": "indexer.records", "TwostageError": "indexer.errors",
    "Encoder": "indexer.protocols", "Retriever": "indexer.protocols", "Reranker": "indexer.protocols",
    "load_corpus": "indexer.corpus", "BeirDataset": "indexer.beir",
    "SearchEngine": "engine.search_engine", "ShardedEngine": "engine.sharded", "open_engine": "engine.door",
    "EngineSettings": "engine.settings",
    "BM25Retriever": "retriever.bm25", "BiEncoder": "retriever.biencoder", "CrossEncoder": "reranker.cross_encoder",
    "train": "eval.workflows", "RetrieverRecipe": "retriever.recipe", "RerankerConfig": "reranker.training",
    "adapt": "eval.workflows", "AdaptRecipe": "engine.adapt",
    "run_bench": "eval.harness", "evaluate": "eval.metrics",
}

# names the facade exported before it was cut to the ones above: still resolved, with a warning saying where they live
_MOVED = {
    **dict.fromkeys(("Query", "Passage", "Judgment"), "twostage.indexer.records"),
    **dict.fromkeys(("DataError", "DataNotFoundError", "ConfigError", "IndexFormatError", "MissingDependencyError",
                     "WriterBusyError", "ModelNotFoundError", "UntrainedHeadError", "FilterError",
                     "PageExpiredError"), "twostage.errors"),
    "train_retriever": "twostage.retriever.recipe",  # twostage.train chooses the epoch as served
    # one entry for both models (twostage.train, its recipe says which) replaced the two below
    **dict.fromkeys(("train_retriever_on", "train_reranker_on"), "twostage.engine.training"),
    "Corpus": "twostage.indexer.corpus", "iter_documents": "twostage.indexer.corpus",
}

if _typing.TYPE_CHECKING:  # pragma: no cover - for type checkers and IDEs
    from twostage.engine.adapt import AdaptRecipe
    from twostage.engine.door import open_engine
    from twostage.engine.search_engine import SearchEngine
    from twostage.engine.settings import EngineSettings
    from twostage.engine.sharded import ShardedEngine
    from twostage.eval.harness import run_bench
    from twostage.eval.metrics import evaluate
    from twostage.eval.workflows import adapt, train
    from twostage.indexer.beir import BeirDataset
    from twostage.indexer.corpus import load_corpus
    from twostage.indexer.errors import TwostageError
    from twostage.indexer.protocols import Encoder, Reranker, Retriever
    from twostage.indexer.records import Document, Hit, Qrels, RankedList, SearchResult
    from twostage.reranker.cross_encoder import CrossEncoder
    from twostage.reranker.training import RerankerConfig
    from twostage.retriever.biencoder import BiEncoder
    from twostage.retriever.bm25 import BM25Retriever
    from twostage.retriever.recipe import RetrieverRecipe


def __getattr__(name: str) -> _typing.Any:
    where = _WHERE.get(name)
    if where is not None:
        value = getattr(_importlib.import_module(f"twostage.{where}"), name)
        globals()[name] = value
        return value
    if name in _MOVED:
        _warnings.warn(f"twostage.{name} has moved: import it from {_MOVED[name]}", DeprecationWarning, stacklevel=2)
        return getattr(_importlib.import_module(_MOVED[name]), name)
    if name == "errors":
        return _importlib.import_module("twostage.errors")
    raise AttributeError(f"module 'twostage' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(__all__)
