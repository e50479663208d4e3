"""The models an engine searches with: loaded on first use (once, across threads), their weights checked against
the sha256 the engine's manifest recorded, shared by every version and view of the engine that names the same
weights."""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from twostage.engine.on_disk import EngineManifest, ModelRef
from twostage.indexer.errors import ConfigError
from twostage.models.device import resolve_device, resolve_precision


def verified_model_dir(ref: ModelRef, role: str) -> Path:
    """The directory of a model the engine names, after checking its weights are the ones it was built with."""
    from twostage.models.weights import resolve_model, sha256_of_weights

    path = Path(ref.path) if Path(ref.path).is_dir() else resolve_model(ref.name)
    digest = sha256_of_weights(path)
    if digest != ref.sha256:
        raise ConfigError(f"{role} {ref.name!r} at {path}: its weights' sha256 {digest[:12]}... no longer matches the "
                          f"engine's {ref.sha256[:12]}...; restore that model, or rebuild the engine with it")
    return path


@dataclass
class Models:
    """Models loaded on first use (info, delete and compact never need them), once even across threads."""

    encoder: Any = None
    reranker: Any = None
    late: Any = None  # the late-interaction encoder (MaxSim's query token vectors)
    query: Any = None  # the retriever's query side without torch (QueryEncoder); False: none to be had
    lock: threading.Lock = field(default_factory=threading.Lock)
    requested_device: str = "cpu"  # where they run: cpu, cuda[:N], or auto (resolved on first use, with torch)
    weights: tuple[str, str | None, str | None] | None = None  # the sha256 of the retriever's, reranker's and
    # late-interaction model's weights they are
    # the engine's own models, for a view's (with_reranker): a model the view loads is loaded there, once for every view
    parent: Models | None = field(default=None, repr=False)
    _device: str | None = field(default=None, repr=False)

    @property
    def device(self) -> str:
        """Where the models run, resolved (``cpu`` or ``cuda[:N]``): importing torch, so an engine that never loads
        a model (BM25 searches, info, deletes) never imports it."""
        if self._device is None:
            self._device = resolve_device(self.requested_device)
        return self._device

    @property
    def device_as_known(self) -> str:
        """The device, resolved if it already was, else as requested (for new Models on the same device)."""
        return self._device or self.requested_device

    def for_manifest(self, manifest: EngineManifest) -> Models:
        """These models for a version naming ``manifest``'s models (the first version they serve claims them), or
        fresh ones on the same device when it names other weights (a version written by a model swap)."""
        weights = (manifest.retriever.sha256 if manifest.retriever else NO_RETRIEVER,
                   manifest.reranker.sha256 if manifest.reranker else None,
                   manifest.late.sha256 if manifest.late else None)
        with self.lock:
            if self.weights is None:
                self.weights = weights
            if self.weights == weights:
                return self
        return Models(requested_device=self.device_as_known, weights=weights)

    def loaded(self, slot: str, ref: ModelRef, role: str, loader: Callable[..., Any], precision: str) -> Any:
        """The model in ``slot`` (``encoder``, ``reranker`` or ``late``; ``role`` retriever or reranker), loaded on
        first use (once, across threads) from the directory ``ref`` names, after its weights are checked against
        ``ref``'s sha256, in ``precision`` (an engine setting, ``auto`` resolved for the role and device)."""
        if getattr(self, slot) is None and self.parent is not None:
            setattr(self, slot, self.parent.loaded(slot, ref, role, loader, precision))
        if getattr(self, slot) is None:
            with self.lock:
                if getattr(self, slot) is None:
                    setattr(self, slot, loader(verified_model_dir(ref, role),
                                               precision=resolve_precision(precision, role, self.device),
                                               device=self.device, trust_remote_code=ref.trust_remote_code))
        return getattr(self, slot)


def query_encoder(models: Models, ref: ModelRef, precision: str) -> Any:
    """The retriever's queries encoded without torch (:class:`~twostage.retriever.query_encoder.QueryEncoder`, from
    the OpenVINO export the full model wrote), or None: the bi-encoder is loaded already (it encodes them), the
    models may run on a GPU, the precision is not OpenVINO's, the model runs code of its own
    (``trust_remote_code``), or the export is missing, stale or damaged. Opened
    once (across threads); its weights are the ones the export's manifest names, checked against ``ref``'s sha256,
    so the weights file itself is never read."""
    if models.encoder is not None:
        return None
    if models.query is None:
        with models.lock:
            if models.query is None:
                models.query = _open_query_side(models, ref, precision) or False
    return models.query or None


def _open_query_side(models: Models, ref: ModelRef, precision: str) -> Any:
    from twostage.models.device import surely_cpu
    from twostage.models.weights import resolve_model
    from twostage.retriever.query_encoder import QueryEncoder

    if models.encoder is not None or ref.trust_remote_code or not surely_cpu(models.device_as_known):
        return None  # (a model with code of its own may tokenise in Python: it loads as it was built)
    resolved = resolve_precision(precision, "retriever", "cpu")
    try:
        path = Path(ref.path) if Path(ref.path).is_dir() else resolve_model(ref.name)
    except (ConfigError, OSError):
        return None
    return QueryEncoder.open(path, ref.sha256, resolved, name=ref.name)


NO_RETRIEVER = "none"  # the retriever's name (and weights) in an engine built without one


class NoRetriever:
    """The retriever of an engine built without one (BM25 only, with or without a reranker): every text becomes a
    vector of width 0, so the document store, its filters and every update work as in any engine, and nothing is
    encoded. The engine refuses dense and hybrid searches before they get here."""

    name = NO_RETRIEVER
    dim = 0
    truncated = 0

    def encode(self, texts: Any, kind: str = "document", batch_size: int = 32, **_: Any) -> np.ndarray:
        return np.zeros((len(texts), 0), dtype=np.float32)

    def info(self) -> Any:
        from twostage.indexer.manifest import EncoderInfo

        return EncoderInfo(name=NO_RETRIEVER, dim=0, normalize=False)
