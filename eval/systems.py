"""The systems the harness can evaluate, by name. Each is built from the corpus and answers ``search``."""

from __future__ import annotations

import weakref
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import Any

from twostage.engine.settings import EngineSettings, with_changes
from twostage.indexer.corpus import Corpus
from twostage.indexer.errors import ConfigError
from twostage.indexer.protocols import Retriever as SearchSystem
from twostage.retriever.analyzer import for_language
from twostage.retriever.bm25 import BM25Config, BM25Retriever


@dataclass(frozen=True)
class SystemOptions:
    """Settings systems need beyond the corpus (models, batch sizes). Defaults are the engine's."""

    retriever_model: str | None = None
    engine: str | None = None  # a built engine directory of this corpus: its models, indexes and settings are used
    reranker_model: str | None = None
    late_model: str | None = None  # token vectors by this model (a ColBERT checkpoint or a bi-encoder): +maxsim systems
    # None (and "auto" for the blend): an --engine's own setting, else the engine default; a value overrides it
    rerank_depth: int | None = None
    rerank_blend: float | str | None = "auto"  # EngineSettings.rerank_blend; "auto": the engine's own
    precision: str | None = None
    backend: str = EngineSettings().backend
    batch_size: int | None = None
    show_progress: bool = False
    device: str = "auto"  # where the models run (twostage.models.device)
    language: str | None = EngineSettings().language  # the lexical analysis (EngineSettings.language)
    # MaxSim's weight against the first stage for the +maxsim systems ("auto": the engine's; 0.0: MaxSim off, as
    # the one command's dev rule may choose, twostage.eval.workflows.choose_maxsim)
    maxsim_blend: float | str = "auto"
    # the first-stage candidates MaxSim reads (None: with "auto", the depth chosen on dev for the late model over its
    # dev corpus, else the engine's)
    maxsim_depth: int | None = None


# One engine per (corpus, model settings): dense, hybrid and their +rerank systems are views of it, so a bench run
# encodes the corpus once and evaluates exactly what `twostage build` / `twostage search` answer. Dropped with the
# corpus (its temporary directory with it).
_ENGINES: weakref.WeakKeyDictionary[Corpus, dict[tuple[Any, ...], Any]] = weakref.WeakKeyDictionary()


def engine_for(corpus: Corpus, options: SystemOptions, *, need_reranker: bool = False,
               need_retriever: bool = True, need_late: bool = False) -> Any:
    """The search engine the harness's dense, hybrid and +rerank systems are views of: an ``--engine``'s, or one
    built in a temporary directory with the engine defaults. With no retriever given and none needed
    (``bm25+rerank``), a BM25-only engine over whole documents: its first stage is the ``bm25`` system's list, so
    the reranker's gain is measured on the same candidates, and ``twostage rerank`` of bench's BM25 run equals it."""
    if need_retriever and not (options.retriever_model or options.engine):  # the build's choice (languages)
        options = replace(options, retriever_model="auto")
    key = (options.retriever_model, options.engine, options.reranker_model, options.precision, options.backend,
           options.batch_size, options.rerank_depth, str(options.rerank_blend), options.device, options.language,
           options.late_model)
    shared = _ENGINES.setdefault(corpus, {})
    if key not in shared:
        shared[key] = _build_engine(corpus, options)
    engine = shared[key]
    weight, depth = maxsim_served(options, corpus)
    if engine.manifest.late is not None and (weight, depth) != (None, None):  # a view: the engine is shared
        engine = engine.with_settings(**({} if weight is None else {"maxsim_blend": weight}),
                                      **({} if depth is None else {"maxsim_depth": depth}))
    if need_reranker and engine.manifest.reranker is None:
        raise ConfigError("the +rerank systems need a cross-encoder: pass --reranker-model NAME_OR_DIR"
                          + (f" (engine {options.engine} has none; rebuild it with --reranker)" if options.engine else ""))
    if need_late and engine.manifest.late is None:
        raise ConfigError("the +maxsim systems need token vectors: pass --late-model NAME_OR_DIR (a ColBERT checkpoint, "
                          "or a bi-encoder read token by token)"
                          + (f" (engine {options.engine} has none; add them with `twostage late`)" if options.engine
                             else ""))
    return engine


def maxsim_weight(options: SystemOptions, corpus: Corpus) -> float | None:
    """MaxSim's weight for the +maxsim systems over ``corpus`` (:func:`maxsim_served`)."""
    return maxsim_served(options, corpus)[0]


def maxsim_depth(options: SystemOptions, corpus: Corpus) -> int | None:
    """The candidates MaxSim reads for the +maxsim systems over ``corpus`` (:func:`maxsim_served`)."""
    return maxsim_served(options, corpus)[1]


def maxsim_served(options: SystemOptions, corpus: Corpus) -> tuple[float | None, int | None]:
    """MaxSim's weight and depth for the +maxsim systems over ``corpus``: the options' numbers, else (``"auto"``)
    what dev chose for the late model: its weight and depth where ``corpus`` is the dev queries' own, its weight for
    another corpus (and the engine's depth) elsewhere (:func:`twostage.engine.knobs.served_maxsim`); None for what
    neither sets (the engine's own setting)."""
    if options.maxsim_blend != "auto":
        return float(options.maxsim_blend), options.maxsim_depth
    from twostage.engine.knobs import served_maxsim

    served = served_maxsim(options.late_model, corpus.ids)
    if served is None:
        return None, options.maxsim_depth
    return served.weight, served.depth if options.maxsim_depth is None else options.maxsim_depth


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
    if not options.retriever_model:  # BM25-only, over whole documents: bm25+rerank reranks exactly bm25's list
        settings = with_changes(settings, {"passage_words": 0})
    tmp = tempfile.mkdtemp(prefix="twostage-bench-")
    engine = SearchEngine.build(corpus, f"{tmp}/engine", retriever=options.retriever_model,
                                reranker=options.reranker_model, settings=settings,
                                show_progress=options.show_progress, device=options.device,
                                late_interaction=options.late_model)
    weakref.finalize(engine, shutil.rmtree, tmp, True)
    return engine


def overrides(options: SystemOptions) -> dict[str, Any]:
    """The engine settings the options set (everything else stays the engine's: passages, fusion, depths...)."""
    given = {"rerank_depth": options.rerank_depth, "precision": options.precision, "batch_size": options.batch_size}
    out: dict[str, Any] = {name: value for name, value in given.items() if value is not None}
    if options.language != EngineSettings().language and not options.engine:
        out["language"] = options.language
    if options.rerank_blend != "auto":
        out["rerank_blend"] = options.rerank_blend
    return out


def _view(first_stage: str, rerank: bool, maxsim: bool = False) -> SystemFactory:
    def build(corpus: Corpus, options: SystemOptions) -> SearchSystem:
        engine = engine_for(corpus, options, need_reranker=rerank, need_retriever=first_stage != "bm25",
                            need_late=maxsim)
        served = maxsim and maxsim_weight(options, corpus) != 0.0  # a weight of 0.0 chosen on dev: MaxSim off, as served
        return engine.as_retriever(first_stage=first_stage, rerank=rerank, maxsim=served)

    return build


SystemFactory = Callable[[Corpus, SystemOptions], SearchSystem]


def _bm25(corpus: Corpus, options: SystemOptions, engine: str = "bm25s") -> SearchSystem:
    return BM25Retriever.build(corpus, BM25Config(engine=engine, analyzer=for_language(options.language)))


SYSTEMS: dict[str, SystemFactory] = {
    "bm25": _bm25,
    "rank-bm25": lambda corpus, options: _bm25(corpus, options, "rank-bm25"),
    "dense": _view("dense", False),
    "hybrid": _view("hybrid", False),
    "bm25+rerank": _view("bm25", True),
    "dense+rerank": _view("dense", True),
    "hybrid+rerank": _view("hybrid", True),
    "hybrid+maxsim": _view("hybrid", False, True),
    "hybrid+maxsim+rerank": _view("hybrid", True, True),
}
DESCRIPTIONS = {
    "bm25": "BM25 (Lucene formula, k1=1.5, b=0.75; each text's language's stemmer and stopwords), bm25s engine",
    "rank-bm25": "the same BM25 computed by rank-bm25 (reference engine, slow)",
    "dense": "bi-encoder (--retriever-model) through the engine's ANN index (--backend), or an --engine's",
    "hybrid": f"bm25 and dense (top {EngineSettings().first_stage_depth} each) fused by the engine's fusion "
              f"(default: {EngineSettings().fusion_label}; blend: min-max normalised scores)",
    "bm25+rerank": "the engine's bm25 (with no retriever: a BM25-only engine over whole documents, bm25's list), "
                   "top --rerank-depth reranked by the cross-encoder (--reranker-model)",
    "dense+rerank": "dense, top --rerank-depth reranked by the cross-encoder",
    "hybrid+rerank": "hybrid, top --rerank-depth reranked by the cross-encoder",
    "hybrid+maxsim": "hybrid, top maxsim_depth reordered by MaxSim over token vectors by --late-model (blended with "
                     "hybrid by the engine's maxsim_blend)",
    "hybrid+maxsim+rerank": "hybrid -> MaxSim -> the cross-encoder on MaxSim's top --rerank-depth",
}
NEEDS_MODEL = {"dense", "hybrid", "dense+rerank", "hybrid+rerank", "hybrid+maxsim", "hybrid+maxsim+rerank"}
NEEDS_RERANKER = {"bm25+rerank", "dense+rerank", "hybrid+rerank", "hybrid+maxsim+rerank"}
NEEDS_LATE = {"hybrid+maxsim", "hybrid+maxsim+rerank"}


def resolve_systems(spec: str | Sequence[str], options: SystemOptions | None = None) -> list[str]:
    """``"all"``, ``"bm25,rank-bm25"`` or a list of names -> list of known names, in order, no repeats.

    ``all`` means every system that can run with ``options`` (the dense ones need a model).
    """
    names = [s.strip() for s in spec.split(",")] if isinstance(spec, str) else [str(s).strip() for s in spec]
    names = [n for n in names if n]
    if names == ["all"]:
        have_model = bool(options and (options.retriever_model or options.engine))
        have_reranker = bool(options and (options.reranker_model or options.engine))
        have_late = bool(options and options.late_model)
        return [n for n in SYSTEMS if (have_model or n not in NEEDS_MODEL)
                and (have_reranker or n not in NEEDS_RERANKER) and (have_late or n not in NEEDS_LATE)]
    unknown = [n for n in names if n not in SYSTEMS]
    if unknown or not names:
        raise ConfigError(f"unknown system(s) {', '.join(unknown) or '(none given)'}; known: all, {', '.join(SYSTEMS)}")
    return list(dict.fromkeys(names))
