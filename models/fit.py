"""The one training loop both models train through (the bi-encoder and the cross-encoder).

A model brings a :class:`Task`: its batches (a function of the seed and the epoch only, so a resumed run
continues exactly where its checkpoint stopped) and the loss of one batch. :func:`fit` does the rest, the same
way for both: seeding (python, numpy, torch), the GPU when there is one, AdamW with bias and norm weights exempt
from weight decay, linear warm-up then linear decay, gradient clipping, bf16 autocast on the model's device,
a checkpoint every ``checkpoint_every`` steps and at each epoch end (:mod:`twostage.models.checkpoint`:
safetensors + JSON, no pickle), resume after a kill, dev evaluation after each epoch with the best epoch kept,
and the final save.

Work directory ``OUT.train/``: ``last/`` (checkpoint), ``best/`` (best epoch on dev), ``log.jsonl`` (one line per
epoch), ``result.json``. The final model is written to ``OUT`` (atomically, by the model's ``save``).
"""

from __future__ import annotations

import json
import logging
import random
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import numpy as np
import torch

from twostage.indexer.atomic import write_json
from twostage.indexer.errors import ConfigError
from twostage.models import checkpoint as checkpoints
from twostage.models.device import bf16_for, release_freed_memory, resolve_device

logger = logging.getLogger(__name__)

NO_DECAY = ("bias", "LayerNorm", "norm")  # parameter names holding these train without weight decay


@dataclass(frozen=True)
class LoopConfig:
    """The loop's own hyper-parameters, the base of every model's training configuration (``TrainConfig``,
    ``RerankerConfig``), which adds its own and may change ``epochs`` and ``lr``."""

    epochs: int = 2
    lr: float = 5e-5
    warmup_ratio: float = 0.1
    weight_decay: float = 0.01
    max_grad_norm: float = 1.0
    seed: int = 42
    bf16: bool | None = None  # autocast, fp32 weights; None: where the device computes bf16 natively (bf16_for)
    device: str = "auto"  # cpu, cuda, cuda:N, or auto (a CUDA GPU when there is one)
    checkpoint_every: int = 50  # steps


class Task(Protocol):
    """What one model brings to :func:`fit`: the model, its batches and its loss."""

    model: Any  # a torch.nn.Module with ``save(path, training=)`` and a ``load(path)`` classmethod

    def identity(self) -> dict[str, Any]:
        """JSON-able facts a checkpoint must share to be resumed (the configuration, the data's size)."""
        ...

    def start(self, device: torch.device) -> Sequence[torch.nn.Module]:
        """Called once the RNGs are seeded and the model is on ``device``; returns modules trained beside the
        model (a loss's own weights), checkpointed with it and not saved with the final model."""
        ...

    def plan(self, epoch: int) -> Sequence[Any]:
        """The batches of one epoch, in order; a function of the seed and ``epoch`` only."""
        ...

    def loss(self, batch: Any) -> torch.Tensor:
        """The scalar loss of one batch (autocast is already on)."""
        ...

    def passes(self, batch: Any) -> Sequence[tuple[Any, float]]:
        """The forward passes of one optimizer step: (part of ``batch``, its weight), the weights summing to 1.
        A loss that is a mean over independent parts (the reranker's groups) is the weighted sum of the parts'
        losses, so splitting bounds the memory a step needs without changing its gradient; ``[(batch, 1.0)]``
        where the loss does not split (in-batch negatives: GradCache bounds those)."""
        ...


@dataclass(frozen=True)
class FitResult:
    """What a training run produced; ``training`` is the record saved with the model (``twostage.json``)."""

    model_dir: Path
    steps: int
    seconds: float
    best_dev: float | None
    history: tuple[dict[str, Any], ...]
    training: dict[str, Any]


def seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)


def linear_schedule(total: int, warmup: int) -> Callable[[int], float]:
    """Learning-rate factor per step: linear warm-up over ``warmup`` steps, then linear decay to 0 at ``total``."""

    def factor(step: int) -> float:
        if step < warmup:
            return (step + 1) / max(1, warmup)
        return max(0.0, (total - step) / max(1, total - warmup))

    return factor


def build_optimizer(model: torch.nn.Module, extra: Sequence[torch.nn.Module], config: LoopConfig) -> torch.optim.AdamW:
    named = list(model.named_parameters())
    decay = [p for n, p in named if not any(x in n for x in NO_DECAY)]
    no_decay = [p for n, p in named if any(x in n for x in NO_DECAY)]
    return torch.optim.AdamW([{"params": decay, "weight_decay": config.weight_decay},
                              {"params": no_decay, "weight_decay": 0.0},
                              {"params": [p for m in extra for p in m.parameters()], "weight_decay": 0.0}],
                             lr=config.lr)


def fit(task: Task, config: LoopConfig, out: str | Path, *, dev: Callable[[Any], float] | None = None,
        resume: bool = True, show_progress: bool = False, info: dict[str, Any] | None = None,
        desc: str = "train") -> FitResult:
    """Train ``task.model`` and write the final model (the best epoch on ``dev`` when given) to ``out``.

    ``dev(model) -> float`` (higher is better) runs after every epoch. With ``resume``, a checkpoint in
    ``OUT.train/last`` whose :meth:`Task.identity` equals this run's is continued.
    """
    from tqdm.auto import tqdm

    if config.epochs <= 0:
        raise ConfigError(f"epochs must be positive, got {config.epochs}")
    out = Path(out)
    target = resolve_device(config.device)  # before anything is written
    work = out.parent / f"{out.name}.train"
    work.mkdir(parents=True, exist_ok=True)
    model = task.model
    seed_everything(config.seed)
    model.to(target)
    device = next(model.parameters()).device
    extra = list(task.start(device))
    optimizer = build_optimizer(model, extra, config)
    plans = [task.plan(e) for e in range(config.epochs)]
    total = sum(len(p) for p in plans)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, linear_schedule(total, int(config.warmup_ratio * total)))
    identity = json.loads(json.dumps(task.identity()))
    fresh = {**identity, "epoch": 0, "batch": 0, "step": 0, "loss_sum": 0.0, "best_dev": None, "history": [],
             "seconds": 0.0}
    last = work / "last"
    state = checkpoints.resume(last, model, extra, optimizer, scheduler, fresh, tuple(identity)) if resume else fresh
    started = time.perf_counter() - state["seconds"]
    autocast = device.type in ("cpu", "cuda") and bf16_for(config.bf16, str(device))
    if config.bf16 is None:
        logger.info("bf16 autocast %s on %s (it computes bf16 %s)", "on" if autocast else "off", device,
                    "in hardware" if autocast else "only by emulation, many times slower than fp32")
    trained = [p for g in optimizer.param_groups for p in g["params"]]

    def checkpoint() -> None:
        state["seconds"] = time.perf_counter() - started
        checkpoints.save_checkpoint(last, model, extra, optimizer, state)

    bar = tqdm(total=total, initial=state["step"], desc=desc, unit="step", disable=not show_progress)
    for epoch in range(state["epoch"], config.epochs):
        model.train()
        for b in range(state["batch"] if epoch == state["epoch"] else 0, len(plans[epoch])):
            value = 0.0
            for part, weight in task.passes(plans[epoch][b]):  # gradients add up over the parts of one step
                with torch.autocast(device.type, dtype=torch.bfloat16, enabled=autocast):
                    loss = task.loss(part) * weight
                loss.backward()
                value += loss.item()
            torch.nn.utils.clip_grad_norm_(trained, config.max_grad_norm)
            optimizer.step()
            scheduler.step()
            optimizer.zero_grad(set_to_none=True)
            state.update(epoch=epoch, batch=b + 1, step=state["step"] + 1, loss_sum=state["loss_sum"] + value)
            bar.update(1)
            bar.set_postfix(loss=f"{value:.4f}")
            if state["step"] % 10 == 0:
                logger.info("step %d/%d loss %.4f", state["step"], total, value)
            if config.checkpoint_every and state["step"] % config.checkpoint_every == 0:
                checkpoint()
        model.eval()
        record: dict[str, Any] = {"epoch": epoch + 1, "step": state["step"], "seconds": time.perf_counter() - started,
                                  "loss": state["loss_sum"] / max(1, len(plans[epoch]))}
        if dev is not None:
            record["dev"] = float(dev(model))
            if state["best_dev"] is None or record["dev"] > state["best_dev"]:
                state["best_dev"] = record["dev"]
                model.save(work / "best", training={"epoch": epoch + 1, "dev": record["dev"]})
        state["history"].append(record)
        logger.info("epoch %d: %s", epoch + 1, record)
        with open(work / "log.jsonl", "a", encoding="utf-8") as fh:
            fh.write(json.dumps(record) + "\n")
        state.update(epoch=epoch + 1, batch=0, loss_sum=0.0)
        checkpoint()
    bar.close()
    seconds = time.perf_counter() - started
    model.eval()
    del optimizer, scheduler
    release_freed_memory()  # the steps' activations and the optimizer's state, before what runs next
    training = {**(info or {}), **identity, "steps": state["step"], "seconds": seconds,
                "best_dev": state["best_dev"], "history": state["history"]}
    final = model
    if dev is not None and (work / "best").is_dir():
        final = type(model).load(work / "best")
        final.name = model.name
    final.save(out, training=training)
    write_json(work / "result.json", training)
    return FitResult(out, state["step"], seconds, state["best_dev"], tuple(state["history"]), training)

