"""An engine's settings: how it searches, saved in its manifest, each overridable per call; grouped by concern
(:data:`INDEX_SHAPE`, :data:`SEARCH_POLICY`, :data:`MODEL_FACTS`, :data:`RUNTIME`), with every renamed name read through
one table (:data:`RENAMES`)."""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from twostage.indexer.errors import ConfigError
from twostage.indexer.passages import PassageShape
from twostage.models.device import PRECISIONS

FIRST_STAGES = ("hybrid", "dense", "bm25")
FUSIONS = ("rrf", "wsum")
# Renamed values, once: (setting, old value, new value). The weighted-sum fusion was called "blend", the word that
# also names the reranker's and MaxSim's weights (rerank_blend, maxsim_blend).
RENAMED_VALUES: tuple[tuple[str, str, str], ...] = (("fusion", "blend", "wsum"),)
# what a --fusion flag or an HTTP field accepts: the fusions and their old names
FUSION_NAMES = (*FUSIONS, *(was for name, was, _ in RENAMED_VALUES if name == "fusion"))


# the ANN backends' parameters a user may set, all integers (a backend ignores those it does not use), and those that
# may be 0 or negative
ANN_PARAMS = ("M", "ef_construction", "ef_search", "nlist", "nprobe", "pq_m", "pq_bits", "rescore", "seed",
              "build_threads", "search_threads")
SIGNED_ANN_PARAMS = ("seed", "rescore", "build_threads")


def check_ann_params(params: Any, where: str = "ann_params") -> dict[str, int]:
    """``params`` as the backends read them, or one line naming the bad one: known names, integer values."""
    if not isinstance(params, dict):
        raise ConfigError(f"{where} must map ANN parameter names to integers, got {type(params).__name__}")
    for key, value in params.items():
        if key not in ANN_PARAMS:
            raise ConfigError(f"{where}: unknown ANN parameter {key!r}; known: {', '.join(ANN_PARAMS)}")
        if isinstance(value, bool) or not isinstance(value, int):
            raise ConfigError(f"{where}: {key} must be an integer, got {value!r}")
        if value <= 0 and key not in SIGNED_ANN_PARAMS:
            raise ConfigError(f"{where}: {key} must be a positive integer, got {value}")
    return dict(params)


@dataclass(frozen=True)
class EngineSettings:
    """How an engine searches; saved in its manifest, each overridable per call.

    The defaults are the measured best of the one-command SciFact run (benchmarks/results/scifact-e2e and
    rerank-scifact): hybrid first stage (RRF of BM25 and dense top 100), the reranker reads the top 20 and is
    blended with the first stage by the weight chosen on dev data when it was trained.

    The same names are used by the Python API, the CLI flags (``--first-stage-depth``, ``--rerank-depth``,
    ``--rerank-blend``), the HTTP fields and the manifest. ``rerank_blend="auto"`` is resolved when the engine is
    built with a reranker (or configured, or swapped to one): the blend the reranker chose on dev for each first
    stage is written into the manifest as numbers (``rerank_blend`` for the engine's first stage,
    ``rerank_blend_by_first_stage`` for each), so the search path never reads policy from a model.
    """

    # ---- index shape: fixed when the engine is built (a change needs a rebuild)
    backend: str = "hnswlib"
    metric: str = "cosine"
    # the ANN backend's parameters at build (M, ef_construction, ef_search, nlist, nprobe...; ANN_PARAMS), each
    # one left out sized from the corpus (indexer.vectors.default_params); kept in the dense part for later changes
    ann_params: dict[str, int] = field(default_factory=dict)
    passage_words: int = 100  # documents are searched as passages of this many words (0: whole documents)
    passage_stride: int = 50  # a new passage every this many words (passages overlap by words - stride)
    passage_title: bool = True  # the title in front of every passage (False: the first passage only)
    passage_whole_up_to: int = 0  # a document of at most this many words stays one passage (0: passage_words)
    # the lexical analysis of a new engine's texts: "auto" (each text's language detected among the corpus's), a
    # language code, or None: the English analysis of engines built before languages (their manifests lack it)
    language: str | None = "auto"
    # ---- search policy: how a search ranks, each one a per-call knob too
    first_stage: str = "hybrid"
    # "wsum" (a weighted sum of min-max normalised scores, dense_weight for dense; "blend" before) or "rrf"
    # (reciprocal rank); wsum 0.5 was chosen on dev splits across collections
    # (benchmarks/experiments/defaults_across.py and fusion_trained.py, at commit 31faba8)
    fusion: str = "wsum"
    k_rrf: float = 60.0
    dense_weight: float = 0.5  # wsum only: dense's weight, BM25's is 1 - dense_weight
    first_stage_depth: int = 100  # candidates each first stage gives the fusion
    rerank_depth: int = 20  # candidates the reranker reads
    rerank: bool = True  # rerank when the engine has a reranker (False: the first stage's order)
    # the weight of the reranker's score against the first stage's (reranker.interpolation): a number in [0, 1];
    # None: the reranker alone; "auto": the reranker's dev-chosen blend, resolved into numbers when the engine is built
    rerank_blend: float | str | None = "auto"
    min_relevance: float = 0.0  # drop hits whose probability of relevance is below this (0: keep every hit)
    rerank_whole_up_to: int = 300  # the reranker reads a document of at most this many words whole, a longer one by
    # its best passage in each first stage, the higher score counting (0: every document so); a search-time choice
    # (benchmarks/results/rerank_reads, rerank_long)
    # late interaction (an engine built with a late-interaction model: token vectors in late/): MaxSim reads the
    # first stage's top maxsim_depth (the passages each document was found by) and blends its score with the first
    # stage's by maxsim_blend (None: MaxSim alone); the reranker then reads the top rerank_depth of that order.
    # Depth 50, blend 0.7: chosen on SciFact train (benchmarks/results/late-scifact.md)
    maxsim: bool = True
    maxsim_depth: int = 50
    maxsim_blend: float | None = 0.7
    # ---- what the models are: written at build from the models (their dev-chosen blends, calibration, languages)
    rerank_blend_by_first_stage: dict[str, float | None] = field(default_factory=dict)  # per first stage, resolved
    # Platt's (a, b): the reranker's score as a probability of relevance (engine.calibration), fitted on dev pairs
    rerank_calibration: tuple[float, float] | None = None
    # the languages the retriever's and the reranker's model cards list (None: not said, read as every language),
    # written at build: a query in another language is searched by BM25 alone and not reranked
    dense_languages: tuple[str, ...] | None = None
    rerank_languages: tuple[str, ...] | None = None
    # ---- runtime: how the models run
    precision: str = "auto"  # "auto": per model, see resolve_precision
    batch_size: int = 32

    def blend_for(self, first_stage: str) -> float | None:
        """The resolved blend with ``first_stage`` (its own when the manifest has one, else ``rerank_blend``); call
        only when ``rerank_blend`` is not "auto" (an engine built before blends were resolved: the reranker's)."""
        by_stage = self.rerank_blend_by_first_stage
        alpha = by_stage.get(first_stage, self.rerank_blend)
        return None if alpha is None else float(alpha)  # type: ignore[arg-type]  # not "auto": checked by callers

    @property
    def fusion_label(self) -> str:
        """The first stage's fusion in words, for reports: "RRF k 60" or "the blend, dense weight 0.5"."""
        return f"RRF k {self.k_rrf:g}" if self.fusion == "rrf" else f"the blend, dense weight {self.dense_weight}"

    @property
    def passages(self) -> PassageShape:
        return PassageShape(self.passage_words, self.passage_stride, self.passage_title, self.passage_whole_up_to,
                            cjk_characters=self.language is not None)

    def __post_init__(self) -> None:
        for name, value in old_values(self.__dict__, "EngineSettings").items():
            object.__setattr__(self, name, value)
        if self.first_stage not in FIRST_STAGES:
            raise ConfigError(f"first_stage must be one of {', '.join(FIRST_STAGES)}, got {self.first_stage!r}")
        if self.fusion not in FUSIONS:
            raise ConfigError(f"fusion must be one of {', '.join(FUSIONS)}, got {self.fusion!r}")
        for name in ("first_stage_depth", "rerank_depth", "batch_size", "maxsim_depth"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
                raise ConfigError(f"{name} must be a positive integer, got {value!r}")
        if (isinstance(self.dense_weight, bool) or not isinstance(self.dense_weight, (int, float))
                or not 0 <= self.dense_weight <= 1):
            raise ConfigError(f"dense_weight must be a number in [0, 1], got {self.dense_weight!r}")
        if not isinstance(self.k_rrf, (int, float)) or self.k_rrf < 0:
            raise ConfigError(f"k_rrf must be a number >= 0, got {self.k_rrf!r}")
        if self.rerank_blend != "auto" and not is_blend(self.rerank_blend):
            raise ConfigError(f"rerank_blend must be 'auto', None or a number in [0, 1], got {self.rerank_blend!r}")
        by_stage = self.rerank_blend_by_first_stage
        if not isinstance(by_stage, dict) or any(k not in FIRST_STAGES or not is_blend(v) for k, v in by_stage.items()):
            raise ConfigError("rerank_blend_by_first_stage must map first stages (hybrid, dense, bm25) to None or a "
                              f"number in [0, 1], got {by_stage!r}")
        cal = self.rerank_calibration
        if cal is not None and (not isinstance(cal, tuple) or len(cal) != 2 or not all(
                isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) for v in cal)):
            raise ConfigError(f"rerank_calibration must be None or two finite numbers (a, b), got {cal!r}")
        if not is_blend(self.min_relevance) or self.min_relevance is None:
            raise ConfigError(f"min_relevance must be a number in [0, 1], got {self.min_relevance!r}")
        for name in ("rerank", "maxsim"):
            if not isinstance(getattr(self, name), bool):
                raise ConfigError(f"{name} must be true or false, got {getattr(self, name)!r}")
        if not is_blend(self.maxsim_blend):
            raise ConfigError(f"maxsim_blend must be None or a number in [0, 1], got {self.maxsim_blend!r}")
        check_ann_params(self.ann_params)
        if self.precision not in PRECISIONS:
            raise ConfigError(f"precision must be one of {', '.join(PRECISIONS)}, got {self.precision!r}")
        if isinstance(self.rerank_whole_up_to, bool) or not isinstance(self.rerank_whole_up_to, int) \
                or self.rerank_whole_up_to < 0:
            raise ConfigError(f"rerank_whole_up_to must be an integer >= 0, got {self.rerank_whole_up_to!r}")
        if self.language is not None and (not isinstance(self.language, str) or not self.language):
            raise ConfigError(f"language must be 'auto' or a language code, got {self.language!r}")
        for name in ("dense_languages", "rerank_languages"):
            value = getattr(self, name)
            if value is not None and (not isinstance(value, tuple) or not value
                                      or not all(isinstance(c, str) and 0 < len(c) <= 16 for c in value)):
                raise ConfigError(f"{name} must be None or a non-empty list of language codes, got {value!r}")
        if not isinstance(self.passage_title, bool):
            raise ConfigError(f"passage_title must be true or false, got {self.passage_title!r}")
        self.passages  # noqa: B018 - checks passage_words and passage_stride


# The settings by concern (every field in one group; a test checks it): what a rebuild changes, what a search
# chooses, what the models wrote at build, how the models run.
INDEX_SHAPE = ("backend", "metric", "ann_params", "passage_words", "passage_stride", "passage_title",
               "passage_whole_up_to", "language")
SEARCH_POLICY = ("first_stage", "fusion", "k_rrf", "dense_weight", "first_stage_depth", "rerank_depth", "rerank",
                 "rerank_blend", "min_relevance", "rerank_whole_up_to", "maxsim", "maxsim_depth", "maxsim_blend")
MODEL_FACTS = ("rerank_blend_by_first_stage", "rerank_calibration", "dense_languages", "rerank_languages")
RUNTIME = ("precision", "batch_size")


def is_blend(value: Any) -> bool:
    """None, or a number in [0, 1] (not a bool)."""
    return value is None or (isinstance(value, (int, float)) and not isinstance(value, bool) and 0 <= value <= 1)


# Every renamed name, once: old name, new name, and where the old one was read. "settings": the engine's settings,
# manifests of format 1, search knobs, HTTP fields and the build / search flags; "rerank": rerank_run and
# `twostage rerank` (whose depth was the reranker's); "bench": `twostage bench`; "train": the training settings
# and `twostage train-reranker`. Manifests, knobs, HTTP fields and CLI flags (app.cli_engine.add_renamed_flags) are
# all mapped from here; an old name still works, with a notice, until the next release.
RENAMES: tuple[tuple[str, str, tuple[str, ...]], ...] = (
    ("depth", "first_stage_depth", ("settings",)),
    ("k_retrieve", "rerank_depth", ("settings",)),
    ("interpolation", "rerank_blend", ("settings", "rerank")),
    ("depth", "rerank_depth", ("rerank",)),
    ("rerank_interpolation", "rerank_blend", ("bench",)),
    ("dev_depth", "rerank_depth", ("train",)),
)


def renames(place: str = "settings") -> dict[str, str]:
    """Old name -> new name of :data:`RENAMES` where ``place`` read it."""
    return {old: new for old, new, places in RENAMES if place in places}


RENAMED = renames("settings")


def old_values(given: Mapping[str, Any], where: str | None = None) -> dict[str, Any]:
    """The settings of ``given`` that hold an old value of :data:`RENAMED_VALUES`, with their new values; a
    DeprecationWarning per old value, unless ``where`` is None (a manifest on disk: mapped silently)."""
    import warnings

    out = {}
    for name, old, new in RENAMED_VALUES:
        if given.get(name) == old:
            if where is not None:
                warnings.warn(f"{where}: {name} {old!r} is now called {new!r}; the old name goes in the next release",
                              DeprecationWarning, stacklevel=4)
            out[name] = new
    return out


def renamed(given: dict[str, Any], where: str, place: str = "settings") -> dict[str, Any]:
    """``given`` with the old names of ``place`` (:data:`RENAMES`) replaced by the new ones, a DeprecationWarning per
    old name (``where`` names the caller, e.g. ``search``); both an old name and its new one is an error."""
    import warnings

    out = dict(given)
    for old, new in renames(place).items():
        if old in out:
            if new in out:
                raise ConfigError(f"{where}: give {new} only ({old} is its old name)")
            warnings.warn(f"{where}: {old} is now called {new}; the old name goes in the next release",
                          DeprecationWarning, stacklevel=3)
            out[new] = out.pop(old)
    return out


def with_changes(settings: EngineSettings, changes: dict[str, Any], where: str = "settings") -> EngineSettings:
    """``settings`` with ``changes`` (old names mapped; None values ignored, except ``rerank_blend=None``, the
    reranker alone, and ``rerank_calibration=None``, none). A new ``rerank_blend`` applies to every first stage
    unless ``rerank_blend_by_first_stage`` is given too."""
    nullable = ("rerank_blend", "rerank_calibration", "maxsim_blend")
    changes = {k: v for k, v in renamed(changes, where).items() if v is not None or k in nullable}
    unknown = sorted(set(changes) - set(EngineSettings.__dataclass_fields__))
    if unknown:
        raise ConfigError(f"unknown engine setting(s) {', '.join(unknown)}; known: "
                          f"{', '.join(EngineSettings.__dataclass_fields__)}")
    if "rerank_blend" in changes and "rerank_blend_by_first_stage" not in changes:
        changes["rerank_blend_by_first_stage"] = {}
    return replace(settings, **changes) if changes else settings


def check_replicas(replicas: object) -> int:
    """``replicas`` (copies of each shard a sharded engine serves) when it is a whole number >= 1, else one
    ConfigError saying so."""
    if isinstance(replicas, bool) or not isinstance(replicas, int) or replicas < 1:
        raise ConfigError(f"--replicas must be an integer >= 1, got {replicas!r}")
    return replicas
