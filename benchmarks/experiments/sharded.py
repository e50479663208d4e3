"""The sharded engine against one engine on SciFact test: the same top 10, every query, every first stage.

Usage (from the repository root, after the one-command run trained its models):
    python benchmarks/experiments/sharded.py --retriever runs/models/scifact-e2e-fit/retriever \\
        --reranker runs/models/scifact-e2e-fit/reranker --shards 2 4

Builds one engine and, for each shard count, a sharded engine over the same corpus, with the exact dense backend
(``flat``: an ANN graph per shard is not one big graph, so ANN shards agree only as far as the ANN recall goes).
Every test query is searched by each with BM25, dense and hybrid (no reranker): a query counts as identical when
the top 10 ids *and* float32 scores are equal. Then hybrid+rerank at the engine's defaults: nDCG@10 of one engine
and of each sharded engine, whose shards are served by local Ray actors (``--no-ray``: in this process).
Writes benchmarks/results/sharded.md; the last line: ``sharded: N shards identical top 10 Q/Q ...``.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
ROOT = Path(__file__).resolve().parents[2]
DATA = ROOT.parent / "shared" / "data" / "scifact"
STAGES = ("bm25", "dense", "hybrid")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--retriever", required=True)
    parser.add_argument("--reranker", required=True)
    parser.add_argument("--data", type=Path, default=DATA)
    parser.add_argument("--shards", type=int, nargs="+", default=[2, 4])
    parser.add_argument("--no-ray", action="store_true", help="serve the shards in this process")
    parser.add_argument("--md", type=Path, default=ROOT / "benchmarks" / "results" / "sharded.md")
    args = parser.parse_args()

    import numpy as np

    from twostage.engine.search_engine import SearchEngine
    from twostage.engine.sharded import ShardedEngine
    from twostage.eval.metrics import evaluate
    from twostage.indexer.beir import BeirDataset

    ds = BeirDataset(args.data)
    split = ds.split("test")
    queries = [q.text for q in split.queries]
    qids = [q.id for q in split.queries]
    corpus = ds.corpus
    work = Path(tempfile.mkdtemp(prefix="sharded-"))
    kw = {"retriever": args.retriever, "reranker": args.reranker, "backend": "flat"}

    def ndcg(engine) -> tuple[float, float]:
        t = time.perf_counter()
        ranked = engine.as_retriever().search_batch(queries, 10)
        seconds = time.perf_counter() - t
        table = evaluate(split.qrels, dict(zip(qids, ranked)), ["ndcg@10"])
        return float(table["ndcg@10"].mean()), 1000 * seconds / len(queries)

    def latency(engine, stage: str) -> float:
        times = []
        for q in queries[:100]:
            t = time.perf_counter()
            engine.ranked(q, 10, first_stage=stage, rerank=False)
            times.append(time.perf_counter() - t)
        return 1000 * statistics.median(times)

    t = time.perf_counter()
    single = SearchEngine.build(corpus, work / "single", **kw)
    single_build = time.perf_counter() - t
    want = {stage: single.as_retriever(first_stage=stage, rerank=False).search_batch(queries, 10) for stage in STAGES}
    single_ndcg, single_ms = ndcg(single)
    single_lat = {stage: latency(single, stage) for stage in STAGES}
    rows, last = [], ""
    for n in args.shards:
        t = time.perf_counter()
        sharded = ShardedEngine.build(corpus, work / f"shards-{n}", shards=n, **kw)
        build_s = time.perf_counter() - t
        sharded.close()
        if not args.no_ray:
            import ray

            ray.init(address="local", num_cpus=os.cpu_count(), include_dashboard=False, log_to_driver=False)
        sharded = ShardedEngine.load(work / f"shards-{n}", ray=not args.no_ray)
        same = {}
        for stage in STAGES:
            got = sharded.as_retriever(first_stage=stage, rerank=False).search_batch(queries, 10)
            same[stage] = sum(list(map(str, a.ids)) == list(map(str, b.ids)) and np.array_equal(a.scores, b.scores)
                              for a, b in zip(got, want[stage]))
        value, ms = ndcg(sharded)
        lat = {stage: latency(sharded, stage) for stage in STAGES}
        sharded.close()
        if not args.no_ray:
            ray.shutdown()
        rows.append((n, build_s, same, value, ms, lat))
        last = (f"sharded: {n} shards identical top 10 " + ", ".join(f"{s} {same[s]}/{len(queries)}" for s in STAGES)
                + f"; hybrid+rerank nDCG@10 {value:.4f} vs one engine {single_ndcg:.4f}")
        print(last, flush=True)

    serve = "in this process" if args.no_ray else "one local Ray actor per shard"
    lines = [
        "# Sharded engine = one engine (SciFact test)\n",
        (f"Command: `python benchmarks/experiments/sharded.py --retriever {args.retriever} --reranker {args.reranker} --shards "
        f"{' '.join(map(str, args.shards))}{' --no-ray' if args.no_ray else ''}`\n"),
        (f"{len(corpus)} documents, {len(queries)} test queries, dense backend `flat` (exact), shards served {serve}; "
        f"{os.cpu_count()} cores. Identical: the top 10 ids and their float32 scores equal one engine's. "
        "Latency: p50 of 100 queries one at a time, first stage only (encoding included).\n"),
        ("| engine | build s | identical bm25 | identical dense | identical hybrid | hybrid+rerank nDCG@10 | "
        "hybrid+rerank ms/query (batch) | p50 ms bm25 / dense / hybrid |"),
        "|---|---|---|---|---|---|---|---|",
        f"| one engine | {single_build:.0f} | - | - | - | {single_ndcg:.4f} | {single_ms:.0f} | "
        + " / ".join(f"{single_lat[s]:.1f}" for s in STAGES) + " |",
    ]
    for n, build_s, same, value, ms, lat in rows:
        lines.append(f"| {n} shards | {build_s:.0f} | " + " | ".join(f"{same[s]}/{len(queries)}" for s in STAGES)
                     + f" | {value:.4f} | {ms:.0f} | " + " / ".join(f"{lat[s]:.1f}" for s in STAGES) + " |")
    lines += ["", last, ""]
    args.md.write_text("\n".join(lines), encoding="utf-8")
    print(last)
    single.close()
    sys.exit(0)


if __name__ == "__main__":
    main()
