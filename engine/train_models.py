"""Training: :func:`train`, the one entry for any model (its recipe says which), and :func:`train_models`, the
models ``twostage bench --train-split`` needs: the bi-encoder first, then the reranker (whose dense negatives come
from that bi-encoder) and, for the MaxSim systems, a late-interaction model (from that bi-encoder), all on the
train split only.

All hold out the same train queries as dev (same fraction, same seed): they pick each model's epoch and the
reranker's blend with the first stage. The evaluation split is never read here.
Settings are dataclasses saved as JSON with the report, so a run can be repeated (``--train-settings FILE``
reads the same shape back; any field left out keeps its default).
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from twostage.engine.settings import EngineSettings, renamed
from twostage.engine.training import train_reranker_on, train_retriever_on
from twostage.indexer.atomic import from_json_dict, to_json_dict
from twostage.indexer.errors import ConfigError
from twostage.reranker.training import RerankerConfig
from twostage.retriever.late import LateConfig
from twostage.retriever.mining import MiningConfig
from twostage.retriever.recipe import DevMetric, RetrieverRecipe
from twostage.retriever.trainer import TrainConfig
from twostage.retriever.training_data import PairScorer

if TYPE_CHECKING:
    from twostage.indexer.beir import BeirDataset
    from twostage.models.fit import FitResult

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
    # the +maxsim systems' model: MaxSim trained in the retriever's loop, 8 epochs (the best on dev kept) with its
    # softmax over MaxSim scores / 0.5, documents cut where the engine's token vectors cut them, on 3 hard negatives a
    # query drawn from the trained bi-encoder's top 30 (the candidates MaxSim reorders are the first stage's top ones).
    # SciFact's held-out train queries by epoch: 0.774, 0.806, 0.812, 0.822, 0.820, 0.829, 0.833, 0.835, against
    # 0.760, 0.789, 0.801, 0.799, 0.806, 0.806 at T 1 in 6 epochs and 0.828 at T 0.25 in 6 (seven recipes tried;
    # benchmarks/results/one_command_scifact.md, #83)
    late: RetrieverRecipe = field(default_factory=lambda: RetrieverRecipe(
        train=TrainConfig(epochs=8, maxsim_temperature=0.5), max_length=LateConfig.document_length, late=True,
        negatives=3, mine_from="dense", mining=MiningConfig(depth=30)))
    # the MaxSim model distils the trained reranker's margins (Margin-MSE over MaxSim, plus in-batch MaxSim) when the
    # one command trains both; off: on SciFact's held-out train queries a tie with plain MaxSim training (0.7825 vs
    # 0.7817 at the epoch kept), on test 0.758 vs 0.764 (benchmarks/results/one_command_scifact.md, #83)
    distill_late: bool = False
    # the training budget of each model: at most this many (query, positive) pairs of the train split
    # (retriever.training_data.within_budget: fewer positives a query unless max_positives names them, then a seeded
    # sample of the queries; what was kept is in each model's training record). About SciFact's train split (919
    # pairs, which it leaves whole), whose one command fits this machine; NFCorpus's 110,575 come down to one positive
    # for each of 1,000 queries. 0: all.
    max_pairs: int = 1000

    def aligned(self) -> TrainSettings:
        """The same dev queries for every model (one fraction, one seed) and one training budget."""
        retriever, late = (replace(r, dev_fraction=self.dev_fraction, train=replace(r.train, seed=self.seed),
                                   max_pairs=r.max_pairs or self.max_pairs) for r in (self.retriever, self.late))
        return replace(self, retriever=retriever, late=replace(late, late=True),
                       reranker=replace(self.reranker, seed=self.seed,
                                        max_pairs=self.reranker.max_pairs or self.max_pairs))


def load_settings(path: str | Path) -> TrainSettings:
    try:
        data = json.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError) as exc:
        raise ConfigError(f"{path}: cannot read the training settings ({exc})") from None
    if isinstance(data, dict):  # config.json files record the names of their day
        data = renamed(data, str(path), "train")
    return from_json_dict(TrainSettings, data, str(path))


def train(recipe: RetrieverRecipe | RerankerConfig, data: str | Path | BeirDataset, split: str, out: str | Path, *,
          base: str = TrainSettings.base, dev_fraction: float | None = None,
          dev_metric: DevMetric, retriever: str | Path | None = None, teacher: str | Path | None = None,
          settings: EngineSettings | None = None, show_progress: bool = False) -> FitResult:
    """Train one model from ``base`` on a BEIR split into ``out``: a bi-encoder for a :class:`RetrieverRecipe`, a
    cross-encoder reranker for a :class:`RerankerConfig`.

    ``dev_fraction`` of the split's queries are held out (0: none; None: a RetrieverRecipe's own ``dev_fraction``
    when it sets one, else 0.1); they choose the epoch (and the reranker's blend with each first stage) by
    ``dev_metric`` (per-query values of a run, higher is better: ``twostage.train`` gives nDCG@10,
    :func:`twostage.eval.metrics.ndcg10_by_query`) of an engine with ``settings`` (the engine defaults) searching
    them, so what is chosen is what such an engine serves. ``retriever`` (a reranker's only): the bi-encoder that
    mines its dense negatives and is its dev engine's retriever (the base model when None). ``teacher`` (a
    RetrieverRecipe's only): a trained cross-encoder whose score margins over each query's positive and mined
    negatives the model learns (Margin-MSE over cosines, or over MaxSim scores for a late-interaction model), its
    scores kept beside ``out`` as they are computed. What dev chose is in the result's ``training`` record.

    >>> train(RetrieverRecipe(), "datasets/scifact", "train", "models/retriever", dev_metric=ndcg10_by_query)
    """
    if isinstance(recipe, RetrieverRecipe):
        if retriever is not None:
            raise ConfigError("retriever= names the bi-encoder a reranker mines with; a RetrieverRecipe trains the "
                              "bi-encoder itself (to mine its negatives with a trained one: mine_with)")
        if dev_fraction is not None and recipe.dev_fraction and recipe.dev_fraction != dev_fraction:
            raise ConfigError(f"dev_fraction {dev_fraction} and the recipe's dev_fraction {recipe.dev_fraction} "
                              "disagree; give it once")
        held = dev_fraction if dev_fraction is not None else recipe.dev_fraction or TrainSettings.dev_fraction
        return train_retriever_on(data, split, base, out, replace(recipe, dev_fraction=held),
                                  dev_metric=dev_metric, settings=settings, show_progress=show_progress,
                                  teacher=None if teacher is None else teacher_of(teacher, recipe, show_progress),
                                  teacher_name=str(teacher or ""))
    if teacher is not None:
        raise ConfigError("teacher= is a cross-encoder a retriever learns from; a RerankerConfig trains the "
                          "cross-encoder itself")
    if isinstance(recipe, RerankerConfig):
        return train_reranker_on(data, split, base, out, recipe,
                                 dev_fraction=TrainSettings.dev_fraction if dev_fraction is None else dev_fraction,
                                 rerank_depth=(settings or EngineSettings()).rerank_depth, dev_metric=dev_metric,
                                 retriever=retriever, settings=settings, show_progress=show_progress)
    raise ConfigError(f"train() takes a RetrieverRecipe or a RerankerConfig, got {type(recipe).__name__}")


def teacher_of(path: str | Path, recipe: RetrieverRecipe, show_progress: bool) -> PairScorer:
    """The cross-encoder at ``path`` as a teacher: its raw logits of (query, document) pairs."""
    from twostage.models.device import cpu_precision
    from twostage.reranker.cross_encoder import CrossEncoder

    model = CrossEncoder.load(path, precision=cpu_precision(recipe.train.bf16))

    def scores(pairs: Sequence[tuple[str, str]]) -> Any:
        return model.predict(list(pairs), activation=None, show_progress=show_progress)

    return scores


@dataclass(frozen=True)
class TrainedModels:
    retriever: str | None
    reranker: str | None
    late: str | None
    seconds: dict[str, float]
    settings: dict[str, Any]


def train_models(data: str | Path, train_split: str, eval_split: str, models_dir: str | Path,
                 settings: TrainSettings = TrainSettings(), *, dev_metric: DevMetric, retriever: str | None = None,
                 need_retriever: bool = True, need_reranker: bool = True, need_late: bool = False,
                 show_progress: bool = False) -> TrainedModels:
    """Train what is needed into ``models_dir`` (``retriever/``, ``reranker/``, ``late/``), each chosen on dev by
    ``dev_metric``; a given ``retriever`` is used as is (for the reranker's dense negatives)."""
    if train_split == eval_split:
        raise ConfigError(f"--train-split {train_split} is the evaluated split: models must never see the test "
                          "queries; train on another split (e.g. train)")
    settings = settings.aligned()
    models_dir = Path(models_dir)
    seconds: dict[str, float] = {}

    def fit(name: str, recipe: RetrieverRecipe | RerankerConfig, base: str, **kw: Any) -> str:
        """One model into ``models_dir/name``, its wall time as the phase ``train_<name>``."""
        t = time.perf_counter()
        out = models_dir / name
        train(recipe, data, train_split, out, base=base, dev_fraction=settings.dev_fraction, dev_metric=dev_metric,
              show_progress=show_progress, **kw)
        seconds[f"train_{name}_s"] = time.perf_counter() - t
        return str(out)

    if need_retriever and retriever is None:
        retriever = fit("retriever", settings.retriever, settings.base)
    reranker = late = None
    if need_reranker:
        reranker = fit("reranker", settings.reranker, settings.base, retriever=retriever,
                       settings=replace(EngineSettings(), rerank_depth=settings.rerank_depth))
    if need_late:
        # from the bi-encoder when there is one: on SciFact's held-out train queries 0.782 against 0.754 from the base
        # model (test: 0.770 against 0.764 over the same hybrid, benchmarks/results/late-scifact-from-retriever.md)
        late = fit("late", settings.late, retriever or settings.base,
                   **({"teacher": reranker} if settings.distill_late and reranker else {}))
    return TrainedModels(retriever, reranker, late, seconds, to_json_dict(settings))
