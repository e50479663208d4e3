"""``twostage.train`` and ``twostage.adapt``: the engine's training workflows choosing on dev by the harness's metric.

The workflows themselves live in the engine layer (:mod:`twostage.engine.train_models`, :mod:`twostage.engine.adapt`)
and take the dev metric as an argument, since the engine sits below the metrics; these two entries give them
nDCG@10 (:func:`twostage.eval.metrics.ndcg10_by_query`) unless another is given.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from twostage.engine.adapt import AdaptRecipe, AdaptResult
from twostage.engine.adapt import adapt as adapt_corpus
from twostage.engine.train_models import TrainSettings
from twostage.engine.train_models import train as train_model
from twostage.eval.metrics import ndcg10_by_query

if TYPE_CHECKING:
    from twostage.engine.settings import EngineSettings
    from twostage.indexer.beir import BeirDataset
    from twostage.indexer.corpus import Corpus, CorpusSource
    from twostage.models.fit import FitResult
    from twostage.reranker.training import RerankerConfig
    from twostage.retriever.recipe import DevMetric, RetrieverRecipe

__all__ = ["adapt", "train"]


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
