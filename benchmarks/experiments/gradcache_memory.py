"""Peak memory of one training step at a large batch: plain MNRL against GradCache.

Usage (from the repository root): python benchmarks/experiments/gradcache_memory.py [--batch 256] [--mini 32]

One step of all-MiniLM-L6-v2 on SciFact (query, relevant document) pairs, documents up to 256 tokens, each
variant in its own process so its peak resident memory (ru_maxrss) is its own. Also checks that both give
the same loss.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))


def step(batch: int, mini: int) -> dict:
    import torch

    from twostage.indexer.beir import BeirDataset
    from twostage.retriever.biencoder import BiEncoder
    from twostage.retriever.gradcache import CachedMultipleNegativesRankingLoss
    from twostage.retriever.losses import MultipleNegativesRankingLoss

    ds = BeirDataset(ROOT.parent / "shared" / "data" / "scifact")
    split = ds.split("train")
    pairs = [(q.text, ds.corpus.get(d).full_text) for q in split.queries for d in sorted(split.qrels.relevant(q.id))]
    pairs = pairs[:batch]
    model = BiEncoder.load("all-MiniLM-L6-v2")
    model.train()
    torch.manual_seed(0)
    base = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    t0 = time.perf_counter()
    if mini:
        loss = CachedMultipleNegativesRankingLoss(model, mini)([a for a, _ in pairs], [p for _, p in pairs])
    else:
        a = model(model.tokenize([a for a, _ in pairs], "query"))
        p = model(model.tokenize([p for _, p in pairs], "document"))
        loss = MultipleNegativesRankingLoss()(a, p)
    loss.backward()
    return {"loss": loss.item(), "seconds": time.perf_counter() - t0,
            "peak_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, "before_mb": base / 1024}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--batch", type=int, default=256)
    parser.add_argument("--mini", type=int, default=32)
    parser.add_argument("--child", nargs=2, type=int, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print(json.dumps(step(*args.child)))
        return
    rows = {}
    for name, mini in (("plain MNRL", 0), (f"GradCache, mini-batch {args.mini}", args.mini)):
        out = subprocess.run([sys.executable, __file__, "--child", str(args.batch), str(mini)], capture_output=True,
                             text=True)
        if out.returncode == -9:  # SIGKILL: the kernel's out-of-memory killer
            rows[name] = None
            continue
        if out.returncode != 0:
            raise SystemExit(out.stderr[-2000:])
        rows[name] = json.loads(out.stdout.strip().splitlines()[-1])
    lines = [f"# One training step at batch {args.batch}: peak memory\n",
             f"Command: `python benchmarks/experiments/gradcache_memory.py --batch {args.batch} --mini {args.mini}`\n",
             "all-MiniLM-L6-v2, SciFact (query, document) pairs, documents up to 256 tokens, CPU.\n",
             "| variant | peak RSS MB | RSS before the step MB | step s | loss |", "|---|---|---|---|---|"]
    total = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**20
    for name, r in rows.items():
        if r is None:
            lines.append(f"| {name} | killed by the kernel: out of memory ({total:.0f} MB machine) | | | |")
            continue
        lines.append(f"| {name} | {r['peak_mb']:.0f} | {r['before_mb']:.0f} | {r['seconds']:.1f} | {r['loss']:.5f} |")
    Path("benchmarks/results/gradcache_memory.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
