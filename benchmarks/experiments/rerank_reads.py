"""What should the reranker read of each candidate in a passage engine: its best passage, or the document whole
(its head, as far as the reranker reads) when the document is short? Chosen on dev queries only.

Usage (from the repository root, with the one-command run's models):
    python benchmarks/experiments/rerank_reads.py --retriever runs/models/scifact-e2e-fit/retriever \
        --reranker runs/models/scifact-e2e-fit/reranker

Builds the default passage engine over SciFact's corpus once, then searches (hybrid+rerank, the engine's defaults)
with ``rerank_whole_up_to`` = each of --values (0: every candidate by its best passage, today's engine). Dev: the
81 SciFact train queries both models held out when they were trained (their twostage.json records them); the other
train queries are reported too, but the models were trained on them. Long documents (1,500 words and more, as in
benchmarks/long_documents.py) are longer than any value tried, so they are read by their best passage either way.
Writes benchmarks/results/rerank_reads.md.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
VALUES = [0, 200, 300, 400, 600, 10**6]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--retriever", required=False, default="runs/models/scifact-e2e-fit/retriever")
    ap.add_argument("--reranker", required=False, default="runs/models/scifact-e2e-fit/reranker")
    ap.add_argument("--data", type=Path, default=ROOT.parent / "shared" / "data" / "scifact")
    ap.add_argument("--values", type=int, nargs="+", default=VALUES)
    ap.add_argument("--trained", type=int, default=200, help="about this many of the trained-on queries, evenly "
                    "spaced, reported beside dev")
    ap.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results" / "rerank_reads.md")
    args = ap.parse_args()

    import numpy as np

    from twostage import SearchEngine
    from twostage.eval.metrics import evaluate
    from twostage.indexer.beir import BeirDataset
    from twostage.indexer.engine_dir import EngineSettings

    data = BeirDataset(args.data)
    split = data.split("train")
    meta = json.loads((Path(args.reranker) / "twostage.json").read_text())["training"]
    dev = set(meta["dev_queries"])
    retriever_meta = json.loads((Path(args.retriever) / "twostage.json").read_text()).get("training", {})
    held = retriever_meta.get("dev_queries")
    same_dev = isinstance(held, list) and set(held) == dev
    words = np.array([len(d.text.split()) for d in data.corpus])
    rows, start = [], time.time()
    with tempfile.TemporaryDirectory() as tmp:
        engine = SearchEngine.build(data.corpus, f"{tmp}/engine", retriever=args.retriever, reranker=args.reranker,
                                    show_progress=True)
        build_s = time.time() - start
        cfg = engine.settings
        shape = (f"{cfg.passages.words}/{cfg.passages.stride} passages" if cfg.passages.enabled
                 else "whole documents")
        trained = [q for q in split.queries if q.id not in dev]
        queries = [q for q in split.queries if q.id in dev] + trained[::max(1, len(trained) // args.trained)]
        for value in args.values:
            engine = engine.configure(rerank_whole_up_to=value)
            t = time.perf_counter()
            run = {q.id: engine.ranked(q.text, k=100) for q in queries}
            seconds = time.perf_counter() - t
            table = evaluate(split.qrels.subset(list(run)), run, ["ndcg@10"])
            nd = table["ndcg@10"]
            rows.append((value, float(nd[nd.index.isin(dev)].mean()), float(nd[~nd.index.isin(dev)].mean()), seconds))
            print(f"rerank_whole_up_to {value}: dev {rows[-1][1]:.4f}, trained-on {rows[-1][2]:.4f}, {seconds:.0f} s",
                  flush=True)
    best = max(rows, key=lambda r: r[1])
    lines = ["# What the reranker reads in a passage engine (dev)", "",
             f"Command: `python benchmarks/experiments/rerank_reads.py --retriever {args.retriever} --reranker "
             f"{args.reranker} --out {args.out.as_posix()}` (2-core CPU, the engine's defaults: {shape}, hybrid by "
             f"{cfg.fusion_label}, rerank top {cfg.rerank_depth} at the reranker's dev-chosen blend "
             f"{cfg.blend_for('hybrid')}, {cfg.precision} precision; build {build_s:.0f} s).", "",
             f"SciFact train split: {len(dev)} dev queries held out by both models' training "
             f"({'the same list in both models' if same_dev else 'the list the reranker records'}),"
             f" {len(queries) - len(dev)} queries they were trained on. SciFact documents: median {np.median(words):.0f} "
             f"words, 90th percentile {np.percentile(words, 90):.0f}, max {words.max()}; "
             + ", ".join(f"{(words <= v).mean():.0%} <= {v}" for v in (150, 200, 250, 300, 400, 600)) + ".", "",
             "| rerank_whole_up_to (words) | nDCG@10 dev | nDCG@10 trained-on queries | search s |",
             "| --- | --- | --- | --- |"]
    lines += [f"| {v if v < 10**6 else 'every document whole'} | {d:.4f} | {t:.4f} | {s:.0f} |" for v, d, t, s in rows]
    default = EngineSettings().rerank_whole_up_to
    at_default = next((f"{d:.4f}" for v, d, _, _ in rows if v == default), "not measured")
    lines += ["", f"Best on dev: {best[0]} ({best[1]:.4f}; the engine's default, {default}: {at_default})."]
    args.out.write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    sys.exit(main())
