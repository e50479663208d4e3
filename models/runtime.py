"""OpenVINO inference for the bi-encoder and the cross-encoder: fp32, or int8 calibrated on the user's own texts.

A model runs in torch unless its precision names OpenVINO (``openvino-fp32``, ``openvino-int8``). Then its forward
pass (the bi-encoder's pooled, normalised embedding; the cross-encoder's logit) is converted to an OpenVINO model
once, int8 weights *and* activations quantised by NNCF (static quantisation: scales measured on calibration texts,
SmoothQuant, bias correction), and cached next to the model::

    MODEL_DIR/twostage-openvino/<precision>/manifest.json   format twostage.openvino-export: the sha256 of
                                        the weights it came from, precision, input names, calibration (count,
                                        sha256), files (sha256, bytes), library versions
    MODEL_DIR/twostage-openvino/<precision>/model.xml, model.bin

The export is used only while ``manifest.json`` names the sha256 of the model's current weights and every file
matches its checksum; a stale or damaged export is rebuilt, never used. Where the model directory is read-only the
cache lives under ``$TWOSTAGE_CACHE/openvino/<weights sha256>`` (sentence-transformers' own ``openvino/`` export
folder is another one). The saved model directory is untouched: sentence-transformers and transformers load it as
before.

This module imports torch only where it converts a model: a query encoded from an export
(:mod:`twostage.retriever.query_encoder`) reads and compiles it without torch.

Why int8 here: this runtime's int8 matrix products use the CPU's VNNI instructions, measured 2.7x torch's fp32
GEMM on the 2-core development machine (``benchmarks/results/inference_speed.md``), and the quantisation scales come
from the user's corpus (``calibration``), not from a public data set.
"""

from __future__ import annotations

import contextlib
import hashlib
import importlib.util
import io
import json
import logging
import os
import threading
import warnings
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from twostage.indexer.atomic import atomic_directory
from twostage.indexer.errors import ConfigError, IndexFormatError
from twostage.indexer.manifest import (
    check_file_entries,
    describe_files,
    manifest_text,
    read_manifest_json,
    verify_files,
)
from twostage.indexer.versions import writer_lock
from twostage.models.weights import ONE_TIME

logger = logging.getLogger(__name__)

OPENVINO_PRECISIONS = ("openvino-fp32", "openvino-int8")
FORMAT = "twostage.openvino-export"
FORMAT_VERSION = 1
CALIBRATION_SIZE = 300  # texts (or pairs) the int8 scales are measured on
SAMPLE = Path(__file__).resolve().parent.parent / "data" / "sample"  # the bundled sample (package data)

Calibration = Callable[[], Sequence[Mapping[str, np.ndarray]]]  # batches of tokenised features


def openvino_available() -> bool:
    """True when the ``openvino`` extra (openvino and nncf) is installed."""
    return importlib.util.find_spec("openvino") is not None and importlib.util.find_spec("nncf") is not None


def is_openvino(precision: str) -> bool:
    return precision in OPENVINO_PRECISIONS


def sample_texts(n: int = CALIBRATION_SIZE) -> list[str]:
    """Documents of the bundled sample collection: the calibration texts when the user gives none."""
    path = SAMPLE / "corpus.jsonl"
    texts = []
    with open(path, encoding="utf-8") as fh:
        for line in fh:
            row = json.loads(line)
            texts.append(f"{row.get('title', '')} {row.get('text', '')}".strip())
    return texts[:n]


def spread(items: Sequence[Any], n: int = CALIBRATION_SIZE) -> list[Any]:
    """At most ``n`` items spread evenly over ``items`` (deterministic)."""
    if len(items) <= n:
        return list(items)
    step = len(items) / n
    return [items[int(i * step)] for i in range(n)]


def traceable(model: Any, names: Sequence[str]) -> Any:
    """``model(features)`` as a torch module taking the tokenizer's tensors positionally (what the converter
    traces). torch is imported here, not with this module: a query encoded from an export never needs it."""
    import torch

    class Forward(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.model, self.names = model, tuple(names)

        def forward(self, *tensors: torch.Tensor) -> torch.Tensor:
            return self.model(dict(zip(self.names, tensors)))

    return Forward().eval()


class OpenVINORunner:
    """A compiled OpenVINO model: tokenised numpy features in, the first output as float32 out.

    The model is compiled with ``streams`` streams sharing the threads, and a call splits its rows into that many
    contiguous slices run at once, one per stream (``streams=1``: one stream over every thread). On 2 cores, two
    streams measured 1.02-1.04x one stream (``benchmarks/results/inference_speed.md``, ``openvino-int8:1-stream``):
    within noise, never slower. A call with fewer rows than streams (one query) runs on ``single``, the model
    compiled once more for latency with one stream over every thread (a query encoding: 5.5 vs 9 ms on 2 cores).
    Thread-safe: each calling thread has its own infer requests.
    """

    def __init__(self, compiled: Any, names: Sequence[str], where: Path, streams: int = 1,
                 single: Any = None, weights_sha256: str = "") -> None:
        self.compiled, self.names, self.where, self.streams = compiled, tuple(names), where, max(1, int(streams))
        self.single, self.weights_sha256 = single, weights_sha256  # the weights it was exported from
        self._local = threading.local()

    def __call__(self, features: Mapping[str, Any]) -> np.ndarray:
        arrays = [np.ascontiguousarray(np.asarray(features[n], dtype=np.int64)) for n in self.names]
        rows = len(arrays[0])
        if rows < self.streams and self.single is not None:
            request = getattr(self._local, "single", None)
            if request is None:
                request = self._local.single = self.single.create_infer_request()
            request.infer(arrays)
            return np.array(request.get_output_tensor(0).data, dtype=np.float32)
        requests = getattr(self._local, "requests", None)
        if requests is None:
            requests = self._local.requests = [self.compiled.create_infer_request() for _ in range(self.streams)]
        bounds = np.linspace(0, rows, max(1, min(self.streams, rows)) + 1).round().astype(int)
        used = requests[:len(bounds) - 1]
        for request, start, stop in zip(used, bounds[:-1], bounds[1:]):
            request.start_async([a[start:stop] for a in arrays])
        for request in used:
            request.wait()
        return np.concatenate([np.array(r.get_output_tensor(0).data, dtype=np.float32) for r in used])


_CORE: Any = None
_CORE_LOCK = threading.Lock()


def _core() -> Any:
    global _CORE
    with _CORE_LOCK:
        if _CORE is None:
            import openvino

            _CORE = openvino.Core()
        return _CORE


def export_root(model_dir: Path, weights_sha256: str) -> Path:
    """``MODEL_DIR/twostage-openvino``, or the user cache when the model directory cannot be written."""
    root = model_dir / "twostage-openvino"
    if os.access(model_dir, os.W_OK) and (not root.exists() or os.access(root, os.W_OK)):
        return root
    from twostage.models.weights import cache_dir

    return cache_dir() / "openvino" / weights_sha256


def fresh_export(where: Path, weights_sha256: str, precision: str,
                 names: Sequence[str] | None) -> dict[str, Any] | None:
    """The export's manifest when it was made from these weights in this precision (with these input ``names``;
    None: any) and every file checks out; None (with the reason logged) when it must be rebuilt."""
    data = fresh_cache(where, FORMAT, FORMAT_VERSION, "an OpenVINO export", ("model.xml", "model.bin"),
                       weights_sha256, precision, "exporting again")
    if data is not None and names is not None and list(data.get("inputs", ())) != list(names):
        logger.warning("%s was exported from other weights or settings; exporting again", where)
        return None
    return data


def fresh_cache(where: Path, fmt: str, version: int, what: str, files: Sequence[str], weights_sha256: str,
                precision: str, remedy: str) -> dict[str, Any] | None:
    """The manifest of a cache directory made from a model's weights (an export, a query side): of format ``fmt``,
    listing exactly ``files``, made from these weights in this precision, every file matching its checksum; None
    (the reason logged, ending in ``remedy``) when it must be made again."""
    if not (where / "manifest.json").is_file():
        return None
    try:
        data = read_manifest_json(where, fmt, version, what, "any OpenVINO precision")
        entries = check_file_entries(where / "manifest.json", data.get("files"))
        if set(entries) != set(files):
            raise IndexFormatError(f"{where}/manifest.json: files must be {' and '.join(files)}")
        if data.get("source_weights_sha256") != weights_sha256 or data.get("precision") != precision:
            logger.warning("%s was made from other weights or settings; %s", where, remedy)
            return None
        verify_files(where, entries)
    except IndexFormatError as exc:
        logger.warning("%s is damaged (%s); %s", where, exc, remedy)
        return None
    return data


def _features_hash(batches: Sequence[Mapping[str, np.ndarray]]) -> str:
    h = hashlib.sha256()
    for batch in batches:
        for name in sorted(batch):
            h.update(name.encode())
            h.update(np.ascontiguousarray(batch[name], dtype=np.int64).tobytes())
    return h.hexdigest()


def _export(module: Any, example: Mapping[str, Any], where: Path, weights_sha256: str,
            precision: str, calibration: Calibration | None) -> None:
    """Convert (and for int8 quantise) ``module`` (a torch module) into ``where``, atomically."""
    import openvino
    import torch

    names = list(example)
    with torch.inference_mode(), warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the tracer's notes on Python branches it fixes (BERT's shapes do not vary)
        model = openvino.convert_model(module, example_input=tuple(example[n] for n in names))
    for port, name in zip(model.inputs, names):
        port.get_tensor().set_names({name})
    calibrated: dict[str, Any] = {}
    if precision == "openvino-int8":
        import nncf

        batches = list(calibration() if calibration is not None else ())
        if not batches:
            raise ConfigError("openvino-int8 needs calibration texts; give some (or use openvino-fp32)")
        data = nncf.Dataset([tuple(np.asarray(b[n], dtype=np.int64) for n in names) for b in batches])
        nncf_log = logging.getLogger("nncf")
        level = nncf_log.level
        # the logger's level only: nncf.set_log_level also sets the level of every handler attached to it, which
        # may be the application's own (under pytest, the log capture's handlers stayed at ERROR afterwards)
        nncf_log.setLevel(logging.ERROR)
        try:  # NNCF draws its own progress bars on the console (rich); the library does not print
            with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
                model = nncf.quantize(model, data, model_type=nncf.ModelType.TRANSFORMER, subset_size=len(batches))
        finally:
            nncf_log.setLevel(level)
        calibrated = {"batches": len(batches), "rows": int(sum(len(b[names[0]]) for b in batches)),
                      "sha256": _features_hash(batches)}
    with atomic_directory(where) as tmp:
        openvino.save_model(model, tmp / "model.xml", compress_to_fp16=False)
        versions = {"openvino": openvino.get_version()}
        if calibrated:
            from importlib.metadata import version

            versions["nncf"] = version("nncf")
        (tmp / "manifest.json").write_text(manifest_text(
            FORMAT, FORMAT_VERSION, describe_files(tmp, ["model.xml", "model.bin"]), versions,
            source_weights_sha256=weights_sha256, precision=precision, inputs=names, calibration=calibrated),
            encoding="utf-8")


def openvino_runner(model: Any, example: Mapping[str, Any], model_dir: Path | None,
                    precision: str, calibration: Calibration | None = None,
                    threads: int | None = None, streams: int | None = None, kind: str = "") -> OpenVINORunner:
    """The OpenVINO model of ``model`` (a module whose forward takes the tokenizer's features as a dict; traced with
    ``example``), exported (or read from the cache if it was made from the same weights in ``model_dir``), compiled
    for this CPU: ``threads`` (default: torch's) shared by ``streams`` (default 2: what was measured on 2 cores; a
    single query then keeps half the threads on larger machines). ``kind`` names exports of other heads on the same
    weights (the token vectors of a bi-encoder read token by token: ``tokens``), kept apart from the model's own."""
    if model_dir is None:
        raise ConfigError(f"{precision} needs a model loaded from a directory (BiEncoder.load / CrossEncoder.load)")
    if not is_openvino(precision):
        raise ConfigError(f"not an OpenVINO precision: {precision!r}; use one of {', '.join(OPENVINO_PRECISIONS)}")
    if not openvino_available():
        raise ConfigError(f"precision {precision} needs OpenVINO: pip install 'twostage-search[openvino]' "
                          "(or choose fp32)")
    from twostage.models.weights import sha256_of_weights

    digest = sha256_of_weights(model_dir)
    root = export_root(model_dir, digest)
    where = root / (f"{kind}-{precision}" if kind else precision)
    names = list(example)
    with writer_lock(root):  # one process exports at a time; the others then read its export
        if fresh_export(where, digest, precision, names) is None:
            logger.info("exporting %s to OpenVINO %s: once per weights, about half a minute on 2 cores", model_dir,
                        precision, extra=ONE_TIME)
            _export(traceable(model, names), example, where, digest, precision, calibration)
            if fresh_export(where, digest, precision, names) is None:  # pragma: no cover - a broken writer
                raise IndexFormatError(f"{where}: the export just written does not verify; remove it and retry")
        ir = read_export(where)
    if threads is None:
        import torch

        threads = torch.get_num_threads()
    return compiled_runner(ir, names, where, precision, int(threads), streams, digest)


def compiled_runner(ir: Any, names: Sequence[str], where: Path, precision: str, threads: int,
                    streams: int | None = None, weights_sha256: str = "") -> OpenVINORunner:
    """An OpenVINO model read from ``where`` compiled for this CPU: ``threads`` shared by ``streams`` (default 2,
    at most ``threads``), and once more with one stream for single queries."""
    streams = min(2, threads) if streams is None else max(1, min(int(streams), threads))

    def compiled(n: int) -> Any:
        config: dict[str, Any] = {"PERFORMANCE_HINT": "THROUGHPUT" if n > 1 else "LATENCY", "NUM_STREAMS": n,
                                  "INFERENCE_NUM_THREADS": threads}
        if precision == "openvino-fp32":
            config["INFERENCE_PRECISION_HINT"] = "f32"  # never bf16 behind the user's back on bf16 machines
        return _core().compile_model(ir, "CPU", config)

    return OpenVINORunner(compiled(streams), names, where, streams, compiled(1) if streams > 1 else None,
                          weights_sha256)


def read_export(where: Path) -> Any:
    """The OpenVINO model of an export (checked by :func:`fresh_export` first)."""
    return _core().read_model(str(where / "model.xml"), str(where / "model.bin"))
