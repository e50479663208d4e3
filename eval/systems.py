"""The systems the harness can evaluate, by name. Each is built from the corpus and answers ``search``."""

from __future__ import annotations

import weakref
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from twostage.indexer.corpus import Corpus
from twostage.indexer.engine_dir import EngineSettings, with_changes
from twostage.indexer.errors import ConfigError
from twostage.indexer.protocols import Retriever as SearchSystem
from twostage.indexer.records import RankedList
from twostage.retriever.bm25 import BM25Config, BM25Retriever
from twostage.retriever.device import resolve_device
from twostage.retriever.precision import resolve_precision


@dataclass(frozen=True)
class SystemOptions:
    """Settings systems need beyond the corpus (models, batch sizes). Defaults are the engine's."""

    retriever_model: str | None = None
    engine: str | None = None  # a built engine directory of this corpus: its models, indexes and settings are used
    reranker_model: str | None = None
    # None (and "auto" for the blend): an --engine's own setting, else the engine default; a value overrides it
    rerank_depth: int | None = None
    rerank_blend: float | str | None = "auto"  # EngineSettings.rerank_blend; "auto": the engine's own
    precision: str | None = None
    backend: str = EngineSettings().backend
    batch_size: int | None = None
    show_progress: bool = False
    device: str = "auto"  # where the models run (twostage.retriever.device)


# One engine per (corpus, model settings): dense, hybrid and their +rerank systems are views of it, so a bench run
# encodes the corpus once and evaluates exactly what `twostage build` / `twostage search` answer. Dropped with the
# corpus (its temporary directory with it).
_ENGINES: weakref.WeakKeyDictionary[Corpus, dict[tuple[Any, ...], Any]] = weakref.WeakKeyDictionary()


def engine_for(corpus: Corpus, options: SystemOptions, *, need_reranker: bool = False) -> Any:
    """The search engine the harness's dense, hybrid and +rerank systems are views of."""
    key = (options.retriever_model, options.engine, options.reranker_model, options.precision, options.backend,
           options.batch_size, options.rerank_depth, str(options.rerank_blend), options.device)
    shared = _ENGINES.setdefault(corpus, {})
    if key not in shared:
        shared[key] = _build_engine(corpus, options)
    engine = shared[key]
    if need_reranker and engine.manifest.reranker is None:
        raise ConfigError("the +rerank systems need a cross-encoder: pass --reranker-model NAME_OR_DIR"
                          + (f" (engine {options.engine} has none; rebuild it with --reranker)" if options.engine else ""))
    return engine


def _build_engine(corpus: Corpus, options: SystemOptions) -> Any:
    import shutil
    import tempfile

    from twostage.engine.door import open_engine
    from twostage.engine.search_engine import SearchEngine

    given = overrides(options)
    if options.engine:
        engine = open_engine(options.engine, device=options.device)
        missing = [d.id for d in corpus if d.id not in engine][:3]
        if missing or len(engine) != len(corpus):
            raise ConfigError(f"engine {options.engine} holds other documents than this corpus (e.g. "
                              f"{', '.join(missing) or 'a different count'}); build it from the same corpus")
        return engine.with_settings(**given) if given else engine  # a view: the engine and its files unchanged
    settings = with_changes(EngineSettings(backend=options.backend), given)
    if not options.retriever_model:
        raise ConfigError("the dense systems need a model: pass --retriever-model NAME_OR_DIR (or --engine DIR)")
    tmp = tempfile.mkdtemp(prefix="twostage-bench-")
    engine = SearchEngine.build(corpus, f"{tmp}/engine", retriever=options.retriever_model,
                                reranker=options.reranker_model, settings=settings,
                                show_progress=options.show_progress, device=options.device)
    weakref.finalize(engine, shutil.rmtree, tmp, True)
    return engine


def overrides(options: SystemOptions) -> dict[str, Any]:
    """The engine settings the options set (everything else stays the engine's: passages, fusion, depths...)."""
    given = {"rerank_depth": options.rerank_depth, "precision": options.precision, "batch_size": options.batch_size}
    out: dict[str, Any] = {name: value for name, value in given.items() if value is not None}
    if options.rerank_blend != "auto":
        out["rerank_blend"] = options.rerank_blend
    return out


def _view(first_stage: str, rerank: bool) -> SystemFactory:
    def build(corpus: Corpus, options: SystemOptions) -> SearchSystem:
        return engine_for(corpus, options, need_reranker=rerank).as_retriever(first_stage=first_stage, rerank=rerank)

    return build


def _bm25_rerank(corpus: Corpus, options: SystemOptions) -> SearchSystem:
    """BM25 then the reranker: a view of the engine when there is a retriever model; else BM25's whole-document
    lists reranked by the engine's reranking function (no engine: nothing to read passages from)."""
    if options.retriever_model or options.engine:
        return _view("bm25", True)(corpus, options)
    from twostage.reranker.cross_encoder import CrossEncoder
    from twostage.reranker.interpolation import blend_for

    if not options.reranker_model:
        raise ConfigError("the +rerank systems need a cross-encoder: pass --reranker-model NAME_OR_DIR")
    device = resolve_device(options.device)
    s = with_changes(EngineSettings(), overrides(options))
    reranker = CrossEncoder.load(options.reranker_model, device=device,
                                 precision=resolve_precision(s.precision, "reranker", device))
    blend = blend_for(reranker, "bm25") if s.rerank_blend == "auto" else s.blend_for("bm25")
    return _BM25Reranked(BM25Retriever.build(corpus), reranker, {d.id: d.full_text for d in corpus}, s, blend)


class _BM25Reranked:
    """BM25's top ``rerank_depth`` reranked (:func:`~twostage.reranker.rerank.rerank_lists`), then BM25's rest."""

    def __init__(self, bm25: BM25Retriever, reranker: Any, texts: dict[str, str], settings: EngineSettings,
                 blend: float | None) -> None:
        self.bm25, self.reranker, self.texts, self.settings, self.blend = bm25, reranker, texts, settings, blend

    def search(self, query: str, k: int) -> RankedList:
        from twostage.reranker.rerank import rerank_lists

        s = self.settings
        first = self.bm25.search(query, max(k, s.rerank_depth))
        return rerank_lists(self.reranker, [query], [first], self.texts.__getitem__, k=k, rerank_depth=s.rerank_depth,
                            blend=self.blend, batch_size=s.batch_size)[0].ranked


SystemFactory = Callable[[Corpus, SystemOptions], SearchSystem]


def _bm25(corpus: Corpus, options: SystemOptions) -> SearchSystem:
    return BM25Retriever.build(corpus)


SYSTEMS: dict[str, SystemFactory] = {
    "bm25": _bm25,
    "rank-bm25": lambda corpus, options: BM25Retriever.build(corpus, BM25Config(engine="rank-bm25")),
    "dense": _view("dense", False),
    "hybrid": _view("hybrid", False),
    "bm25+rerank": _bm25_rerank,
    "dense+rerank": _view("dense", True),
    "hybrid+rerank": _view("hybrid", True),
}
DESCRIPTIONS = {
    "bm25": "BM25 (Lucene formula, k1=1.5, b=0.75, stemming + stopwords), bm25s engine",
    "rank-bm25": "the same BM25 computed by rank-bm25 (reference engine, slow)",
    "dense": "bi-encoder (--retriever-model) through the engine's ANN index (--backend), or an --engine's",
    "hybrid": "reciprocal rank fusion of bm25 and dense (top 100 each), as the engine does",
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
        have_model = bool(options and (options.retriever_model or options.engine))
        have_reranker = bool(options and (options.reranker_model or options.engine))
        return [n for n in SYSTEMS
                if (have_model or n not in NEEDS_MODEL) and (have_reranker or n not in NEEDS_RERANKER)]
    unknown = [n for n in names if n not in SYSTEMS]
    if unknown or not names:
        raise ConfigError(f"unknown system(s) {', '.join(unknown) or '(none given)'}; known: all, {', '.join(SYSTEMS)}")
    return list(dict.fromkeys(names))
