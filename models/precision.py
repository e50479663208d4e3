"""Which precision each model of an engine runs in: ``auto`` resolved per role and per machine."""

from __future__ import annotations

from twostage.indexer.engine_dir import PRECISIONS
from twostage.indexer.errors import ConfigError
from twostage.models.device import cpu_has_amx, precision_on

__all__ = ["PRECISIONS", "ROLES", "resolve_precision", "resolve_precisions"]

ROLES = ("retriever", "reranker")


def resolve_precision(precision: str, role: str, device: str = "cpu") -> str:
    """The precision a model in ``role`` (``retriever`` or ``reranker``) runs in on ``device`` (resolved: ``cpu``
    or ``cuda[:N]``; on a GPU, :func:`twostage.models.device.precision_on` decides). ``auto`` on the CPU,
    measured on the SciFact one-command models (``benchmarks/results/inference_speed.md``):

    - with the ``openvino`` extra installed: the retriever in ``openvino-fp32`` and the reranker in ``openvino-int8``
      (calibrated on the corpus). int8 keeps the reranker's nDCG@10, but costs a fine-tuned bi-encoder 0.007 dense
      nDCG@10; OpenVINO fp32 is the fastest encoder that keeps it;
    - else ``bf16`` where the CPU has AMX (without AMX, torch's bf16 ran at 0.64-0.70x fp32 on an AVX512-BF16
      machine), else ``fp32``.
    """
    if role not in ROLES:
        raise ConfigError(f"role must be one of {', '.join(ROLES)}, got {role!r}")
    precision = precision_on(device, precision)
    if precision != "auto":
        return precision
    import importlib.util

    if importlib.util.find_spec("openvino") is not None and importlib.util.find_spec("nncf") is not None:
        return "openvino-int8" if role == "reranker" else "openvino-fp32"
    return "bf16" if cpu_has_amx() else "fp32"


def resolve_precisions(precision: str, device: str = "cpu") -> dict[str, str]:
    """Each role's precision on ``device`` (:func:`resolve_precision`), by role."""
    return {role: resolve_precision(precision, role, device) for role in ROLES}
