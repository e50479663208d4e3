"""The cost of reading documents back from an index (what a search does for its hits and rerank candidates).

Usage (from the repository root):
    python benchmarks/experiments/doc_fetch.py --data ../shared/data/scifact [--md FILE --label NAME]

Builds an index of the corpus with a random 16-d encoder (the vectors do not matter here), opens it, and calls
``Index.documents`` with 30 random live ids, 300 times: the first call (nothing read yet) and the warm p50 / p95.
Run it against two versions of the package (PYTHONPATH) to compare them; the last line:
``doc fetch: first X ms, p50 Y ms, p95 Z ms per 30 ids``.
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

import numpy as np

from twostage.indexer.build import build_index
from twostage.indexer.corpus import load_corpus
from twostage.indexer.index import Index
from twostage.indexer.manifest import EncoderInfo


class RandomEncoder:
    def encode(self, texts: list[str], kind: str = "document", **kw: object) -> np.ndarray:
        return np.random.default_rng(len(texts)).normal(size=(len(texts), 16)).astype(np.float32)

    def info(self) -> EncoderInfo:
        return EncoderInfo("random-16", 16)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--data", type=Path, required=True, help="a BEIR directory (its corpus is indexed)")
    ap.add_argument("--calls", type=int, default=300)
    ap.add_argument("--md", type=Path, default=None, help="append a table row to this markdown file")
    ap.add_argument("--label", default="", help="a name for the code measured")
    args = ap.parse_args()
    docs = list(load_corpus(args.data))
    ids = [d.id for d in docs]
    rng = np.random.default_rng(0)
    batches = [list(rng.choice(ids, 30, replace=False)) for _ in range(args.calls)]
    with tempfile.TemporaryDirectory() as tmp:
        build_index(docs, RandomEncoder(), Path(tmp) / "idx", backend="flat", chunk_size=4096)
        index = Index.load(Path(tmp) / "idx", verify=False)
        t = time.perf_counter()
        index.documents(batches[0])
        first = time.perf_counter() - t
        times = []
        for batch in batches:
            t = time.perf_counter()
            got = index.documents(batch)
            times.append(time.perf_counter() - t)
            assert [d.id for d in got] == batch
        index.close()
    p50, p95 = (float(np.percentile(times, p)) * 1000 for p in (50, 95))
    if args.md:
        fresh = not args.md.exists()
        with open(args.md, "a", encoding="utf-8") as fh:
            if fresh:
                fh.write("| code | documents | first call ms | warm p50 ms | warm p95 ms |\n|---|---|---|---|---|\n")
            fh.write(f"| {args.label} | {len(docs):,} | {first * 1000:.1f} | {p50:.2f} | {p95:.2f} |\n")
    print(f"doc fetch: first {first * 1000:.1f} ms, p50 {p50:.2f} ms, p95 {p95:.2f} ms per 30 ids")


if __name__ == "__main__":
    main()
