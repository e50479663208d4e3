"""Late interaction (ColBERT): one small vector per token, a query's tokens each matched to their best document token.

:class:`LateEncoder` turns texts into per-token vectors (the transformer's last hidden states, projected when the
model has a projection, L2-normalised) on the models' common base (:class:`~twostage.models.base.HFModel`). The
score of a document for a query is MaxSim, :func:`twostage.indexer.tokens.maxsim`.

Three layouts load, by path or name:

- **PyLate / sentence-transformers ColBERT** (``modules.json`` with a ``Dense`` module after the transformer,
  ``config_sentence_transformers.json`` with ``query_prefix``, ``query_length``, ``skiplist_words``...). twostage
  saves its own late-interaction models in this layout, plus ``twostage.json``.
- **Stanford ColBERT** (``config.json`` architectures ``HF_ColBERT``: a BERT under ``bert.`` and a ``linear`` head in
  one safetensors file; ``artifact.metadata`` with ``query_token_id``, ``query_maxlen``, ``doc_maxlen``...).
- **Any bi-encoder** (the zero-shot baseline): its token states as they are, no projection, no markers.

Inputs as both libraries make them: a marker token (``[Q]`` / ``[D]``, or ``[unused0]`` / ``[unused1]``) right after
the first special token; a query padded to ``query_length`` with mask tokens that it does not attend to (query
augmentation) but whose output vectors it keeps; a document's punctuation (the skiplist) and padding left out.
"""

from __future__ import annotations

import json
import logging
import string
from collections.abc import Sequence
from contextlib import nullcontext
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np
import torch

from twostage.indexer.atomic import from_json_dict, to_json_dict
from twostage.indexer.errors import ConfigError
from twostage.indexer.work import checkpoint
from twostage.models.base import (
    HFModel,
    arrays,
    cap_max_length,
    check_texts,
    evaluating,
    head_words,
)
from twostage.models.model_meta import read_json_object, read_model_meta, write_model_meta
from twostage.models.runtime import sample_texts, spread
from twostage.models.weights import ModelNotFoundError

logger = logging.getLogger(__name__)

LAYOUTS = ("plain", "pylate", "stanford")
PUNCTUATION = tuple(string.punctuation)


@dataclass(frozen=True)
class LateConfig:
    """How texts become token vectors. ``query_marker`` / ``document_marker``: the token put after the first special
    token ("" for none); ``expand_query``: pad queries to ``query_length`` with mask tokens and keep their vectors;
    ``attend_to_expansion``: let the query's other tokens attend to those; ``skiplist``: tokens whose document vectors
    are left out (punctuation)."""

    query_length: int = 32
    document_length: int = 180
    query_marker: str = ""
    document_marker: str = ""
    expand_query: bool = True
    attend_to_expansion: bool = False
    skiplist: tuple[str, ...] = PUNCTUATION
    layout: str = "pylate"

    def __post_init__(self) -> None:
        if self.layout not in LAYOUTS:
            raise ConfigError(f"late-interaction layout must be one of {', '.join(LAYOUTS)}, got {self.layout!r}")
        for name in ("query_length", "document_length"):
            if not isinstance(getattr(self, name), int) or getattr(self, name) < 3:
                raise ConfigError(f"{name} must be an integer >= 3, got {getattr(self, name)!r}")

    @property
    def similarity(self) -> str:
        return "MaxSim"


# a bi-encoder read token by token: no markers, no query augmentation (it was never trained with mask tokens)
ZERO_SHOT = LateConfig(query_length=64, document_length=256, expand_query=False, layout="plain")


def _typed(value: Any, kind: type, where: str, default: Any) -> Any:
    if value is None:
        return default
    if kind is int and (isinstance(value, bool) or not isinstance(value, int)):
        raise ConfigError(f"{where} must be an integer, got {value!r}; restore the model directory")
    if kind is bool and not isinstance(value, bool):
        raise ConfigError(f"{where} must be true or false, got {value!r}; restore the model directory")
    if kind is str and not isinstance(value, str):
        raise ConfigError(f"{where} must be a string, got {value!r}; restore the model directory")
    return value


def layout_of(path: Path) -> str:
    """Which late-interaction layout a model directory holds (``plain``: none, a bi-encoder read token by token)."""
    meta = read_model_meta(path)
    if meta is not None and meta[0] == "late-interaction":
        return "pylate"
    if (path / "artifact.metadata").is_file():
        return "stanford"
    config = read_json_object(path / "config.json") if (path / "config.json").is_file() else {}
    if config.get("architectures") == ["HF_ColBERT"]:
        return "stanford"
    if (path / "modules.json").is_file() and _dense_module(path) is not None:
        return "pylate"
    if meta is not None and meta[0] == "cross-encoder":
        raise ConfigError(f"{path}: a cross-encoder (twostage.json); a late-interaction model reads queries and "
                          "documents apart: give a ColBERT model or a bi-encoder")
    return "plain"


def _dense_module(path: Path) -> str | None:
    """The folder of the projection after the transformer in a sentence-transformers ``modules.json``."""
    try:
        modules = json.loads((path / "modules.json").read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ConfigError(f"{path / 'modules.json'}: unreadable ({exc}); restore the model directory") from None
    if not isinstance(modules, list):
        raise ConfigError(f"{path / 'modules.json'}: not a list of modules; restore the model directory")
    for entry in modules:
        if isinstance(entry, dict) and str(entry.get("type", "")).endswith("Dense"):
            folder = entry.get("path")
            if not isinstance(folder, str) or not folder or ".." in Path(folder).parts or Path(folder).is_absolute():
                raise ConfigError(f"{path / 'modules.json'}: the Dense module's path {folder!r} is not a folder of "
                                  "the model; restore the model directory")
            return folder
    return None


def config_from_directory(path: Path, layout: str) -> LateConfig:
    """The token-vector settings a model directory records, in its layout's own files."""
    if layout == "plain":
        return ZERO_SHOT
    if layout == "stanford":
        meta = read_json_object(path / "artifact.metadata") if (path / "artifact.metadata").is_file() else {}
        where = str(path / "artifact.metadata")
        return LateConfig(
            query_length=_typed(meta.get("query_maxlen"), int, f"{where}: query_maxlen", 32),
            document_length=_typed(meta.get("doc_maxlen"), int, f"{where}: doc_maxlen", 180),
            query_marker=_typed(meta.get("query_token_id"), str, f"{where}: query_token_id", "[unused0]"),
            document_marker=_typed(meta.get("doc_token_id"), str, f"{where}: doc_token_id", "[unused1]"),
            attend_to_expansion=_typed(meta.get("attend_to_mask_tokens"), bool, f"{where}: attend_to_mask_tokens",
                                       False),
            skiplist=PUNCTUATION if _typed(meta.get("mask_punctuation"), bool, f"{where}: mask_punctuation", True)
            else (), layout="stanford")
    own = read_model_meta(path)
    if own is not None and own[0] == "late-interaction":
        return from_json_dict(LateConfig, own[1], f"{path / 'twostage.json'}: settings")
    st = read_json_object(path / "config_sentence_transformers.json") \
        if (path / "config_sentence_transformers.json").is_file() else {}
    where = str(path / "config_sentence_transformers.json")
    skip = st.get("skiplist_words", list(PUNCTUATION))
    if not isinstance(skip, list) or not all(isinstance(w, str) for w in skip):
        raise ConfigError(f"{where}: skiplist_words must be a list of strings; restore the model directory")
    return LateConfig(
        query_length=_typed(st.get("query_length"), int, f"{where}: query_length", 32),
        document_length=_typed(st.get("document_length"), int, f"{where}: document_length", 180),
        query_marker=_typed(st.get("query_prefix"), str, f"{where}: query_prefix", "[Q] "),
        document_marker=_typed(st.get("document_prefix"), str, f"{where}: document_prefix", "[D] "),
        expand_query=_typed(st.get("do_query_expansion"), bool, f"{where}: do_query_expansion", True),
        attend_to_expansion=_typed(st.get("attend_to_expansion_tokens"), bool,
                                   f"{where}: attend_to_expansion_tokens", False),
        skiplist=tuple(skip), layout="pylate")


def _read_tensors(file: Path, keys: Sequence[str]) -> dict[str, torch.Tensor]:
    """The named tensors of one safetensors file (a missing or damaged file, or a missing key: one clear error)."""
    from safetensors import safe_open

    if not file.is_file():
        raise ModelNotFoundError(f"{file}: missing; the projection's weights must be saved as safetensors")
    try:
        with safe_open(str(file), framework="pt") as f:
            names = set(f.keys())
            return {k: f.get_tensor(k) for k in keys if k in names}
    except Exception as exc:  # safetensors raises its own error type for a broken header
        raise ModelNotFoundError(f"{file}: unreadable ({str(exc)[:200]}); restore the model directory") from None


def read_projection(path: Path, layout: str, hidden: int) -> torch.nn.Linear | None:
    """The linear head after the transformer (None for a plain bi-encoder), its shape checked against ``hidden``."""
    if layout == "plain":
        return None
    if layout == "stanford":
        found: dict[str, torch.Tensor] = {}
        for f in sorted(path.glob("*.safetensors")):
            found.update(_read_tensors(f, ["linear.weight"]))
        where = f"{path}: linear.weight"
        weight, bias = found.get("linear.weight"), None
    else:
        folder = _dense_module(path)
        if folder is None:  # saved by twostage without a projection
            return None
        config = read_json_object(path / folder / "config.json")
        activation = str(config.get("activation_function", "torch.nn.modules.linear.Identity"))
        if not activation.endswith("Identity") or config.get("use_residual"):
            raise ConfigError(f"{path / folder / 'config.json'}: activation {activation!r} / use_residual "
                              f"{config.get('use_residual')!r}: only a plain linear projection is supported")
        found = _read_tensors(path / folder / "model.safetensors", ["linear.weight", "linear.bias"])
        where = f"{path / folder / 'model.safetensors'}: linear.weight"
        weight, bias = found.get("linear.weight"), found.get("linear.bias")
    if weight is None:
        raise ModelNotFoundError(f"{where} is missing; restore the model directory")
    if weight.ndim != 2 or weight.shape[1] != hidden or not torch.isfinite(weight).all():
        raise ModelNotFoundError(f"{where} has shape {tuple(weight.shape)}, expected (dim, {hidden}) with finite "
                                 "values; the projection belongs to another model")
    linear = torch.nn.Linear(hidden, weight.shape[0], bias=bias is not None)
    with torch.no_grad():
        linear.weight.copy_(weight.float())
        if bias is not None:
            linear.bias.copy_(bias.float())
    return linear


class LateEncoder(HFModel):
    """A late-interaction encoder: texts -> one L2-normalised vector per kept token.

    >>> enc = LateEncoder.load("all-MiniLM-L6-v2")          # zero-shot: a bi-encoder's token states
    >>> q = enc.encode_tokens(["a query"], kind="query")[0]  # (tokens, dim) float32
    """

    export_kind = "tokens"  # its OpenVINO export gives every token's vector, apart from a bi-encoder's pooled one

    def __init__(self, model: Any, tokenizer: Any, config: LateConfig, projection: torch.nn.Linear | None,
                 name: str = "") -> None:
        super().__init__(model, tokenizer, name)
        self.config, self.projection = config, projection
        self.marker_ids = {kind: self._marker_id(marker) for kind, marker in
                           (("query", config.query_marker), ("document", config.document_marker))}
        self.skip_ids = frozenset(i for i in (tokenizer.convert_tokens_to_ids(w) for w in config.skiplist)
                                  if i is not None and i != tokenizer.unk_token_id)
        if config.expand_query and tokenizer.mask_token_id is None:
            raise ConfigError(f"{name}: query augmentation pads with the mask token and this tokenizer has none")

    def _marker_id(self, marker: str) -> int | None:
        if not marker:
            return None
        i = self.tokenizer.convert_tokens_to_ids(marker)
        if i is None or i == self.tokenizer.unk_token_id:
            raise ConfigError(f"{self.name}: the marker token {marker!r} is not in the tokenizer's vocabulary; the "
                              "tokenizer belongs to another model")
        return int(i)

    @classmethod
    def load(cls, name_or_path: str | Path, *, precision: str = "fp32", device: str | None = None,
             calibration: Sequence[str] | None = None, trust_remote_code: bool = False,
             **overrides: Any) -> LateEncoder:
        """Load a ColBERT model (PyLate or Stanford layout) or a bi-encoder (zero-shot) by path or name.
        ``overrides`` replace fields of its :class:`LateConfig` (``query_length``, ``document_length``...)."""
        from transformers import AutoModel

        path = cls.model_dir(name_or_path)
        layout = layout_of(path)
        unknown = set(overrides) - set(LateConfig.__dataclass_fields__)
        if unknown:
            raise ConfigError(f"unknown late-interaction option(s): {', '.join(sorted(unknown))}")
        config = replace(config_from_directory(path, layout), **{k: v for k, v in overrides.items() if v is not None})
        model, tokenizer, _ = cls.read_pretrained(path, AutoModel, trust_remote_code)
        positions = cap_max_length(model, max(config.query_length, config.document_length))
        config = replace(config, query_length=min(config.query_length, positions),
                         document_length=min(config.document_length, positions))
        projection = read_projection(path, layout, int(model.config.hidden_size))
        encoder = cls(model, tokenizer, config, projection, name=str(name_or_path))
        encoder.placed(path, device)
        return encoder.with_precision(precision, calibration=calibration)

    @property
    def dim(self) -> int:
        return int(self.projection.out_features if self.projection is not None else self.model.config.hidden_size)

    # ---- inputs ------------------------------------------------------------------------------------------------
    def features(self, texts: Sequence[str], kind: str, tensors: str = "pt") -> dict[str, Any]:
        """Model inputs of ``kind`` ("query" or "document"): cut to the kind's length, the marker after the first
        special token, a query padded with mask tokens to ``query_length`` when ``expand_query``."""
        if kind not in ("query", "document"):
            raise ConfigError(f"kind must be 'query' or 'document', got {kind!r}")
        c = self.config
        length = c.query_length if kind == "query" else c.document_length
        marker = self.marker_ids[kind]
        room = length - (marker is not None)
        texts = head_words(self.tokenizer, [t.strip() for t in texts], room)
        expand = kind == "query" and c.expand_query
        enc = self.tokenizer(texts, truncation=True, max_length=room, padding="max_length" if expand else True,
                             verbose=False)
        batch = {k: [list(v) for v in enc[k]] for k in ("input_ids", "attention_mask", "token_type_ids") if k in enc}
        if marker is not None:
            fill = {"input_ids": marker, "attention_mask": 1, "token_type_ids": 0}
            batch = {k: [row[:1] + [fill[k]] + row[1:] for row in rows] for k, rows in batch.items()}
        if expand:  # padding becomes mask tokens (query augmentation)
            mask = self.tokenizer.mask_token_id
            for ids, att in zip(batch["input_ids"], batch["attention_mask"]):
                for j, a in enumerate(att):
                    if not a:
                        ids[j] = mask
                        if c.attend_to_expansion:
                            att[j] = 1
        return arrays(batch, tensors)

    def kept(self, features: dict[str, Any], kind: str) -> np.ndarray:
        """Which positions give a vector: a query's every position when augmented (its mask tokens too), else the
        attended ones; of a document, the attended ones outside the skiplist."""
        ids = np.asarray(features["input_ids"])
        if kind == "query" and self.config.expand_query:
            return np.ones(ids.shape, dtype=bool)
        keep = np.asarray(features["attention_mask"]).astype(bool)
        if kind == "document" and self.skip_ids:
            keep &= ~np.isin(ids, np.fromiter(self.skip_ids, dtype=np.int64))
        return keep

    def train_tokens(self, texts: Sequence[str], kind: str) -> tuple[torch.Tensor, torch.Tensor]:
        """What training scores: ``texts``' token vectors (n, L, d), with graph, and the mask of those that count
        (n, L), both on the model's device."""
        features = self.features(list(texts), kind, "np")
        keep = torch.from_numpy(self.kept(features, kind)).to(self.device)
        return self({k: torch.from_numpy(v).to(self.device) for k, v in features.items()}), keep

    # ---- the forward pass --------------------------------------------------------------------------------------
    def forward(self, features: dict[str, torch.Tensor]) -> torch.Tensor:
        """Inputs -> (batch, length, dim) token vectors, projected and L2-normalised (every position)."""
        out = self.model(**features).last_hidden_state
        if self.projection is not None:
            out = self.projection(out.to(self.projection.weight.dtype))
        return torch.nn.functional.normalize(out.float(), p=2, dim=-1)

    def trace_example(self) -> dict[str, torch.Tensor]:
        return self.features(["an example document to trace", "a query"], "document")

    def calibration_batches(self, calibration: Sequence[str] | None) -> list[dict[str, np.ndarray]]:
        docs = spread([t for t in (calibration or sample_texts()) if t.strip()] or sample_texts())
        batches = [self.features(docs[i:i + 16], "document", "np") for i in range(0, len(docs), 16)]
        queries = [" ".join(t.split()[:12]) for t in docs[::2]]
        return batches + [self.features(queries[i:i + 16], "query", "np") for i in range(0, len(queries), 16)]

    def encode_tokens(self, texts: Sequence[str], *, kind: str = "document", batch_size: int = 32,
                      show_progress: bool = False, allow_empty: bool = False) -> list[np.ndarray]:
        """Each text's token vectors, float32 (kept tokens, dim), in input order; batches formed by length."""
        from tqdm.auto import tqdm

        texts = check_texts(texts, kind, allow_empty)
        if batch_size <= 0:
            raise ConfigError(f"batch_size must be positive, got {batch_size}")
        order = np.argsort([-len(t) for t in texts], kind="stable")
        out: list[np.ndarray] = [np.empty((0, self.dim), dtype=np.float32)] * len(texts)
        with evaluating(self) if self.runtime is None else nullcontext():  # OpenVINO runs no torch module
            for start in tqdm(range(0, len(texts), batch_size), desc=f"token vectors of {kind}s", unit="batch",
                              disable=not show_progress):
                checkpoint()
                idx = order[start:start + batch_size]
                features = self.features([texts[i] for i in idx], kind, "np")
                if self.runtime is not None:  # OpenVINO
                    vectors = np.asarray(self.runtime(features), dtype=np.float32)
                else:
                    pt = {k: torch.from_numpy(v).to(self.device) for k, v in features.items()}
                    vectors = self.forward(pt).float().cpu().numpy()
                keep = self.kept(features, kind)
                for row, i in enumerate(idx):
                    out[i] = np.ascontiguousarray(vectors[row][keep[row]])
        return out

    # ---- saving ------------------------------------------------------------------------------------------------
    def save(self, path: str | Path, training: dict[str, Any] | None = None) -> Path:
        """Write the model atomically in PyLate's layout (``SentenceTransformer``-style modules, a ``Dense``
        projection), plus ``twostage.json``, so PyLate loads it and gives the same vectors."""
        from safetensors.torch import save_file

        c = self.config
        with self.saving(path) as tmp:
            modules = [{"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"}]
            if self.projection is not None:
                modules.append({"idx": 1, "name": "1", "path": "1_Dense", "type": "pylate.models.Dense.Dense"})
                (tmp / "1_Dense").mkdir()
                (tmp / "1_Dense" / "config.json").write_text(json.dumps({
                    "in_features": self.projection.in_features, "out_features": self.projection.out_features,
                    "bias": self.projection.bias is not None,
                    "activation_function": "torch.nn.modules.linear.Identity", "use_residual": False}, indent=2))
                tensors = {"linear.weight": self.projection.weight.detach().float().cpu().contiguous()}
                if self.projection.bias is not None:
                    tensors["linear.bias"] = self.projection.bias.detach().float().cpu().contiguous()
                save_file(tensors, str(tmp / "1_Dense" / "model.safetensors"))
            (tmp / "modules.json").write_text(json.dumps(modules, indent=2) + "\n")
            (tmp / "sentence_bert_config.json").write_text(
                json.dumps({"max_seq_length": c.document_length, "do_lower_case": False}, indent=2) + "\n")
            (tmp / "config_sentence_transformers.json").write_text(json.dumps({
                "query_prefix": c.query_marker, "document_prefix": c.document_marker, "query_length": c.query_length,
                "document_length": c.document_length, "attend_to_expansion_tokens": c.attend_to_expansion,
                "skiplist_words": list(c.skiplist), "do_query_expansion": c.expand_query,
                "similarity_fn_name": "MaxSim", "model_type": "ColBERT"}, indent=2) + "\n")
            write_model_meta(tmp, "late-interaction", self.name, to_json_dict(replace(c, layout="pylate")), training)
        return Path(path)
