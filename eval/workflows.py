"""``twostage.train`` and ``twostage.adapt``: the engine's training workflows choosing on dev by the harness's metric.

The workflows themselves live in the engine layer (:mod:`twostage.engine.train_models`, :mod:`twostage.engine.adapt`)
and take the dev metric as an argument, since the engine sits below the metrics; these two entries give them
nDCG@10 (:func:`twostage.eval.metrics.ndcg10_by_query`) unless another is given.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from twostage.engine.adapt import AdaptRecipe, AdaptResult
from twostage.engine.adapt import adapt as adapt_corpus
from twostage.engine.fusion import ELSEWHERE_MAX
from twostage.engine.train_models import TrainSettings
from twostage.engine.train_models import train as train_model
from twostage.eval.metrics import ndcg10_by_query
from twostage.indexer.errors import ConfigError

if TYPE_CHECKING:
    from twostage.engine.settings import EngineSettings
    from twostage.eval.systems import SystemOptions
    from twostage.indexer.beir import BeirDataset
    from twostage.indexer.corpus import Corpus, CorpusSource
    from twostage.models.fit import FitResult
    from twostage.reranker.training import RerankerConfig
    from twostage.retriever.recipe import DevMetric, RetrieverRecipe

__all__ = ["StageChoice", "adapt", "choose_maxsim", "train"]


def train(recipe: RetrieverRecipe | RerankerConfig, data: str | Path | BeirDataset, split: str, out: str | Path, *,
          base: str = TrainSettings.base, dev_fraction: float | None = None, dev_metric: DevMetric = ndcg10_by_query,
          retriever: str | Path | None = None, teacher: str | Path | None = None,
          settings: EngineSettings | None = None, show_progress: bool = False) -> FitResult:
    """Train one model from ``base`` on a BEIR split into ``out`` (:func:`twostage.engine.train_models.train`): a
    bi-encoder for a :class:`RetrieverRecipe`, a cross-encoder reranker for a :class:`RerankerConfig`, its epoch
    (and blend) chosen on the held-out queries by ``dev_metric`` (nDCG@10 of each query); a retriever distils
    ``teacher``'s margins when given (a trained cross-encoder).

    >>> train(RetrieverRecipe(), "datasets/scifact", "train", "models/retriever")
    >>> train(RerankerConfig(), "datasets/scifact", "train", "models/reranker", retriever="models/retriever")

    Raises:
        ConfigError: a recipe of another type, ``retriever`` given with a RetrieverRecipe, two dev fractions that
            disagree, a base model or split that is not there.
    """
    return train_model(recipe, data, split, out, base=base, dev_fraction=dev_fraction, dev_metric=dev_metric,
                       retriever=retriever, teacher=teacher, settings=settings, show_progress=show_progress)


def adapt(corpus: CorpusSource | Corpus, out: str | Path, *, base: str = "all-MiniLM-L6-v2",
          recipe: AdaptRecipe = AdaptRecipe(), dev_metric: DevMetric = ndcg10_by_query, show_progress: bool = False,
          device: str = "auto", keep_checkpoints: bool = False) -> AdaptResult:
    """Both models adapted to ``corpus`` without labels (:func:`twostage.engine.adapt.adapt`), chosen on held-out
    pseudo-queries by ``dev_metric`` (nDCG@10 of each query).

    Raises:
        ConfigError: a corpus that cannot be read or is too small to make pseudo-queries from, a device that is not
            there.
    """
    return adapt_corpus(corpus, out, base=base, recipe=recipe, dev_metric=dev_metric, show_progress=show_progress,
                        device=device, keep_checkpoints=keep_checkpoints)


@dataclass(frozen=True)
class StageChoice:
    """What dev chose for a stage the one command serves: its weight against the first stage (0.0: off), the dev
    metric at every weight tried and the number of dev queries; ``line`` says it in words. ``elsewhere``: MaxSim's
    weight for a corpus the dev queries did not search (:func:`twostage.engine.fusion.maxsim_elsewhere`);
    ``served_here``: what a run over another corpus serves instead, in words (None: the dev corpus's choice).
    ``depth``: the first-stage candidates MaxSim reads, chosen on dev with the weight (``dev_by_weight`` is measured
    at it), and ``dev_by_depth`` the best of dev at each depth tried."""

    stage: str
    weight: float
    dev_by_weight: tuple[tuple[float, float], ...]
    dev_queries: int
    rule: str = "one_se"  # a name in twostage.engine.fusion.BLEND_RULES: how ``weight`` was chosen
    elsewhere: float | None = None
    served_here: str | None = None  # the words of engine.knobs.ServedMaxSim.line, when this corpus is not dev's
    depth: int | None = None  # the first-stage candidates the stage reads, where dev chose it (None: the engine's)
    dev_by_depth: tuple[tuple[int, float, float], ...] = ()  # (depth, dev metric, weight) at each depth tried

    @property
    def served(self) -> bool:
        return self.weight != 0.0

    @property
    def line(self) -> str:
        curve = dict(self.dev_by_weight)
        base, best = curve.get(0.0, float("nan")), max(curve.values())
        if not self.served:
            said = (f"{self.stage}: off. On the {self.dev_queries} dev queries the first stage alone scored "
                    f"{base:.3f} and no weight of {self.stage} was more than one standard error above it (best "
                    f"{best:.3f}), so the engine does not serve it")
        else:
            depth = "" if self.depth is None else f" over its top {self.depth}"
            said = (f"{self.stage}: served at weight {self.weight:g} against the first stage{depth}, chosen on the "
                    f"{self.dev_queries} dev queries ({curve[self.weight]:.3f} against the first stage alone "
                    f"{base:.3f}; {RULE_WORDS.get(self.rule, self.rule)})")
        if self.served and len(self.dev_by_depth) > 1:
            said += ("; dev by depth, each at its own weight: "
                     + ", ".join(f"top {d} {m:.3f} (weight {w:g})" for d, m, w in self.dev_by_depth)
                     + " (the engine's depth unless another scores higher)")
        if self.elsewhere is not None and self.elsewhere != self.weight:
            said += (f"; on another corpus {self.elsewhere:g} ({RULE_WORDS['one_se']}, at most {ELSEWHERE_MAX:g}, "
                     "as the dev queries do not search it)")
        return said if self.served_here is None else f"{said}. Here: {self.served_here}"


RULE_WORDS = {"one_se": "the smallest weight within one standard error of the best",
              "gated_best": "the best weight whose gain over the first stage alone is more than one standard error"}


def choose_maxsim(dataset: BeirDataset, train_split: str, dev_fraction: float, seed: int, options: SystemOptions, *,
                  dev_metric: DevMetric = ndcg10_by_query) -> StageChoice:
    """MaxSim's weight and depth for the +maxsim systems chosen on the train split's held-out queries (the ones
    every model of the one command held out: ``dev_fraction`` and ``seed``), searched through the engine those
    systems are views of (:func:`twostage.engine.training.maxsim_curve` at each of
    :data:`~twostage.engine.training.MAXSIM_DEPTHS`; :func:`twostage.engine.fusion.maxsim_rule` for the weight,
    :func:`~twostage.engine.fusion.maxsim_depth_rule` for the depth): 0.0, MaxSim off, unless dev shows a gain;
    with the weight for other corpora (:func:`twostage.engine.fusion.maxsim_elsewhere` of the curve at the engine's
    depth, which other corpora are served at; never above the weight)."""
    from twostage.engine.fusion import MAXSIM_RULE, maxsim_depth_rule, maxsim_elsewhere, maxsim_rule
    from twostage.engine.training import MAXSIM_DEPTHS, maxsim_curve
    from twostage.eval.systems import engine_for
    from twostage.retriever.training_data import hold_out

    split = dataset.split(train_split)
    dev = hold_out(list(split.queries), dev_fraction, seed)[1]
    qrels = split.qrels.subset(q.id for q in dev)
    dev = [q for q in dev if qrels.relevant(q.id)]
    engine = engine_for(dataset.corpus, options, need_late=True)
    curves = [(depth, maxsim_curve(engine.with_settings(maxsim_depth=depth), dev, qrels, dev_metric,
                                   show_progress=options.show_progress)) for depth in MAXSIM_DEPTHS]
    depth = maxsim_depth_rule(curves)
    weights = {d: maxsim_rule(c) for d, c in curves}
    by_depth = tuple((d, float(np.mean(dict(c)[weights[d]])), weights[d]) for d, c in curves)
    # another corpus is served at the engine's depth (engine.knobs.ServedMaxSim.depth): its weight from that curve
    elsewhere = min(maxsim_elsewhere(curves[0][1]), weights[depth])
    return StageChoice("MaxSim", weights[depth], tuple((a, float(np.mean(v))) for a, v in dict(curves)[depth]),
                       len(dev), MAXSIM_RULE, elsewhere, depth=depth, dev_by_depth=by_depth)


def record_maxsim_choice(model_dir: str | Path, choice: StageChoice, home: Corpus, first_stage: str = "hybrid") -> None:
    """Keep what dev chose for the late-interaction model in ``model_dir`` in its training record
    (:data:`twostage.engine.knobs.MAXSIM_CHOICE`), with a sketch of the ``home`` corpus the dev queries searched
    (:mod:`twostage.indexer.corpus_sketch`), so that an engine built with it later (``twostage build
    --late-interaction``, ``bench --late-model``) serves the same weight over that corpus (0.0: MaxSim off) and the
    ``elsewhere`` weight over another."""
    from twostage.engine.knobs import MAXSIM_CHOICE
    from twostage.indexer.corpus_sketch import home_record
    from twostage.models.model_meta import record_training

    depth = {} if choice.depth is None else {"depth": choice.depth,
                                              "dev_by_depth": [list(p) for p in choice.dev_by_depth]}
    record_training(Path(model_dir), MAXSIM_CHOICE, {
        "weight": choice.weight, "first_stage": first_stage, "dev_queries": choice.dev_queries, "rule": choice.rule,
        "dev_by_weight": [list(p) for p in choice.dev_by_weight], **depth,
        "elsewhere": choice.weight if choice.elsewhere is None else choice.elsewhere,
        "home": home_record(home.ids)})


def record_reranker_home(model_dir: str | Path, home: Corpus) -> None:
    """Name ``home``, the corpus the held-out queries of the reranker in ``model_dir`` searched when its blends were
    chosen, in its training record, as its training now does (:func:`twostage.engine.training.choose_blend`): for a
    reranker trained before the record kept it, so that an engine over another corpus serves it off
    (:func:`twostage.engine.knobs.resolved_blends`). Its blends must have been chosen on dev."""
    from twostage.engine.knobs import RERANK_HOME, dev_choice
    from twostage.indexer.corpus_sketch import home_record
    from twostage.models.model_meta import record_training

    if not dev_choice(model_dir).by_first_stage:
        raise ConfigError(f"{model_dir}: no blend chosen on dev is recorded with this reranker; nothing holds for a "
                          "corpus (train it with --dev-fraction)")
    record_training(Path(model_dir), RERANK_HOME, home_record(home.ids))


def recorded_maxsim_choice(model_dir: str | Path | None, corpus: Corpus | None = None) -> StageChoice | None:
    """What the one command chose on dev for the late-interaction model in ``model_dir`` (:func:`record_maxsim_choice`),
    as a :class:`StageChoice`, saying what a run over ``corpus`` serves where that is not the dev corpus; None when
    nothing was recorded."""
    from twostage.engine.knobs import served_maxsim

    served = served_maxsim(model_dir, None if corpus is None else corpus.ids)
    if served is None:
        return None
    record = served.record
    return StageChoice("MaxSim", record.weight, record.dev_by_weight or ((record.weight, float("nan")),),
                       record.dev_queries, record.rule, record.elsewhere, None if served.home else served.line,
                       depth=served.depth, dev_by_depth=record.dev_by_depth if served.home else ())


def reranker_choice(model_dir: str | Path, first_stage: str = "hybrid",
                    corpus: Corpus | None = None) -> StageChoice | None:
    """What the reranker's training chose on dev after ``first_stage`` (its training record beside the weights), as
    a :class:`StageChoice`, saying that a run over ``corpus`` serves it off where that is not the corpus its dev
    queries searched (:func:`twostage.engine.knobs.reranker_elsewhere`); None for a model trained without dev
    queries."""
    from twostage.engine.fusion import RERANK_ELSEWHERE
    from twostage.engine.knobs import dev_choice, reranker_elsewhere
    from twostage.models.model_meta import read_model_meta

    meta = read_model_meta(Path(model_dir))
    training = meta[2] if meta is not None else {}
    chosen = training.get("interpolation")
    if not isinstance(chosen, dict):
        return None
    shared = reranker_elsewhere(model_dir, None if corpus is None else corpus.ids)
    here = None if shared is None else (
        f"weight {RERANK_ELSEWHERE:g} (off): this corpus shares {shared:.0%} of the "
        f"{dev_choice(model_dir).home_documents} documents the dev queries searched, and a reranker is off over "
        "another corpus")
    for stage, weight, curve in chosen.get("by_first_stage") or []:
        if stage == first_stage:
            return StageChoice("the reranker", float(weight), tuple((float(a), float(m)) for a, m in curve),
                               len(training.get("dev_queries") or []), served_here=here)
    return None
