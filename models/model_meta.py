"""A model directory's ``twostage.json``: what kind of model it is, its settings and how it was trained; read and
written without torch (a query encoded from an OpenVINO export reads it, :mod:`twostage.retriever.query_encoder`)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from twostage.indexer.errors import ConfigError
from twostage.indexer.manifest import library_versions

__all__ = ["FILE", "FORMAT", "FORMAT_VERSION", "KINDS", "read_json_object", "read_model_meta", "record_training",
           "write_model_meta"]

FILE = "twostage.json"
FORMAT, FORMAT_VERSION = "twostage.model", 1
KINDS = ("bi-encoder", "cross-encoder", "late-interaction")
_LEGACY_CROSS = ("max_length", "head_trained", "interpolation")


def write_model_meta(directory: Path, kind: str, base: str, settings: dict[str, Any],
                     training: dict[str, Any] | None) -> None:
    if kind not in KINDS:
        raise ConfigError(f"kind must be one of {', '.join(KINDS)}, got {kind!r}")
    from twostage.models.model_card import base_languages

    meta = {"format": FORMAT, "format_version": FORMAT_VERSION, "kind": kind, "base": base, "settings": settings,
            "training": training or {}, "versions": library_versions()}
    languages = base_languages(base)
    if languages:  # what the base model's card says it covers (twostage.models.model_card)
        meta["languages"] = list(languages)
    (directory / FILE).write_text(json.dumps(meta, indent=2, default=str) + "\n", encoding="utf-8")


def record_training(directory: Path, key: str, value: Any) -> None:
    """Add ``key`` to the training record of the model in ``directory`` (a choice made after its training, e.g. the
    MaxSim weight the one command chose on dev), written through a temporary file and a rename."""
    from twostage.indexer.atomic import atomic_write_text

    f = Path(directory) / FILE
    meta = read_json_object(f, "restore the model directory or train it again")
    if "format" not in meta or not isinstance(meta.get("training", {}), dict):
        raise ConfigError(f"{f}: not a twostage model description with a training record; train the model again")
    meta["training"] = {**meta.get("training", {}), key: value}
    atomic_write_text(f, json.dumps(meta, indent=2, default=str) + "\n")


def read_json_object(path: Path, remedy: str = "restore the model directory") -> dict[str, Any]:
    """A model directory's JSON file as an object; unreadable or not an object: one ConfigError ending in ``remedy``."""
    try:
        data = json.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ConfigError(f"{path}: unreadable ({exc}); {remedy}") from None
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: not a JSON object; {remedy}")
    return data


def read_model_meta(directory: Path) -> tuple[str, dict[str, Any], dict[str, Any]] | None:
    """(kind, settings, training) of a model directory, or None when it has no ``twostage.json``."""
    f = Path(directory) / FILE
    if not f.is_file():
        return None
    meta = read_json_object(f, "restore the model directory or train it again")
    kind = meta.get("kind", "bi-encoder")
    if kind not in KINDS:
        raise ConfigError(f"{f}: unknown model kind {kind!r} (expected {' or '.join(KINDS)})")
    if "format" in meta:
        if meta["format"] != FORMAT or not isinstance(meta.get("format_version"), int):
            raise ConfigError(f"{f}: not a twostage model description; restore the model directory")
        if meta["format_version"] > FORMAT_VERSION:
            raise ConfigError(f"{f}: format version {meta['format_version']} is newer than this library reads "
                              f"({FORMAT_VERSION}); upgrade twostage")
        settings = meta.get("settings")
    elif kind == "bi-encoder":
        settings = meta.get("encoder", {})
    else:
        settings = {k: meta[k] for k in _LEGACY_CROSS if k in meta}
    training = meta.get("training", {})
    if not isinstance(settings, dict) or not isinstance(training, dict):
        raise ConfigError(f"{f}: settings and training must be objects; restore the model directory")
    return kind, settings, training
