"""First-stage defaults chosen across collections on dev data (#46): passage shape and fusion, zero-shot MiniLM.

    python benchmarks/experiments/defaults_across.py [--base all-MiniLM-L6-v2] [--work runs/defaults]

Every default the engine ships was chosen on SciFact. This builds, for each collection, an engine per document
shape (100-word passages with stride 50, the default; whole documents) with the zero-shot retriever and no
reranker, and measures the engine's own search (views: ``engine.with_settings``) over a grid of fusions: RRF at
several k and the min-max blend at several dense weights. Settings are **chosen on dev splits only**: SciFact
train (the zero-shot model never trained on it) and NFCorpus dev; by the mean of their nDCG@10, each collection
weighing the same. ArguAna and Cranfield have only test queries: they are reported, never chosen on. The last
column says, per collection, which setting its own test split would have preferred (an oracle, for reading only).

Queries are encoded once per engine (a cache in front of the engine's encoder: the same vectors). ArguAna is
evaluated without each query's own document (``ignore_identical_ids``, as BEIR does). Writes
benchmarks/results/defaults_across.md and .json.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "benchmarks"))
DATA = ROOT.parent / "shared" / "data"
# (collection, dev split or None, test split)
COLLECTIONS = [("scifact", "train", "test"), ("nfcorpus", "dev", "test"), ("arguana", None, "test"),
               ("cranfield", None, "test")]
SHAPES = {"passages 100/50": {}, "whole documents": {"passage_words": 0}}
FUSIONS: dict[str, dict[str, Any]] = {
    **{f"rrf k={k}": {"fusion": "rrf", "k_rrf": float(k)} for k in (10, 30, 60, 100)},
    **{f"blend dense {w}": {"fusion": "blend", "dense_weight": w} for w in (0.3, 0.4, 0.5, 0.6, 0.7)},
}


class CachedQueries:
    """The engine's encoder with each query's vector kept: a grid of fusions encodes the queries once."""

    def __init__(self, encoder: Any) -> None:
        self.encoder, self.cache = encoder, {}

    def __getattr__(self, name: str) -> Any:
        return getattr(self.encoder, name)

    def encode(self, texts: Any, *, kind: str = "document", **kw: Any) -> np.ndarray:
        if kind != "query":
            return self.encoder.encode(texts, kind=kind, **kw)
        missing = [t for t in dict.fromkeys(texts) if t not in self.cache]
        if missing:
            self.cache.update(zip(missing, self.encoder.encode(missing, kind="query", **kw)))
        return np.stack([self.cache[t] for t in texts])


def measure(engine: Any, data: Path, split: str, ignore: bool) -> dict[str, dict[str, float]]:
    """nDCG@10 and Recall@100 of bm25, dense and every fusion of hybrid: the engine's own search, per system."""
    from twostage.eval.harness import run_bench

    systems = {"bm25": engine.as_retriever(first_stage="bm25", rerank=False),
               "dense": engine.as_retriever(first_stage="dense", rerank=False)}
    systems.update({f"hybrid {name}": engine.with_settings(**knobs).as_retriever(first_stage="hybrid", rerank=False)
                    for name, knobs in FUSIONS.items()})
    result = run_bench(data, split, systems, ignore_identical_ids=ignore)
    table = result.table()
    return {name: {"ndcg@10": float(row["ndcg@10"]), "recall@100": float(row["recall@100"])}
            for name, row in table.iterrows()}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--base", default="all-MiniLM-L6-v2")
    parser.add_argument("--work", type=Path, default=ROOT / "runs" / "defaults")
    parser.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results" / "defaults_across.md")
    parser.add_argument("--collections", default=",".join(c[0] for c in COLLECTIONS),
                        help="a comma list of the collections (those with dev splits are the ones chosen on)")
    parser.add_argument("--shapes", default=",".join(s.split()[0] for s in SHAPES),
                        help="passages,whole (the first word of each shape)")
    args = parser.parse_args()
    collections = [c for c in COLLECTIONS if c[0] in args.collections.split(",")]
    shapes = {name: s for name, s in SHAPES.items() if name.split()[0] in args.shapes.split(",")}

    from serve_load import machine

    from twostage.engine.search_engine import SearchEngine
    from twostage.indexer.beir import BeirDataset

    started = time.perf_counter()
    scores: dict[str, dict[str, dict[str, dict[str, float]]]] = {}  # "collection/split" -> shape -> system -> metric
    build_s: dict[str, float] = {}
    for name, dev, test in collections:
        data = DATA / name
        corpus = BeirDataset(data).corpus
        for shape, settings in shapes.items():
            path = args.work / f"{name}-{shape.split()[0]}"
            t = time.perf_counter()
            if (path / "CURRENT").is_file():
                engine = SearchEngine.load(path, verify=False)
            else:
                engine = SearchEngine.build(corpus, path, retriever=args.base, show_progress=True, **settings)
                build_s[f"{name} {shape}"] = time.perf_counter() - t
            engine.use_models(encoder=CachedQueries(engine.encoder))
            for split in [s for s in (dev, test) if s]:
                key = f"{name}/{split}"
                scores.setdefault(key, {})[shape] = measure(engine, data, split, ignore=name == "arguana")
                best = max(scores[key][shape].items(), key=lambda kv: kv[1]["ndcg@10"])
                print(f"{key} {shape}: hybrid rrf k=60 {scores[key][shape]['hybrid rrf k=60']['ndcg@10']:.4f}, "
                      f"best {best[0]} {best[1]['ndcg@10']:.4f} ({time.perf_counter() - started:.0f} s)", flush=True)
            engine.close()
    args.out.with_suffix(".json").write_text(json.dumps({"scores": scores, "build_s": build_s}, indent=1) + "\n")
    args.out.write_text(report(scores, args, collections, shapes, machine(), time.perf_counter() - started),
                        encoding="utf-8")
    print(args.out.read_text())
    return 0


def report(scores: dict[str, Any], args: argparse.Namespace, collections: list[tuple[str, str | None, str]],
           shapes: dict[str, Any], where: str, seconds: float) -> str:
    devs = [f"{n}/{d}" for n, d, _ in collections if d]
    tests = [f"{n}/{t}" for n, _, t in collections]
    cells = [(shape, system) for shape in shapes for system in scores[devs[0]][shape]]

    def ndcg(key: str, cell: tuple[str, str]) -> float:
        return scores[key][cell[0]][cell[1]]["ndcg@10"]

    def dev_mean(cell: tuple[str, str]) -> float:
        return float(np.mean([ndcg(k, cell) for k in devs]))

    hybrid = [c for c in cells if c[1].startswith("hybrid")]
    chosen = max(hybrid, key=dev_mean)
    default = ("passages 100/50", "hybrid rrf k=60") if "passages 100/50" in shapes else (next(iter(shapes)),
                                                                                           "hybrid rrf k=60")
    lines = ["# First-stage defaults across collections (chosen on dev only)", "",
             f"Command: `python benchmarks/experiments/defaults_across.py {' '.join(sys.argv[1:])}`", "",
             f"Retriever `{args.base}` zero-shot, no reranker, engine defaults except the shape and fusion in each "
             "row; the engine's default index (hnswlib), depth 100 per list. nDCG@10. **Chosen** on the mean over the "
             "dev splits "
             f"({', '.join(devs)}); the test splits ({', '.join(tests)}) are reported, never chosen on. ArguAna "
             "without each query's own document.", "",
             "| shape | system | " + " | ".join(devs) + " | dev mean | " + " | ".join(tests) + " | test mean |",
             "|---|---|" + "---:|" * (len(devs) + len(tests) + 2)]
    for cell in cells:
        mark = " **(chosen)**" if cell == chosen else (" (default)" if cell == default else "")
        test_mean = float(np.mean([ndcg(k, cell) for k in tests]))
        lines.append(f"| {cell[0]} | {cell[1]}{mark} | " + " | ".join(f"{ndcg(k, cell):.4f}" for k in devs)
                     + f" | {dev_mean(cell):.4f} | " + " | ".join(f"{ndcg(k, cell):.4f}" for k in tests)
                     + f" | {test_mean:.4f} |")
    lines += ["", f"Chosen on dev: **{chosen[0]}, {chosen[1]}** (dev mean {dev_mean(chosen):.4f}; the default "
              f"{default[0]}, {default[1]}: {dev_mean(default):.4f}). On each test split, chosen vs default:", ""]
    for key in tests:
        oracle = max(hybrid, key=lambda c: ndcg(key, c))
        lines.append(f"- {key}: {ndcg(key, chosen):.4f} vs {ndcg(key, default):.4f} "
                     f"({ndcg(key, chosen) - ndcg(key, default):+.4f}); its own best hybrid (oracle, not a choice): "
                     f"{oracle[0]}, {oracle[1]} {ndcg(key, oracle):.4f}")
    lines += ["", f"Machine: {where}; {seconds / 60:.1f} min."]
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    raise SystemExit(main())
