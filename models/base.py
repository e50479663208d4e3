"""What the bi-encoder and the cross-encoder share: a Hugging Face transformer and its tokenizer, loaded from a
directory or a name, checked, placed on a device, run in a precision (torch or OpenVINO) and saved atomically.

:class:`~twostage.retriever.biencoder.BiEncoder` (texts -> vectors) and
:class:`~twostage.reranker.cross_encoder.CrossEncoder` (pairs -> scores) each bring what is theirs: the head
(pooling, or a one-output classifier), how texts become inputs, the example an OpenVINO export is traced with and the
inputs its int8 scales are measured on, and their own files in the saved layout.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import numpy as np
import torch

from twostage.indexer.atomic import atomic_directory
from twostage.indexer.errors import ConfigError
from twostage.models.hf import check_tokenizer, require_tokenizer_files, unreadable_weights, with_precision
from twostage.models.runtime import OpenVINORunner, is_openvino, openvino_runner
from twostage.models.weights import ModelNotFoundError, resolve_model


class HFModel(torch.nn.Module, ABC):
    """A transformer with its tokenizer; subclasses add the head and the inputs.

    ``precision``: how it runs (``fp32``, ``bf16``, ``int8``, ``openvino-fp32``, ``openvino-int8``); ``runtime``:
    the OpenVINO runner when the precision is an OpenVINO one (inference runs there, the torch model stays fp32);
    ``path``: the directory it was loaded from.
    """

    export_kind = ""  # what sets this model's OpenVINO exports apart from others of the same weights

    def __init__(self, model: Any, tokenizer: Any, name: str = "") -> None:
        super().__init__()
        self.model, self.tokenizer, self.name = model, tokenizer, name
        self.precision = "fp32"
        self.path: Path | None = None
        self.runtime: OpenVINORunner | None = None

    # ---- loading -----------------------------------------------------------------------------------------------
    @staticmethod
    def model_dir(name_or_path: str | Path) -> Path:
        """The directory of a model given by path or name (:func:`~twostage.models.weights.resolve_model`), after
        checking it holds safetensors weights (never pickle) and a tokenizer."""
        path = resolve_model(name_or_path)
        if not list(path.glob("*.safetensors")):
            if list(path.glob("*.bin")):
                raise ModelNotFoundError(f"{path}: only pickle-based .bin weights; twostage loads safetensors only "
                                         "(convert with transformers' save_pretrained(safe_serialization=True))")
            raise ModelNotFoundError(f"{path}: no model weights (model.safetensors)")
        require_tokenizer_files(path)
        return path

    @staticmethod
    def read_pretrained(path: Path, auto_class: Any, trust_remote_code: bool, **kwargs: Any) -> tuple[Any, Any, Any]:
        """(model, tokenizer, loading info) from ``path`` by ``auto_class`` (transformers' ``AutoModel...``), the
        tokenizer checked against the model (a tokenizer of another model is one ConfigError)."""
        from transformers import AutoTokenizer

        tokenizer = AutoTokenizer.from_pretrained(path, trust_remote_code=trust_remote_code)
        with unreadable_weights(path):
            model, info = auto_class.from_pretrained(path, trust_remote_code=trust_remote_code, use_safetensors=True,
                                                     output_loading_info=True, **kwargs)
        check_tokenizer(model, tokenizer, path)
        return model, tokenizer, info

    def placed(self, path: Path, device: str | None) -> HFModel:
        """This model, loaded from ``path``, on ``device`` (a torch device; None: where it is), in eval mode."""
        self.path = path
        if device:
            self.to(device)
        self.eval()
        return self

    @property
    def device(self) -> torch.device:
        return next(self.model.parameters()).device

    # ---- precision ---------------------------------------------------------------------------------------------
    def with_precision(self, precision: str, *, calibration: Sequence[Any] | None = None) -> Any:
        """Run in ``precision``: ``fp32``; ``bf16`` (weights in bfloat16); ``int8`` (dynamic int8 Linear layers, CPU
        only, a copy); ``openvino-fp32`` / ``openvino-int8`` (the OpenVINO runtime, :mod:`twostage.models.runtime`;
        int8 scales measured on ``calibration``, texts or pairs of the user's corpus, default the bundled sample)."""
        self.model = with_precision(self.model, precision)
        self.runtime = openvino_runner(self, self.trace_example(), self.path, precision,
                                       lambda: self.calibration_batches(calibration), kind=self.export_kind) \
            if is_openvino(precision) else None
        self.precision = precision
        return self

    @abstractmethod
    def trace_example(self) -> dict[str, torch.Tensor]:
        """The inputs an OpenVINO export is traced with."""

    @abstractmethod
    def calibration_batches(self, calibration: Sequence[Any] | None) -> list[dict[str, np.ndarray]]:
        """The input batches ``openvino-int8`` measures its scales on (``calibration``, else the bundled sample)."""

    # ---- saving ------------------------------------------------------------------------------------------------
    @contextmanager
    def saving(self, path: str | Path) -> Iterator[Path]:
        """A directory written atomically at ``path``, holding the weights (safetensors) and the tokenizer; the
        subclass adds its own files inside the ``with`` block. Only an fp32 model (or one run by OpenVINO, which keeps
        its fp32 torch model) is saved."""
        if self.precision != "fp32" and not is_openvino(self.precision):
            raise ConfigError(f"save an fp32 model; this one runs in {self.precision} (load it again in fp32)")
        with atomic_directory(Path(path)) as tmp:
            self.model.save_pretrained(tmp, safe_serialization=True)
            self.tokenizer.save_pretrained(tmp)
            yield tmp
