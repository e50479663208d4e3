"""The bi-encoder: a Hugging Face transformer with pooling that turns texts into vectors, on the models' common base
(:class:`~twostage.models.base.HFModel`: loading, precision, OpenVINO, saving).

Saved models use the sentence-transformers layout (``modules.json``, ``1_Pooling/``, ``2_Normalize/``,
``sentence_bert_config.json``, ``config_sentence_transformers.json``) plus ``twostage.json``, so
``sentence_transformers.SentenceTransformer(path)`` loads them and gives the same embeddings.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import torch

from twostage.indexer.atomic import to_json_dict
from twostage.indexer.errors import ConfigError
from twostage.indexer.manifest import EncoderInfo
from twostage.indexer.work import checkpoint
from twostage.models.base import (
    HFModel,
    arrays,
    cap_max_length,
    check_texts,
    evaluating,
    head_words,
    padded,
    tokenize_once,
)
from twostage.models.model_meta import write_model_meta
from twostage.models.runtime import sample_texts, spread
from twostage.retriever.encoder_config import (
    BiEncoderConfig,
    check_pooling,
    config_from_directory,
    mode_from_st_config,
    st_pooling_config,
)
from twostage.retriever.query_encoder import query_side_of, save_query_side

logger = logging.getLogger(__name__)

KINDS = ("query", "document")


class BiEncoder(HFModel):
    """Transformer + pooling (+ L2 normalisation). ``encode`` for inference, ``forward`` for training.

    >>> enc = BiEncoder.load("all-MiniLM-L6-v2")
    >>> enc.encode(["a query"], kind="query").shape
    (1, 384)
    """

    def __init__(self, model: Any, tokenizer: Any, config: BiEncoderConfig, name: str = "") -> None:
        super().__init__(model, tokenizer, name)
        self.config = config
        self.truncated = 0  # texts cut at max_length by the last encode call

    # ---- loading -----------------------------------------------------------------------------
    @classmethod
    def load(cls, name_or_path: str | Path, *, precision: str = "fp32", device: str | None = None,
             calibration: Sequence[str] | None = None, trust_remote_code: bool = False,
             **overrides: Any) -> BiEncoder:
        """Load a model directory or name (see :func:`twostage.models.weights.resolve_model`).

        ``overrides`` replace fields of the saved :class:`BiEncoderConfig` (pooling, normalize, max_length,
        query_prefix, document_prefix). ``calibration``: texts of the user's corpus that ``openvino-int8`` measures
        its scales on when it has no export of these weights yet (default: the bundled sample).
        ``trust_remote_code`` runs Python code shipped with the model (only for a model you trust; off by default).
        """
        from transformers import AutoModel

        path = cls.model_dir(name_or_path)
        config = config_from_directory(path)
        unknown = set(overrides) - set(BiEncoderConfig.__dataclass_fields__)
        if unknown:
            raise ConfigError(f"unknown BiEncoder option(s): {', '.join(sorted(unknown))}")
        config = replace(config, **{k: v for k, v in overrides.items() if v is not None})
        model, tokenizer, _ = cls.read_pretrained(path, AutoModel, trust_remote_code)
        config = replace(config, max_length=cap_max_length(model, config.max_length))
        encoder = cls(model, tokenizer, config, name=str(name_or_path))
        encoder.placed(path, device)
        encoder.with_precision(precision, calibration=calibration)
        if encoder.runtime is not None and encoder.path is not None:  # what a cold search reads without torch
            made = query_side_of(encoder.tokenizer, config.max_length, config.query_prefix)
            if made is not None:
                save_query_side(encoder.path, encoder.runtime.weights_sha256, precision, *made)
        return encoder

    def trace_example(self) -> dict[str, torch.Tensor]:
        return self.tokenize(["an example document to trace", "a query"], "document")

    def calibration_batches(self, calibration: Sequence[str] | None) -> list[dict[str, np.ndarray]]:
        docs = spread([t for t in (calibration or sample_texts()) if t.strip()] or sample_texts())
        # documents as they are indexed, and their first words as query-like short inputs
        inputs = [(self.config.document_prefix + t) for t in docs]
        inputs += [self.config.query_prefix + " ".join(t.split()[:12]) for t in docs[::2]]
        return [dict(self.features(inputs[i:i + 16], "", "np")) for i in range(0, len(inputs), 16)]

    def info(self) -> EncoderInfo:
        """Identity recorded in index manifests: name, dimension, weights hash, pooling, normalisation."""
        from twostage.models.weights import sha256_of_weights

        digest = sha256_of_weights(self.path) if self.path is not None else ""
        return EncoderInfo(name=self.name, dim=self.dim, weights_sha256=digest, pooling=self.config.pooling,
                           normalize=self.config.normalize, max_length=self.config.max_length)

    @property
    def dim(self) -> int:
        return int(self.model.config.hidden_size)

    # ---- the forward pass --------------------------------------------------------------------
    def features(self, texts: Sequence[str], prefix: str, tensors: str = "pt") -> Any:
        """``prefix + text`` as model inputs (``tensors``: "pt" or "np"), truncated to ``max_length`` tokens; long
        texts are first cut to their head words where that is exact (:func:`head_words`)."""
        return self._tokenized(head_words(self.tokenizer, [prefix + t for t in texts], self.config.max_length),
                               tensors)

    def _tokenized(self, texts: Sequence[str], tensors: str) -> Any:
        """Texts (prefixed and cut already) tokenised, padded and truncated to ``max_length``, as arrays."""
        return arrays(self.tokenizer(list(texts), padding=True, truncation=True, max_length=self.config.max_length),
                      tensors)

    def tokenize(self, texts: Sequence[str], kind: str = "document") -> dict[str, torch.Tensor]:
        return {k: v.to(self.device) for k, v in self.features(texts, self._prefix(kind)).items()}

    def forward(self, features: dict[str, torch.Tensor]) -> torch.Tensor:
        """Token features (from :meth:`tokenize`) -> pooled, optionally normalised embeddings (batch, dim)."""
        out = self.model(**features).last_hidden_state
        emb = pool(out, features["attention_mask"], self.config.pooling)
        if self.config.normalize:
            emb = torch.nn.functional.normalize(emb.float(), p=2, dim=-1)
        return emb

    def _prefix(self, kind: str) -> str:
        if kind not in KINDS:
            raise ConfigError(f"kind must be 'query' or 'document', got {kind!r}")
        return self.config.query_prefix if kind == "query" else self.config.document_prefix

    # ---- inference ---------------------------------------------------------------------------
    def encode(self, texts: Sequence[str], *, kind: str = "document", batch_size: int = 32,
               show_progress: bool = False, allow_empty: bool = False, threads: int | None = None) -> np.ndarray:
        """Embeddings of ``texts`` as float32 (n, dim), in input order.

        Batches are formed from texts sorted by length (less padding). Texts longer than ``max_length``
        tokens are truncated; their number is kept in ``self.truncated`` and logged. ``threads`` sets
        torch's intra-op thread count for this call only.
        """
        if threads is not None:
            if threads <= 0:
                raise ConfigError(f"threads must be positive, got {threads}")
            before = torch.get_num_threads()
            torch.set_num_threads(threads)
            try:
                return self.encode(texts, kind=kind, batch_size=batch_size, show_progress=show_progress,
                                   allow_empty=allow_empty)
            finally:
                torch.set_num_threads(before)
        from tqdm.auto import tqdm

        texts = check_texts(texts, kind, allow_empty)
        if batch_size <= 0:
            raise ConfigError(f"batch_size must be positive, got {batch_size}")
        out = np.empty((len(texts), self.dim), dtype=np.float32)
        if not texts:
            return out
        prefix = self._prefix(kind)
        heads = head_words(self.tokenizer, [prefix + t for t in texts], self.config.max_length)
        rows, self.truncated = tokenize_once(self.tokenizer, heads, self.config.max_length)
        lengths = np.array([len(ids) for ids in rows["input_ids"]])
        if self.truncated:
            logger.info("%d of %d %s texts are longer than %d tokens and were truncated",
                        self.truncated, len(texts), kind, self.config.max_length)
        order = np.argsort(-lengths, kind="stable")
        slices = [order[start:start + batch_size] for start in range(0, len(texts), batch_size)]
        if self.runtime is not None:  # OpenVINO
            for idx in tqdm(slices, desc=f"encode {kind}s", unit="batch", disable=not show_progress):
                checkpoint()
                out[idx] = self.runtime(padded(self.tokenizer, rows, idx, "np"))
            return out
        with evaluating(self):
            for idx in tqdm(slices, desc=f"encode {kind}s", unit="batch", disable=not show_progress):
                checkpoint()
                features = padded(self.tokenizer, rows, idx, "pt")
                emb = self.forward({k: v.to(self.device) for k, v in features.items()})
                out[idx] = emb.float().cpu().numpy()
        return out

    def longer_than_read(self, texts: Sequence[str], kind: str = "query") -> int:
        """How many of ``texts`` (with the ``kind``'s prefix) are longer than ``max_length`` tokens: :meth:`encode`
        reads only their beginning."""
        prefix = self._prefix(kind)
        heads = head_words(self.tokenizer, [prefix + t for t in texts], self.config.max_length)
        return tokenize_once(self.tokenizer, heads, self.config.max_length)[1]

    def encode_queries(self, queries: Sequence[str], **kw: Any) -> np.ndarray:
        return self.encode(queries, kind="query", **kw)

    def encode_documents(self, documents: Sequence[str], **kw: Any) -> np.ndarray:
        return self.encode(documents, kind="document", **kw)

    # ---- saving --------------------------------------------------------------------------------
    def save(self, path: str | Path, training: dict[str, Any] | None = None) -> Path:
        """Write the model atomically in the sentence-transformers layout, plus ``twostage.json``."""
        from importlib.metadata import version

        with self.saving(path) as tmp:
            modules = [{"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},
                       {"idx": 1, "name": "1", "path": "1_Pooling", "type": "sentence_transformers.models.Pooling"}]
            if self.config.normalize:
                modules.append({"idx": 2, "name": "2", "path": "2_Normalize",
                                "type": "sentence_transformers.models.Normalize"})
                (tmp / "2_Normalize").mkdir()
                (tmp / "2_Normalize" / "config.json").write_text("{}\n")
            (tmp / "modules.json").write_text(json.dumps(modules, indent=2) + "\n")
            (tmp / "1_Pooling").mkdir()
            (tmp / "1_Pooling" / "config.json").write_text(
                json.dumps(st_pooling_config(self.config.pooling, self.dim), indent=2) + "\n")
            (tmp / "sentence_bert_config.json").write_text(
                json.dumps({"max_seq_length": self.config.max_length, "do_lower_case": False}, indent=2) + "\n")
            st = {"__version__": {"transformers": version("transformers"), "pytorch": torch.__version__},
                  "prompts": {"query": self.config.query_prefix, "document": self.config.document_prefix},
                  "default_prompt_name": None, "similarity_fn_name": "cosine" if self.config.normalize else "dot"}
            (tmp / "config_sentence_transformers.json").write_text(json.dumps(st, indent=2) + "\n")
            write_model_meta(tmp, "bi-encoder", self.name, to_json_dict(self.config), training)
        return Path(path)


def pool(token_embeddings: torch.Tensor, attention_mask: torch.Tensor, mode: str) -> torch.Tensor:
    """(batch, tokens, dim) and (batch, tokens) -> (batch, dim); padding never counts."""
    if mode == "cls":
        return token_embeddings[:, 0]
    mask = attention_mask.unsqueeze(-1).to(token_embeddings.dtype)
    if mode == "max":
        return token_embeddings.masked_fill(mask == 0, torch.finfo(token_embeddings.dtype).min).max(dim=1).values
    summed = (token_embeddings * mask).sum(dim=1)
    return summed / mask.sum(dim=1).clamp(min=1e-9)
