"""STS: Spearman x100 of cosine similarity against gold scores, zero-shot and after NLI training.

Usage (from the repository root): python benchmarks/experiments/sts.py [--data ../shared/data] [--epochs 1]

The NLI run trains all-MiniLM-L6-v2 with MultipleNegativesRankingLoss on (premise, entailed hypothesis,
contradicting hypothesis) triplets from snli-devtest (dev + test) and SICK train, the Sentence-BERT NLI
recipe on the NLI data available here (SNLI's train split is not). STS-b and SICK test are never trained on.
"""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")

from twostage.eval.report import versions  # noqa: E402
from twostage.eval.sts import sts_spearman  # noqa: E402
from twostage.retriever.biencoder import BiEncoder  # noqa: E402
from twostage.retriever.trainer import TrainConfig, train  # noqa: E402
from twostage.retriever.training_data import nli_triplets  # noqa: E402

OUT = Path("benchmarks/results/sts.md")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data", type=Path, default=Path("../shared/data"))
    parser.add_argument("--epochs", type=int, default=1)
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--model-dir", type=Path, default=Path("runs/models/minilm-nli"))
    args = parser.parse_args()
    tests = {"STS-b test": args.data / "stsb" / "test.jsonl", "SICK test": args.data / "sick" / "test.jsonl"}
    base = BiEncoder.load("all-MiniLM-L6-v2")
    rows = {"all-MiniLM-L6-v2 zero-shot": {n: sts_spearman(base, p) for n, p in tests.items()}}
    nli = nli_triplets([args.data / "snli-devtest" / "dev.jsonl", args.data / "snli-devtest" / "test.jsonl",
                        args.data / "sick" / "train.jsonl"])
    config = TrainConfig(epochs=args.epochs, batch_size=args.batch_size, lr=2e-5, bf16=True, checkpoint_every=200)
    t0 = time.perf_counter()
    train(base, [nli], config, args.model_dir)
    seconds = time.perf_counter() - t0
    trained = BiEncoder.load(args.model_dir)
    name = f"+ NLI MNRL ({len(nli.examples)} triplets, {args.epochs} epoch, bs {args.batch_size}, {seconds:.0f} s)"
    rows[name] = {n: sts_spearman(trained, p) for n, p in tests.items()}
    lines = ["# STS: Spearman x100 of cosine similarity\n",
             f"Command: `python benchmarks/experiments/sts.py --epochs {args.epochs}`\n",
             "SBERT paper, STS-b test: BERT CLS 16.50, BERT mean 46.35, SBERT-NLI-base 77.03.\n",
             "| model | " + " | ".join(tests) + " |", "|---|" + "---|" * len(tests)]
    for model, scores in rows.items():
        lines.append(f"| {model} | " + " | ".join(f"{scores[n]:.2f}" for n in tests) + " |")
    lines.append("\nVersions: " + ", ".join(f"{k} {v}" for k, v in versions().items()) + "\n")
    OUT.write_text("\n".join(lines))
    (OUT.with_suffix(".json")).write_text(json.dumps(rows, indent=2) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
