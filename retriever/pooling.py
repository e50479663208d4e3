"""Pooling token embeddings into one vector per text (mean, CLS or max), as Sentence-BERT does."""

from __future__ import annotations

from typing import Any

import torch

from twostage.indexer.errors import ConfigError

POOLING_MODES = ("mean", "cls", "max")


def check_pooling(mode: str) -> str:
    if mode not in POOLING_MODES:
        raise ConfigError(f"unknown pooling {mode!r}; use one of {', '.join(POOLING_MODES)}")
    return mode


def pool(token_embeddings: torch.Tensor, attention_mask: torch.Tensor, mode: str) -> torch.Tensor:
    """(batch, tokens, dim) and (batch, tokens) -> (batch, dim); padding never counts."""
    if mode == "cls":
        return token_embeddings[:, 0]
    mask = attention_mask.unsqueeze(-1).to(token_embeddings.dtype)
    if mode == "max":
        return token_embeddings.masked_fill(mask == 0, torch.finfo(token_embeddings.dtype).min).max(dim=1).values
    summed = (token_embeddings * mask).sum(dim=1)
    return summed / mask.sum(dim=1).clamp(min=1e-9)


def st_pooling_config(mode: str, dim: int) -> dict[str, Any]:
    """The classic sentence-transformers ``1_Pooling/config.json`` (read by every version)."""
    return {
        "word_embedding_dimension": dim,
        "pooling_mode_cls_token": mode == "cls",
        "pooling_mode_mean_tokens": mode == "mean",
        "pooling_mode_max_tokens": mode == "max",
        "pooling_mode_mean_sqrt_len_tokens": False,
        "pooling_mode_weightedmean_tokens": False,
        "pooling_mode_lasttoken": False,
        "include_prompt": True,
    }


def mode_from_st_config(cfg: dict[str, Any], where: str) -> str:
    """Pooling mode of a sentence-transformers pooling config, classic or 5.x+ (``pooling_mode``)."""
    if isinstance(cfg.get("pooling_mode"), str):
        mode = cfg["pooling_mode"]
    else:
        flags = {"cls": "pooling_mode_cls_token", "mean": "pooling_mode_mean_tokens", "max": "pooling_mode_max_tokens"}
        on = [m for m, key in flags.items() if cfg.get(key)]
        others = [k for k, v in cfg.items() if k.startswith("pooling_mode") and v and k not in flags.values()]
        if len(on) != 1 or others:
            raise ConfigError(f"{where}: pooling {on + others} is not supported; twostage pools with mean, cls or max")
        mode = on[0]
    mode = {"mean_tokens": "mean", "cls_token": "cls", "max_tokens": "max"}.get(mode, mode)
    return check_pooling(mode)
