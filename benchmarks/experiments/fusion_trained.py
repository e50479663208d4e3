"""Does a fine-tuned retriever want another first-stage fusion than the zero-shot default? Dev only chooses.

    python benchmarks/experiments/fusion_trained.py --collection scifact \\
        --retriever runs/models/scifact-maxp/retriever --reranker runs/models/scifact-maxp/reranker
    python benchmarks/experiments/fusion_trained.py --collection nfcorpus --retriever runs/models/nfcorpus-retriever-2/retriever

The engine's fusion default (blend, dense weight 0.5) was chosen across collections with the zero-shot MiniLM
(defaults_across.md). A retriever trained on the collection is stronger than BM25 there, so the best weight may
move. One engine (the defaults) with the trained retriever, no reranker; its hybrid first stage viewed with every
fusion of the grid (``engine.with_settings``); nDCG@10 and Recall@100 on dev and on test.

Dev: SciFact, the train queries the models held out (the reranker's twostage.json lists them; the retriever held
out the same ones); NFCorpus, its dev split (the retriever never saw it). The dev choice: the best mean nDCG@10,
and the one-standard-error rule toward the default (the default unless another weight beats it by more than the
standard error of the paired per-query difference). Test is reported for the choice, never chosen on.
Writes benchmarks/results/fusion_trained_<collection>.md.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[2]
DATA = ROOT.parent / "shared" / "data"
WEIGHTS = (0.3, 0.4, 0.5, 0.6, 0.7, 0.8)
DEFAULT = "blend dense 0.5"
FUSIONS: dict[str, dict[str, Any]] = {
    **{f"rrf k={k}": {"fusion": "rrf", "k_rrf": float(k)} for k in (10, 60)},
    **{f"blend dense {w}": {"fusion": "blend", "dense_weight": w} for w in WEIGHTS},
}


def per_query(engine: Any, queries: list[Any], qrels: Any, knobs: dict[str, Any], first_stage: str) -> dict[str, Any]:
    """nDCG@10 per query and mean Recall@100 of one view of the engine (no reranker)."""
    from twostage.eval.metrics import evaluate

    view = engine.with_settings(**knobs) if knobs else engine
    lists = view.as_retriever(first_stage=first_stage, rerank=False).search_batch([q.text for q in queries], 100)
    run = {q.id: r for q, r in zip(queries, lists)}
    table = evaluate(qrels.subset(list(run)), run, ["ndcg@10", "recall@100"]).sort_index()
    return {"ndcg": table["ndcg@10"].to_numpy(dtype=float), "recall@100": float(table["recall@100"].mean())}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--collection", choices=["scifact", "nfcorpus"], required=True)
    ap.add_argument("--retriever", required=True)
    ap.add_argument("--reranker", help="SciFact: the reranker whose twostage.json lists the held-out dev queries")
    ap.add_argument("--out", type=Path)
    args = ap.parse_args()
    out = args.out or ROOT / "benchmarks" / "results" / f"fusion_trained_{args.collection}.md"

    from defaults_across import CachedQueries  # this folder is on sys.path when the script runs

    from twostage.engine.search_engine import SearchEngine
    from twostage.indexer.beir import BeirDataset

    data = BeirDataset(DATA / args.collection)
    if args.collection == "scifact":
        if not args.reranker:
            ap.error("--reranker: SciFact's dev queries are the ones its twostage.json lists")
        held = set(json.loads((Path(args.reranker) / "twostage.json").read_text())["training"]["dev_queries"])
        train = data.split("train")
        dev = ([q for q in train.queries if q.id in held], train.qrels.subset(held), "train (held out)")
    else:
        d = data.split("dev")
        dev = (list(d.queries), d.qrels, "dev")
    t = data.split("test")
    test = (list(t.queries), t.qrels, "test")

    started = time.perf_counter()
    scores: dict[str, dict[str, dict[str, Any]]] = {"dev": {}, "test": {}}
    with tempfile.TemporaryDirectory() as tmp:
        engine = SearchEngine.build(data.corpus, f"{tmp}/engine", retriever=args.retriever, show_progress=True)
        build_s = time.perf_counter() - started
        engine.use_models(encoder=CachedQueries(engine.encoder))  # each query encoded once for all the views
        for name, (queries, qrels, _) in (("dev", dev), ("test", test)):
            for system in ("bm25", "dense"):
                scores[name][system] = per_query(engine, queries, qrels, {}, system)
            for fusion, knobs in FUSIONS.items():
                scores[name][f"hybrid {fusion}"] = per_query(engine, queries, qrels, knobs, "hybrid")
        engine.close()

    base = scores["dev"][f"hybrid {DEFAULT}"]["ndcg"]
    hybrids = [f"hybrid {f}" for f in FUSIONS]
    best = max(hybrids, key=lambda s: scores["dev"][s]["ndcg"].mean())
    diff = scores["dev"][best]["ndcg"] - base
    se = float(diff.std(ddof=1) / np.sqrt(len(diff))) if len(diff) > 1 else 0.0
    chosen = best if diff.mean() > se else f"hybrid {DEFAULT}"
    lines = [f"# First-stage fusion for a trained retriever ({args.collection}, dev chooses)", "",
             f"Command: `python benchmarks/experiments/fusion_trained.py --collection {args.collection} --retriever "
             f"{args.retriever}" + (f" --reranker {args.reranker}" if args.reranker else "") + "`", "",
             (f"Engine defaults (passages 100/50), no reranker; build {build_s:.0f} s, "
             f"{time.perf_counter() - started:.0f} s in all. dev: {len(dev[0])} queries ({dev[2]}); test: "
             f"{len(test[0])}. nDCG@10 (Recall@100)."), "",
             "| system | dev | test |", "|---|---:|---:|"]
    for s in ["bm25", "dense", *hybrids]:
        cells = [f"{scores[n][s]['ndcg'].mean():.4f} ({scores[n][s]['recall@100']:.3f})" for n in ("dev", "test")]
        mark = " **(dev choice)**" if s == chosen else (" (default)" if s == f"hybrid {DEFAULT}" else "")
        lines.append(f"| {s}{mark} | " + " | ".join(cells) + " |")
    lines += ["", (f"Best on dev: {best} ({scores['dev'][best]['ndcg'].mean():.4f}), against the default "
              f"{base.mean():.4f}: {diff.mean():+.4f}, standard error {se:.4f}; the dev choice (one-SE rule "
              f"toward the default): {chosen}. On test, the dev choice {scores['test'][chosen]['ndcg'].mean():.4f} "
              f"vs default "
              f"{scores['test'][f'hybrid {DEFAULT}']['ndcg'].mean():.4f}. The engine ships the default for every "
              "corpus; a per-corpus dev choice of the weight is not in the engine.")]
    out.write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
