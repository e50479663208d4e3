"""One MaxSim training step, plain against GradCache: peak memory and seconds (SciFact train, a trained MaxSim model).

    python benchmarks/experiments/maxsim_train_step.py --model MAXSIM_MODEL_DIR [--modes 0 32 16] [--rounds 2] \
        [--batch-size 32 --negatives 3] [--out benchmarks/results/maxsim_train_step.md]

A batch is ``--batch-size`` SciFact train queries (seeded), each with a relevant document and ``--negatives`` other
documents drawn at random, cut at the model's document length, as the MaxSim objective reads them
(``twostage.retriever.objectives``). Each mode (0: the plain loss; N: GradCache with N texts a forward pass,
``TrainConfig.mini_batch_size``) runs in a process of its own, so its peak resident memory (``ru_maxrss``) is its
own: the model loaded in train mode, then the loss and its backward pass (no optimizer step) twice, timed. The modes
alternate, ``--rounds`` times.
"""

from __future__ import annotations

import argparse
import json
import random
import resource
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def one(model_dir: str, data: Path, mode: int, batch_size: int, negatives: int) -> dict[str, object]:
    import torch

    from twostage import BeirDataset
    from twostage.retriever.examples import PairExample
    from twostage.retriever.late import LateEncoder
    from twostage.retriever.objectives import OBJECTIVES
    from twostage.retriever.trainer import TrainConfig

    ds = BeirDataset(data)
    split = ds.split("train")
    texts = [d.full_text for d in ds.corpus]
    rng = random.Random(0)
    queries = rng.sample(list(split.queries), batch_size)
    batch = [PairExample(anchor=q.text, positive=ds.corpus.get(sorted(split.qrels.relevant(q.id))[0]).full_text,
                         negatives=tuple(rng.sample(texts, negatives))) for q in queries]
    model = LateEncoder.load(model_dir)
    model.train(True)
    torch.manual_seed(0)
    config = TrainConfig(mini_batch_size=mode)
    objective = OBJECTIVES["maxsim"]
    loss_fn = objective.build(model, 0, config)
    seconds = []
    for _ in range(2):
        t = time.perf_counter()
        objective.compute(loss_fn, model, batch, config).backward()
        seconds.append(time.perf_counter() - t)
        model.zero_grad()
    return {"mode": mode, "seconds": seconds, "peak_gb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1e6}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", required=True, help="a late-interaction model directory")
    ap.add_argument("--data", type=Path, default=ROOT.parent / "shared" / "data" / "scifact")
    ap.add_argument("--modes", type=int, nargs="+", default=[0, 32, 16], help="0: plain; N: GradCache, N texts")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--batch-size", type=int, default=32)
    ap.add_argument("--negatives", type=int, default=3)
    ap.add_argument("--out", type=Path, default=None)
    ap.add_argument("--one", type=int, default=None, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.one is not None:
        print(json.dumps(one(args.model, args.data, args.one, args.batch_size, args.negatives)))
        return
    rows: dict[int, list[dict[str, object]]] = {m: [] for m in args.modes}
    for _ in range(args.rounds):
        for mode in args.modes:
            cmd = [sys.executable, __file__, "--model", args.model, "--data", str(args.data), "--one", str(mode),
                   "--batch-size", str(args.batch_size), "--negatives", str(args.negatives)]
            rows[mode].append(json.loads(subprocess.run(cmd, check=True, stdout=subprocess.PIPE, text=True)
                                         .stdout.strip().splitlines()[-1]))
    import torch

    docs = args.batch_size * (1 + args.negatives)
    lines = [f"# One MaxSim training step: plain against GradCache ({args.batch_size} queries, {docs} documents)", "",
             "Command: `python benchmarks/experiments/maxsim_train_step.py " + " ".join(sys.argv[1:]) + "`", "",
             f"torch {torch.__version__}, {torch.get_num_threads()} threads. Each mode in a process of its own, the "
             "modes alternating; a step is the loss and its backward pass, twice a process.", "",
             "| mode | peak RSS GB (each round) | seconds a step (each) | best | best / plain |", "| --- | --- | --- | --- | --- |"]
    plain = min(s for r in rows.get(0, []) for s in r["seconds"]) if 0 in rows else None  # type: ignore[union-attr]
    for mode, runs in rows.items():
        secs = [s for r in runs for s in r["seconds"]]  # type: ignore[attr-defined]
        name = "plain MaxSimLoss" if mode == 0 else f"GradCache, {mode} texts a forward pass"
        ratio = f"{min(secs) / plain:.2f}x" if plain else "-"
        peaks = ", ".join(f"{r['peak_gb']:.2f}" for r in runs)
        each = ", ".join(f"{s:.1f}" for s in secs)
        lines.append(f"| {name} | {peaks} | {each} | {min(secs):.1f} | {ratio} |")
    text = "\n".join(lines) + "\n"
    print(text)
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(text)


if __name__ == "__main__":
    main()
