"""Which passage shape should the engine default to? Chosen on dev queries only.

Usage (from the repository root): python benchmarks/experiments/passage_shapes.py [--shapes 0 100/50 150/75 200/100]

For each shape (words/stride; 0 = whole documents) BM25, dense (all-MiniLM-L6-v2 zero-shot, exact search, fp32)
and their RRF fusion (k 60) are scored as the engine scores them: each document by its best passage in each
stage. Two dev collections, never the test queries: SciFact with its train queries (short abstracts), and "long
SciFact dev", composites of 1,500-3,000 words built from the train queries' relevant documents exactly as
benchmarks/long_documents.py builds the test one (300 composites). The reranker is left out (it reads one passage
per document whatever the shape). Writes benchmarks/results/passage_shapes.md.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "benchmarks"))


def scores_by_shape(docs: list[Any], queries: list[Any], qrels: Any, shape: Any, encoder: Any) -> dict[str, float]:
    import numpy as np

    from twostage.eval.metrics import evaluate
    from twostage.indexer.passages import group_starts, split_all
    from twostage.indexer.records import RankedList
    from twostage.indexer.topk import top_k
    from twostage.retriever.bm25 import BM25Retriever
    from twostage.retriever.hybrid import fuse

    rows = split_all(docs, shape) if shape.words else list(docs)
    groups = group_starts([p.id for p in rows]) if shape.words else np.arange(len(rows))
    ids = np.array([d.id for d in docs], dtype=object)
    bm25 = BM25Retriever.build(rows)
    vectors = encoder.encode([p.full_text for p in rows], kind="document", batch_size=64)
    qv = encoder.encode([q.text for q in queries], kind="query", batch_size=64)
    runs: dict[str, dict[str, RankedList]] = {"bm25": {}, "dense": {}, "hybrid": {}}
    for q, v in zip(queries, qv):
        lists = {}
        for name, s in (("bm25", bm25.scores(q.text)), ("dense", vectors @ v)):
            best = np.maximum.reduceat(np.asarray(s, dtype=np.float32), groups)
            r, val = top_k(best, 100, positive_only=name == "bm25")
            lists[name] = RankedList(ids[r], val)
            runs[name][q.id] = lists[name]
        runs["hybrid"][q.id] = fuse([lists["bm25"], lists["dense"]], "rrf", k_rrf=60.0).truncate(100)
    return {name: float(evaluate(qrels, run, ["ndcg@10"])["ndcg@10"].mean()) for name, run in runs.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--shapes", nargs="+", default=["0", "100/50", "150/75", "200/100"])
    parser.add_argument("--data", type=Path, default=ROOT.parent / "shared" / "data" / "scifact")
    parser.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results" / "passage_shapes.md")
    args = parser.parse_args()

    from long_documents import long_collection

    from twostage.indexer.beir import BeirDataset
    from twostage.indexer.passages import PassageShape
    from twostage.retriever.biencoder import BiEncoder

    t0 = time.perf_counter()
    encoder = BiEncoder.load("all-MiniLM-L6-v2", precision="fp32")
    ds = BeirDataset(args.data)
    train = ds.split("train")
    long_docs, long_queries, long_qrels, about = long_collection(args.data, 300, 0, "train")
    collections = {"SciFact train": (list(ds.corpus), list(train.queries), train.qrels),
                   "long SciFact dev": (long_docs, long_queries, long_qrels)}
    rows = []
    for text in args.shapes:
        words, _, stride = text.partition("/")
        shape = PassageShape(int(words), int(stride or 0) or max(1, int(words) // 2))
        row = [text if shape.words else "whole documents"]
        for name, (docs, queries, qrels) in collections.items():
            result = scores_by_shape(docs, queries, qrels, shape, encoder)
            print(text, name, result, flush=True)
            row += [f"{result[s]:.4f}" for s in ("bm25", "dense", "hybrid")]
        rows.append(row)
    lines = ["# Passage shapes on dev queries", "", f"Command: `python benchmarks/experiments/passage_shapes.py "
             f"--shapes {' '.join(args.shapes)}`", "",
             f"nDCG@10, all-MiniLM-L6-v2 zero-shot (fp32, exact), each document by its best passage. Long SciFact dev: "
             f"{about['composites']} composites of {about['words_min']}-{about['words_max']} words built from the "
             f"train queries' documents. {(time.perf_counter() - t0) / 60:.1f} min on the 2-core machine.", "",
             "| shape (words/stride) | SciFact train BM25 | dense | hybrid | long dev BM25 | dense | hybrid |",
             "|---|---|---|---|---|---|---|"]
    lines += ["| " + " | ".join(r) + " |" for r in rows]
    args.out.write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
