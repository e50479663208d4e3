"""Two-stage latency of the engine, one query at a time, per precision and reranking depth (SciFact test).

    python benchmarks/experiments/engine_latency.py --retriever MODEL_DIR --reranker MODEL_DIR \
        [--modes fp32:20 auto:10,20,50] [--out benchmarks/results/engine_latency]

For each precision an engine is built over the SciFact corpus (hybrid first stage, the default settings; the
openvino-int8 models calibrated on the corpus by the build), then every test query is searched once with
``engine.search(query, rerank_depth=depth)`` (a warm-up pass over 20 queries first). Reported per (precision, depth):
p50 / p95 / max of the whole call and the p50 of each stage (query encoding; first stage = dense search, BM25 and
the fusion; reranking), and the
nDCG@10 of the hits. The engine directories are removed afterwards.
"""

from __future__ import annotations

import argparse
import json
import shutil
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[2]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--retriever", required=True)
    ap.add_argument("--reranker", required=True)
    ap.add_argument("--data", type=Path, default=ROOT.parent / "shared" / "data" / "scifact")
    ap.add_argument("--modes", nargs="+", default=["fp32:20", "auto:10,20,50"],
                    help="PRECISION:DEPTH[,DEPTH...] (default: fp32:20 auto:10,20,50; auto is shown resolved)")
    ap.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results" / "engine_latency")
    args = ap.parse_args()

    from twostage import BeirDataset, SearchEngine
    from twostage.eval.metrics import mean_ndcg10
    from twostage.indexer.manifest import library_versions
    from twostage.indexer.records import RankedList

    ds = BeirDataset(args.data)
    split = ds.split("test")
    queries = list(split.queries)
    rows, raw = [], {}
    scratch = Path(tempfile.mkdtemp(prefix="engine-latency-"))
    try:
        for spec in args.modes:
            precision, depths = spec.split(":")
            t = time.perf_counter()
            engine = SearchEngine.build(args.data, scratch / precision, retriever=args.retriever,
                                        reranker=args.reranker, precision=precision)
            build_s = time.perf_counter() - t
            for q in queries[:20]:
                engine.search(q.text, k=10)
            for depth in map(int, depths.split(",")):
                total, stages, run = [], {"encode_s": [], "first_stage": [], "rerank_s": []}, {}
                for q in queries:
                    t = time.perf_counter()
                    res = engine.search(q.text, k=10, rerank_depth=depth)
                    total.append(1000 * (time.perf_counter() - t))
                    stages["encode_s"].append(1000 * res.timings.get("encode_s", 0.0))
                    stages["rerank_s"].append(1000 * res.timings.get("rerank_s", 0.0))
                    stages["first_stage"].append(1000 * sum(res.timings.get(k, 0.0)
                                                            for k in ("dense_s", "bm25_s", "fuse_s")))
                    run[q.id] = RankedList(np.array([h.id for h in res.hits], dtype=object),
                                           np.array([h.score for h in res.hits], dtype=np.float32))
                ndcg = mean_ndcg10(split.qrels, run)
                shown = precision if precision == engine.precision else f"{precision} = {engine.precision}"
                row = {"precision": shown, "depth": depth, "p50": float(np.percentile(total, 50)),
                       "p95": float(np.percentile(total, 95)), "max": float(np.max(total)),
                       **{f"{k}_p50": float(np.median(v)) for k, v in stages.items()}, "ndcg@10": ndcg,
                       "build_s": build_s}
                rows.append(row)
                raw[f"{precision}:{depth}"] = total
                print(json.dumps(row), flush=True)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    lines = ["# Engine latency, one query at a time (SciFact test, all 300 queries, hybrid first stage)", "",
             f"Command: `python benchmarks/experiments/engine_latency.py --retriever {args.retriever} --reranker {args.reranker} "
             f"--modes {' '.join(args.modes)}`", "",
             "| precision | rerank depth | p50 ms | p95 ms | max ms | encode p50 | first stage p50 | rerank p50 | "
             "hybrid+rerank nDCG@10 | engine build s |", "|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r['precision']} | {r['depth']} | {r['p50']:.1f} | {r['p95']:.1f} | {r['max']:.1f} | "
                     f"{r['encode_s_p50']:.1f} | {r['first_stage_p50']:.1f} | {r['rerank_s_p50']:.1f} | "
                     f"{r['ndcg@10']:.4f} | {r['build_s']:.0f} |")
    lines += ["", "Versions: " + ", ".join(f"{k} {v}" for k, v in library_versions().items())]
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.with_suffix(".md").write_text("\n".join(lines) + "\n")
    args.out.with_suffix(".json").write_text(json.dumps({"rows": rows, "latencies_ms": raw}, indent=1) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
