"""Blend curves of a trained reranker: nDCG@10 by alpha for each first stage, on the reranker's dev queries (depth
20 and 30) and on SciFact test (depth 20; analysis only, nothing is chosen on it).

    python benchmarks/experiments/blend_curves.py RETRIEVER_DIR RERANKER_DIR SEED OUT.json

SEED is the reranker's training seed (its dev queries are the held-out 10% of train drawn with it).
"""
import argparse
import json

from twostage.eval.metrics import mean_ndcg10
from twostage.eval.systems import SystemOptions, engine_for
from twostage.indexer.beir import BeirDataset
from twostage.indexer.records import RankedList
from twostage.reranker.interpolation import GRID, rerank_order
from twostage.retriever.training_data import hold_out


def main() -> None:
    parser = argparse.ArgumentParser(description="nDCG@10 by blend alpha for each first stage (dev and test).")
    parser.add_argument("retriever", help="bi-encoder directory")
    parser.add_argument("reranker", help="cross-encoder directory")
    parser.add_argument("seed", type=int, help="the reranker's training seed (its dev queries are drawn with it)")
    parser.add_argument("out", help="JSON file to write")
    args = parser.parse_args()
    retriever, reranker, seed, out = args.retriever, args.reranker, args.seed, args.out
    ds = BeirDataset("../shared/data/scifact")
    corpus = ds.corpus
    texts = {d.id: d.full_text for d in corpus}
    engine = engine_for(corpus, SystemOptions(retriever_model=retriever, reranker_model=reranker, precision="bf16"),
                        need_reranker=True)
    model = engine.reranker
    _, dev = hold_out(list(ds.split("train").queries), 0.1, seed)
    sets = {"dev": (dev, ds.split("train").qrels.subset(q.id for q in dev), 30), "test": (list(ds.split("test").queries), ds.split("test").qrels, 20)}
    result = {"alpha_saved": model.interpolation}
    for name, (queries, qrels, depth) in sets.items():
        for fs in ("bm25", "dense", "hybrid"):
            view = engine.as_retriever(first_stage=fs, rerank=False)
            cached = {}
            for q in queries:
                first = view.search(q.text, depth)
                cached[q.id] = (first, model.score(q.text, [texts[str(d)] for d in first.ids]))
            for d in sorted({20, depth}):
                curve = []
                for alpha in GRID:
                    run = {}
                    for qid, (first, scores) in cached.items():
                        f = RankedList(first.ids[:d], first.scores[:d])
                        order, final = rerank_order(f.scores, scores[:d], float(alpha))
                        run[qid] = RankedList(f.ids[order], final[order])
                    curve.append(round(mean_ndcg10(qrels, run), 4))
                result[f"{name}/{fs}/depth{d}"] = curve
                print(name, fs, d, curve, flush=True)
    with open(out, "w") as f:
        json.dump({"grid": list(GRID), **result}, f, indent=1)
    print(f"blend curves of {len(result) - 1} (split, first stage, depth) in {out}")


if __name__ == "__main__":
    main()
