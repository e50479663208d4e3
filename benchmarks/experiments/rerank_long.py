"""How should the reranker read a long candidate in a passage engine? Chosen on dev composites only.

Usage (from the repository root, with the one-command run's models):
    python benchmarks/experiments/rerank_long.py --retriever runs/models/scifact-one-path/retriever \
        --reranker runs/models/scifact-one-path/reranker

Long SciFact dev: composites built as benchmarks/long_documents.py builds them (1,500-3,000 words, the documents
of other queries as filler), around the documents relevant to the SciFact train queries that both models held out
when they were trained (the reranker's twostage.json lists them). One default passage engine over them; its hybrid
first stage once; then the reranker reads each of the top ``rerank_depth`` candidates in one of these ways:

- ``chosen``: the best passage of the first stage that ranked the document highest (the engine before cd4b50f);
- ``maxp``: the best passage of each first stage (BM25's and dense's), the higher reranker score counts (the
  engine since);
- ``para``: the chosen passage, moved back to the start of its paragraph when that is at most --back words
  before it (a paragraph: text after a blank line), then as many words as a passage has;
- ``para-maxp``: both stages' passages moved so, the higher score counts.

Each is blended with the first stage at every blend 0, 0.1 ... 1 (the engine's min-max blend); nDCG@10 on the dev
queries. A sanity row gives the engine's own hybrid+rerank: it equals the row of the engine's reading at its blend.
Writes benchmarks/results/rerank_long.md.
"""

from __future__ import annotations

import argparse
import bisect
import json
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
BLENDS = [round(0.1 * i, 1) for i in range(11)]
VARIANTS = ["chosen", "maxp", "para", "para-maxp"]


def moved_back(doc: Any, n: int, words: int, stride: int, back: int) -> str:
    """Passage ``n`` of ``doc`` started at its paragraph's first word when that is at most ``back`` words before."""
    from twostage.indexer.passages import word_starts
    from twostage.indexer.records import Document

    starts = word_starts(doc.text)
    first = min(n * stride, max(0, len(starts) - 1))
    at = starts[first] if starts else 0
    para = doc.text.rfind("\n\n", 0, at)
    para_word = bisect.bisect_left(starts, para + 2) if para >= 0 else 0
    if first - para_word <= back:
        first = para_word
    end = starts[first + words] if first + words < len(starts) else len(doc.text)
    return Document(doc.id, doc.text[starts[first] if starts else 0:end], doc.title).full_text


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--retriever", default="runs/models/scifact-one-path/retriever")
    ap.add_argument("--reranker", default="runs/models/scifact-one-path/reranker")
    ap.add_argument("--data", type=Path, default=ROOT.parent / "shared" / "data" / "scifact")
    ap.add_argument("--documents", type=int, default=250, help="composites in the dev collection")
    ap.add_argument("--collection", choices=["long", "scifact"], default="long",
                    help="long: the dev composites; scifact: SciFact's own corpus (documents of at most the engine's "
                         "rerank_whole_up_to words are read whole, as the engine reads them)")
    ap.add_argument("--back", type=int, default=100, help="how far back (words) a passage may move to its paragraph")
    ap.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results" / "rerank_long.md")
    args = ap.parse_args()

    import numpy as np

    sys.path.insert(0, str(ROOT / "benchmarks"))
    from long_documents import long_collection

    from twostage import SearchEngine
    from twostage.eval.metrics import evaluate
    from twostage.indexer.passages import by_document, split_id
    from twostage.indexer.records import RankedList
    from twostage.reranker.interpolation import rerank_order
    from twostage.retriever.hybrid import dense_weights, fuse

    dev = set(json.loads((Path(args.reranker) / "twostage.json").read_text())["training"]["dev_queries"])
    if args.collection == "long":
        docs, queries, qrels, about = long_collection(args.data, args.documents, 0, "train", query_ids=dev)
    else:
        from twostage.indexer.beir import BeirDataset

        data = BeirDataset(args.data)
        split = data.split("train")
        docs, queries, qrels = list(data.corpus), [q for q in split.queries if q.id in dev], split.qrels.subset(dev)
        words = [len(d.text.split()) for d in docs]
        about = {"composites": len(docs), "words_min": min(words), "words_max": max(words),
                 "words_median": float(np.median(words)), "relevant_inside": len({j.doc_id for j in qrels})}
    t0 = time.perf_counter()
    with tempfile.TemporaryDirectory() as tmp:
        engine = SearchEngine.build(docs, f"{tmp}/engine", retriever=args.retriever, reranker=args.reranker,
                                    show_progress=True)
        build_s = time.perf_counter() - t0
        s = engine.settings
        texts = [q.text for q in queries]
        engine_run = {q.id: engine.ranked(q.text, k=10) for q in queries}
        vectors = engine.encoder.encode(texts, kind="query", batch_size=s.batch_size)
        lists = engine.candidates(texts, vectors, "hybrid", s.first_stage_depth, None, {})
        doc_lists, by_stage = by_document(lists)  # each document's best passage in each stage, the first: "chosen"
        firsts = [fuse([b, d], s.fusion, k_rrf=s.k_rrf, weights=dense_weights(s.dense_weight))
                  .truncate(s.first_stage_depth) for b, d in zip(doc_lists["bm25"], doc_lists["dense"])]
        heads = [f.truncate(s.rerank_depth) for f in firsts]
        full = {d.id: d for d in engine.documents(sorted({str(d) for h in heads for d in h.ids}))}
        shape = s.passages

        wanted = {p for q, h in enumerate(heads) for d in map(str, h.ids) for p in by_stage[q][d]}
        passage_text = {p.id: p.full_text for p in engine.passages(sorted(wanted))}

        def read(pid: str, para: bool) -> str:
            doc_id, n = split_id(pid)
            if len(full[doc_id].text.split()) <= s.rerank_whole_up_to:  # read whole, as the engine does
                return full[doc_id].full_text
            if para:
                return moved_back(full[doc_id], n, shape.words, shape.stride, args.back)
            return passage_text[pid]

        # each query's candidates -> the texts each variant reads (one or two per candidate)
        reads: dict[str, list[list[list[str]]]] = {v: [] for v in VARIANTS}
        for q, head in enumerate(heads):
            for v in VARIANTS:
                para = v.startswith("para")
                per_doc = []
                for d in map(str, head.ids):
                    pids = by_stage[q][d] if v.endswith("maxp") else by_stage[q][d][:1]
                    per_doc.append([read(p, para) for p in pids])
                reads[v].append(per_doc)
        pairs = sorted({(texts[q], t) for v in VARIANTS for q, per_doc in enumerate(reads[v])
                        for ts in per_doc for t in ts})
        t = time.perf_counter()
        scores = dict(zip(pairs, np.asarray(engine.reranker.predict(pairs, batch_size=s.batch_size), dtype=float)))
        score_s = time.perf_counter() - t

    def ndcg(run: dict[str, RankedList]) -> float:
        return float(evaluate(qrels.subset(list(run)), run, ["ndcg@10"])["ndcg@10"].mean())

    table: dict[str, list[float]] = {}
    for v in VARIANTS:
        ce = [np.array([max(scores[(texts[q], t)] for t in ts) for ts in per_doc]) for q, per_doc in enumerate(reads[v])]
        table[v] = []
        for blend in BLENDS:
            run = {}
            for q, (head, c) in enumerate(zip(heads, ce)):
                order, final = rerank_order(head.scores, c, blend)
                run[queries[q].id] = RankedList(head.ids[order], final[order])
            table[v].append(ndcg(run))
    engine_blend = engine.settings.rerank_blend
    two = sum(len(by_stage[q][str(d)]) > 1 for q, h in enumerate(heads) for d in h.ids)
    lines = [f"# How the reranker reads a long candidate (dev queries, {args.collection})", "",
             f"Command: `python benchmarks/experiments/rerank_long.py --retriever {args.retriever} --reranker "
             f"{args.reranker} --documents {args.documents} --back {args.back} --collection {args.collection}"
             + (f" --out {args.out}" if args.collection != "long" else "") + "`", "",
             (f"Long SciFact dev: {about['composites']} composites of {about['words_min']}-{about['words_max']} "
              f"words (median {about['words_median']:.0f}), {about['relevant_inside']} of them around a document "
              f"relevant to one of the {len(queries)} dev queries" if args.collection == "long" else
              f"SciFact's corpus: {about['composites']} documents of {about['words_min']}-{about['words_max']} words "
              f"(median {about['words_median']:.0f}), {about['relevant_inside']} of them relevant to one of the "
              f"{len(queries)} dev queries; a document of at most {s.rerank_whole_up_to} words is read whole by "
              "every variant")
             + " (SciFact train queries both models held out). The engine's "
             f"defaults (passages {shape.words}/{shape.stride}, hybrid {s.fusion}, rerank top {s.rerank_depth}, "
             f"{s.precision} precision); build {build_s:.0f} s, {len(pairs)} pairs scored in {score_s:.0f} s. "
             f"Of the {sum(len(h) for h in heads)} reranked candidates, {two} have a different best passage in "
             "BM25 and in dense. Every number is nDCG@10 on the dev queries.", "",
             f"Sanity: the engine's own hybrid+rerank (blend {engine_blend}) scores {ndcg(engine_run):.4f}.", "",
             "| reads | " + " | ".join(str(b) for b in BLENDS) + " | best |",
             "|---|" + "---|" * (len(BLENDS) + 1)]
    for v in VARIANTS:
        i = int(np.argmax(table[v]))
        lines.append(f"| {v} | " + " | ".join(f"{x:.4f}" for x in table[v]) + f" | {table[v][i]:.4f} ({BLENDS[i]}) |")
    args.out.write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
