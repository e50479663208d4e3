"""The systems the harness can evaluate, by name. Each is built from the corpus and answers ``search``."""

from __future__ import annotations

import weakref
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from indexer.corpus import Corpus
from indexer.errors import ConfigError
from indexer.protocols import Retriever as SearchSystem
from indexer.records import RankedList
from retriever.bm25 import BM25Config, BM25Retriever


@dataclass(frozen=True)
class SystemOptions:
    """Settings systems need beyond the corpus (models, batch sizes)."""

    retriever_model: str | None = None
    index: str | None = None  # a built index directory: dense search through its ANN structure
    reranker_model: str | None = None
    rerank_depth: int = 100
    rerank_interpolation: float | str | None = "auto"  # see reranker.pipeline.Pipeline
    precision: str = "fp32"
    batch_size: int = 32
    show_progress: bool = False


class IndexSearch:
    """An index directory as a first stage (`search(query, k)` -> one RankedList, through its ANN backend)."""

    def __init__(self, index: object) -> None:
        self.index = index

    def search(self, query: str, k: int) -> RankedList:
        return self.index.search(query, k)[0]  # type: ignore[attr-defined]


# One dense first stage per (corpus, model settings): dense, hybrid and their +rerank systems share one encoding
# of the corpus within a bench run (searching it never changes it). Dropped with the corpus.
_DENSE: weakref.WeakKeyDictionary[Corpus, dict[tuple[Any, ...], SearchSystem]] = weakref.WeakKeyDictionary()


def _dense(corpus: Corpus, options: SystemOptions) -> SearchSystem:
    key = (options.retriever_model, options.index, options.precision, options.batch_size)
    shared = _DENSE.setdefault(corpus, {})
    if key not in shared:
        shared[key] = _build_dense(corpus, options)
    return shared[key]


def _build_dense(corpus: Corpus, options: SystemOptions) -> SearchSystem:
    from retriever.biencoder import BiEncoder
    from retriever.dense import DenseRetriever

    if options.index:
        from indexer.index import Index

        index = Index.load(options.index)
        missing = [d.id for d in corpus if d.id not in index][:3]
        if missing:
            raise ConfigError(f"index {options.index} lacks documents of this corpus (e.g. {', '.join(missing)}); "
                              "build it from the same corpus")
        index.attach_encoder(BiEncoder.load(options.retriever_model or index.manifest.encoder.name,
                                            precision=options.precision))
        return IndexSearch(index)
    if not options.retriever_model:
        raise ConfigError("the dense system needs a model: pass --retriever-model NAME_OR_DIR")
    encoder = BiEncoder.load(options.retriever_model, precision=options.precision)
    return DenseRetriever.build(corpus, encoder, batch_size=options.batch_size, show_progress=options.show_progress)


def _hybrid(corpus: Corpus, options: SystemOptions) -> SearchSystem:
    from retriever.hybrid import HybridRetriever

    return HybridRetriever([BM25Retriever.build(corpus), _dense(corpus, options)], depth=max(100, options.rerank_depth))


class _Reranked:
    """A first stage followed by the cross-encoder, through the same Pipeline users call."""

    def __init__(self, pipeline: object) -> None:
        self.pipeline = pipeline

    def search(self, query: str, k: int) -> RankedList:
        return self.pipeline.ranked(query, k)  # type: ignore[attr-defined]


def _reranked(first: SystemFactory) -> SystemFactory:
    def build(corpus: Corpus, options: SystemOptions) -> SearchSystem:
        from reranker.cross_encoder import CrossEncoder
        from reranker.pipeline import Pipeline

        if not options.reranker_model:
            raise ConfigError("the +rerank systems need a cross-encoder: pass --reranker-model NAME_OR_DIR")
        reranker = CrossEncoder.load(options.reranker_model, precision=options.precision)
        texts = {d.id: d.full_text for d in corpus}
        return _Reranked(Pipeline(first(corpus, options), reranker=reranker, texts=texts,
                                  k_retrieve=options.rerank_depth, k=min(10, options.rerank_depth),
                                  batch_size=options.batch_size, interpolation=options.rerank_interpolation))

    return build


SystemFactory = Callable[[Corpus, SystemOptions], SearchSystem]


def _bm25(corpus: Corpus, options: SystemOptions) -> SearchSystem:
    return BM25Retriever.build(corpus)


SYSTEMS: dict[str, SystemFactory] = {
    "bm25": _bm25,
    "rank-bm25": lambda corpus, options: BM25Retriever.build(corpus, BM25Config(engine="rank-bm25")),
    "dense": _dense,
    "hybrid": _hybrid,
    "bm25+rerank": _reranked(_bm25),
    "dense+rerank": _reranked(_dense),
    "hybrid+rerank": _reranked(_hybrid),
}
DESCRIPTIONS = {
    "bm25": "BM25 (Lucene formula, k1=1.5, b=0.75, stemming + stopwords), bm25s engine",
    "rank-bm25": "the same BM25 computed by rank-bm25 (reference engine, slow)",
    "dense": "bi-encoder (--retriever-model), exact search over the corpus embeddings, or --index",
    "hybrid": "reciprocal rank fusion of bm25 and dense",
    "bm25+rerank": "bm25, top --rerank-depth reranked by the cross-encoder (--reranker-model)",
    "dense+rerank": "dense, top --rerank-depth reranked by the cross-encoder",
    "hybrid+rerank": "hybrid, top --rerank-depth reranked by the cross-encoder",
}
NEEDS_MODEL = {"dense", "hybrid", "dense+rerank", "hybrid+rerank"}
NEEDS_RERANKER = {"bm25+rerank", "dense+rerank", "hybrid+rerank"}


def resolve_systems(spec: str | Sequence[str], options: SystemOptions | None = None) -> list[str]:
    """``"all"``, ``"bm25,rank-bm25"`` or a list of names -> list of known names, in order, no repeats.

    ``all`` means every system that can run with ``options`` (the dense ones need a model).
    """
    names = [s.strip() for s in spec.split(",")] if isinstance(spec, str) else [str(s).strip() for s in spec]
    names = [n for n in names if n]
    if names == ["all"]:
        have_model = bool(options and (options.retriever_model or options.index))
        have_reranker = bool(options and options.reranker_model)
        return [n for n in SYSTEMS
                if (have_model or n not in NEEDS_MODEL) and (have_reranker or n not in NEEDS_RERANKER)]
    unknown = [n for n in names if n not in SYSTEMS]
    if unknown or not names:
        raise ConfigError(f"unknown system(s) {', '.join(unknown) or '(none given)'}; known: all, {', '.join(SYSTEMS)}")
    return list(dict.fromkeys(names))
