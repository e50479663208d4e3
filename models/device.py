"""Where and in what precision the models run: the device, ``cpu``, ``cuda`` (or ``cuda:N``), or ``auto`` (a CUDA
GPU when torch sees one), and the precision of each model's role, ``auto`` resolved per role and per machine.

The device is a choice of the machine a model runs on, not of the engine: an engine built on a GPU opens on a CPU
and the other way round. On a GPU the OpenVINO precisions (a CPU runtime) and dynamic int8 (CPU kernels) do not
apply: ``auto`` precision means fp32 there, and asking for a CPU-only precision on a GPU is one ConfigError.
"""

from __future__ import annotations

import sys
from pathlib import Path

from twostage.indexer.errors import ConfigError

PRECISIONS = ("auto", "fp32", "bf16", "int8", "openvino-fp32", "openvino-int8")  # an engine's precision setting

__all__ = ["CPU_ONLY", "DEVICES", "PRECISIONS", "ROLES", "bf16_for", "cpu_has_amx", "cpu_precision", "native_bf16",
           "precision_on", "release_freed_memory", "requested_device", "resolve_device", "resolve_precision",
           "resolve_precisions"]

DEVICES = ("auto", "cpu", "cuda")
CPU_ONLY = ("int8", "openvino-fp32", "openvino-int8")
ROLES = ("retriever", "reranker")


def requested_device(device: str | None = "auto") -> str:
    """``device`` checked and lower-cased without importing torch: ``auto`` and ``cpu`` as they are (``auto`` is
    resolved when a model first loads), ``cuda[:N]`` resolved now (a machine without one is told at once)."""
    name = (device or "auto").strip().lower()
    if name in ("auto", "cpu"):
        return name
    return resolve_device(name)


def resolve_device(device: str | None = "auto") -> str:
    """``cpu`` or ``cuda[:N]`` for a device name; ``cuda`` on a machine without a usable CUDA GPU is a ConfigError
    that says so."""
    import torch

    name = (device or "auto").strip().lower()
    if name == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    if name == "cpu":
        return "cpu"
    if name == "cuda" or name.startswith("cuda:"):
        if not torch.cuda.is_available():
            why = "this torch is a CPU build" if torch.version.cuda is None else "torch finds no CUDA GPU"
            raise ConfigError(f"device {device!r}: no CUDA GPU here ({why}); use --device cpu or --device auto")
        index = name.partition(":")[2]
        if index and (not index.isdigit() or int(index) >= torch.cuda.device_count()):
            raise ConfigError(f"device {device!r}: this machine has {torch.cuda.device_count()} CUDA GPU(s), "
                              f"numbered from 0")
        return name
    raise ConfigError(f"unknown device {device!r}; use cpu, cuda, cuda:N or auto")


def surely_cpu(device: str) -> bool:
    """Whether models asked to run on ``device`` (as :func:`requested_device` returns it) run on the CPU, answered
    without importing torch: ``cpu``, or ``auto`` where the machine has no GPU device node (``/dev/nvidia*``, AMD's
    ``/dev/kfd``, WSL's ``/dev/dxg``); in doubt, False (then torch decides)."""
    if device == "cpu":
        return True
    if device != "auto" or sys.platform != "linux":
        return sys.platform == "darwin" and device == "auto"  # torch has no CUDA on macOS
    dev = Path("/dev")
    return not any(dev.glob("nvidia*")) and not (dev / "kfd").exists() and not (dev / "dxg").exists()


def precision_on(device: str, precision: str) -> str:
    """The precision a model runs in on ``device`` (resolved): on a GPU, ``auto`` is fp32 and a CPU-only precision
    is refused; on the CPU the precision is left as it is (``auto`` resolved later, per role)."""
    if device == "cpu":
        return precision
    if precision == "auto":
        return "fp32"
    if precision in CPU_ONLY:
        raise ConfigError(f"precision {precision} runs on the CPU only; on {device} use fp32 or bf16 "
                          "(or --device cpu)")
    return precision


def cpu_has_amx() -> bool:
    """Whether this CPU has AMX, the tiles that compute bfloat16 fast (read from /proc/cpuinfo; False elsewhere)."""
    try:
        flags = Path("/proc/cpuinfo").read_text(encoding="utf-8", errors="replace")
    except OSError:
        return False
    return "amx_bf16" in flags


def native_bf16(device: str) -> bool:
    """Whether ``device`` (resolved: ``cpu`` or ``cuda[:N]``) computes bfloat16 in hardware: a CUDA GPU that supports
    it, a CPU with AMX. Elsewhere torch emulates it: on an AMD EPYC without AVX512-BF16 one MiniLM training step
    under bf16 autocast took 122.8 s against 5.7 s in fp32 (benchmarks/results/bf16_train_step.md)."""
    if device.startswith("cuda"):
        import torch

        return bool(torch.cuda.is_bf16_supported())
    return cpu_has_amx()


def bf16_for(choice: bool | None, device: str = "auto") -> bool:
    """A training configuration's ``bf16`` on ``device``: ``True``/``False`` as given; ``None`` (the default) means
    bf16 autocast where the device computes bf16 in hardware (:func:`native_bf16`), fp32 elsewhere."""
    return native_bf16(resolve_device(device)) if choice is None else bool(choice)


def cpu_precision(choice: bool | None) -> str:
    """The precision of an encoder a training run uses on the CPU (to mine negatives or to teach): ``bf16`` where
    :func:`bf16_for` says so for the CPU, else ``fp32``."""
    return "bf16" if bf16_for(choice, "cpu") else "fp32"


def resolve_precision(precision: str, role: str, device: str = "cpu") -> str:
    """The precision a model in ``role`` (``retriever`` or ``reranker``) runs in on ``device`` (resolved: ``cpu``
    or ``cuda[:N]``; on a GPU, :func:`precision_on` decides). ``auto`` on the CPU,
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


def release_freed_memory() -> None:
    """Hand the heap that finished work freed back to the system (glibc's ``malloc_trim``; elsewhere nothing).

    A training step's activations are freed when it ends but glibc keeps the pages, so a process that trains, then
    encodes, then trains again holds the sum of its phases' peaks; trimming after each phase holds their maximum."""
    import ctypes
    import gc

    gc.collect()
    if sys.platform.startswith("linux"):
        try:
            ctypes.CDLL("libc.so.6").malloc_trim(0)
        except (OSError, AttributeError):  # musl and other libcs: no malloc_trim, nothing to do
            pass
