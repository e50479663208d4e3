"""ANN benchmark: every backend against exact search, on SciFact embeddings and on synthetic clustered vectors.

Usage (from the repository root):
    python benchmarks/experiments/ann.py --data scifact                # MiniLM embeddings of the SciFact corpus and queries
    python benchmarks/experiments/ann.py --data synthetic --n 1000000  # 1M x 384 clustered vectors, 1,000 held-out queries

For each backend: build time, index size on disk, resident memory added by the build, queries per second
(all queries in one batch, both cores) and recall@10 against exact search on the same vectors. Exact search
is numpy's matrix product over the whole matrix (BLAS, both cores), the baseline every ratio is taken
against. Results: benchmarks/results/ann-<data>.md.
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time
from pathlib import Path

import numpy as np

os.environ.setdefault("HF_HUB_OFFLINE", "1")

from twostage.eval.report import versions  # noqa: E402
from twostage.indexer.vectors import (  # noqa: E402
    BackendConfig,
    ann_from_vectors,  # noqa: E402
    default_params,
    prepare,
)

SETTINGS = {
    "hnswlib": [{"M": 16, "ef_construction": 100, "ef_search": ef} for ef in (64, 128, 256)],
    "faiss-hnsw": [{"M": 16, "ef_construction": 100, "ef_search": ef} for ef in (64, 128, 256)],
    "faiss-ivf": [{"nprobe": p} for p in (16, 64)],
    "faiss-ivfpq": [{"nprobe": 64}],
}


def rss() -> int:
    with open("/proc/self/statm") as fh:
        return int(fh.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def synthetic(n: int, dim: int, queries: int, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """Gaussian clusters (1,000 centres, spread 0.5 around unit-scale centres), queries from the same law."""
    rng = np.random.default_rng(seed)
    centres = rng.normal(size=(1000, dim)).astype(np.float32)
    out = np.empty((n + queries, dim), dtype=np.float32)
    for start in range(0, n + queries, 100_000):
        m = min(100_000, n + queries - start)
        out[start:start + m] = centres[rng.integers(0, 1000, m)] + 0.5 * rng.normal(size=(m, dim)).astype(np.float32)
    return out[:n], out[n:]


def scifact(data: Path) -> tuple[np.ndarray, np.ndarray]:
    from twostage.indexer.beir import BeirDataset
    from twostage.retriever.biencoder import BiEncoder

    ds = BeirDataset(data)
    enc = BiEncoder.load("all-MiniLM-L6-v2", precision="bf16")
    docs = enc.encode([d.full_text for d in ds.corpus], batch_size=32, allow_empty=True)
    return docs, enc.encode([q.text for q in ds.queries.values()], kind="query")


def exact(vectors: np.ndarray, queries: np.ndarray, k: int) -> tuple[np.ndarray, float]:
    t0 = time.perf_counter()
    top = np.empty((len(queries), k), dtype=np.int64)
    for start in range(0, len(queries), 256):
        s = queries[start:start + 256] @ vectors.T
        part = np.argpartition(-s, k, axis=1)[:, :k]
        order = np.argsort(-np.take_along_axis(s, part, 1), axis=1)
        top[start:start + 256] = np.take_along_axis(part, order, 1)
    return top, time.perf_counter() - t0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data", default="synthetic", choices=["synthetic", "scifact"])
    parser.add_argument("--n", type=int, default=1_000_000)
    parser.add_argument("--dim", type=int, default=384)
    parser.add_argument("--queries", type=int, default=1000)
    parser.add_argument("--backends", default=",".join(SETTINGS))
    parser.add_argument("--scifact", type=Path, default=Path("../shared/data/scifact"))
    args = parser.parse_args()
    t0 = time.perf_counter()
    docs, queries = synthetic(args.n, args.dim, args.queries) if args.data == "synthetic" else scifact(args.scifact)
    make_s = time.perf_counter() - t0
    docs, queries = prepare(docs, "cosine"), prepare(queries, "cosine")
    truth, exact_s = exact(docs, queries, 10)
    exact_qps = len(queries) / exact_s
    rows = [("exact (numpy, BLAS)", "-", 0.0, docs.nbytes, 0, exact_qps, 1.0)]
    for name in args.backends.split(","):
        for setting in SETTINGS[name]:
            build_params = {k: v for k, v in setting.items() if k not in ("ef_search", "nprobe")}
            before = rss()
            t0 = time.perf_counter()
            ann = ann_from_vectors(BackendConfig(name, "cosine", build_params), docs)
            build_s = time.perf_counter() - t0
            grown = rss() - before
            with tempfile.TemporaryDirectory() as tmp:
                ann.save(Path(tmp) / "ann")
                size = (Path(tmp) / "ann").stat().st_size
            for search in ([setting] if name not in ("hnswlib", "faiss-hnsw") else
                           [{**build_params, "ef_search": e["ef_search"]} for e in SETTINGS[name]]):
                params = {**default_params(name, len(docs), docs.shape[1]), **search, "search_threads": -1}
                ann.search(queries[:10], 10, params)
                t0 = time.perf_counter()
                labels, _ = ann.search(queries, 10, params)
                qps = len(queries) / (time.perf_counter() - t0)
                recall = float(np.mean([len(set(a) & set(b)) / 10 for a, b in zip(labels, truth)]))
                shown = ", ".join(f"{k}={v}" for k, v in search.items())
                rows.append((name, shown, build_s, size, grown, qps, recall))
                print(rows[-1], flush=True)
            del ann
            if name in ("hnswlib", "faiss-hnsw"):
                break  # one build per HNSW backend serves its three ef_search settings
    table = rows
    lines = [f"# ANN benchmark: {args.data} ({len(docs):,} x {docs.shape[1]} vectors, {len(queries):,} queries)\n",
             f"Command: `python benchmarks/experiments/ann.py --data {args.data}" + (f" --n {args.n}`" if args.data == "synthetic" else "`"),
             f"\nCosine similarity; recall@10 against exact search; queries/s with all queries in one batch on this "
             f"{os.cpu_count()}-core machine; exact search: {exact_qps:.0f} queries/s. Data made in {make_s:.0f} s.\n",
             "| backend | search setting | build s | index MB | RSS growth MB | queries/s | x exact | recall@10 |",
             "|---|---|---|---|---|---|---|---|"]
    for name, shown, build_s, size, grown, qps, recall in table:
        lines.append(f"| {name} | {shown} | {build_s:.1f} | {size / 2**20:.0f} | {grown / 2**20:.0f} | {qps:.0f} | "
                     f"{qps / exact_qps:.1f} | {recall:.4f} |")
    lines.append("\nVersions: " + ", ".join(f"{k} {v}" for k, v in versions().items()) + "\n")
    out = Path(f"benchmarks/results/ann-{args.data}.md")
    out.write_text("\n".join(lines))
    print("\n".join(lines))
    best = max(table, key=lambda row: row[5])
    print(f"ann ({args.data}): fastest {best[0]} ({best[1]}) {best[5] / exact_qps:.1f}x exact at recall@10 "
          f"{best[6]:.4f}; table in {out}")


if __name__ == "__main__":
    main()
