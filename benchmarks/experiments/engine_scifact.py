"""The engine end to end on SciFact test: `twostage build` + `twostage search` against the harness, and
`search_batch` against one query at a time.

Usage (from the repository root, after the one-command run trained its models):
    python benchmarks/experiments/engine_scifact.py --retriever runs/models/scifact-e2e/retriever \\
        --reranker runs/models/scifact-e2e/reranker

1. The harness's `hybrid+rerank` (run_bench, which builds its own engine from the corpus).
2. An engine built by the command line (`twostage build`) and searched by it (`twostage search --queries FILE
   --json --k 100`, all 300 test queries in one process); its output scored with the same metrics.
3. The same engine in Python: `search_batch` over every query against `search` one query at a time, alternating
   rounds, queries/s at the default depth; the hits must be the same.
Writes benchmarks/results/engine-scifact.md and .json.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
DATA = ROOT.parent / "shared" / "data" / "scifact"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--retriever", required=True)
    parser.add_argument("--reranker", required=True)
    parser.add_argument("--data", type=Path, default=DATA)
    parser.add_argument("--rounds", type=int, default=3, help="search_batch vs search rounds (0: skip)")
    parser.add_argument("--precision", default="auto", help="both models' precision (auto: the engine default)")
    parser.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results" / "engine-scifact")
    args = parser.parse_args()

    import numpy as np

    from twostage.engine.search_engine import SearchEngine
    from twostage.eval.harness import run_bench
    from twostage.eval.metrics import evaluate
    from twostage.eval.run import Run
    from twostage.eval.systems import SystemOptions
    from twostage.indexer.beir import BeirDataset
    from twostage.indexer.codec import to_json_dict
    from twostage.indexer.records import RankedList

    ds = BeirDataset(args.data)
    split = ds.split("test")
    metrics = ["ndcg@10", "mrr@10", "recall@100"]
    t = time.perf_counter()
    bench = run_bench(ds, "test", "hybrid+rerank",
                      options=SystemOptions(retriever_model=args.retriever, reranker_model=args.reranker,
                                            precision=args.precision))
    harness = {m: float(bench.systems[0].per_query[m].mean()) for m in metrics}
    harness_s = time.perf_counter() - t
    print("harness hybrid+rerank:", harness, flush=True)

    with tempfile.TemporaryDirectory() as tmp:
        eng = Path(tmp) / "engine"
        env = {**os.environ, "HF_HUB_OFFLINE": "1"}
        cli = [sys.executable, "-m", "twostage"]
        build_cmd = [*cli, "-q", "build", "--corpus", str(args.data), "--out", str(eng), "--retriever", args.retriever,
                     "--reranker", args.reranker, "--precision", args.precision]
        t = time.perf_counter()
        subprocess.run(build_cmd, check=True, env=env)
        build_s = time.perf_counter() - t
        qfile = Path(tmp) / "queries.txt"
        qfile.write_text("".join(q.text.replace("\n", " ") + "\n" for q in split.queries), encoding="utf-8")
        search_cmd = [*cli, "search", str(eng), "--queries", str(qfile), "--json", "--k", "100"]
        t = time.perf_counter()
        out = subprocess.run(search_cmd, check=True, env=env, capture_output=True, text=True).stdout
        search_s = time.perf_counter() - t
        lines = [json.loads(x) for x in out.splitlines()]
        assert len(lines) == len(split.queries)
        run = Run("cli", {q.id: RankedList(np.array([h["id"] for h in r["hits"]], dtype=object),
                                           np.array([h["score"] for h in r["hits"]], dtype=np.float32))
                          for q, r in zip(split.queries, lines)})
        per_query = evaluate(split.qrels, run, metrics)
        cli_metrics = {m: float(per_query[m].mean()) for m in metrics}
        print("cli engine:", cli_metrics, flush=True)

        engine = SearchEngine.load(eng)
        texts = [q.text for q in split.queries]
        engine.search_batch(texts[:8])  # load the models
        batch_s, single_s = [float("nan")], [float("nan")]
        differ = 0
        if args.rounds:
            batch_s, single_s = [], []
        for _ in range(args.rounds):
            t = time.perf_counter()
            batched = [r for i in range(0, len(texts), 32) for r in engine.search_batch(texts[i:i + 32], k=10)]
            batch_s.append(time.perf_counter() - t)
            t = time.perf_counter()
            single = [engine.search(q, k=10) for q in texts]
            single_s.append(time.perf_counter() - t)
            differ = max(differ, sum(a.ids != b.ids for a, b in zip(batched, single)))
        settings = to_json_dict(engine.settings)
        fusion = engine.settings.fusion_label
        # the same comparison with both models in fp32 (query time only; the corpus vectors stay as built)
        fp32 = engine.configure(precision="fp32")
        sample = texts[:64]
        batched32 = [r for i in range(0, len(sample), 32) for r in fp32.search_batch(sample[i:i + 32], k=10)]
        differ32 = sum(a.ids != b.ids for a, b in zip(batched32, [fp32.search(q, k=10) for q in sample]))
        differ16 = sum(a.ids != b.ids for a, b in zip(batched[:64] if args.rounds else [], single[:64] if args.rounds else []))
    n = len(texts)
    qps_batch, qps_single = n / statistics.median(batch_s), n / statistics.median(single_s)
    cli_differ = sum(list(bench.systems[0].run[q.id].ids[:10]) != [h["id"] for h in r["hits"][:10]]
                     for q, r in zip(split.queries, lines))
    result = {"harness": harness, "cli": cli_metrics, "equal_ndcg": abs(harness["ndcg@10"] - cli_metrics["ndcg@10"]) < 1e-9,
              "queries": n, "settings": settings, "qps_search_batch": qps_batch, "qps_search": qps_single,
              "ratio": qps_batch / qps_single, "queries_whose_top10_differ_batch_vs_single": differ,
              "queries_whose_top10_differ_cli_vs_harness": cli_differ,
              "fp32_first64_differ_batch_vs_single": differ32, "bf16_first64_differ_batch_vs_single": differ16, "build_s": build_s, "cli_search_s": search_s,
              "harness_s": harness_s, "rounds": args.rounds,
              "commands": {"build": " ".join(build_cmd[2:]), "search": " ".join(search_cmd[2:])}}
    if args.precision != "auto":
        args.out = args.out.with_name(f"{args.out.name}-{args.precision}")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.with_suffix(".json").write_text(json.dumps(result, indent=2) + "\n")
    md = f"""# The engine on SciFact test (300 queries), 2-core CPU

Command: `python benchmarks/experiments/engine_scifact.py --retriever {args.retriever} --reranker {args.reranker} --precision {args.precision} --rounds {args.rounds}`

Models: the one-command run's bi-encoder and reranker (`twostage bench --data ../shared/data/scifact --split test
--systems all --train-split train`, trained on SciFact train only). Engine settings (the defaults): first stage
{settings['first_stage']} ({fusion} of BM25 and dense top {settings['first_stage_depth']}),
reranker on the top {settings['rerank_depth']},
blend {settings['rerank_blend']} (the reranker's dev-chosen blend), precision {settings['precision']},
{settings['backend']} index.

| how | nDCG@10 | MRR@10 | Recall@100 |
|---|---|---|---|
| harness `hybrid+rerank` (run_bench) | {harness['ndcg@10']:.4f} | {harness['mrr@10']:.4f} | {harness['recall@100']:.4f} |
| `twostage build` + `twostage search --queries FILE --json --k 100` | {cli_metrics['ndcg@10']:.4f} | {cli_metrics['mrr@10']:.4f} | {cli_metrics['recall@100']:.4f} |

Same nDCG@10: **{result['equal_ndcg']}** (difference {cli_metrics['ndcg@10'] - harness['ndcg@10']:+.4f}; the top 10 differs
on {cli_differ} of {n} queries). The harness runs one query at a time; the CLI searches 32 queries per call, so the
encoder and the reranker see other batch shapes, which in bf16 changes scores in the last bits and reorders
near-ties. The same engine with both models switched to fp32 (`configure(precision="fp32")`, query time only): on
the first 64 queries, `search_batch` and `search` differ in the top 10 of {differ32} queries (bf16: {differ16}). Build (`{' '.join(build_cmd[2:4])} ...`, one process, 5,183 documents):
{build_s:.0f} s; the CLI search of all 300 queries in one process (models loaded once): {search_s:.0f} s.

| API, k=10, default depth | queries/s (median of {args.rounds} alternating rounds) |
|---|---|
| `search_batch` (32 queries a call: one encoder pass, shared reranker batches) | {qps_batch:.2f} |
| `search`, one query at a time | {qps_single:.2f} |
| ratio | **{result['ratio']:.2f}x** |

Queries whose top 10 differs between the two: {differ} of {n} (the same batch-shape effect).
"""
    args.out.with_suffix(".md").write_text(md)
    print(md)
    print(f"engine on {args.data}: nDCG@10 harness {harness['ndcg@10']:.4f}, CLI {cli_metrics['ndcg@10']:.4f}; "
          f"search_batch {result['ratio']:.2f}x search; report in {args.out.with_suffix('.md')}")


if __name__ == "__main__":
    main()
