"""Training checkpoints without pickle: weights and optimizer state in safetensors, loop state in JSON.

A checkpoint directory holds ``model.safetensors`` (the module's state dict, shared tensors handled),
``optimizer.safetensors`` (AdamW moments per parameter position, the torch RNG state and any extra tensors
a trainer keeps, e.g. a loss's own weights) and ``trainer_state.json``. It is written atomically: a crash
while saving leaves the previous checkpoint in place. Both trainers (bi-encoder, cross-encoder) use it.
"""

from __future__ import annotations

import json
import logging
import warnings
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch

from twostage.indexer.atomic import atomic_directory
from twostage.indexer.errors import ConfigError

logger = logging.getLogger(__name__)


def save_checkpoint(path: str | Path, module: torch.nn.Module, optimizer: torch.optim.Optimizer,
                    state: dict[str, Any], extra: dict[str, torch.Tensor] | None = None) -> None:
    from safetensors.torch import save_file, save_model

    with atomic_directory(Path(path)) as tmp:
        save_model(module, str(tmp / "model.safetensors"))
        tensors: dict[str, torch.Tensor] = {"rng.torch": torch.get_rng_state()}
        params = [p for g in optimizer.param_groups for p in g["params"]]
        for i, p in enumerate(params):
            for key, value in optimizer.state.get(p, {}).items():
                tensors[f"opt.{i}.{key}"] = value.detach().cpu() if torch.is_tensor(value) else torch.tensor(value)
        tensors.update({f"extra.{k}": v.detach().cpu() for k, v in (extra or {}).items()})
        save_file({k: v.contiguous() for k, v in tensors.items()}, str(tmp / "optimizer.safetensors"))
        (tmp / "trainer_state.json").write_text(json.dumps(state, indent=2), encoding="utf-8")


def saved_state(path: str | Path) -> dict[str, Any] | None:
    """The loop state of the checkpoint at ``path``, or None when there is none."""
    f = Path(path) / "trainer_state.json"
    if not f.is_file():
        return None
    try:
        return json.loads(f.read_text(encoding="utf-8"))
    except json.JSONDecodeError:
        raise ConfigError(f"{f}: unreadable checkpoint state; delete {Path(path)} to start over") from None


def load_checkpoint(path: str | Path, module: torch.nn.Module,
                    optimizer: torch.optim.Optimizer) -> tuple[dict[str, Any], dict[str, torch.Tensor]]:
    """Restore weights, optimizer moments and the RNG in place; returns (loop state, extra tensors)."""
    from safetensors.torch import load_file, load_model

    path = Path(path)
    state = saved_state(path)
    if state is None:
        raise ConfigError(f"{path}: no checkpoint here")
    load_model(module, str(path / "model.safetensors"))
    tensors = load_file(str(path / "optimizer.safetensors"))
    params = [p for g in optimizer.param_groups for p in g["params"]]
    for i, p in enumerate(params):
        st = {k.split(".", 2)[2]: v.to(p.device) for k, v in tensors.items() if k.startswith(f"opt.{i}.")}
        if st:
            optimizer.state[p] = st
    torch.set_rng_state(tensors["rng.torch"])
    return state, {k[len("extra."):]: v for k, v in tensors.items() if k.startswith("extra.")}


def resume_from(path: str | Path, module: torch.nn.Module, optimizer: torch.optim.Optimizer, scheduler: Any,
                fresh: dict[str, Any], match: Sequence[str]) -> tuple[dict[str, Any], dict[str, torch.Tensor]]:
    """Continue from the checkpoint at ``path`` when its ``match`` fields equal ``fresh``'s (weights, optimizer,
    RNG and scheduler restored); otherwise start from ``fresh``. Returns (loop state, extra tensors)."""
    saved = saved_state(path)
    if saved is None:
        return fresh, {}
    if any(saved.get(k) != fresh[k] for k in match):
        logger.warning("%s holds a checkpoint of another configuration; starting over", path)
        return fresh, {}
    state, extra = load_checkpoint(path, module, optimizer)
    with warnings.catch_warnings():  # fast-forwarding the schedule before the next optimizer step is intended
        warnings.filterwarnings("ignore", message=".*lr_scheduler.step.*")
        for _ in range(state["step"]):
            scheduler.step()
    logger.info("resuming from %s at step %d", path, state["step"])
    return state, extra
