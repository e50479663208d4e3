"""Long queries (#46): which part of a query longer than the retriever reads should it read, and how?

    python benchmarks/experiments/long_queries.py [--data ../shared/data/arguana] [--model all-MiniLM-L6-v2]

ArguAna's queries are whole arguments (513 of 1,406 test queries are longer than the 256 tokens MiniLM reads);
the engine reads their beginning. This encodes the corpus once (whole documents, as `--passage-words 0`) and each
query several ways, then measures dense and hybrid (RRF of BM25 and dense, k 60, depth 100: the engine's default
fusion) nDCG@10 without each query's own document (as BEIR):

- ``head``: the first 256 tokens (what the engine does);
- ``tail``: the last 256 tokens;
- ``head+tail``: the first and the last 127;
- ``windows mean``: every 254-token window (no overlap) encoded, the normalised vectors averaged and normalised
  again (the whole query read, one vector);
- ``windows max``: the same windows, a document scored by its best window;
- ``head 512``: the first 512 tokens (the model's position limit; it was trained on 128-256).

The variants need no labels; their choice here is made on a seeded half of the queries ("choose") and reported
on the other half ("held out") and on all, so that the held-out column is not chosen on. BM25 reads every query
whole. Writes benchmarks/results/long_queries.md (+ .json).
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[2]
VARIANTS = ("head", "tail", "head+tail", "windows mean", "windows max", "head 512")


def windows(tokenizer: Any, text: str, size: int) -> list[str]:
    """``text`` as consecutive pieces of ``size`` tokens (the last shorter), decoded back to text."""
    ids = tokenizer(text, add_special_tokens=False)["input_ids"]
    return [tokenizer.decode(ids[i:i + size]) for i in range(0, max(1, len(ids)), size)] or [text]


def cut(tokenizer: Any, text: str, variant: str, size: int) -> str:
    ids = tokenizer(text, add_special_tokens=False)["input_ids"]
    if len(ids) <= size:
        return text
    if variant == "tail":
        return tokenizer.decode(ids[-size:])
    if variant == "head+tail":
        return tokenizer.decode(ids[:size // 2]) + " " + tokenizer.decode(ids[-(size - size // 2):])
    return text  # head: the encoder cuts it


def query_scores(model: Any, queries: list[str], variant: str, docs: np.ndarray) -> np.ndarray:
    """(queries, documents) dense scores of the queries read as ``variant``."""
    if variant != "windows max":
        return query_vectors(model, queries, variant) @ docs.T
    pieces = [windows(model.tokenizer, q, model.config.max_length - 2) for q in queries]
    flat = model.encode([p for ps in pieces for p in ps], kind="query")
    out, i = np.empty((len(queries), docs.shape[0]), dtype=np.float32), 0
    for n, ps in enumerate(pieces):
        out[n] = (flat[i:i + len(ps)] @ docs.T).max(0)
        i += len(ps)
    return out


def query_vectors(model: Any, queries: list[str], variant: str) -> np.ndarray:
    tok, size = model.tokenizer, model.config.max_length - 2
    if variant in ("head", "tail", "head+tail"):
        return model.encode([cut(tok, q, variant, size) for q in queries], kind="query")
    if variant == "head 512":
        before = model.config
        model.config = replace(before, max_length=512)
        try:
            return model.encode(queries, kind="query")
        finally:
            model.config = before
    pieces = [windows(tok, q, size) for q in queries]
    flat = model.encode([p for ps in pieces for p in ps], kind="query")
    out, i = np.empty((len(queries), flat.shape[1]), dtype=np.float32), 0
    for n, ps in enumerate(pieces):
        v = flat[i:i + len(ps)].mean(0)
        out[n] = v / max(np.linalg.norm(v), 1e-12)
        i += len(ps)
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", type=Path, default=ROOT.parent / "shared" / "data" / "arguana")
    parser.add_argument("--model", default="all-MiniLM-L6-v2")
    parser.add_argument("--precision", default="openvino-fp32")
    parser.add_argument("--seed", type=int, default=42)
    parser.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results" / "long_queries.md")
    args = parser.parse_args()

    from twostage.eval.metrics import evaluate
    from twostage.indexer.beir import BeirDataset
    from twostage.indexer.records import RankedList
    from twostage.retriever.biencoder import BiEncoder
    from twostage.retriever.bm25 import BM25Retriever
    from twostage.retriever.hybrid import rrf

    t0 = time.time()
    data = BeirDataset(args.data)
    corpus, split = data.corpus, data.split("test")
    queries = list(split.queries)
    model = BiEncoder.load(args.model, precision=args.precision)
    texts = [q.text for q in queries]
    longer = model.longer_than_read(texts)
    docs = model.encode([d.full_text for d in corpus], kind="document", show_progress=True)
    doc_ids = np.array([d.id for d in corpus], dtype=object)
    bm25 = BM25Retriever.build(corpus)
    bm25_lists = {q.id: bm25.search(q.text, 100) for q in queries}
    order = list(range(len(queries)))
    random.Random(args.seed).shuffle(order)
    halves = {"choose": {queries[i].id for i in order[:len(order) // 2]},
              "held out": {queries[i].id for i in order[len(order) // 2:]}}
    long_ids = {q.id for q, n in zip(queries, model.tokenizer(texts)["input_ids"]) if len(n) > model.config.max_length}
    rows: dict[str, Any] = {}
    for variant in VARIANTS:
        t = time.time()
        scores = query_scores(model, texts, variant, docs)
        top = np.argsort(-scores, axis=1)[:, :101]
        dense = {q.id: RankedList(doc_ids[top[i]], scores[i, top[i]].astype(np.float32)) for i, q in enumerate(queries)}
        hybrid = {q.id: rrf([bm25_lists[q.id], dense[q.id]]) for q in queries}
        row: dict[str, Any] = {"seconds": time.time() - t}
        for system, run in (("dense", dense), ("hybrid", hybrid)):
            table = evaluate(split.qrels, run, ["ndcg@10"], ignore_identical_ids=True)["ndcg@10"]
            row[system] = {"all": float(table.mean()), "long": float(table[table.index.isin(long_ids)].mean()),
                           **{h: float(table[table.index.isin(ids)].mean()) for h, ids in halves.items()}}
        rows[variant] = row
        print(variant, json.dumps(row), flush=True)
    chosen = max(VARIANTS, key=lambda v: rows[v]["hybrid"]["choose"])
    out = {"queries": len(queries), "longer_than_read": longer, "max_length": model.config.max_length,
           "rows": rows, "chosen_on_half": chosen, "seconds": time.time() - t0}
    args.out.with_suffix(".json").write_text(json.dumps(out, indent=1) + "\n")
    lines = ["# Long queries: which part to read", "",
             f"Command: `python benchmarks/experiments/long_queries.py {' '.join(sys.argv[1:])}`", "",
             f"{args.data.name} test: {len(queries)} queries, {longer} longer than the {model.config.max_length} tokens "
             f"{args.model} reads ({args.precision}); corpus of {len(corpus)} whole documents. nDCG@10 without each "
             "query's own document; hybrid: RRF (k 60) of BM25 (the whole query) and dense, top 100 each. "
             f"'choose' / 'held out': a seeded half of the queries each (seed {args.seed}); 'long': the {len(long_ids)} "
             f"queries over {model.config.max_length} tokens. {out['seconds'] / 60:.1f} min on this 2-core machine.",
             "", "| query read as | dense: all | dense: long | hybrid: all | hybrid: long | hybrid: choose | "
             "hybrid: held out |", "|---|---:|---:|---:|---:|---:|---:|"]
    for v, r in rows.items():
        d, h = r["dense"], r["hybrid"]
        lines.append(f"| {v} | {d['all']:.4f} | {d['long']:.4f} | {h['all']:.4f} | {h['long']:.4f} | "
                     f"{h['choose']:.4f} | {h['held out']:.4f} |")
    base = rows["head"]["hybrid"]
    lines += ["", f"Chosen on the 'choose' half by hybrid nDCG@10: **{chosen}**; on the held-out half "
              f"{rows[chosen]['hybrid']['held out']:.4f} against head's {base['held out']:.4f} "
              f"({rows[chosen]['hybrid']['held out'] - base['held out']:+.4f})."]
    args.out.write_text("\n".join(lines) + "\n", encoding="utf-8")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
