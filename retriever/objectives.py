"""The bi-encoder's training objectives in one table: adding one is one entry here (and its loss module).

Each :class:`Objective` names the example record it reads, builds its loss module (:mod:`twostage.retriever.losses`)
and turns a batch of examples into that module's input with the model. The losses themselves take embeddings.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import torch

from twostage.retriever.examples import PairExample, ScoredPair
from twostage.retriever.gradcache import CachedMaxSimLoss, CachedMultipleNegativesRankingLoss
from twostage.retriever.losses import (
    ContrastiveLoss,
    CosineSimilarityLoss,
    MarginMSELoss,
    MaxSimLoss,
    MaxSimMarginMSELoss,
    MultipleNegativesRankingLoss,
    SoftmaxLoss,
    TripletLoss,
)


class LossParams(Protocol):
    """The loss settings of a run (``TrainConfig`` has them)."""

    @property
    def scale(self) -> float: ...
    @property
    def symmetric(self) -> bool: ...
    @property
    def mini_batch_size(self) -> int: ...
    @property
    def triplet_margin(self) -> float: ...
    @property
    def margin_rank_weight(self) -> float: ...
    @property
    def maxsim_temperature(self) -> float: ...


Build = Callable[[Any, int, LossParams], torch.nn.Module]  # (model, num_labels, params) -> loss module
Compute = Callable[[torch.nn.Module, Any, Sequence[Any], LossParams], torch.Tensor]  # (loss, model, batch, params)


@dataclass(frozen=True)
class Objective:
    example: type  # the record every example of the set must be
    build: Build
    compute: Compute
    check: Callable[[Sequence[Any]], str | None] = lambda examples: None  # the first problem with a set, if any


def _embed(model: Any, texts: Sequence[str], kind: str) -> torch.Tensor:
    return model(model.tokenize(list(texts), kind))


def _triples(model: Any, batch: Sequence[PairExample]) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """Anchors (B, d), positives (B, d) and hard negatives (B, m, d) or None."""
    a = _embed(model, [e.anchor for e in batch], "query")
    p = _embed(model, [e.positive for e in batch], "document")
    m = len(batch[0].negatives)
    n = _embed(model, [t for e in batch for t in e.negatives], "document").reshape(len(batch), m, -1) if m else None
    return a, p, n


def _pairs(loss: torch.nn.Module, model: Any, batch: Sequence[ScoredPair], params: LossParams) -> torch.Tensor:
    u = _embed(model, [e.text1 for e in batch], "document")
    v = _embed(model, [e.text2 for e in batch], "document")
    return loss(u, v, torch.tensor([e.label for e in batch], device=u.device))


def _mnrl(loss: torch.nn.Module, model: Any, batch: Sequence[PairExample], params: LossParams) -> torch.Tensor:
    if isinstance(loss, CachedMultipleNegativesRankingLoss):  # GradCache embeds the texts itself
        negatives = [list(e.negatives) for e in batch] if batch[0].negatives else None
        return loss([e.anchor for e in batch], [e.positive for e in batch], negatives)
    return loss(*_triples(model, batch))


def _triplet(loss: torch.nn.Module, model: Any, batch: Sequence[PairExample], params: LossParams) -> torch.Tensor:
    a, p, n = _triples(model, batch)
    return loss(a, p, n[:, 0])  # type: ignore[index]


def _margin_mse(loss: torch.nn.Module, model: Any, batch: Sequence[PairExample], params: LossParams) -> torch.Tensor:
    """MarginMSE distillation, plus MNRL on the same embeddings weighted by ``margin_rank_weight``."""
    a, p, n = _triples(model, batch)
    distill = loss(a, p, n, torch.tensor([e.margins for e in batch], device=a.device))
    if not params.margin_rank_weight:
        return distill
    return distill + params.margin_rank_weight * MultipleNegativesRankingLoss(params.scale, params.symmetric)(a, p, n)


def _first(examples: Sequence[Any], bad: Callable[[Any], bool], problem: str) -> str | None:
    i = next((i for i, e in enumerate(examples) if bad(e)), None)
    return None if i is None else f"example #{i} {problem}"


def _maxsim_inputs(loss: torch.nn.Module, model: Any, batch: Sequence[PairExample],
                   extra: Sequence[torch.Tensor]) -> torch.Tensor:
    queries = [e.anchor for e in batch]
    documents = [e.positive for e in batch] + [t for e in batch for t in e.negatives]
    if isinstance(loss, CachedMaxSimLoss):  # GradCache embeds the texts itself
        return loss(queries, documents, *extra)
    q, q_keep = model.train_tokens(queries, "query")
    d, d_keep = model.train_tokens(documents, "document")
    return loss(q, q_keep, d, d_keep, *extra)


def _maxsim(loss: torch.nn.Module, model: Any, batch: Sequence[PairExample], params: LossParams) -> torch.Tensor:
    return _maxsim_inputs(loss, model, batch, ())


def _maxsim_margin_mse(loss: torch.nn.Module, model: Any, batch: Sequence[PairExample],
                       params: LossParams) -> torch.Tensor:
    return _maxsim_inputs(loss, model, batch, (torch.tensor([e.margins for e in batch], device=model.device),))


def _late(inner: Callable[[LossParams], MaxSimLoss | MaxSimMarginMSELoss]) -> Build:
    """A late-interaction loss, through GradCache (:class:`CachedMaxSimLoss`) when the run sets ``mini_batch_size``."""
    return lambda model, labels, c: CachedMaxSimLoss(model, inner(c), c.mini_batch_size) if c.mini_batch_size \
        else inner(c)


def _margins_check(name: str) -> Callable[[Sequence[Any]], str | None]:
    return lambda ex: _first(ex, lambda e: not e.negatives or len(e.margins) != len(e.negatives),
                             f"needs one teacher margin per negative (and at least one negative) for the {name} "
                             "objective")


OBJECTIVES: dict[str, Objective] = {
    "mnrl": Objective(
        PairExample,
        lambda model, labels, c: CachedMultipleNegativesRankingLoss(model, c.mini_batch_size, c.scale, c.symmetric)
        if c.mini_batch_size else MultipleNegativesRankingLoss(c.scale, c.symmetric),
        _mnrl),
    "triplet": Objective(
        PairExample, lambda model, labels, c: TripletLoss(margin=c.triplet_margin), _triplet,
        lambda ex: _first(ex, lambda e: not e.negatives,
                          "has no negative: the triplet objective needs a negative in every example")),
    "margin_mse": Objective(
        PairExample, lambda model, labels, c: MarginMSELoss(c.scale), _margin_mse, _margins_check("margin_mse")),
    "cosine": Objective(ScoredPair, lambda model, labels, c: CosineSimilarityLoss(), _pairs),
    "contrastive": Objective(ScoredPair, lambda model, labels, c: ContrastiveLoss(), _pairs),
    "softmax": Objective(ScoredPair, lambda model, labels, c: SoftmaxLoss(model.dim, labels), _pairs),
    # a late-interaction model (retriever.late.LateEncoder): in-batch and hard negatives scored by MaxSim
    "maxsim": Objective(PairExample, _late(lambda c: MaxSimLoss(c.maxsim_temperature)), _maxsim),
    # the same, distilling a teacher's margins (losses.MaxSimMarginMSELoss; in-batch MaxSim by margin_rank_weight)
    "maxsim_margin_mse": Objective(
        PairExample, _late(lambda c: MaxSimMarginMSELoss(c.margin_rank_weight, c.maxsim_temperature)),
        _maxsim_margin_mse,
        _margins_check("maxsim_margin_mse")),
}
