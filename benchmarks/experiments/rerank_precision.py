"""Cross-encoder inference precision on CPU: fp32, bf16 and int8, same model, same pairs, SciFact test.

Usage (from the repository root):
    python benchmarks/experiments/rerank_precision.py --reranker runs/models/scifact-ce2 --depth 20

Scores every test query's dense top --depth with each precision (one pass each, timed) and reports
nDCG@10 / MRR@10 of dense+rerank (reranker alone and blended at the model's dev-chosen alpha) and pairs/s.
A precision is kept as an option only if its nDCG@10 is within 0.005 of fp32.
"""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")



from twostage.eval.metrics import evaluate  # noqa: E402
from twostage.eval.report import versions  # noqa: E402
from twostage.indexer.beir import BeirDataset  # noqa: E402
from twostage.indexer.records import RankedList  # noqa: E402
from twostage.reranker.cross_encoder import CrossEncoder  # noqa: E402
from twostage.reranker.interpolation import rerank_order  # noqa: E402
from twostage.retriever.biencoder import BiEncoder  # noqa: E402
from twostage.retriever.dense import DenseRetriever  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data", type=Path, default=Path("../shared/data/scifact"))
    parser.add_argument("--reranker", default="runs/models/scifact-ce2")
    parser.add_argument("--retriever", default="runs/models/scifact-ours")
    parser.add_argument("--depth", type=int, default=20)
    parser.add_argument("--out", type=Path, default=Path("benchmarks/results/rerank-precision.md"))
    args = parser.parse_args()
    ds = BeirDataset(args.data)
    split = ds.split("test")
    texts = {d.id: d.full_text for d in ds.corpus}
    dense = DenseRetriever.build(ds.corpus, BiEncoder.load(args.retriever, precision="bf16"))
    queries = list(split.queries)
    firsts = {q.id: dense.search(q.text, args.depth) for q in queries}
    pairs = [(q.text, texts[str(d)]) for q in queries for d in firsts[q.id].ids]
    rows = []
    for precision in ("fp32", "bf16", "int8"):
        ce = CrossEncoder.load(args.reranker, precision=precision)
        t = time.perf_counter()
        scores = ce.predict(pairs, batch_size=32)
        seconds = time.perf_counter() - t
        row = {"precision": precision, "pairs/s": len(pairs) / seconds}
        for mode, alpha in (("reranker", None), ("blend", ce.interpolation)):
            run, start = {}, 0
            for q in queries:
                first = firsts[q.id]
                o, s = rerank_order(first.scores, scores[start:start + len(first)], alpha)
                start += len(first)
                run[q.id] = RankedList(first.ids[o], s[o])
            table = evaluate(split.qrels, run, ["ndcg@10", "mrr@10"])
            row[f"{mode} nDCG@10"], row[f"{mode} MRR@10"] = float(table["ndcg@10"].mean()), float(table["mrr@10"].mean())
        rows.append(row)
    base = rows[0]
    lines = [f"# Cross-encoder precision on CPU (SciFact test, dense top {args.depth}, {len(pairs)} pairs)\n",
             f"Command: `python benchmarks/experiments/rerank_precision.py --reranker {args.reranker} --depth {args.depth}`\n",
             "| precision | pairs/s | speed vs fp32 | reranker nDCG@10 | blend nDCG@10 | blend MRR@10 | Δ blend nDCG@10 vs fp32 | kept |",
             "|---|---|---|---|---|---|---|---|"]
    for r in rows:
        delta = r["blend nDCG@10"] - base["blend nDCG@10"]
        keep = abs(r["reranker nDCG@10"] - base["reranker nDCG@10"]) <= 0.005 and abs(delta) <= 0.005
        r["kept"] = keep
        lines.append(f"| {r['precision']} | {r['pairs/s']:.1f} | {r['pairs/s'] / base['pairs/s']:.2f}x | "
                     f"{r['reranker nDCG@10']:.4f} | {r['blend nDCG@10']:.4f} | {r['blend MRR@10']:.4f} | "
                     f"{delta:+.4f} | {'yes' if keep else 'no (quality)'} |")
    lines.append("\nVersions: " + ", ".join(f"{k} {v}" for k, v in versions().items()) + "\n")
    args.out.write_text("\n".join(lines))
    Path(str(args.out).replace(".md", ".json")).write_text(json.dumps(rows, indent=2))
    print("\n".join(lines))



if __name__ == "__main__":
    main()
