"""Peak memory of building a whole engine (documents, BM25, dense index) over N synthetic documents.

Usage (from the repository root):
    python benchmarks/engine_scale.py --docs 100000
    python benchmarks/engine_scale.py --docs 1000000 --md benchmarks/results/engine_scale.md   # appends a row

The documents are benchmarks/scale.py's synthetic texts; the bi-encoder is the tests' tiny random BERT (2 layers,
32 dimensions, built offline), so that encoding is cheap and what grows with N is the engine's own bookkeeping:
the texts, BM25's arrays, the vectors and the ANN graph (hnswlib). Peak RSS is the process's peak at the end of
the build. The last line: ``engine scale: N docs, peak RSS X GB, build T s``.
"""

from __future__ import annotations

import argparse
import os
import resource
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--docs", type=int, required=True)
    ap.add_argument("--dir", type=Path, default=None, help="where the engine goes (default: a temporary directory)")
    ap.add_argument("--md", type=Path, default=None, help="append the result as a table row to this markdown file")
    ap.add_argument("--label", default="", help="a name for the code measured (the row's first column)")
    args = ap.parse_args()

    from scale import documents
    from tests.conftest import build_tiny_bert

    from twostage.reranker.engine import SearchEngine

    with tempfile.TemporaryDirectory(dir=args.dir) as tmp:
        bert = build_tiny_bert(Path(tmp) / "bert")
        base = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 / 2**30
        t = time.perf_counter()
        engine = SearchEngine.build(documents(args.docs), Path(tmp) / "engine", retriever=bert, precision="fp32",
                                    batch_size=256)
        build_s = time.perf_counter() - t
        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 / 2**30
        hits = engine.search("t17 w5 w9", k=10, rerank=False)
        assert len(engine) == args.docs and len(hits.hits) == 10
        engine.close()
    if args.md:
        new = not args.md.exists()
        with open(args.md, "a", encoding="utf-8") as fh:
            if new:
                fh.write("| code | docs | build s | peak RSS GB | RSS before the build GB |\n|---|---|---|---|---|\n")
            fh.write(f"| {args.label} | {args.docs:,} | {build_s:.0f} | {peak:.2f} | {base:.2f} |\n")
    print(f"engine scale: {args.docs} docs, peak RSS {peak:.2f} GB, build {build_s:.0f} s")


if __name__ == "__main__":
    main()
