"""Where the models run: ``cpu``, ``cuda`` (or ``cuda:N``), or ``auto`` (a CUDA GPU when torch sees one).

The device is a choice of the machine a model runs on, not of the engine: an engine built on a GPU opens on a CPU
and the other way round. On a GPU the OpenVINO precisions (a CPU runtime) and dynamic int8 (CPU kernels) do not
apply: ``auto`` precision means fp32 there, and asking for a CPU-only precision on a GPU is one ConfigError.
"""

from __future__ import annotations

from twostage.indexer.errors import ConfigError

DEVICES = ("auto", "cpu", "cuda")
CPU_ONLY = ("int8", "openvino-fp32", "openvino-int8")


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
