"""A bi-encoder's query side without torch: what a cold search needs, and nothing of the training stack (#81).

A cold ``twostage search`` spent most of its 6.5 s importing torch and transformers and loading the model, to
encode one query. A bi-encoder that runs in OpenVINO (the CPU's ``auto`` precision when the ``openvino`` extra is
installed) already has its forward pass exported (:mod:`twostage.models.runtime`); when it loads, it also writes
its query side next to that export::

    EXPORT_ROOT/query-<precision>/manifest.json   format twostage.query-side: the sha256 of the weights,
                                        precision, settings (max_length, query prefix, padding and truncation
                                        sides, pad ids), files (sha256, bytes)
    EXPORT_ROOT/query-<precision>/tokenizer.json  the tokenizer exactly as transformers configured it

:meth:`QueryEncoder.open` reads that with the ``tokenizers`` library and compiles the export with one stream (a
query's latency), importing neither torch nor transformers. Both manifests must name the weights the engine was
built with and every file must match its checksum; anything missing, stale or damaged, and the engine loads the
full bi-encoder instead (which writes them again). The query vectors are the ones the full model's OpenVINO runtime
gives: the same export, the same tokens.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from twostage.indexer.atomic import atomic_directory
from twostage.indexer.errors import ConfigError, IndexFormatError
from twostage.indexer.manifest import describe_files, manifest_text
from twostage.indexer.versions import writer_lock
from twostage.models.runtime import (
    compiled_runner,
    export_root,
    fresh_cache,
    fresh_export,
    is_openvino,
    read_export,
)

logger = logging.getLogger(__name__)

FORMAT = "twostage.query-side"
FORMAT_VERSION = 1
INPUTS = ("input_ids", "token_type_ids", "attention_mask")


@dataclass(frozen=True)
class QuerySide:
    """How a bi-encoder turns a query into the export's inputs."""

    max_length: int
    query_prefix: str = ""
    pad_id: int = 0
    pad_type_id: int = 0
    padding_side: str = "right"
    truncation_side: str = "right"

    def __post_init__(self) -> None:
        if isinstance(self.max_length, bool) or not isinstance(self.max_length, int) or self.max_length < 2:
            raise IndexFormatError(f"query side: max_length must be an integer >= 2, got {self.max_length!r}")
        for side in (self.padding_side, self.truncation_side):
            if side not in ("left", "right"):
                raise IndexFormatError(f"query side: a side must be left or right, got {side!r}")
        if not isinstance(self.query_prefix, str):
            raise IndexFormatError("query side: query_prefix must be a string")
        for pad in (self.pad_id, self.pad_type_id):
            if isinstance(pad, bool) or not isinstance(pad, int) or pad < 0:
                raise IndexFormatError(f"query side: pad ids must be integers >= 0, got {pad!r}")


def query_side_dir(model_dir: Path, weights_sha256: str, precision: str) -> Path:
    return export_root(model_dir, weights_sha256) / f"query-{precision}"


def save_query_side(model_dir: Path, weights_sha256: str, precision: str, tokenizer_json: str,
                    side: QuerySide) -> None:
    """Write the query side of a bi-encoder loaded from ``model_dir`` in ``precision`` (atomically), unless a fresh
    one is there: ``tokenizer_json`` is its tokenizer as transformers configured it (``backend.to_str()``)."""
    where = query_side_dir(model_dir, weights_sha256, precision)
    try:
        with writer_lock(where.parent):  # one writer at a time, as the export beside it
            if _fresh(where, weights_sha256, precision) is not None:
                return
            with atomic_directory(where) as tmp:
                (tmp / "tokenizer.json").write_text(tokenizer_json, encoding="utf-8")
                (tmp / "manifest.json").write_text(manifest_text(
                    FORMAT, FORMAT_VERSION, describe_files(tmp, ["tokenizer.json"]), {},
                    source_weights_sha256=weights_sha256, precision=precision, settings=side.__dict__),
                    encoding="utf-8")
    except OSError as exc:  # a read-only cache: searches load the full model, as before
        logger.warning("%s: the query side could not be written (%s); cold searches load the full model", where, exc)


def _fresh(where: Path, weights_sha256: str, precision: str) -> QuerySide | None:
    """The query side in ``where`` when it was written for these weights and precision and its file checks out."""
    data = fresh_cache(where, FORMAT, FORMAT_VERSION, "a query side", ("tokenizer.json",), weights_sha256, precision,
                       "the full model writes it again")
    if data is None:
        return None
    settings = data.get("settings")
    try:
        if not isinstance(settings, dict) or set(settings) - set(QuerySide.__dataclass_fields__):
            raise IndexFormatError(f"{where}/manifest.json: settings must be an object of the query side's fields")
        return QuerySide(**settings)
    except (IndexFormatError, TypeError) as exc:
        logger.warning("%s is damaged (%s); the full model writes it again", where, exc)
        return None


class QueryEncoder:
    """A bi-encoder's queries encoded from its OpenVINO export (see the module's docstring); ``encode`` as
    :meth:`~twostage.retriever.biencoder.BiEncoder.encode` for ``kind="query"``."""

    def __init__(self, tokenizer: Any, runner: Any, side: QuerySide, names: Sequence[str], dim: int,
                 name: str = "") -> None:
        self.tokenizer, self.runner, self.side, self.names, self.dim = tokenizer, runner, side, tuple(names), dim
        self.name = name
        self.truncated = 0  # queries cut at max_length by the last encode call
        tokenizer.no_padding()
        tokenizer.enable_truncation(side.max_length + 1, direction=side.truncation_side)

    @classmethod
    def open(cls, model_dir: Path, weights_sha256: str, precision: str, threads: int | None = None,
             name: str = "") -> QueryEncoder | None:
        """The query encoder of the bi-encoder in ``model_dir`` (weights ``weights_sha256``, the engine's record),
        or None where its export or query side is missing, stale or damaged, or OpenVINO is not installed."""
        if not is_openvino(precision):
            return None
        try:
            import openvino  # noqa: F401
            import tokenizers
        except ImportError:
            return None
        root = export_root(model_dir, weights_sha256)
        side = _fresh(root / f"query-{precision}", weights_sha256, precision)
        export = root / precision
        data = fresh_export(export, weights_sha256, precision, None) if side is not None else None
        if side is None or data is None:
            return None
        names = [str(n) for n in data.get("inputs", ())]
        if not names or set(names) - set(INPUTS) or "input_ids" not in names:
            logger.warning("%s: inputs %s are not a bi-encoder's; the full model is loaded", export, names)
            return None
        try:
            tokenizer = tokenizers.Tokenizer.from_file(str(root / f"query-{precision}" / "tokenizer.json"))
            ir = read_export(export)
            dim = ir.outputs[0].get_partial_shape()[-1]
            runner = compiled_runner(ir, names, export, precision, int(threads or _cores()), streams=1)
        except Exception as exc:  # noqa: BLE001 - any unreadable part: the full model takes over
            logger.warning("%s: the query side does not load (%s); the full model is loaded", root, exc)
            return None
        if not dim.is_static:
            return None
        return cls(tokenizer, runner, side, names, int(dim.get_length()), name=name)

    @property
    def max_length(self) -> int:
        return self.side.max_length

    def features(self, texts: Sequence[str]) -> dict[str, np.ndarray]:
        """Queries (with the prefix) as the export's padded int64 inputs; ``truncated`` counts those cut."""
        encodings = self.tokenizer.encode_batch([self.side.query_prefix + t for t in texts])
        limit = self.side.max_length
        rows: list[tuple[list[int], list[int]]] = []
        self.truncated = 0
        for e in encodings:
            ids, types, special = list(e.ids), list(e.type_ids), list(e.special_tokens_mask)
            if len(ids) > limit:  # tokenised at limit + 1: the last content token dropped, as the bi-encoder does
                self.truncated += 1  # (twostage.models.base.tokenize_once)
                drop = max(i for i, s in enumerate(special) if not s)
                del ids[drop], types[drop]
            rows.append((ids, types))
        width = max(len(ids) for ids, _ in rows)
        out = {n: np.zeros((len(rows), width), dtype=np.int64) for n in INPUTS}
        out["input_ids"][:] = self.side.pad_id
        out["token_type_ids"][:] = self.side.pad_type_id
        for r, (ids, types) in enumerate(rows):
            at = slice(0, len(ids)) if self.side.padding_side == "right" else slice(width - len(ids), width)
            out["input_ids"][r, at], out["token_type_ids"][r, at], out["attention_mask"][r, at] = ids, types, 1
        return {n: out[n] for n in self.names}

    def encode(self, texts: Sequence[str], *, kind: str = "query", batch_size: int = 32,
               **_: Any) -> np.ndarray:
        """Embeddings of queries as float32 (n, dim), in input order, ``batch_size`` at a time."""
        if kind != "query":
            raise ConfigError(f"the query encoder encodes queries only, not {kind!r}; load the bi-encoder")
        texts = [str(t) for t in texts]
        out = np.empty((len(texts), self.dim), dtype=np.float32)
        truncated = 0
        for start in range(0, len(texts), max(1, int(batch_size))):
            chunk = texts[start:start + batch_size]
            out[start:start + len(chunk)] = self.runner(self.features(chunk))
            truncated += self.truncated
        self.truncated = truncated
        return out

    def longer_than_read(self, texts: Sequence[str], kind: str = "query") -> int:
        """How many of the queries are longer than ``max_length`` tokens (encode reads their beginning)."""
        self.features(list(texts))
        return self.truncated


def _cores() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # pragma: no cover - not Linux
        return os.cpu_count() or 1


def query_side_of(tokenizer: Any, max_length: int, query_prefix: str) -> tuple[str, QuerySide] | None:
    """The query side of a transformers tokenizer (its backend's JSON and how queries are padded and cut), or None
    for a tokenizer without a ``tokenizers`` backend."""
    backend = getattr(tokenizer, "backend_tokenizer", None) or getattr(tokenizer, "_tokenizer", None)
    if backend is None or not hasattr(backend, "to_str"):
        return None
    pad = tokenizer.pad_token_id
    side = QuerySide(max_length=int(max_length), query_prefix=query_prefix, pad_id=int(pad or 0),
                     pad_type_id=int(getattr(tokenizer, "pad_token_type_id", 0) or 0),
                     padding_side=str(getattr(tokenizer, "padding_side", "right")),
                     truncation_side=str(getattr(tokenizer, "truncation_side", "right")))
    return backend.to_str(), side

