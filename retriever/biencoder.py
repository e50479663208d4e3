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
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np
import torch

from twostage.indexer.atomic import from_json_dict, to_json_dict
from twostage.indexer.errors import ConfigError
from twostage.indexer.manifest import EncoderInfo
from twostage.indexer.work import checkpoint
from twostage.models.base import (
    HFModel,
    arrays,
    cap_max_length,
    check_texts,
    head_words,
    padded,
    read_model_meta,
    tokenize_once,
    write_model_meta,
)
from twostage.models.runtime import sample_texts, spread

logger = logging.getLogger(__name__)

KINDS = ("query", "document")


@dataclass(frozen=True)
class BiEncoderConfig:
    """How texts become vectors. Saved as ``twostage.json`` next to the weights."""

    pooling: str = "mean"
    normalize: bool = True
    max_length: int = 256
    query_prefix: str = ""
    document_prefix: str = ""

    def __post_init__(self) -> None:
        check_pooling(self.pooling)
        if self.max_length < 2:
            raise ConfigError(f"max_length must be at least 2, got {self.max_length}")


def _read_json(path: Path) -> dict[str, Any]:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError) as exc:
        raise ConfigError(f"{path}: unreadable ({exc})") from None


def config_from_directory(path: Path) -> BiEncoderConfig:
    """The encoder config recorded in a model directory (twostage.json, else sentence-transformers files)."""
    meta = read_model_meta(path)
    if meta is not None:
        kind, settings, _ = meta
        if kind != "bi-encoder":
            raise ConfigError(f"{path}: a {kind} model (twostage.json), not a bi-encoder; give it where a "
                              "reranker is taken (--reranker), and a bi-encoder here")
        return from_json_dict(BiEncoderConfig, settings, f"{path / 'twostage.json'}: settings")
    cfg = BiEncoderConfig()
    modules = path / "modules.json"
    if modules.is_file():
        entries = json.loads(modules.read_text())
        types = [str(e.get("type", "")) for e in entries]
        normalize = any(t.endswith("Normalize") for t in types)
        pooling = cfg.pooling
        for e in entries:
            if str(e.get("type", "")).endswith("Pooling"):
                pooling = mode_from_st_config(_read_json(path / e["path"] / "config.json"), str(path / e["path"]))
        cfg = replace(cfg, pooling=pooling, normalize=normalize)
    sbert = path / "sentence_bert_config.json"
    tok = path / "tokenizer_config.json"
    if sbert.is_file() and "max_seq_length" in (data := _read_json(sbert)):
        cfg = replace(cfg, max_length=int(data["max_seq_length"]))
    elif modules.is_file() and tok.is_file():  # sentence-transformers >= 5 keeps it in the tokenizer config
        limit = _read_json(tok).get("model_max_length")
        if isinstance(limit, int) and 2 <= limit <= 8192:
            cfg = replace(cfg, max_length=limit)
    st = path / "config_sentence_transformers.json"
    if st.is_file():
        prompts = _read_json(st).get("prompts") or {}
        if isinstance(prompts, dict):  # a document's prompt goes by several names (e5: "passage")
            query = prompts.get("query", "")
            document = next((prompts[n] for n in ("document", "passage", "corpus") if prompts.get(n)), "")
            cfg = replace(cfg, query_prefix=query if isinstance(query, str) else "",
                          document_prefix=document if isinstance(document, str) else "")
    return cfg


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
        return encoder.with_precision(precision, calibration=calibration)

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
        was_training = self.training
        self.eval()
        with torch.inference_mode():
            for idx in tqdm(slices, desc=f"encode {kind}s", unit="batch", disable=not show_progress):
                checkpoint()
                features = padded(self.tokenizer, rows, idx, "pt")
                emb = self.forward({k: v.to(self.device) for k, v in features.items()})
                out[idx] = emb.float().cpu().numpy()
        self.train(was_training)
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
