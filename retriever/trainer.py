"""Training the bi-encoder: its batches and objectives, run by the shared loop (:func:`twostage.models.fit.fit`).

Batches come from one training set at a time (round robin), with no duplicate text in a batch; the order of
every epoch depends only on the seed. Each set trains with its objective (:mod:`twostage.retriever.objectives`).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch

from twostage.indexer.errors import ConfigError
from twostage.models.fit import FitResult, LoopConfig, fit
from twostage.retriever.biencoder import BiEncoder
from twostage.retriever.objectives import OBJECTIVES
from twostage.retriever.training_data import TrainingSet, no_duplicate_batches, round_robin


@dataclass(frozen=True)
class TrainConfig(LoopConfig):
    """Hyper-parameters of one training run; saved with the checkpoint and the final model.

    The defaults are the measured SciFact recipe (benchmarks/results/ablation-scifact): what ``twostage
    train-retriever`` with no flags, ``bench --train-split`` and ``train_retriever_on`` all train with.
    """

    epochs: int = 3
    batch_size: int = 32
    lr: float = 3e-5
    scale: float = 20.0
    symmetric: bool = False
    mini_batch_size: int = 0  # > 0: GradCache (mnrl and the MaxSim objectives), this many texts per forward pass
    triplet_margin: float = 5.0
    margin_rank_weight: float = 1.0  # margin_mse sets also train MNRL on the same batch, weighted by this
    maxsim_temperature: float = 1.0  # the MaxSim objectives' softmax over scores / T (1: ColBERT's and PyLate's)

    def __post_init__(self) -> None:
        if self.epochs <= 0 or self.batch_size <= 0 or self.lr <= 0:
            raise ConfigError("epochs, batch_size and lr must be positive")
        if not self.maxsim_temperature > 0:
            raise ConfigError(f"maxsim_temperature must be positive, got {self.maxsim_temperature}")


class RetrieverTask:
    """The bi-encoder's part of a training run: round-robin batches over ``sets``, each set's objective."""

    def __init__(self, model: BiEncoder, sets: Sequence[TrainingSet], config: TrainConfig) -> None:
        if not sets:
            raise ConfigError("no training set given")
        self.model, self.sets, self.config = model, list(sets), config
        self.losses: list[torch.nn.Module] = []

    def identity(self) -> dict[str, Any]:
        return {"config": asdict(self.config), "sets": {s.name: len(s.examples) for s in self.sets}}

    def start(self, device: torch.device) -> list[torch.nn.Module]:
        self.losses = [OBJECTIVES[s.objective].build(self.model, s.num_labels, self.config).to(device)
                       for s in self.sets]
        return [m for m in self.losses if _owns_weights(m, self.model)]

    def plan(self, epoch: int) -> list[tuple[int, list[int]]]:
        seed = self.config.seed + 1000 * epoch
        return round_robin([no_duplicate_batches(s.examples, self.config.batch_size, seed + i)
                            for i, s in enumerate(self.sets)])

    def passes(self, batch: tuple[int, list[int]]) -> list[tuple[tuple[int, list[int]], float]]:
        return [(batch, 1.0)]  # in-batch negatives do not split: mini_batch_size (GradCache) bounds the memory

    def loss(self, batch: tuple[int, list[int]]) -> torch.Tensor:
        index, rows = batch
        s = self.sets[index]
        return OBJECTIVES[s.objective].compute(self.losses[index], self.model, [s.examples[i] for i in rows],
                                               self.config)


def _owns_weights(module: torch.nn.Module, model: torch.nn.Module) -> bool:
    """Whether ``module`` has parameters of its own (not the model's, as GradCache's loss holds the model)."""
    shared = {id(p) for p in model.parameters()}
    return any(id(p) not in shared for p in module.parameters())


def train(model: BiEncoder, sets: Sequence[TrainingSet], config: TrainConfig, out: str | Path, *,
          dev: Callable[[BiEncoder], float] | None = None, resume: bool = True, show_progress: bool = False,
          info: dict[str, Any] | None = None) -> FitResult:
    """Train ``model`` on ``sets`` and write the final (or best-on-dev) model to ``out``.

    ``dev(model) -> float`` (higher is better) is called after every epoch; the best model is kept. With
    ``resume`` a checkpoint of the same configuration in ``OUT.train/last`` is continued.
    """
    return fit(RetrieverTask(model, sets, config), config, out, dev=dev, resume=resume, show_progress=show_progress,
               info=info)
