"""A search's settings: the engine's, with one call's options (``KNOBS``: the :class:`EngineSettings` names a call
may change; the old names still read, with a DeprecationWarning), and the reranker's blend they resolve to.

Search policy lives in the engine: what training chose on dev for a reranker (:class:`DevChoice`: its blend with
each first stage, the calibration of its score) is read from the training record beside the model's weights
(``twostage.json``'s ``training``) when an engine is built with ``rerank_blend="auto"``, and written into the
engine's manifest as numbers; the model's own settings hold none of it. Models saved before kept the choice in their
settings (``interpolation``, ``interpolation_by_first_stage``, ``calibration``): read from there, checked.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace
from functools import lru_cache
from pathlib import Path
from typing import Any

from twostage.engine.fusion import ELSEWHERE_MAX, RERANK_ELSEWHERE
from twostage.engine.options import MAX_DEPTH, SEARCH_OPTIONS
from twostage.engine.settings import FIRST_STAGES, EngineSettings, is_blend, renamed, with_changes
from twostage.indexer.errors import ConfigError
from twostage.indexer.records import check_k

KNOBS = tuple(option.name for option in SEARCH_OPTIONS)  # the options a call may change, described once


@dataclass(frozen=True)
class DevChoice:
    """What training chose on dev for a reranker: ``blend``, its weight against the first stage over every first stage
    (None: the reranker alone), ``by_first_stage`` each first stage's own, and ``calibration``, Platt's (a, b).

    ``home`` is the bottom-k sketch of the corpus the dev queries searched (:mod:`twostage.indexer.corpus_sketch`) and
    ``home_documents`` its size: over another corpus the reranker is served at
    :data:`~twostage.engine.fusion.RERANK_ELSEWHERE` (:func:`reranker_elsewhere`). A record from before names no
    corpus (``home`` empty): its choice is served everywhere."""

    blend: float | None = None
    by_first_stage: Mapping[str, float] = field(default_factory=dict)
    calibration: tuple[float, float] | None = None
    home: tuple[str, ...] = ()
    home_documents: int = 0

    def blend_for(self, first_stage: str | None) -> float | None:
        """The blend after ``first_stage`` (the overall one for a first stage it was not chosen for)."""
        return self.by_first_stage.get(first_stage, self.blend) if first_stage else self.blend


def dev_choice(model_dir: str | Path | None) -> DevChoice:
    """The dev choice recorded with the reranker in ``model_dir`` (nothing chosen: every field None or empty)."""
    if model_dir is None or not (Path(model_dir) / "twostage.json").is_file():
        return DevChoice()
    path = Path(model_dir) / "twostage.json"
    return _dev_choice(str(path), path.stat().st_mtime_ns)


@lru_cache(maxsize=64)
def _dev_choice(path: str, _mtime: int) -> DevChoice:
    from twostage.models.model_meta import read_model_meta

    meta = read_model_meta(Path(path).parent)
    if meta is None or meta[0] != "cross-encoder":
        return DevChoice()
    _, settings, training = meta
    chosen, fitted = training.get("interpolation"), training.get("calibration")
    if isinstance(chosen, dict):  # the training record: InterpolationChoice (twostage.engine.fusion) as JSON
        overall = chosen.get("alpha")
        stages = chosen.get("by_first_stage") or []
        if not isinstance(stages, list) or not all(isinstance(s, list) and len(s) >= 2 for s in stages):
            raise ConfigError(f"{path}: training.interpolation.by_first_stage must list [first stage, blend, ...]; "
                              "restore the model directory or train it again")
        by_stage = {str(s[0]): s[1] for s in stages}
    else:  # a model saved before: the choice in its settings
        overall, by_stage = settings.get("interpolation"), settings.get("interpolation_by_first_stage", {})
        if not isinstance(by_stage, dict):
            raise ConfigError(f"{path}: interpolation_by_first_stage must be an object of first stage -> blend; "
                              "restore the model directory or train it again")
    calibration = [fitted.get("a"), fitted.get("b")] if isinstance(fitted, dict) else settings.get("calibration")
    sketch, documents = _home(training.get(RERANK_HOME), path, RERANK_HOME)
    return DevChoice(None if overall is None else _blend(overall, path, "interpolation"),
                     {k: _blend(v, path, f"interpolation_by_first_stage.{k}") for k, v in by_stage.items()},
                     None if calibration is None else _calibration(calibration, path), sketch, documents)


RERANK_HOME = "home"  # the reranker's training record: the corpus its dev queries searched (a sketch and a count)


def _home(home: Any, path: str, key: str) -> tuple[tuple[str, ...], int]:
    """A training record's ``home`` (the dev corpus: ``documents``, a count, and ``sketch``), checked; ((), 0) for
    none."""
    from twostage.indexer.corpus_sketch import is_sketch

    home = home or {}
    sketch: Any = (home.get("sketch") or []) if isinstance(home, dict) else None
    documents: Any = home.get("documents", 0) if isinstance(home, dict) else 0
    if not is_sketch(sketch) or isinstance(documents, bool) or not isinstance(documents, int) or documents < 0:
        raise ConfigError(f"{path}: training.{key} must hold the dev corpus's documents (a count) and sketch "
                          "(ascending 16-digit hex hashes); restore the model directory or train it again")
    return tuple(str(h) for h in sketch), documents


def home_similarity(home: tuple[str, ...], document_ids: Iterable[str] | None) -> float | None:
    """The estimated share of documents that a corpus holding ``document_ids`` has in common with the dev corpus
    sketched as ``home``; None when either is not known (no sketch recorded, no ids given)."""
    if not home or document_ids is None:
        return None
    from twostage.indexer.corpus_sketch import corpus_sketch, similarity

    return similarity(home, corpus_sketch(document_ids, len(home)))


def reranker_elsewhere(model_dir: str | Path | None, document_ids: Iterable[str] | None) -> float | None:
    """The share of documents an engine holding ``document_ids`` has in common with the corpus the reranker in
    ``model_dir`` was chosen on, when that is under :data:`HOME_SIMILARITY` (the reranker is then served at
    :data:`~twostage.engine.fusion.RERANK_ELSEWHERE`); None when this is its dev corpus or that is not known."""
    shared = home_similarity(dev_choice(model_dir).home, document_ids)
    return shared if shared is not None and shared < HOME_SIMILARITY else None


MAXSIM_CHOICE = "maxsim_choice"  # the late model's training record: what the one command chose for it on dev
HOME_SIMILARITY = 0.5  # an engine sharing at least this much of its documents with the dev corpus serves its choice


@dataclass(frozen=True)
class MaxSimChoice:
    """What the one command chose on dev for a late-interaction model: MaxSim's ``weight`` against the first stage
    (0.0: off), the dev metric at every weight tried, the number of dev queries and the rule that chose (a name in
    :data:`twostage.engine.fusion.BLEND_RULES`; a record without one is from before the gated rule: ``one_se``).

    ``elsewhere`` is the weight for a corpus other than the one the dev queries searched, whose bottom-k sketch of
    document ids is ``home`` (:mod:`twostage.indexer.corpus_sketch`) and whose size is ``home_documents``: the
    smallest weight within one standard error of dev's best, never above ``weight`` nor
    :data:`~twostage.engine.fusion.ELSEWHERE_MAX` (a record from before the cap is read capped). A record
    from before it names no corpus (``home`` empty): its weight is served everywhere.

    ``depth`` is the number of first-stage candidates MaxSim reads that dev chose with the weight (``dev_by_weight``
    is measured at it); None, in a record from before the depth was chosen: the engine's own ``maxsim_depth``."""

    weight: float
    dev_by_weight: tuple[tuple[float, float], ...] = ()
    dev_queries: int = 0
    rule: str = "one_se"
    elsewhere: float | None = None
    home: tuple[str, ...] = ()
    home_documents: int = 0
    depth: int | None = None
    dev_by_depth: tuple[tuple[int, float, float], ...] = ()  # (depth, dev metric, weight) at each depth tried


def maxsim_record(model_dir: str | Path | None) -> MaxSimChoice | None:
    """The MaxSim choice recorded in the training record of the late-interaction model in ``model_dir`` (the one
    command's dev rule, :func:`twostage.eval.workflows.choose_maxsim`, puts it there), checked; None when nothing was
    chosen for it (a model trained alone, a ColBERT checkpoint, a name)."""
    if model_dir is None or not (Path(model_dir) / "twostage.json").is_file():
        return None
    path = Path(model_dir) / "twostage.json"
    return _maxsim_record(str(path), path.stat().st_mtime_ns)


@lru_cache(maxsize=64)
def _maxsim_record(path: str, _mtime: int) -> MaxSimChoice | None:
    from twostage.models.model_meta import read_model_meta

    meta = read_model_meta(Path(path).parent)
    chosen = meta[2].get(MAXSIM_CHOICE) if meta is not None else None
    if chosen is None:
        return None
    if not isinstance(chosen, dict) or "weight" not in chosen:
        raise ConfigError(f"{path}: training.{MAXSIM_CHOICE} must be an object with a weight; restore the model "
                          "directory or train it again")
    curve = chosen.get("dev_by_weight") or []
    if not isinstance(curve, list) or not all(
            isinstance(p, list) and len(p) == 2 and all(isinstance(v, (int, float)) for v in p) for p in curve):
        raise ConfigError(f"{path}: training.{MAXSIM_CHOICE}.dev_by_weight must list [weight, dev score] pairs; "
                          "restore the model directory or train it again")
    queries, rule = chosen.get("dev_queries", 0), chosen.get("rule", "one_se")
    sketch, documents = _home(chosen.get("home"), path, f"{MAXSIM_CHOICE}.home")
    weight = _blend(chosen["weight"], path, f"{MAXSIM_CHOICE}.weight")
    elsewhere = chosen.get("elsewhere")
    if elsewhere is not None:
        elsewhere = _blend(elsewhere, path, f"{MAXSIM_CHOICE}.elsewhere")
        if elsewhere > weight:
            raise ConfigError(f"{path}: training.{MAXSIM_CHOICE}.elsewhere ({elsewhere:g}) is above its weight "
                              f"({weight:g}); restore the model directory or train it again")
        elsewhere = min(elsewhere, ELSEWHERE_MAX)  # a record from before the cap: served as the rule now chooses
    depth = chosen.get("depth")
    if depth is not None and (isinstance(depth, bool) or not isinstance(depth, int) or not 1 <= depth <= MAX_DEPTH):
        raise ConfigError(f"{path}: training.{MAXSIM_CHOICE}.depth must be a whole number in [1, {MAX_DEPTH}], got "
                          f"{depth!r}; restore the model directory or train it again")
    by_depth = chosen.get("dev_by_depth") or []
    if not isinstance(by_depth, list) or not all(
            isinstance(p, list) and len(p) == 3 and all(isinstance(v, (int, float)) for v in p) for p in by_depth):
        raise ConfigError(f"{path}: training.{MAXSIM_CHOICE}.dev_by_depth must list [depth, dev score, weight] "
                          "triples; restore the model directory or train it again")
    return MaxSimChoice(weight, tuple((float(a), float(m)) for a, m in curve), queries if isinstance(queries, int) else 0,
                        rule if isinstance(rule, str) else "one_se", elsewhere, sketch, documents, depth,
                        tuple((int(d), float(m), float(w)) for d, m, w in by_depth))


@dataclass(frozen=True)
class ServedMaxSim:
    """The MaxSim weight an engine serves for a late-interaction model with a recorded dev choice, and why.

    ``similarity`` is the estimated share of documents the engine's corpus and the dev corpus have in common (None:
    not known, the record or the caller naming no corpus); below :data:`HOME_SIMILARITY` the engine serves the
    record's ``elsewhere`` weight instead of the one dev chose, since the dev queries never searched this corpus."""

    weight: float
    record: MaxSimChoice
    similarity: float | None = None

    @property
    def home(self) -> bool:
        return self.similarity is None or self.similarity >= HOME_SIMILARITY

    @property
    def depth(self) -> int | None:
        """The candidates MaxSim reads: dev's choice on the dev corpus, the engine's own (None) on another one."""
        return self.record.depth if self.home else None

    @property
    def line(self) -> str:
        if self.home:
            where = "" if self.similarity is None else f" (this corpus is the dev corpus: {self.similarity:.0%} shared)"
            depth = "" if self.depth is None else f" over the top {self.depth}"
            return f"weight {self.weight:g}{depth}, chosen on {self.record.dev_queries} dev queries{where}"
        return (f"weight {self.weight:g}, the weight for another corpus: dev chose {self.record.weight:g} on a corpus of "
                f"{self.record.home_documents} documents that shares {self.similarity:.0%} of this one's, and "
                f"{self.weight:g} is the smallest weight within one standard error of dev's best there, at most "
                f"{ELSEWHERE_MAX:g} (level with the first stage)")


def served_maxsim(late_model: str | Path | None, document_ids: Iterable[str] | None = None) -> ServedMaxSim | None:
    """The MaxSim weight to serve for the late-interaction model in ``late_model`` (:func:`maxsim_record`) over an
    engine holding ``document_ids`` (read only when the record names its dev corpus): the dev choice on the dev
    corpus, the record's ``elsewhere`` weight on another one; None when nothing was chosen for the model."""
    record = maxsim_record(late_model)
    if record is None:
        return None
    shared = None if record.elsewhere is None else home_similarity(record.home, document_ids)
    if shared is None or record.elsewhere is None:
        return ServedMaxSim(record.weight, record)
    return ServedMaxSim(record.weight if shared >= HOME_SIMILARITY else record.elsewhere, record, shared)


def maxsim_choice(model_dir: str | Path | None, document_ids: Iterable[str] | None = None) -> float | None:
    """The MaxSim weight to serve for the late-interaction model in ``model_dir`` over an engine holding
    ``document_ids`` (:func:`served_maxsim`; 0.0: MaxSim off), None when nothing was chosen for it."""
    served = served_maxsim(model_dir, document_ids)
    return None if served is None else served.weight


def with_maxsim(settings: EngineSettings, served: ServedMaxSim | None) -> EngineSettings:
    """``settings`` serving ``served``'s weight (and depth, where dev chose one for this corpus): a weight of 0.0
    switches the stage off (``maxsim=False``: the token vectors stay, a search may still ask for it); as they are
    when nothing was chosen (None)."""
    if served is None:
        return settings
    weight, depth = served.weight, served.depth
    return replace(settings, maxsim=weight > 0.0, maxsim_blend=weight if weight > 0.0 else settings.maxsim_blend,
                   maxsim_depth=settings.maxsim_depth if depth is None else depth)


def with_maxsim_choice(settings: EngineSettings, late_model: str | Path | None,
                       document_ids: Iterable[str] | None = None) -> EngineSettings:
    """``settings`` with the MaxSim weight to serve for ``late_model`` over an engine holding ``document_ids``
    (:func:`served_maxsim`, :func:`with_maxsim`)."""
    return with_maxsim(settings, served_maxsim(late_model, document_ids))


def _blend(value: Any, path: str, key: str) -> float:
    if value is None or not is_blend(value):
        raise ConfigError(f"{path}: {key} must be a number in [0, 1], got {value!r}; restore the model directory or "
                          "train it again")
    return float(value)


def _calibration(value: Any, path: str) -> tuple[float, float]:
    if not isinstance(value, list) or len(value) != 2 or not all(
            isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) for v in value):
        raise ConfigError(f"{path}: calibration must be two finite numbers [a, b], got {value!r}; restore the model "
                          "directory or train it again")
    return (float(value[0]), float(value[1]))


def blend_of(settings: EngineSettings, reranker: Any, first_stage: str) -> float | None:
    """The blend of the reranker's score with ``first_stage``'s: the numbers in the settings; for an engine
    written before blends were resolved into its manifest (``rerank_blend="auto"``), the reranker's dev choice."""
    if settings.rerank_blend == "auto":
        return dev_choice(getattr(reranker, "path", None)).blend_for(first_stage)
    return settings.blend_for(first_stage)


def second_stage(settings: EngineSettings, name: str | None, reranker: Any = None) -> str:
    """The second stage in words, for the build line and ``info``: none, what the reranker does by default, or that
    it is switched off and why (a blend of 0.0 chosen on dev: the first stage alone ranked at least as well)."""
    from twostage.engine.fusion import reorders

    if name is None:
        return "no reranker"
    if not settings.rerank:
        return f"reranker {name}, off (the engine's rerank setting is false)"
    if settings.rerank_blend == "auto" and reranker is None:  # an engine from before blends were resolved
        return f"reranker {name} (top {settings.rerank_depth}, the blend it chose on dev)"
    alpha = blend_of(settings, reranker, settings.first_stage)
    if not reorders(alpha):
        chose = dev_choice(getattr(reranker, "path", None))
        dev = chose.blend_for(settings.first_stage)
        if chose.home and reorders(dev):  # dev chose a weight, on its own corpus: this engine serves another one
            return (f"reranker {name}, switched off: its weight after {settings.first_stage} is 0.0 in this engine "
                    f"(dev chose {dev:g} over the corpus of {chose.home_documents} documents its training searched; "
                    "over another corpus a reranker is served off, as it showed no gain on another collection's "
                    f"dev), so no pair is scored; --rerank-blend {dev:g} forces it on per search")
        return (f"reranker {name}, switched off: its weight after {settings.first_stage} is 0.0 (chosen on dev: "
                f"{settings.first_stage} alone ranked at least as well), so no pair is scored; --rerank-blend 0.5 "
                "forces it on per search")
    weight = "by its own scores" if alpha is None else f"weight {alpha:g} against {settings.first_stage}"
    return f"reranker {name} (top {settings.rerank_depth}, {weight})"


def resolved_blends(settings: EngineSettings, reranker: Any,
                    document_ids: Iterable[str] | None = None) -> EngineSettings:
    """``settings`` with ``rerank_blend="auto"`` replaced by the numbers training chose on dev for ``reranker``
    (:func:`dev_choice` of the directory it was loaded from; for the engine's first stage, and for each first
    stage), and the calibration fitted with it when the settings have none; as they are with no reranker.

    Over an engine holding ``document_ids`` (read only when the record names the corpus its dev queries searched)
    that is not that corpus (:func:`reranker_elsewhere`), every blend is
    :data:`~twostage.engine.fusion.RERANK_ELSEWHERE` instead: the reranker is off there unless a search asks."""
    if reranker is None:
        return settings
    path = getattr(reranker, "path", None)
    choice = dev_choice(path)
    if settings.rerank_calibration is None and choice.calibration is not None:
        settings = replace(settings, rerank_calibration=choice.calibration)
    if settings.rerank_blend != "auto":
        return settings
    if reranker_elsewhere(path, document_ids) is not None:
        return replace(settings, rerank_blend=RERANK_ELSEWHERE,
                       rerank_blend_by_first_stage=dict.fromkeys(FIRST_STAGES, RERANK_ELSEWHERE))
    return replace(settings, rerank_blend=choice.blend_for(settings.first_stage),
                   rerank_blend_by_first_stage={fs: choice.blend_for(fs) for fs in FIRST_STAGES})


def with_model_languages(settings: EngineSettings, retriever: Any, reranker: Any) -> EngineSettings:
    """``settings`` with the languages the retriever's and the reranker's model cards list (their ModelRefs, None
    when absent; :mod:`twostage.models.model_card`). An engine of the legacy English analysis keeps None."""
    from twostage.models.model_card import model_languages

    if settings.language is None:
        return settings
    return replace(settings, dense_languages=model_languages(retriever.path) if retriever is not None else None,
                   rerank_languages=model_languages(reranker.path) if reranker is not None else None)


def outside(languages: tuple[str, ...] | None, query_languages: list[str] | None) -> list[bool]:
    """For each query, whether a model listing ``languages`` does not cover its language (never when either is
    unknown)."""
    if languages is None or query_languages is None:
        return [False] * (len(query_languages) if query_languages is not None else 0)
    return [code not in languages for code in query_languages]


def settings_for(settings: EngineSettings, knobs: Mapping[str, Any]) -> tuple[EngineSettings, bool]:
    """The engine's settings with one call's knobs (None: the engine's), checked; and whether to rerank. The old
    names (``k_retrieve``, ``depth``, ``interpolation``) still work, with a DeprecationWarning."""
    knobs = renamed(dict(knobs), "search")
    unknown = sorted(set(knobs) - set(KNOBS))
    if unknown:
        raise ConfigError(f"unknown search option(s) {', '.join(unknown)}; known: {', '.join(KNOBS)}")
    given = {name: value for name, value in knobs.items() if value is not None}
    for name in ("rerank_blend", "maxsim_blend"):
        if given.get(name) == "none":  # the stage's score alone (None means "the engine's" in a call)
            given[name] = None
    rerank = given.pop("rerank", settings.rerank)
    if not isinstance(rerank, bool):
        raise ConfigError(f"rerank must be true or false, got {rerank!r}")
    if "first_stage" in given and given["first_stage"] not in ("hybrid", "dense", "bm25"):
        raise ConfigError(f"first_stage must be hybrid, dense or bm25, got {given['first_stage']!r}")
    for name in ("rerank_depth", "first_stage_depth", "maxsim_depth"):
        if name in given:
            given[name] = check_k(given[name])
    return with_changes(settings, given, "search"), rerank
