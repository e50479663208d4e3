"""A plain, readable training loop for the bi-encoder, resumable from any checkpoint.

AdamW, linear warm-up then linear decay, gradient clipping, fixed seeds, bf16 autocast when asked, the GPU
when there is one. Batches come from one training set at a time (round robin), with no duplicate text in a
batch. The batch order of every epoch depends only on the seed, so a resumed run continues exactly where the
checkpoint stopped. Checkpoints (:mod:`twostage.retriever.checkpoint`) hold the weights and the optimizer state
(safetensors) and the loop state (JSON); no pickle.

Work directory ``OUT.train/``: ``last/`` (checkpoint), ``best/`` (best model on the dev metric), ``log.jsonl``.
The final model is written to ``OUT`` (atomically).
"""

from __future__ import annotations

import json
import logging
import random
import shutil
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from twostage.indexer.atomic import write_json
from twostage.indexer.errors import ConfigError
from twostage.retriever.biencoder import BiEncoder
from twostage.retriever.checkpoint import resume_from, save_checkpoint
from twostage.retriever.gradcache import CachedMultipleNegativesRankingLoss
from twostage.retriever.losses import (
    ContrastiveLoss,
    CosineSimilarityLoss,
    MarginMSELoss,
    MultipleNegativesRankingLoss,
    SoftmaxLoss,
    TripletLoss,
)
from twostage.retriever.training_data import TrainingSet, no_duplicate_batches, round_robin

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class TrainConfig:
    """Hyper-parameters of one training run; saved with the checkpoint and the final model.

    The defaults are the measured SciFact recipe (benchmarks/results/ablation-scifact): what ``twostage
    train-retriever`` with no flags, ``bench --train-split`` and ``train_retriever`` all train with.
    """

    epochs: int = 3
    batch_size: int = 32
    lr: float = 3e-5
    warmup_ratio: float = 0.1
    weight_decay: float = 0.01
    max_grad_norm: float = 1.0
    seed: int = 42
    bf16: bool = True  # autocast; fp32 weights
    scale: float = 20.0
    symmetric: bool = False
    mini_batch_size: int = 0  # > 0: GradCache for the mnrl objective, this many texts per forward pass
    checkpoint_every: int = 50  # steps
    triplet_margin: float = 5.0
    margin_rank_weight: float = 1.0  # margin_mse sets also train MNRL on the same batch, weighted by this

    def __post_init__(self) -> None:
        if self.epochs <= 0 or self.batch_size <= 0 or self.lr <= 0:
            raise ConfigError("epochs, batch_size and lr must be positive")


@dataclass(frozen=True)
class TrainResult:
    model_dir: Path
    steps: int
    seconds: float
    best_dev: float | None
    history: tuple[dict[str, Any], ...]


def _seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)


class _Objectives:
    """The loss of every training set, built once (SoftmaxLoss has weights of its own)."""

    def __init__(self, model: BiEncoder, sets: Sequence[TrainingSet], config: TrainConfig) -> None:
        self.model, self.config = model, config
        self.modules: list[torch.nn.Module] = []
        for s in sets:
            if s.objective == "mnrl":
                loss: torch.nn.Module = (
                    CachedMultipleNegativesRankingLoss(model, config.mini_batch_size, config.scale, config.symmetric)
                    if config.mini_batch_size else MultipleNegativesRankingLoss(config.scale, config.symmetric))
            elif s.objective == "triplet":
                loss = TripletLoss(margin=config.triplet_margin)
            elif s.objective == "margin_mse":
                loss = MarginMSELoss(config.scale)
            elif s.objective == "cosine":
                loss = CosineSimilarityLoss()
            elif s.objective == "contrastive":
                loss = ContrastiveLoss()
            else:
                loss = SoftmaxLoss(model.dim, s.num_labels).to(model.device)
            self.modules.append(loss)

    def extra_parameters(self) -> list[torch.nn.Parameter]:
        return [p for m in self.modules if isinstance(m, SoftmaxLoss) for p in m.parameters()]

    def extra_state(self) -> dict[str, torch.Tensor]:
        return {f"objective{i}.{k}": v for i, m in enumerate(self.modules) if isinstance(m, SoftmaxLoss)
                for k, v in m.state_dict().items()}

    def load_extra_state(self, tensors: dict[str, torch.Tensor]) -> None:
        for i, m in enumerate(self.modules):
            if isinstance(m, SoftmaxLoss):
                m.load_state_dict({k.split(".", 1)[1]: v for k, v in tensors.items() if k.startswith(f"objective{i}.")})

    def loss(self, set_index: int, examples: Sequence[Any]) -> torch.Tensor:
        loss = self.modules[set_index]
        embed = self.model
        if isinstance(loss, CachedMultipleNegativesRankingLoss):
            negs = [list(e.negatives) for e in examples] if examples[0].negatives else None
            return loss([e.anchor for e in examples], [e.positive for e in examples], negs)
        if isinstance(loss, (MultipleNegativesRankingLoss, TripletLoss, MarginMSELoss)):
            a = embed(embed.tokenize([e.anchor for e in examples], "query"))
            p = embed(embed.tokenize([e.positive for e in examples], "document"))
            m = len(examples[0].negatives)
            n = None
            if m:
                flat = [t for e in examples for t in e.negatives]
                n = embed(embed.tokenize(flat, "document")).reshape(len(examples), m, -1)
            if isinstance(loss, TripletLoss):
                return loss(a, p, n[:, 0])  # type: ignore[index]
            if isinstance(loss, MarginMSELoss):
                margins = torch.tensor([e.margins for e in examples], device=a.device)
                distill = loss(a, p, n, margins)
                if not self.config.margin_rank_weight:
                    return distill
                ranking = MultipleNegativesRankingLoss(self.config.scale, self.config.symmetric)(a, p, n)
                return distill + self.config.margin_rank_weight * ranking
            return loss(a, p, n)
        u = embed(embed.tokenize([e.text1 for e in examples], "document"))
        v = embed(embed.tokenize([e.text2 for e in examples], "document"))
        labels = torch.tensor([e.label for e in examples], device=u.device)
        return loss(u, v, labels)


def linear_schedule(total: int, warmup: int) -> Callable[[int], float]:
    """Learning-rate factor per step: linear warm-up over ``warmup`` steps, then linear decay to 0 at ``total``."""

    def factor(step: int) -> float:
        if step < warmup:
            return (step + 1) / max(1, warmup)
        return max(0.0, (total - step) / max(1, total - warmup))

    return factor


def train(
    model: BiEncoder,
    sets: Sequence[TrainingSet],
    config: TrainConfig,
    out: str | Path,
    *,
    dev: Callable[[BiEncoder], float] | None = None,
    resume: bool = True,
    show_progress: bool = False,
    info: dict[str, Any] | None = None,
) -> TrainResult:
    """Train ``model`` on ``sets`` and write the final (or best-on-dev) model to ``out``.

    ``dev(model) -> float`` (higher is better) is called after every epoch; the best model is kept. With
    ``resume`` a checkpoint of the same configuration in ``OUT.train/last`` is continued.
    """
    from tqdm.auto import tqdm

    if not sets:
        raise ConfigError("no training set given")
    out = Path(out)
    work = out.parent / f"{out.name}.train"
    work.mkdir(parents=True, exist_ok=True)
    _seed_everything(config.seed)
    if torch.cuda.is_available() and model.device.type == "cpu":
        model.to("cuda")
    objectives = _Objectives(model, sets, config)
    decay = [p for n, p in model.named_parameters() if not any(x in n for x in ("bias", "LayerNorm", "norm"))]
    no_decay = [p for n, p in model.named_parameters() if any(x in n for x in ("bias", "LayerNorm", "norm"))]
    optimizer = torch.optim.AdamW([{"params": decay, "weight_decay": config.weight_decay},
                                   {"params": no_decay, "weight_decay": 0.0},
                                   {"params": objectives.extra_parameters(), "weight_decay": 0.0}], lr=config.lr)
    epoch_plans = [round_robin([no_duplicate_batches(s.examples, config.batch_size, config.seed + 1000 * e + i)
                                for i, s in enumerate(sets)]) for e in range(config.epochs)]
    total = sum(len(p) for p in epoch_plans)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, linear_schedule(total, int(config.warmup_ratio * total)))
    fresh = {"config": asdict(config), "sets": [s.name for s in sets], "epoch": 0, "batch": 0, "step": 0,
             "best_dev": None, "history": [], "seconds": 0.0}
    last = work / "last"
    state, extra = resume_from(last, model, optimizer, scheduler, fresh, ("config", "sets")) if resume else (fresh, {})
    if extra:
        objectives.load_extra_state(extra)
    started = time.perf_counter() - state["seconds"]
    autocast = config.bf16 and model.device.type in ("cpu", "cuda")
    bar = tqdm(total=total, initial=state["step"], desc="train", unit="step", disable=not show_progress)
    model.train()
    for epoch in range(state["epoch"], config.epochs):
        plan = epoch_plans[epoch]
        for b in range(state["batch"] if epoch == state["epoch"] else 0, len(plan)):
            set_index, batch = plan[b]
            examples = [sets[set_index].examples[i] for i in batch]
            with torch.autocast(model.device.type, dtype=torch.bfloat16, enabled=autocast):
                loss = objectives.loss(set_index, examples)
            loss.backward()
            torch.nn.utils.clip_grad_norm_([p for g in optimizer.param_groups for p in g["params"]], config.max_grad_norm)
            optimizer.step()
            scheduler.step()
            optimizer.zero_grad(set_to_none=True)
            state.update(epoch=epoch, batch=b + 1, step=state["step"] + 1)
            bar.update(1)
            bar.set_postfix(loss=f"{loss.item():.4f}", set=sets[set_index].name)
            if state["step"] % 10 == 0:
                logger.info("step %d/%d loss %.4f (%s)", state["step"], total, loss.item(), sets[set_index].name)
            if config.checkpoint_every and state["step"] % config.checkpoint_every == 0:
                state["seconds"] = time.perf_counter() - started
                save_checkpoint(last, model, optimizer, state, objectives.extra_state())
        record: dict[str, Any] = {"epoch": epoch + 1, "step": state["step"], "seconds": time.perf_counter() - started}
        if dev is not None:
            score = float(dev(model))
            model.train()
            record["dev"] = score
            if state["best_dev"] is None or score > state["best_dev"]:
                state["best_dev"] = score
                model.save(work / "best", training={"epoch": epoch + 1, "dev": score})
        state["history"].append(record)
        logger.info("epoch %d: %s", epoch + 1, record)
        with open(work / "log.jsonl", "a", encoding="utf-8") as fh:
            fh.write(json.dumps(record) + "\n")
        state.update(epoch=epoch + 1, batch=0, seconds=time.perf_counter() - started)
        save_checkpoint(last, model, optimizer, state, objectives.extra_state())
    bar.close()
    seconds = time.perf_counter() - started
    model.eval()
    training = {**(info or {}), "config": asdict(config), "sets": {s.name: len(s.examples) for s in sets},
                "steps": state["step"], "seconds": seconds, "best_dev": state["best_dev"], "history": state["history"]}
    if dev is not None and (work / "best").is_dir():
        best = BiEncoder.load(work / "best")
        best.name = model.name
        best.save(out, training=training)
    else:
        model.save(out, training=training)
    write_json(work / "result.json", training)
    return TrainResult(out, state["step"], seconds, state["best_dev"], tuple(state["history"]))


def clean_work_dir(out: str | Path) -> None:
    """Remove ``OUT.train/`` (checkpoints) once a run is done and no longer needed."""
    shutil.rmtree(Path(out).parent / f"{Path(out).name}.train", ignore_errors=True)
