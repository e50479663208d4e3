"""One training step of the base bi-encoder in fp32 and under bf16 autocast, on this machine's CPU.

Usage (from the repository root): python benchmarks/experiments/bf16_train_step.py [--rounds 2] [--texts 32] [--words 200]

Why: the training recipe ran under bf16 autocast by default. On a CPU without bf16 in hardware (no AMX, no
AVX512-BF16) torch emulates it, and `twostage bench --train-split train` crawled at 317 s a step. Training now
autocasts only where the device computes bf16 natively (twostage.retriever.device.bf16_for). This measures the
gap: forward + backward + AdamW step of all-MiniLM-L6-v2 on ``--texts`` texts of ``--words`` words (256 tokens),
the two modes alternating, ``--rounds`` times; the report names the CPU and whether it has AMX / AVX512-BF16.
"""

from __future__ import annotations

import argparse
import platform
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]


def cpu() -> tuple[str, str]:
    try:
        info = Path("/proc/cpuinfo").read_text(encoding="utf-8", errors="replace")
    except OSError:
        return platform.processor() or "unknown", "unknown"
    name = next((line.split(":", 1)[1].strip() for line in info.splitlines() if line.startswith("model name")), "?")
    flags = [f for f in ("amx_bf16", "avx512_bf16") if f in info]
    return name, ", ".join(flags) or "neither amx_bf16 nor avx512_bf16"


def texts(n: int, words: int) -> list[str]:
    """``n`` synthetic texts of ``words`` words (biomedical vocabulary, no two alike)."""
    vocab = "cell protein gene expression tumour patient study result effect level increase".split()
    return [" ".join(vocab[(i + j) % len(vocab)] for j in range(words)) for i in range(n)]


def train_step(model: Any, batch: Any, optimizer: Any, bf16: bool = False) -> float:
    """Seconds of one forward (mean-pooled squared activations as the loss), backward and optimizer step."""
    import torch

    t0 = time.perf_counter()
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
        loss = model(**batch).last_hidden_state.mean(1).pow(2).mean()
    loss.backward()
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    return time.perf_counter() - t0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--texts", type=int, default=32)
    parser.add_argument("--words", type=int, default=200)
    parser.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results" / "bf16_train_step.md")
    args = parser.parse_args()
    import torch
    from transformers import AutoModel, AutoTokenizer

    from twostage.retriever.weights import resolve_model

    path = resolve_model("all-MiniLM-L6-v2")
    tokenizer, model = AutoTokenizer.from_pretrained(path), AutoModel.from_pretrained(path)
    batch = tokenizer(texts(args.texts, args.words), padding=True, truncation=True, max_length=256,
                      return_tensors="pt")
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-5)
    times: dict[str, list[float]] = {"fp32": [], "bf16 autocast": []}
    for _ in range(args.rounds):
        for mode in times:
            times[mode].append(train_step(model, batch, optimizer, bf16=mode != "fp32"))
            print(f"{mode}: {times[mode][-1]:.1f} s", flush=True)
    name, flags = cpu()
    best = {m: min(t) for m, t in times.items()}
    lines = ["# One training step: fp32 against bf16 autocast on the CPU", "",
             f"Command: `python benchmarks/experiments/bf16_train_step.py --rounds {args.rounds} --texts {args.texts} "
             f"--words {args.words}`", "",
             f"CPU: {name} ({flags}), {torch.get_num_threads()} threads, torch {torch.__version__}. all-MiniLM-L6-v2, "
             f"{args.texts} texts of {batch['input_ids'].shape[1]} tokens: forward, backward and an AdamW step; the "
             "two modes alternate.", "",
             "| mode | seconds per step (each round) | best |", "| --- | --- | --- |"]
    lines += [f"| {m} | {', '.join(f'{x:.1f}' for x in t)} | {best[m]:.1f} |" for m, t in times.items()]
    lines += ["", f"bf16 autocast / fp32: **{best['bf16 autocast'] / best['fp32']:.1f}x** the time of a step. "
              "Training therefore autocasts only where the device computes bf16 in hardware "
              "(`twostage.retriever.device.bf16_for`; `--bf16` forces it)."]
    args.out.write_text("\n".join(lines) + "\n", encoding="utf-8")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
