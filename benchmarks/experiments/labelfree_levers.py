"""Label-free query-time levers for the hybrid first stage, on the zero-shot base model: an ablation on dev.

Usage (from the repository root):
    python benchmarks/experiments/labelfree_levers.py

#18 asks for an engine that beats zero-shot hybrid (BM25 + all-MiniLM-L6-v2, RRF) by >= 0.02 nDCG@10 without
labels. Fine-tuning on pseudo-queries does not transfer (benchmarks/results/adapt-*), so this measures the levers
that need no training at all, each against the same baseline lists:

- **fusion**: RRF at several k, the min-max score blend (the engine's ``blend``) and ranx's other unsupervised
  fusions (ISR variants, rank-biased centroids, BordaFuse, weighted sums under other normalisations);
- **BM25 + RM3**: relevance-model query expansion (Lavrenko & Croft; the RM3 interpolation of Anserini), from the
  BM25 top ``docs`` documents, ``terms`` expansion terms, the original query keeping weight ``orig``;
- **dense MaxP**: each document also encoded as overlapping windows of 100 words (title + window, stride 50); its
  dense score is the best of its windows and its whole text;
- **dense Rocchio**: the query vector moved towards the mean of the hybrid top ``docs`` documents' vectors by
  ``beta``, then searched again.

Each lever's setting is chosen on SciFact *train* (dev: the split the supervised recipe trains on, never the test
split) by hybrid nDCG@10, then reported on SciFact test and Cranfield (test only, never chosen on). Exact search,
fp32, depth 100 per list, as the engine fuses. Writes benchmarks/results/labelfree-levers.md; last line:
``labelfree: best lever LEVER, SciFact test +X.XXX, Cranfield +Y.YYY over zero-shot hybrid``.
"""

from __future__ import annotations

import argparse
import functools
import os
import platform
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import scipy.sparse as sp

ROOT = Path(__file__).resolve().parents[2]
DEPTH = 100


@dataclass
class Collection:
    """What every lever needs of one collection: the BM25 term matrix, the dense vectors, the queries."""

    name: str
    ids: np.ndarray
    weights: sp.csr_matrix  # documents x terms: BM25 term weights (score = weights @ query term counts)
    counts: sp.csr_matrix   # documents x terms: term frequencies
    lengths: np.ndarray
    vocab: dict[str, int]
    analyze: Callable[[str], list[str]]
    vectors: np.ndarray
    windows: np.ndarray     # the best window score needs (window vectors, owner document)
    owners: np.ndarray
    splits: dict[str, tuple[list[str], list[str], np.ndarray, object]]  # split -> (ids, texts, vectors, qrels)

    @functools.cached_property
    def rows(self) -> dict[str, int]:
        return {d: i for i, d in enumerate(self.ids)}


def bm25_terms(docs: list[list[str]], k1: float, b: float) -> tuple[sp.csr_matrix, sp.csr_matrix, np.ndarray,
                                                                     dict[str, int]]:
    """The engine's Lucene BM25 (retriever/bm25.py's formula) as a sparse matrix, so a query can weight its terms."""
    vocab: dict[str, int] = {}
    rows, cols, vals = [], [], []
    for i, terms in enumerate(docs):
        tf: dict[int, int] = {}
        for t in terms:
            j = vocab.setdefault(t, len(vocab))
            tf[j] = tf.get(j, 0) + 1
        rows += [i] * len(tf)
        cols += list(tf)
        vals += list(tf.values())
    counts = sp.csr_matrix((np.array(vals, np.float64), (rows, cols)), shape=(len(docs), len(vocab)))
    lengths = np.array([len(t) for t in docs], np.float64)
    df = np.bincount(counts.indices, minlength=len(vocab))
    idf = np.log(1 + (len(docs) - df + 0.5) / (df + 0.5))
    c = counts.tocoo()
    data = idf[c.col] * c.data / (c.data + k1 * (1 - b + b * lengths[c.row] / max(lengths.mean(), 1e-9)))
    return sp.csr_matrix((data, (c.row, c.col)), shape=counts.shape), counts, lengths, vocab


def windows_of(title: str, text: str, size: int = 100, stride: int = 50) -> list[str]:
    from rerank_windows import windows  # the sibling benchmark's cut: the reranker's windows are the same kind

    return [f"{title} {w}".strip() for w in windows(text.split(), size, stride)]


def load(root: Path, base: str, show_progress: bool) -> Collection:
    from twostage.indexer.beir import BeirDataset
    from twostage.retriever.analyzer import Analyzer
    from twostage.retriever.biencoder import BiEncoder
    from twostage.retriever.bm25 import BM25Config

    ds = BeirDataset(root)
    docs = list(ds.corpus.to_frame().itertuples(index=False))
    texts = [f"{d.title} {d.text}" if d.title and d.text else (d.title or d.text) for d in docs]
    analyzer = Analyzer()
    config = BM25Config()
    weights, counts, lengths, vocab = bm25_terms(analyzer.analyze_many(texts), config.k1, config.b)
    model = BiEncoder.load(base, precision="fp32")
    vectors = model.encode(texts, allow_empty=True, show_progress=show_progress)
    chunks = [windows_of(d.title, d.text) for d in docs]
    owners = np.repeat(np.arange(len(docs)), [len(c) for c in chunks])
    windows = model.encode([w for c in chunks for w in c], allow_empty=True, show_progress=show_progress)
    splits = {}
    for name in ds.splits:
        split = ds.split(name)
        queries = list(split.queries)
        splits[name] = ([q.id for q in queries], [q.text for q in queries],
                        model.encode([q.text for q in queries], kind="query"), split.qrels)
    collection = Collection(ds.name, np.array([d.id for d in docs], dtype=object), weights, counts, lengths, vocab,
                            analyzer, vectors, windows, owners, splits)
    check_bm25(collection, ds.corpus, [q.text for q in list(ds.queries.values())[:50]])
    return collection


def check_bm25(c: Collection, corpus, queries: list[str]) -> None:
    """The matrix scores as the engine's BM25 does (the top 10 scores of 50 queries, up to the engine's constant
    factor), or the levers would be measured against another baseline than the engine's."""
    from twostage.retriever.bm25 import BM25Retriever

    engine = BM25Retriever.build(corpus)
    for text in queries:
        ours = np.sort(c.weights @ term_vector(c, text))[::-1][:10]
        theirs = engine.search(text, 10).scores.astype(np.float64)
        if not np.allclose(ours * (theirs[0] / max(ours[0], 1e-12)), theirs, rtol=1e-4, atol=1e-6):
            raise SystemExit(f"the BM25 matrix does not score {text!r} as the engine's BM25 does")


def ranked(c: Collection, scores: np.ndarray):
    from twostage.indexer.records import RankedList
    from twostage.indexer.topk import top_k

    idx, values = top_k(scores.astype(np.float32), DEPTH)
    return RankedList(c.ids[idx], values)


def term_vector(c: Collection, text: str) -> np.ndarray:
    v = np.zeros(len(c.vocab))
    for t in c.analyze(text):
        if t in c.vocab:
            v[c.vocab[t]] += 1
    return v


def rm3(c: Collection, query: np.ndarray, docs: int, terms: int, orig: float) -> np.ndarray:
    """The RM3 query: ``orig`` x the query's term distribution + (1 - orig) x the top ``terms`` of the relevance
    model sum_d p(d) tf(t, d) / |d| over the BM25 top ``docs``, p(d) the normalised BM25 scores."""
    first = c.weights @ query
    top = np.argsort(-first, kind="stable")[:docs]
    p = first[top] / max(first[top].sum(), 1e-9)
    model = np.asarray(c.counts[top].multiply(1 / np.maximum(c.lengths[top], 1)[:, None]).T @ p).ravel()
    keep = np.argsort(-model, kind="stable")[:terms]
    expansion = np.zeros_like(query)
    expansion[keep] = model[keep] / max(model[keep].sum(), 1e-9)
    return orig * query / max(query.sum(), 1e-9) + (1 - orig) * expansion


def first_stage_lists(c: Collection, split: str):
    """Baseline BM25 and dense lists of every query, plus the raw scores the levers rework."""
    qids, texts, qvecs, _ = c.splits[split]
    terms = [term_vector(c, t) for t in texts]
    dense = qvecs @ c.vectors.T
    return qids, terms, dense


def evaluate_split(c: Collection, split: str, levers: dict[str, list[tuple[str, Callable]]]) -> dict[str, float]:
    from twostage.eval.metrics import mean_ndcg10
    from twostage.retriever.hybrid import fuse

    qids, terms, dense = first_stage_lists(c, split)
    qrels = c.splits[split][3]
    bm25 = {q: ranked(c, c.weights @ t) for q, t in zip(qids, terms)}
    dn = {q: ranked(c, s) for q, s in zip(qids, dense)}
    out = {"bm25": mean_ndcg10(qrels, bm25), "dense": mean_ndcg10(qrels, dn),
           "hybrid (rrf)": mean_ndcg10(qrels, {q: fuse([bm25[q], dn[q]]) for q in qids})}
    context = {"split": split, "qids": qids, "terms": terms, "dense": dense, "bm25": bm25, "dn": dn}
    for group, settings in levers.items():
        for label, make in settings:
            out[f"{group}: {label}"] = mean_ndcg10(qrels, make(c, context))
    return out


def lever_table() -> dict[str, list[tuple[str, Callable]]]:
    import ranx

    from twostage.indexer.records import RankedList
    from twostage.retriever.hybrid import fuse

    def from_ranx(run: ranx.Run, q: str) -> RankedList:
        items = sorted(run[q].items(), key=lambda kv: -kv[1])
        return RankedList(np.array([d for d, _ in items], dtype=object), np.array([s for _, s in items], np.float32))

    def ranx_fusion(method: str, norm: str | None, params: dict | None):
        def make(c, x):
            runs = [ranx.Run({q: dict(zip(r[q].ids, r[q].scores.astype(float))) for q in x["qids"]})
                    for r in (x["bm25"], x["dn"])]
            kw = {"norm": norm} if norm else {}
            fused = ranx.fuse(runs, method=method, params=params, **kw)
            return {q: from_ranx(fused, q) for q in x["qids"]}
        return make

    def rrf_k(k):
        return lambda c, x: {q: fuse([x["bm25"][q], x["dn"][q]], "rrf", k_rrf=k) for q in x["qids"]}

    def blend(w):
        return lambda c, x: {q: fuse([x["bm25"][q], x["dn"][q]], "blend", weights=[1 - w, w]) for q in x["qids"]}

    def with_rm3(docs, terms, orig):
        def make(c, x):
            lists = {q: ranked(c, c.weights @ rm3(c, t, docs, terms, orig)) for q, t in zip(x["qids"], x["terms"])}
            return {q: fuse([lists[q], x["dn"][q]]) for q in x["qids"]}
        return make

    def maxp(c, x):
        out = {}
        qvecs = c.splits[x["split"]][2]
        for i, q in enumerate(x["qids"]):
            best = np.full(len(c.ids), -np.inf, dtype=np.float32)
            np.maximum.at(best, c.owners, c.windows @ qvecs[i])
            out[q] = fuse([x["bm25"][q], ranked(c, np.maximum(best, x["dense"][i]))])
        return out

    def rocchio(docs, beta):
        def make(c, x):
            qvecs, out = c.splits[x["split"]][2], {}
            for i, q in enumerate(x["qids"]):
                first = fuse([x["bm25"][q], x["dn"][q]])
                rows = [c.rows[d] for d in first.ids[:docs]]
                moved = qvecs[i] + beta * c.vectors[rows].mean(axis=0)
                out[q] = fuse([x["bm25"][q], ranked(c, c.vectors @ (moved / np.linalg.norm(moved)))])
            return out
        return make

    levers: dict[str, list[tuple[str, Callable]]] = {
        "fusion": [(f"rrf k={k}", rrf_k(k)) for k in (10, 20, 30, 100)]
        + [(f"blend min-max, dense {w}", blend(w)) for w in (0.3, 0.4, 0.5, 0.6)]
        + [(f"ranx {label}", ranx_fusion(m, n, p))
           for label, m, n, p in [("wsum, sum norm, dense 0.5", "wsum", "sum", {"weights": [0.5, 0.5]}),
                                  ("wsum, max norm, dense 0.5", "wsum", "max", {"weights": [0.5, 0.5]}),
                                  ("wsum, z-score norm, dense 0.4", "wsum", "zmuv", {"weights": [0.6, 0.4]}),
                                  ("isr", "isr", None, None), ("logn_isr", "logn_isr", None, None),
                                  ("rbc, phi 0.95", "rbc", None, {"phi": 0.95}),
                                  ("bordafuse", "bordafuse", None, None)]],
        "bm25+rm3 in rrf": [(f"docs {d}, terms {t}, orig {o}", with_rm3(d, t, o))
                            for d, t, o in [(3, 10, 0.5), (5, 10, 0.5), (10, 20, 0.5), (5, 20, 0.7), (10, 20, 0.7)]],
        "dense maxp in rrf": [("100-word windows, stride 50", maxp)],
        "dense rocchio in rrf": [(f"hybrid top {d}, beta {b}", rocchio(d, b)) for d, b in [(3, 0.5), (5, 0.5), (5, 1.0)]],
    }
    return levers


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--scifact", type=Path, default=ROOT.parent / "shared" / "data" / "scifact")
    parser.add_argument("--cranfield", type=Path, default=ROOT.parent / "shared" / "data" / "cranfield")
    parser.add_argument("--base", default="all-MiniLM-L6-v2")
    parser.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results" / "labelfree-levers.md")
    args = parser.parse_args()

    start = time.perf_counter()
    levers = lever_table()
    columns = {"SciFact train (dev)": (args.scifact, "train"), "SciFact test": (args.scifact, "test"),
               "Cranfield test": (args.cranfield, "test")}
    loaded: dict[Path, Collection] = {}
    results: dict[str, dict[str, float]] = {}
    for column, (root, split) in columns.items():
        if root not in loaded:
            loaded[root] = load(root, args.base, show_progress=True)
        results[column] = evaluate_split(loaded[root], split, levers)
        print(column, {k: round(v, 4) for k, v in results[column].items()}, flush=True)

    dev, tests = "SciFact train (dev)", ["SciFact test", "Cranfield test"]
    base = "hybrid (rrf)"
    chosen = {g: max((f"{g}: {label}" for label, _ in settings), key=lambda r: results[dev][r])
              for g, settings in levers.items()}
    best = max(chosen.values(), key=lambda r: results[dev][r])
    lines = [
        "# Label-free query-time levers on the zero-shot hybrid first stage (ablation on dev)", "",
        "Command: `python benchmarks/experiments/labelfree_levers.py`", "",
        (f"Base model {args.base} zero-shot, fp32, exact search, BM25 (Lucene, k1 1.5, b 0.75, the engine's "
        "analyzer); depth 100 per list. Each lever's setting is chosen on SciFact train by nDCG@10 (bold); SciFact "
        "test and Cranfield are reported, never chosen on. Δ is against zero-shot hybrid (RRF, k 60), the engine's "
        "default. What each lever does is in the script's docstring."), "",
        "| system | " + " | ".join(f"{c} nDCG@10 (Δ)" for c in columns) + " |",
        "|---|" + "---|" * len(columns),
    ]
    for row in results[dev]:
        cells = []
        for c in columns:
            v, d = results[c][row], results[c][row] - results[c][base]
            cells.append(f"{v:.4f}" if row in ("bm25", "dense", base) else f"{v:.4f} ({d:+.4f})")
        name = f"**{row}**" if row in chosen.values() else row
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    deltas = ", ".join(f"{t.split()[0]} {results[t][best] - results[t][base]:+.3f}" for t in tests)
    lines += ["", "Chosen on dev, per lever: " + "; ".join(
        f"{g} -> {r.split(': ', 1)[1]} (" + ", ".join(f"{t} {results[t][r] - results[t][base]:+.4f}" for t in tests)
        + ")" for g, r in chosen.items()) + ".", "",
        (f"Machine: {platform.processor() or platform.machine()}, {len(os.sched_getaffinity(0))} cores; "
        f"{(time.perf_counter() - start) / 60:.1f} min."), "",
        f"labelfree: best lever {best}, {deltas} over zero-shot hybrid"]
    args.out.write_text("\n".join(lines) + "\n", encoding="utf-8")
    print(lines[-1])


if __name__ == "__main__":
    main()
