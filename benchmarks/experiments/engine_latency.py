"""Two-stage latency of the engine, one query at a time, per precision and reranking depth (SciFact test).

    python benchmarks/experiments/engine_latency.py --retriever MODEL_DIR --reranker MODEL_DIR \
        [--modes fp32:20 auto:10,20,50] [--rerank-whole-up-to N] [--out benchmarks/results/engine_latency]
    python benchmarks/experiments/engine_latency.py --engine ENGINE_DIR [--rounds 3] [--reranker DIR --rerank-blend W]

For each precision an engine is built over the SciFact corpus (hybrid first stage, the default settings; the
openvino-int8 models calibrated on the corpus by the build), then every test query is searched once with
``engine.search(query, rerank_depth=depth)`` (a warm-up pass over 20 queries first). Reported per (precision, depth):
p50 / p95 / max of the whole call and the p50 of each stage (query encoding; first stage = dense search, BM25 and
the fusion; reranking), the reranker's pairs per query (counted in a second, untimed pass) and the nDCG@10 of the
hits. ``--rerank-whole-up-to N`` adds, for each (precision, depth), a row from the same engine searched with the
reranker reading every candidate of at most N words whole (the default reads one of more than
``rerank_whole_up_to`` words by its best passage in each first stage): what the passage reads cost. The engine
directories are removed afterwards.

``--engine ENGINE_DIR`` times the default search (``engine.search(query, k=10)``) of an engine already built (with
``--reranker DIR``: that cross-encoder in openvino-int8 at ``--rerank-blend``), every test query ``--rounds`` times
after the warm-up, and prints one JSON line (p50, p95, each stage's p50 from the
search's timings, nDCG@10, the library's path):
run alternately with two versions of the library on the same engine (one through ``PYTHONPATH``), it compares
them interleaved on one machine.
"""

from __future__ import annotations

import argparse
import json
import shutil
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[2]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--retriever")
    ap.add_argument("--reranker")
    ap.add_argument("--engine", type=Path, help="time this engine's default search instead of building engines")
    ap.add_argument("--rounds", type=int, default=3, help="--engine: passes over the test queries (default 3)")
    ap.add_argument("--rerank-blend", type=float, default=None,
                    help="--engine with --reranker: the reranker's weight against the first stage")
    ap.add_argument("--data", type=Path, default=ROOT.parent / "shared" / "data" / "scifact")
    ap.add_argument("--modes", nargs="+", default=["fp32:20", "auto:10,20,50"],
                    help="PRECISION:DEPTH[,DEPTH...] (default: fp32:20 auto:10,20,50; auto is shown resolved)")
    ap.add_argument("--rerank-whole-up-to", type=int, default=None, metavar="N",
                    help="also measure each row with the reranker reading candidates of at most N words whole")
    ap.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results" / "engine_latency")
    args = ap.parse_args()
    if args.engine is not None:
        return time_existing(args.engine, args.data, args.rounds, args.reranker, args.rerank_blend)
    if not args.retriever or not args.reranker:
        ap.error("give --retriever and --reranker (the engines built), or --engine DIR")

    from twostage import BeirDataset, SearchEngine
    from twostage.indexer.manifest import library_versions

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
            views = [(engine.settings.rerank_whole_up_to, engine)]
            if args.rerank_whole_up_to is not None:
                views.append((args.rerank_whole_up_to,
                              engine.with_settings(rerank_whole_up_to=args.rerank_whole_up_to)))
            for depth in map(int, depths.split(",")):
                for whole, view in views:
                    row, total = measure(view, queries, split.qrels, depth)
                    shown = precision if precision == engine.precision else f"{precision} = {engine.precision}"
                    row = {"precision": shown, "depth": depth, "whole_up_to": whole, **row, "build_s": build_s}
                    rows.append(row)
                    raw[f"{precision}:{depth}:{whole}"] = total
                    print(json.dumps(row), flush=True)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    whole = "" if args.rerank_whole_up_to is None else f" --rerank-whole-up-to {args.rerank_whole_up_to}"
    command = (f"python benchmarks/experiments/engine_latency.py --retriever {args.retriever} "
               f"--reranker {args.reranker} --modes {' '.join(args.modes)}{whole}")
    header = ("| precision | rerank depth | read whole up to (words) | p50 ms | p95 ms | max ms | encode p50 | "
              "first stage p50 | rerank p50 | reranker pairs / query | hybrid+rerank nDCG@10 | engine build s |")
    lines = ["# Engine latency, one query at a time (SciFact test, all 300 queries, hybrid first stage)", "",
             f"Command: `{command}`", "", header, "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r['precision']} | {r['depth']} | {r['whole_up_to']} | {r['p50']:.1f} | {r['p95']:.1f} | "
                     f"{r['max']:.1f} | {r['encode_s_p50']:.1f} | {r['first_stage_p50']:.1f} | "
                     f"{r['rerank_s_p50']:.1f} | {r['pairs_per_query']:.1f} | {r['ndcg@10']:.4f} | "
                     f"{r['build_s']:.0f} |")
    lines += ["", "Versions: " + ", ".join(f"{k} {v}" for k, v in library_versions().items())]
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.with_suffix(".md").write_text("\n".join(lines) + "\n")
    args.out.with_suffix(".json").write_text(json.dumps({"rows": rows, "latencies_ms": raw}, indent=1) + "\n")
    print("\n".join(lines))


def time_existing(path: Path, data: Path, rounds: int, reranker: str | None = None,
                  rerank_blend: float | None = None) -> None:
    """The default search of the engine at ``path`` (with ``reranker`` in openvino-int8 at ``rerank_blend``, when
    given), every test query ``rounds`` times after a warm-up: one JSON line."""
    import twostage
    from twostage import BeirDataset, SearchEngine
    from twostage.eval.metrics import mean_ndcg10
    from twostage.indexer.records import RankedList
    from twostage.reranker.cross_encoder import CrossEncoder

    split = BeirDataset(data).split("test")
    queries = list(split.queries)
    engine = SearchEngine.load(path)
    if reranker:
        engine = engine.with_reranker(CrossEncoder.load(reranker, precision="openvino-int8"))
        engine = engine.with_settings(rerank_blend=rerank_blend) if rerank_blend is not None else engine
    for q in queries[:20]:
        engine.search(q.text, k=10)
    total, run, stages = [], {}, {}
    for _ in range(rounds):
        for q in queries:
            t = time.perf_counter()
            res = engine.search(q.text, k=10)
            total.append(1000 * (time.perf_counter() - t))
            for name, seconds in res.timings.items():
                stages.setdefault(name, []).append(1000 * seconds)
            run[q.id] = RankedList(np.array([h.id for h in res.hits], dtype=object),
                                   np.array([h.score for h in res.hits], dtype=np.float32))
    print(json.dumps({"p50": float(np.percentile(total, 50)), "p95": float(np.percentile(total, 95)),
                      **{f"{name}_p50": float(np.median(v)) for name, v in sorted(stages.items())},
                      "ndcg@10": mean_ndcg10(split.qrels, run), "library": str(Path(twostage.__file__).parent)}))


class PairCounter:
    """A reranker that counts the pairs it is given and passes them on."""

    def __init__(self, reranker: Any) -> None:
        self.reranker, self.pairs = reranker, 0

    def predict(self, pairs: list[tuple[str, str]], batch_size: int = 32) -> Any:
        self.pairs += len(pairs)
        return self.reranker.predict(pairs, batch_size=batch_size)


def measure(engine: Any, queries: list[Any], qrels: Any, depth: int) -> tuple[dict[str, float], list[float]]:
    """Every query once, timed; then once more, untimed, through a pair-counting reranker."""
    from twostage.eval.metrics import mean_ndcg10
    from twostage.indexer.records import RankedList

    total, stages, run = [], {"encode_s": [], "first_stage": [], "rerank_s": []}, {}
    for q in queries:
        t = time.perf_counter()
        res = engine.search(q.text, k=10, rerank_depth=depth)
        total.append(1000 * (time.perf_counter() - t))
        stages["encode_s"].append(1000 * res.timings.get("encode_s", 0.0))
        stages["rerank_s"].append(1000 * res.timings.get("rerank_s", 0.0))
        stages["first_stage"].append(1000 * sum(res.timings.get(k, 0.0) for k in ("dense_s", "bm25_s", "fuse_s")))
        run[q.id] = RankedList(np.array([h.id for h in res.hits], dtype=object),
                               np.array([h.score for h in res.hits], dtype=np.float32))
    counter = PairCounter(engine.reranker)
    counting = engine.with_reranker(counter)
    for q in queries:
        counting.search(q.text, k=10, rerank_depth=depth)
    return {"p50": float(np.percentile(total, 50)), "p95": float(np.percentile(total, 95)),
            "max": float(np.max(total)), **{f"{k}_p50": float(np.median(v)) for k, v in stages.items()},
            "pairs_per_query": counter.pairs / len(queries), "ndcg@10": mean_ndcg10(qrels, run)}, total


if __name__ == "__main__":
    main()
