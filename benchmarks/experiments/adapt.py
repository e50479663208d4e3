"""Label-free adaptation (`twostage adapt`) against the zero-shot engine, on a BEIR collection's test split.

Usage (from the repository root):
    python benchmarks/experiments/adapt.py --data ../shared/data/scifact --models runs/adapt/scifact
    python benchmarks/experiments/adapt.py --data ../shared/data/cranfield --models runs/adapt/cranfield
    python benchmarks/experiments/adapt.py --data ../shared/data/arguana --models runs/adapt/arguana \
        --ignore-identical-ids --no-reranker

1. `adapt` trains the bi-encoder and the reranker on the corpus alone (the queries and qrels are never read; dev
   is a held-out part of the pseudo-queries). Its time is the sum of the phases adapt.json records (a finished
   `--models` directory is reused: then the recorded time of the run that trained it).
2. Systems scored on the split (the same harness as `twostage bench`), every model in fp32 with exact search:
   BM25; the base model zero-shot: dense, hybrid with RRF (the engine's default fusion when this was written) and
   hybrid with the adapted engine's fusion (the recipe's blend); the adapted engine: dense, hybrid with RRF, hybrid
   with its fusion, and hybrid+rerank (the adapted reranker over the top 20, blended with the first stage by the
   weight chosen on the dev pseudo-queries). The zero-shot rows with both fusions separate what the fusion gives from
   what the adapted models give.
Writes OUT/report.md (and the harness's files); last line:
`adapt: NAME engine X nDCG@10, zero-shot hybrid Y (+D), bm25 Z, adaptation M min`.
"""

from __future__ import annotations

import argparse
import json
import tempfile
from dataclasses import replace
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data", type=Path, required=True, help="BEIR directory")
    parser.add_argument("--split", default="test")
    parser.add_argument("--models", type=Path, required=True, help="adapt's output directory (reused when done)")
    parser.add_argument("--base", default="all-MiniLM-L6-v2")
    parser.add_argument("--out", type=Path, default=None, help="default: benchmarks/results/adapt-NAME")
    parser.add_argument("--ignore-identical-ids", action="store_true",
                        help="score without each query's own document (ArguAna), as bench does")
    parser.add_argument("--no-reranker", action="store_true", help="adapt the bi-encoder only")
    args = parser.parse_args()

    from twostage.app.adapt import AdaptRecipe, adapt
    from twostage.engine.search_engine import SearchEngine
    from twostage.eval.harness import run_bench
    from twostage.eval.report import write_outputs
    from twostage.indexer.beir import BeirDataset
    from twostage.indexer.engine_dir import EngineSettings
    from twostage.retriever.bm25 import BM25Retriever

    ds = BeirDataset(args.data)
    out = args.out or ROOT / "benchmarks" / "results" / f"adapt-{ds.name}"
    recipe = replace(AdaptRecipe(), reranker=None) if args.no_reranker else AdaptRecipe()
    result = adapt(ds.corpus, args.models, base=args.base, recipe=recipe, show_progress=True)
    record = json.loads((Path(args.models) / "adapt.json").read_text(encoding="utf-8"))
    minutes = sum(record["seconds"].values()) / 60
    fixed = EngineSettings(precision="fp32", backend="flat")
    tmp = Path(tempfile.mkdtemp(prefix="twostage-adapt-bench-"))
    zero = SearchEngine.build(ds.corpus, tmp / "zero-shot", retriever=args.base, settings=fixed, show_progress=True)
    chosen = replace(fixed, fusion=result.settings.fusion, dense_weight=result.settings.dense_weight)
    adapted = SearchEngine.build(ds.corpus, tmp / "adapted", retriever=result.retriever, reranker=result.reranker,
                                 settings=chosen, show_progress=True)
    rrf = adapted.configure(replace(chosen, fusion="rrf"))
    adapted = rrf.configure(chosen)  # the engine as adapt set it up, read back from its own manifest
    zero_fused = zero.configure(replace(fixed, fusion=chosen.fusion, dense_weight=chosen.dense_weight))
    fusion = "rrf" if chosen.fusion == "rrf" else f"blend {chosen.dense_weight:g}"
    systems = {
        "bm25": BM25Retriever.build(ds.corpus),
        "zero-shot dense": zero.as_retriever(first_stage="dense", rerank=False),
        "zero-shot hybrid": zero.as_retriever(first_stage="hybrid", rerank=False),
        f"zero-shot hybrid ({fusion})": zero_fused.as_retriever(first_stage="hybrid", rerank=False),
        "adapted dense": adapted.as_retriever(first_stage="dense", rerank=False),
        "adapted hybrid (rrf)": rrf.as_retriever(first_stage="hybrid", rerank=False),
        f"adapted hybrid ({fusion})": adapted.as_retriever(first_stage="hybrid", rerank=False),
    }
    if result.reranker:
        systems[f"adapted hybrid ({fusion}) + rerank"] = adapted.as_retriever(first_stage="hybrid", rerank=True)
    bench = run_bench(ds, args.split, systems, ignore_identical_ids=args.ignore_identical_ids, show_progress=True)
    command = (f"python benchmarks/experiments/adapt.py --data {args.data} --models {args.models}"
               + (f" --base {args.base}" if args.base != "all-MiniLM-L6-v2" else "")
               + (" --ignore-identical-ids" if args.ignore_identical_ids else "")
               + (" --no-reranker" if args.no_reranker else ""))
    write_outputs(bench, out, {"command": command, "adapt": record})
    table = bench.table()
    ndcg = dict(zip(table.index, table["ndcg@10"])) if "ndcg@10" in table else {}
    final = list(systems)[-1]
    summary = [
        f"# label-free adaptation on {ds.name}/{args.split}", "",
        f"Command: `{command}`", "",
        f"Adaptation ({record['documents']} documents, {record['pseudo_queries']} pseudo-queries + "
        f"{record['dev_queries']} dev, 2 cores): {minutes:.1f} min "
        f"({', '.join(f'{k} {v / 60:.1f} min' for k, v in record['seconds'].items())}). Queries and qrels of the "
        "collection are never read by adapt; "
        + ("the reranker's blend is chosen on held-out pseudo-queries, " if result.reranker else "no reranker; ")
        + f"the fusion is the recipe's ({fusion}, chosen on SciFact train). Models in fp32, exact search.", "",
    ]
    (out / "summary.md").write_text("\n".join(summary) + "\n" + (out / "report.md").read_text(encoding="utf-8"),
                                    encoding="utf-8")
    print(f"adapt: {ds.name} engine {ndcg.get(final, float('nan')):.3f} nDCG@10, zero-shot hybrid "
          f"{ndcg.get('zero-shot hybrid', float('nan')):.3f} "
          f"({ndcg.get(final, 0) - ndcg.get('zero-shot hybrid', 0):+.3f}), bm25 {ndcg.get('bm25', float('nan')):.3f}, "
          f"adaptation {minutes:.1f} min")


if __name__ == "__main__":
    main()
