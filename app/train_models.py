"""Training both models for ``twostage bench --train-split``: the bi-encoder first, then the reranker (whose
dense negatives come from that bi-encoder), both on the train split only.

Both hold out the same train queries as dev (same fraction, same seed): they pick the bi-encoder's epoch, the
reranker's epoch and the reranker's blend with the first stage. The evaluation split is never read here.
Settings are dataclasses saved as JSON with the report, so a run can be repeated (``--train-settings FILE``
reads the same shape back; any field left out keeps its default).
"""

from __future__ import annotations

import json
import logging
import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from twostage.engine.training import train_reranker_on, train_retriever_on
from twostage.indexer.codec import from_json_dict, to_json_dict
from twostage.indexer.engine_dir import EngineSettings, renamed
from twostage.indexer.errors import ConfigError
from twostage.reranker.training import RerankerConfig
from twostage.retriever.recipe import RetrieverRecipe

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class TrainSettings:
    """What ``bench --train-split`` trains: the recipes' own defaults (measured on SciFact, benchmarks/results), one
    dev fraction and seed for both. ``twostage train-retriever`` / ``train-reranker`` take their flags' defaults
    from ``TrainSettings().aligned()``, so all three train the same thing."""

    base: str = "all-MiniLM-L6-v2"
    dev_fraction: float = 0.1
    seed: int = 42
    rerank_depth: int = EngineSettings().rerank_depth  # the reranker is chosen and blended at the depth the engine reads
    retriever: RetrieverRecipe = field(default_factory=RetrieverRecipe)
    reranker: RerankerConfig = field(default_factory=RerankerConfig)

    def aligned(self) -> TrainSettings:
        """The same dev queries for both models: one fraction, one seed."""
        retriever = replace(self.retriever, dev_fraction=self.dev_fraction,
                            train=replace(self.retriever.train, seed=self.seed))
        return replace(self, retriever=retriever, reranker=replace(self.reranker, seed=self.seed))


def load_settings(path: str | Path) -> TrainSettings:
    try:
        data = json.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError) as exc:
        raise ConfigError(f"{path}: cannot read the training settings ({exc})") from None
    if isinstance(data, dict):  # config.json files record the names of their day
        data = renamed(data, str(path), "train")
    return from_json_dict(TrainSettings, data, str(path))


@dataclass(frozen=True)
class TrainedModels:
    retriever: str | None
    reranker: str | None
    seconds: dict[str, float]
    settings: dict[str, Any]


def train_models(data: str | Path, train_split: str, eval_split: str, models_dir: str | Path,
                 settings: TrainSettings = TrainSettings(), *, retriever: str | None = None,
                 need_retriever: bool = True, need_reranker: bool = True,
                 show_progress: bool = False) -> TrainedModels:
    """Train what is needed into ``models_dir`` (``retriever/``, ``reranker/``); a given ``retriever`` is used
    as is (for the reranker's dense negatives)."""
    from twostage.eval.metrics import ndcg10_by_query

    if train_split == eval_split:
        raise ConfigError(f"--train-split {train_split} is the evaluated split: models must never see the test "
                          "queries; train on another split (e.g. train)")
    settings = settings.aligned()
    models_dir = Path(models_dir)
    seconds: dict[str, float] = {}

    if need_retriever and retriever is None:
        t = time.perf_counter()
        out = models_dir / "retriever"
        train_retriever_on(data, train_split, settings.base, out, settings.retriever, dev_metric=ndcg10_by_query,
                        show_progress=show_progress)
        retriever = str(out)
        seconds["train_retriever_s"] = time.perf_counter() - t
    reranker = None
    if need_reranker:
        t = time.perf_counter()
        out = models_dir / "reranker"
        config = settings.reranker
        train_reranker_on(data, train_split, settings.base, out, config, dev_fraction=settings.dev_fraction,
                          rerank_depth=settings.rerank_depth, dev_metric=ndcg10_by_query, retriever=retriever,
                          show_progress=show_progress)
        reranker = str(out)
        seconds["train_reranker_s"] = time.perf_counter() - t
    return TrainedModels(retriever, reranker, seconds, to_json_dict(settings))
