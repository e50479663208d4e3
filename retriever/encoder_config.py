"""A bi-encoder's settings as its model directory records them (``twostage.json``, else the sentence-transformers
files): pooling, normalisation, the length it reads, the query and document prompts. Read without torch (a query
encoded from an OpenVINO export needs them, :mod:`twostage.retriever.query_encoder`)."""

from __future__ import annotations

import json
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from twostage.indexer.atomic import from_json_dict
from twostage.indexer.errors import ConfigError
from twostage.models.model_meta import read_model_meta

__all__ = ["BiEncoderConfig", "POOLING_MODES", "check_pooling", "config_from_directory", "mode_from_st_config",
           "st_pooling_config"]


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


POOLING_MODES = ("mean", "cls", "max")


def check_pooling(mode: str) -> str:
    if mode not in POOLING_MODES:
        raise ConfigError(f"unknown pooling {mode!r}; use one of {', '.join(POOLING_MODES)}")
    return mode


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
