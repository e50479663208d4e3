"""Encoding throughput: BiEncoder.encode (fp32, bf16, int8) against SentenceTransformer.encode, same run.

Usage (from the repository root): python benchmarks/experiments/encode_speed.py [--docs 1024] [--rounds 3]

Same model (all-MiniLM-L6-v2, or --model), same texts (the first --docs SciFact documents, title + text),
max length 256, batch 32, both cores. The engines run in alternation, round after round, so a passing
load on the machine hits them alike; the table gives the median documents per second and the ratio to
sentence-transformers. Quality of each precision is measured by benchmarks/experiments/dense_scifact.py --stage precision.
"""

from __future__ import annotations

import argparse
import os
import time
from pathlib import Path

import numpy as np

os.environ.setdefault("HF_HUB_OFFLINE", "1")

from twostage.eval.report import versions  # noqa: E402
from twostage.indexer.beir import BeirDataset  # noqa: E402
from twostage.retriever.biencoder import BiEncoder  # noqa: E402
from twostage.retriever.weights import resolve_model  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="all-MiniLM-L6-v2")
    parser.add_argument("--docs", type=int, default=1024)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--data", type=Path, default=Path("../shared/data/scifact"))
    args = parser.parse_args()
    from sentence_transformers import SentenceTransformer

    texts = [d.full_text for d in BeirDataset(args.data).corpus][: args.docs]
    st = SentenceTransformer(str(resolve_model(args.model)), device="cpu")
    st.max_seq_length = 256
    ours = {p: BiEncoder.load(args.model, precision=p, max_length=256) for p in ("fp32", "bf16", "int8")}
    engines = {"sentence-transformers": lambda: st.encode(texts, batch_size=32),
               **{f"twostage {p}": (lambda e=e: e.encode(texts, batch_size=32)) for p, e in ours.items()}}
    rates: dict[str, list[float]] = {n: [] for n in engines}
    for _ in range(args.rounds):
        for name, fn in engines.items():
            t0 = time.perf_counter()
            fn()
            rates[name].append(len(texts) / (time.perf_counter() - t0))
            print(name, f"{rates[name][-1]:.1f}", flush=True)
    med = {n: float(np.median(v)) for n, v in rates.items()}
    base = med["sentence-transformers"]
    lines = [f"# Encoding throughput: {args.model}, {len(texts)} SciFact documents (title + text, max length 256)\n",
             f"Command: `python benchmarks/experiments/encode_speed.py --docs {args.docs} --rounds {args.rounds}`\n",
             f"Batch 32, {os.cpu_count()} cores, engines alternating; median of {args.rounds} rounds.\n",
             "| engine | documents/s | x sentence-transformers | rounds |", "|---|---|---|---|"]
    for n in engines:
        lines.append(f"| {n} | {med[n]:.1f} | {med[n] / base:.2f}x | {', '.join(f'{r:.1f}' for r in rates[n])} |")
    lines.append("\nVersions: " + ", ".join(f"{k} {v}" for k, v in versions().items()) + "\n")
    Path("benchmarks/results/encode_speed.md").write_text("\n".join(lines))
    print("\n".join(lines))


if __name__ == "__main__":
    main()
