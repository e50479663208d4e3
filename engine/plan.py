"""A search's plan: the engine's settings, one call's options, ``k`` and ``offset`` resolved once, before any stage
runs, into how deep each stage reads and where the page is cut.

The arithmetic, in one place: a query ranks a fixed ``window`` of hits (the first stage's depth, or the rerank
depth when larger and reranking), so consecutive pages read the same list and never overlap or skip; a first page
asking for more than the window ranks deeper (``end``). Each first stage lists ``depth`` candidates (at least the
window, and the rerank depth when reranking); the reranked lists are cut at ``cut`` (``end``, or the whole
``depth`` when diversity or grouping reorder it afterwards).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from twostage.engine.knobs import settings_for
from twostage.engine.settings import EngineSettings
from twostage.engine.steer import Steering, split_steering
from twostage.indexer.errors import ConfigError
from twostage.indexer.records import check_k


@dataclass(frozen=True)
class EngineParts:
    """What an engine holds that a plan depends on: a retriever (dense vectors), a reranker it names in its manifest,
    a reranker it can use (named, or given to a view), token vectors (a late-interaction part)."""

    retriever: bool
    names_reranker: bool
    has_reranker: bool
    late: bool


@dataclass(frozen=True)
class SearchPlan:
    """One search call, resolved: the settings with the call's options, the steering options, whether a reranker
    reads the candidates, and the depths (see the module's docstring)."""

    settings: EngineSettings
    steer: Steering
    rerank: bool
    k: int
    offset: int
    window: int
    end: int
    depth: int
    cut: int
    maxsim: bool  # MaxSim reorders the first stage: the settings ask for it, the engine holds token vectors


def make_plan(settings: EngineSettings, knobs: Mapping[str, Any], k: int, offset: int,
              parts: EngineParts) -> SearchPlan:
    """The plan of a search with ``knobs`` (:data:`~twostage.engine.knobs.KNOBS` and the steering options) over an
    engine holding ``parts``.

    Raises:
        ConfigError: an option out of range or unknown, or one asking for a part the engine does not hold (a
            reranker, token vectors, a retriever), or an offset past the window.
    """
    steer, knobs = split_steering(knobs)
    s, rerank = settings_for(settings, knobs)
    k = check_k(k)
    if isinstance(offset, bool) or not isinstance(offset, int) or offset < 0:
        raise ConfigError(f"offset must be an integer >= 0, got {offset!r}")
    if knobs.get("rerank") is True and not parts.names_reranker:
        raise ConfigError("rerank: this engine has no reranker, so there is nothing to rerank with; search "
                          "without rerank, or build the engine with --reranker")
    if knobs.get("maxsim") is True and not parts.late:
        raise ConfigError("maxsim: this engine holds no token vectors, so there is no MaxSim stage; search without "
                          "maxsim, or build the engine with --late-interaction MODEL")
    reranks = rerank and parts.has_reranker
    if s.min_relevance and not reranks and parts.names_reranker:
        raise ConfigError("min_relevance needs the reranker's score, and this search turns the reranker off "
                          "(rerank false); search with the reranker, or without min_relevance")
    if s.first_stage != "bm25" and not parts.retriever:
        raise ConfigError(f"first_stage {s.first_stage} needs a retriever, and this engine was built without one "
                          "(BM25 only): search with first_stage bm25, or rebuild the engine with --retriever")
    window = max(s.first_stage_depth, s.rerank_depth) if reranks else s.first_stage_depth
    if offset >= window:
        raise ConfigError(f"offset {offset} is past the {window} hits one query ranks (the engine's "
                          "first_stage_depth); raise first_stage_depth (a knob), or narrow the query with a filter")
    end = min(offset + k, window) if offset else k
    depth = max(window, max(end, s.rerank_depth) if reranks else end)
    cut = max(depth, end) if steer.reorders else end
    maxsim = bool(s.maxsim) and parts.late and not steer.similar
    return SearchPlan(s, steer, reranks, k, offset, window, end, depth, cut, maxsim)
