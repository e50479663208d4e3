"""Training checkpoints without pickle: weights and optimizer state in safetensors, loop state in JSON.

A checkpoint directory holds ``model.safetensors`` (the model's state dict, shared tensors handled),
``optimizer.safetensors`` (AdamW moments per parameter position, the torch RNG state and the state of the modules
trained beside the model, e.g. a loss's own weights) and ``trainer_state.json``. It is written atomically: a crash
while saving leaves the previous checkpoint in place. :func:`twostage.models.fit.fit` writes and resumes them.
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


def _params(optimizer: torch.optim.Optimizer) -> list[torch.Tensor]:
    return [p for g in optimizer.param_groups for p in g["params"]]


def save_checkpoint(path: Path, model: torch.nn.Module, extra: Sequence[torch.nn.Module],
                    optimizer: torch.optim.Optimizer, state: dict[str, Any]) -> None:
    from safetensors.torch import save_file, save_model

    with atomic_directory(path) as tmp:
        save_model(model, str(tmp / "model.safetensors"))
        tensors: dict[str, torch.Tensor] = {"rng.torch": torch.get_rng_state()}
        for i, p in enumerate(_params(optimizer)):
            for key, value in optimizer.state.get(p, {}).items():
                tensors[f"opt.{i}.{key}"] = value.detach().cpu() if torch.is_tensor(value) else torch.tensor(value)
        tensors.update({f"module{i}.{k}": v.detach().cpu()
                        for i, m in enumerate(extra) for k, v in m.state_dict().items()})
        save_file({k: v.contiguous() for k, v in tensors.items()}, str(tmp / "optimizer.safetensors"))
        (tmp / "trainer_state.json").write_text(json.dumps(state, indent=2), encoding="utf-8")


def resume(path: Path, model: torch.nn.Module, extra: Sequence[torch.nn.Module], optimizer: torch.optim.Optimizer,
           scheduler: Any, fresh: dict[str, Any], match: Sequence[str]) -> dict[str, Any]:
    """The loop state to continue from: the checkpoint's at ``path`` when its ``match`` fields equal ``fresh``'s
    (weights, optimizer moments, RNG and schedule restored in place), else ``fresh``."""
    from safetensors.torch import load_file, load_model

    f = path / "trainer_state.json"
    if not f.is_file():
        return fresh
    try:
        state = json.loads(f.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError):
        raise ConfigError(f"{f}: unreadable checkpoint state; delete {path} to start over") from None
    if not isinstance(state, dict) or any(state.get(k) != fresh[k] for k in match):
        logger.warning("%s holds a checkpoint of another configuration; starting over", path)
        return fresh
    load_model(model, str(path / "model.safetensors"))
    tensors = load_file(str(path / "optimizer.safetensors"))
    for i, p in enumerate(_params(optimizer)):
        moments = {k.split(".", 2)[2]: v.to(p.device) for k, v in tensors.items() if k.startswith(f"opt.{i}.")}
        if moments:
            optimizer.state[p] = moments
    for i, m in enumerate(extra):
        m.load_state_dict({k.split(".", 1)[1]: v for k, v in tensors.items() if k.startswith(f"module{i}.")})
    torch.set_rng_state(tensors["rng.torch"])
    with warnings.catch_warnings():  # fast-forwarding the schedule before the next optimizer step is intended
        warnings.filterwarnings("ignore", message=".*lr_scheduler.step.*")
        for _ in range(state["step"]):
            scheduler.step()
    logger.info("resuming from %s at step %d", path, state["step"])
    return state
