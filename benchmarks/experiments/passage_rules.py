"""Which documents should each first stage read as passages? Chosen on dev queries only.

Usage (from the repository root): python benchmarks/experiments/passage_rules.py

benchmarks/experiments/passage_shapes.py chose 100/50 passages for both stages on dev. On SciFact test that cost
BM25 0.008 nDCG@10 on short abstracts, while dense gained; this script asks, per stage, whether a document should
be cut only when it is longer than some number of words (``whole up to W``: a document of at most W words stays one
passage). Each stage is scored as the engine scores it (a document by its best passage), every combination of a
BM25 rule and a dense rule is fused (RRF, k 60), all on dev: SciFact with its train queries and "long SciFact dev"
(one composite of 1,500-3,300 words around each of the train queries' 565 relevant documents, built as
benchmarks/long_documents.py builds the test one). Dense: all-MiniLM-L6-v2 zero-shot, fp32, exact search; passage texts are encoded once and
shared between rules. Writes benchmarks/results/passage_rules.md.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "benchmarks"))

RULES = ["whole", "100/50", "100/50 whole<=200", "100/50 whole<=300", "200/100", "150/75"]


def parse_rule(text: str) -> tuple[int, int, int]:
    """(words, stride, whole_up_to) of a rule such as ``100/50 whole<=200`` (``whole``: 0, 0, 0)."""
    if text == "whole":
        return 0, 0, 0
    text = text.partition(" reads ")[0]
    shape, _, whole = text.partition(" whole<=")
    words, _, stride = shape.partition("/")
    return int(words), int(stride), int(whole or 0)


def rows_for(docs: list[Any], rule: str) -> list[Any]:
    from twostage.indexer.passages import PassageShape, split

    words, stride, whole = parse_rule(rule)
    if not words:
        return [d for d in docs]
    shape = PassageShape(words, stride)
    reads = int(rule.partition(" reads ")[2] or 0)
    if reads:  # the same rows, each read from its passage's first word for `reads` words (BM25 only)
        from twostage.indexer.records import Document

        out = []
        for d in docs:
            ws = d.text.split()
            out += [Document(p.id, " ".join(ws[n * stride:n * stride + reads]), p.title, p.metadata)
                    for n, p in enumerate(split(d, shape))]
        return out
    out = []
    for d in docs:
        if whole and len(d.text.split()) <= whole:
            out.append(split(d, PassageShape(10 ** 9, 1))[0])
        else:
            out.extend(split(d, shape))
    return out


def best_lists(docs: list[Any], rows: list[Any], scores: Any, positive_only: bool) -> list[Any]:
    """Per query (rows of ``scores``) the top 100 documents by their best row."""
    import numpy as np

    from twostage.indexer.passages import group_starts
    from twostage.indexer.records import RankedList
    from twostage.indexer.topk import top_k

    groups = group_starts([p.id for p in rows]) if len(rows) != len(docs) else np.arange(len(rows))
    if len(groups) != len(docs):  # whole documents only among rows of passages: every row id ends in SEP + 0
        raise SystemExit("internal: rows do not group into documents")
    ids = np.array([d.id for d in docs], dtype=object)
    out = []
    for s in scores:
        best = np.maximum.reduceat(np.asarray(s, dtype=np.float32), groups)
        r, val = top_k(best, 100, positive_only=positive_only)
        out.append(RankedList(ids[r], val))
    return out


def evaluate_collection(docs: list[Any], queries: list[Any], qrels: Any, encoder: Any, cache: dict[str, Any],
                        rules: list[str]) -> tuple[dict[str, float], dict[str, float], dict[tuple[str, str], float]]:
    import numpy as np

    from twostage.eval.metrics import evaluate
    from twostage.retriever.bm25 import BM25Retriever
    from twostage.retriever.hybrid import fuse

    def ndcg(lists: list[Any]) -> float:
        return float(evaluate(qrels, {q.id: r for q, r in zip(queries, lists)}, ["ndcg@10"])["ndcg@10"].mean())

    qv = encoder.encode([q.text for q in queries], kind="query", batch_size=64)
    bm25_lists, dense_lists = {}, {}
    for rule in rules:
        rows = rows_for(docs, rule)
        bm25 = BM25Retriever.build(rows)
        bm25_lists[rule] = best_lists(docs, rows, [bm25.scores(q.text) for q in queries], True)
        if " reads " in rule:  # a BM25-only rule: its dense lists are its rows' passages'
            print(f"  {rule}: bm25 {ndcg(bm25_lists[rule]):.4f}", flush=True)
            continue
        texts = [p.full_text for p in rows]
        missing = sorted({t for t in texts if t not in cache})
        if missing:
            for t, v in zip(missing, encoder.encode(missing, kind="document", batch_size=64)):
                cache[t] = v
        vectors = np.stack([cache[t] for t in texts])
        dense_lists[rule] = best_lists(docs, rows, qv @ vectors.T, False)
        print(f"  {rule}: bm25 {ndcg(bm25_lists[rule]):.4f} dense {ndcg(dense_lists[rule]):.4f}", flush=True)
    bm25_scores = {r: ndcg(x) for r, x in bm25_lists.items()}
    dense_scores = {r: ndcg(x) for r, x in dense_lists.items()}
    hybrid = {}
    for b in rules:
        for d in dense_lists:
            fused = [fuse([x, y], "rrf", k_rrf=60.0).truncate(100) for x, y in zip(bm25_lists[b], dense_lists[d])]
            hybrid[(b, d)] = ndcg(fused)
    return bm25_scores, dense_scores, hybrid


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rules", nargs="+", default=RULES,
                        help="`whole`, `W/S`, `W/S whole<=N`, or (BM25 only) `W/S reads N`: the W/S rows, each read "
                             "by BM25 from its first word for N words")
    parser.add_argument("--precision", default="fp32", help="the encoder's precision (openvino-fp32 is faster)")
    parser.add_argument("--data", type=Path, default=ROOT.parent / "shared" / "data" / "scifact")
    parser.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results" / "passage_rules.md")
    args = parser.parse_args()

    from long_documents import long_collection

    from twostage.indexer.beir import BeirDataset
    from twostage.retriever.biencoder import BiEncoder

    t0 = time.perf_counter()
    encoder = BiEncoder.load("all-MiniLM-L6-v2", precision=args.precision)
    ds = BeirDataset(args.data)
    train = ds.split("train")
    long_docs, long_queries, long_qrels, about = long_collection(args.data, 300, 0, "train")
    collections = {"SciFact train": (list(ds.corpus), list(train.queries), train.qrels),
                   "long SciFact dev": (long_docs, long_queries, long_qrels)}
    cache: dict[str, Any] = {}
    results = {}
    for name, (docs, queries, qrels) in collections.items():
        print(name, flush=True)
        results[name] = evaluate_collection(docs, queries, qrels, encoder, cache, args.rules)
    names = list(collections)
    lines = ["# Which documents each first stage reads as passages (dev queries)", "",
             "Command: `python benchmarks/experiments/passage_rules.py" +
             (f" --rules {' '.join(repr(r) for r in args.rules)}" if args.rules != RULES else "") +
             (f" --precision {args.precision}" if args.precision != "fp32" else "") +
             (f" --out {args.out}" if args.out.resolve() != ROOT / "benchmarks" / "results" / "passage_rules.md"
              else "") + "`", "",
             f"nDCG@10; all-MiniLM-L6-v2 zero-shot ({args.precision}, exact); each document scored by its best passage; "
             "`100/50 whole<=200`: 100-word passages every 50 words, but a document of at most 200 words stays one "
             f"passage; `100/50 reads 200`: the same rows, BM25 reading each from its first word for 200 words (dense "
             f"keeps its 100). Long SciFact dev: {about['composites']} composites of {about['words_min']}-"
             f"{about['words_max']} words from the train queries' documents. "
             f"{(time.perf_counter() - t0) / 60:.1f} min on the 2-core machine.", "",
             "## Each stage alone", "", "| rule | " + " | ".join(f"{n} BM25 | {n} dense" for n in names) + " |",
             "|---|" + "---|---|" * len(names)]
    for rule in args.rules:
        cells = [f"{results[n][0][rule]:.4f} | {results[n][1].get(rule, float('nan')):.4f}" for n in names]
        lines.append(f"| {rule} | " + " | ".join(cells) + " |")
    lines += ["", "## Hybrid (RRF k 60): BM25 rule x dense rule", "",
              "| BM25 rule | dense rule | " + " | ".join(names) + " | mean |", "|---|---|" + "---|" * (len(names) + 1)]
    combos = sorted(results[names[0]][2], key=lambda c: -sum(results[n][2][c] for n in names))
    for combo in combos:
        vals = [results[n][2][combo] for n in names]
        lines.append(f"| {combo[0]} | {combo[1]} | " + " | ".join(f"{v:.4f}" for v in vals) +
                     f" | {sum(vals) / len(vals):.4f} |")
    args.out.write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
