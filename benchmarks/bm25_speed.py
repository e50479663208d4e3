"""BM25 speed: the default engine (bm25s) against rank-bm25, same analyzer, same corpus, same run.

Usage: python benchmarks/bm25_speed.py [--data ../shared/data/scifact] [--out benchmarks/results/bm25_speed.md]

Times every query of queries.jsonl, one at a time, through each engine (analysis included), three rounds
in alternation; reports the median queries per second, the ratio, and nDCG@10 / Recall@100 of both on the
test split.
"""

from __future__ import annotations

import argparse
import os
import platform
import time
from pathlib import Path

import numpy as np

from twostage.eval.harness import measure_system
from twostage.eval.report import versions
from twostage.indexer.beir import BeirDataset
from twostage.retriever.bm25 import BM25Config, BM25Retriever


def qps(retriever: BM25Retriever, queries: list[str], k: int) -> float:
    t0 = time.perf_counter()
    for q in queries:
        retriever.search(q, k)
    return len(queries) / (time.perf_counter() - t0)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data", type=Path, default=Path("../shared/data/scifact"))
    parser.add_argument("--out", type=Path, default=Path("benchmarks/results/bm25_speed.md"))
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--k", type=int, default=100)
    args = parser.parse_args()

    ds = BeirDataset(args.data)
    corpus, split = ds.corpus, ds.split("test")
    queries = [q.text for q in ds.queries.values()]
    engines, build = {}, {}
    for name in ("bm25s", "rank-bm25"):
        t0 = time.perf_counter()
        engines[name] = BM25Retriever.build(corpus, BM25Config(engine=name))
        build[name] = time.perf_counter() - t0
    rates: dict[str, list[float]] = {n: [] for n in engines}
    for _ in range(args.rounds):
        for name, r in engines.items():
            rates[name].append(qps(r, queries, args.k))
    quality = {n: measure_system(n, r, split, k=args.k).summary() for n, r in engines.items()}
    med = {n: float(np.median(v)) for n, v in rates.items()}
    ratio = med["bm25s"] / med["rank-bm25"]
    lines = [
        f"# BM25 speed on {ds.name}: bm25s (default) against rank-bm25\n",
        f"Command: `python benchmarks/bm25_speed.py --data {args.data}`\n",
        f"{len(corpus)} documents; {len(queries)} queries timed one at a time (analysis and top-{args.k} included), "
        f"median of {args.rounds} alternating rounds; quality on the {len(split.queries)} test queries. "
        f"Machine: {os.cpu_count()} cores, {platform.processor() or platform.machine()}.\n",
        "| engine | queries/s | build s | nDCG@10 | Recall@100 |",
        "|---|---|---|---|---|",
    ]
    for n in engines:
        lines.append(f"| {n} | {med[n]:.0f} | {build[n]:.2f} | {quality[n]['ndcg@10']:.4f} | {quality[n]['recall@100']:.4f} |")
    lines.append(f"\n**bm25s is {ratio:.1f}x the queries per second of rank-bm25**; "
                 f"nDCG@10 differs by {abs(quality['bm25s']['ndcg@10'] - quality['rank-bm25']['ndcg@10']):.4f}.\n")
    lines.append("Per-round queries/s: " + "; ".join(f"{n}: {', '.join(f'{x:.0f}' for x in v)}" for n, v in rates.items()) + "\n")
    lines.append("Versions: " + ", ".join(f"{k} {v}" for k, v in versions().items()) + "\n")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text("\n".join(lines), encoding="utf-8")
    print("\n".join(lines))
    print(f"bm25 speed: bm25s {ratio:.1f}x rank-bm25 queries/s; table in {args.out}")


if __name__ == "__main__":
    main()
