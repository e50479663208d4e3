"""Helpers shared by the bi-encoder and the cross-encoder for Hugging Face models."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import torch

from twostage.indexer.errors import ConfigError
from twostage.retriever.weights import ModelNotFoundError

logger = logging.getLogger(__name__)
PRECISIONS = ("fp32", "bf16", "int8", "openvino-fp32", "openvino-int8")


def cap_max_length(model: Any, max_length: int) -> int:
    """``max_length``, lowered to the model's position embeddings when it has fewer (longer inputs crash)."""
    positions = getattr(model.config, "max_position_embeddings", None)
    if positions and max_length > positions:
        logger.info("max_length %d capped at the model's %d positions", max_length, positions)
        return int(positions)
    return max_length


@contextmanager
def unreadable_weights(path: Any) -> Iterator[None]:
    """A truncated or damaged ``model.safetensors`` (or a config that does not fit it) becomes one clear error."""
    try:
        yield
    except (OSError, ValueError, RuntimeError, EnvironmentError) as exc:
        if isinstance(exc, ConfigError | ModelNotFoundError):
            raise
        first = str(exc).strip().splitlines()[0][:200] if str(exc).strip() else type(exc).__name__
        raise ModelNotFoundError(f"{path}: the model weights cannot be read ({first}); the files are damaged or "
                                 "incomplete: restore or re-download the model") from None
    except Exception as exc:  # safetensors raises its own error type for a broken header
        if type(exc).__name__ != "SafetensorError":
            raise
        raise ModelNotFoundError(f"{path}: model.safetensors is damaged ({str(exc)[:200]}); restore or re-download "
                                 "the model") from None


TOKENIZER_FILES = ("tokenizer.json", "vocab.txt", "tokenizer.model", "vocab.json")


def require_tokenizer_files(path: Any) -> None:
    """A model directory must hold its tokenizer (we never fetch one from elsewhere)."""
    if not any((path / f).is_file() for f in TOKENIZER_FILES):
        raise ModelNotFoundError(f"{path}: no tokenizer files (tokenizer.json or vocab.txt)")


def check_tokenizer(model: Any, tokenizer: Any, where: Any) -> None:
    """Refuse a tokenizer whose ids run past the model's embeddings (another model's tokenizer): it would fail
    deep inside torch with an index error, or on some builds read garbage."""
    vocab = getattr(model.config, "vocab_size", None)
    if vocab and len(tokenizer) > vocab:
        raise ConfigError(f"{where}: the tokenizer has {len(tokenizer)} tokens but the model's embeddings hold "
                          f"{vocab}: the tokenizer belongs to another model; save the model with its own tokenizer")


def with_precision(model: Any, precision: str) -> Any:
    """The torch model for inference in ``fp32``; ``bf16`` (weights cast in place); ``int8`` (dynamic int8 Linear
    layers, CPU only, a new module). The OpenVINO precisions keep the fp32 torch model (the runtime, in
    :mod:`twostage.retriever.runtime`, is exported from it)."""
    if precision not in PRECISIONS:
        raise ConfigError(f"unknown precision {precision!r}; use one of {', '.join(PRECISIONS)}")
    if precision == "bf16":
        return model.to(torch.bfloat16)
    if precision == "int8":
        return torch.ao.quantization.quantize_dynamic(model, {torch.nn.Linear}, dtype=torch.qint8)
    return model
