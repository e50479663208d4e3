"""A search's settings: the engine's, with one call's options (``KNOBS``: the :class:`EngineSettings` names a call
may change; the old names still read, with a DeprecationWarning), and the reranker's blend they resolve to."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace
from typing import Any

from twostage.engine.fusion import blend_for
from twostage.indexer.engine_dir import FIRST_STAGES, EngineSettings, renamed, with_changes
from twostage.indexer.errors import ConfigError
from twostage.indexer.topk import check_k

KNOBS = ("first_stage", "rerank_depth", "rerank", "rerank_blend", "fusion", "dense_weight", "k_rrf",
         "first_stage_depth", "min_relevance")


def blend_of(settings: EngineSettings, reranker: Any, first_stage: str) -> float | None:
    """The blend of the reranker's score with ``first_stage``'s: the numbers in the settings; for an engine
    written before blends were resolved into its manifest (``rerank_blend="auto"``), the reranker's dev choice."""
    if settings.rerank_blend == "auto":
        return blend_for(reranker, first_stage)
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
        return (f"reranker {name}, switched off: its weight after {settings.first_stage} is 0.0 (chosen on dev: "
                f"{settings.first_stage} alone ranked at least as well), so no pair is scored; --rerank-blend 0.5 "
                "forces it on per search")
    weight = "by its own scores" if alpha is None else f"weight {alpha:g} against {settings.first_stage}"
    return f"reranker {name} (top {settings.rerank_depth}, {weight})"


def resolved_blends(settings: EngineSettings, reranker: Any) -> EngineSettings:
    """``settings`` with ``rerank_blend="auto"`` replaced by the numbers ``reranker`` chose on dev (for the
    engine's first stage, and for each first stage), and the calibration fitted with it when the settings have none;
    as they are with no reranker."""
    if reranker is None:
        return settings
    if settings.rerank_calibration is None and getattr(reranker, "calibration", None) is not None:
        settings = replace(settings, rerank_calibration=tuple(reranker.calibration))
    if settings.rerank_blend != "auto":
        return settings
    return replace(settings, rerank_blend=blend_for(reranker, settings.first_stage),
                   rerank_blend_by_first_stage={fs: blend_for(reranker, fs) for fs in FIRST_STAGES})


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
    if given.get("rerank_blend") == "none":  # the reranker alone (None means "the engine's" in a call)
        given["rerank_blend"] = None
    rerank = given.pop("rerank", settings.rerank)
    if not isinstance(rerank, bool):
        raise ConfigError(f"rerank must be true or false, got {rerank!r}")
    if "first_stage" in given and given["first_stage"] not in ("hybrid", "dense", "bm25"):
        raise ConfigError(f"first_stage must be hybrid, dense or bm25, got {given['first_stage']!r}")
    for name in ("rerank_depth", "first_stage_depth"):
        if name in given:
            given[name] = check_k(given[name])
    return with_changes(settings, given, "search"), rerank
