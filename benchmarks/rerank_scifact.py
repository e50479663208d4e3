"""Reranking on SciFact: a cross-encoder trained here from all-MiniLM-L6-v2, over BM25 and dense first stages.

Usage (from the repository root, after benchmarks/dense_scifact.py trained runs/models/scifact-ours):
    python benchmarks/rerank_scifact.py [--depth 30] [--epochs 2]

Trains on the SciFact train split only (groups: query, positive, 3 BM25-mined negatives; listwise loss;
bf16 autocast), then evaluates on the test split every first stage alone and reranked at --depth.
"""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")

from eval.harness import run_bench  # noqa: E402
from eval.report import markdown_table, versions  # noqa: E402
from eval.systems import _Reranked  # noqa: E402
from indexer.beir import BeirDataset  # noqa: E402
from reranker.cross_encoder import CrossEncoder  # noqa: E402
from reranker.pipeline import Pipeline  # noqa: E402
from reranker.training import RerankerConfig, groups_from_split, train_reranker  # noqa: E402
from retriever.biencoder import BiEncoder  # noqa: E402
from retriever.bm25 import BM25Retriever  # noqa: E402
from retriever.dense import DenseRetriever  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data", type=Path, default=Path("../shared/data/scifact"))
    parser.add_argument("--retriever", default="runs/models/scifact-ours")
    parser.add_argument("--out", type=Path, default=Path("runs/models/scifact-reranker"))
    parser.add_argument("--depth", type=int, default=30)
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--loss", default="listwise")
    args = parser.parse_args()
    ds = BeirDataset(args.data)
    config = RerankerConfig(epochs=args.epochs, loss=args.loss, bf16=True)
    groups = groups_from_split(ds, "train", config)
    t0 = time.perf_counter()
    train_reranker(CrossEncoder.load("all-MiniLM-L6-v2", allow_untrained_head=True), groups, config, args.out)
    train_s = time.perf_counter() - t0
    ce = CrossEncoder.load(args.out, precision="bf16")
    corpus = ds.corpus
    texts = {d.id: d.full_text for d in corpus}
    bm25 = BM25Retriever.build(corpus)
    dense = DenseRetriever.build(corpus, BiEncoder.load(args.retriever, precision="bf16"))
    systems = {"bm25": bm25, "dense": dense,
               "bm25+rerank": _Reranked(Pipeline(bm25, reranker=ce, texts=texts, k_retrieve=args.depth, k=10)),
               "dense+rerank": _Reranked(Pipeline(dense, reranker=ce, texts=texts, k_retrieve=args.depth, k=10))}
    result = run_bench(ds, "test", systems)
    table = result.table()
    lines = ["# Reranking on SciFact test: cross-encoder trained on train from all-MiniLM-L6-v2\n",
             f"Command: `python benchmarks/rerank_scifact.py --depth {args.depth} --epochs {args.epochs} --loss {args.loss}`\n",
             f"{len(groups)} training groups (query, positive, {config.negatives} BM25 negatives), {config.loss} loss, "
             f"{args.epochs} epochs, max length {config.max_length}, bf16 autocast: {train_s:.0f} s. Rerank depth "
             f"{args.depth}; dense = {args.retriever}; bf16 inference for both models.\n",
             markdown_table(table[["ndcg@10", "mrr@10", "recall@10", "recall@100", "latency_ms_p50", "latency_ms_p95"]]),
             "\nVersions: " + ", ".join(f"{k} {v}" for k, v in versions().items()) + "\n"]
    Path("benchmarks/results/rerank-scifact.md").write_text("\n".join(lines))
    Path("benchmarks/results/rerank-scifact.json").write_text(json.dumps(
        {n: {k: float(v) for k, v in row.items()} for n, row in table.iterrows()}, indent=2) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
