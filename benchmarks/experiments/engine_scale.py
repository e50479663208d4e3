"""Memory of an engine's life over N synthetic documents: the build, the first search that shows hits, an update.

Usage (from the repository root):
    python benchmarks/experiments/engine_scale.py --docs 100000
    python benchmarks/experiments/engine_scale.py --docs 1000000 --md benchmarks/results/engine_scale.md   # appends a row

The documents are benchmarks/scale.py's synthetic texts; the bi-encoder is the tests' tiny random BERT (2 layers,
32 dimensions, built offline), so that encoding is cheap and what grows with N is the engine's own bookkeeping:
the texts, BM25's arrays, the vectors and the ANN graph (hnswlib). ``--words`` sets the documents' length.
Phases, one after the other in one process:
build; the first search with hits (their documents read from the store); ``add`` of 1,000 new documents and
``delete`` of 1,000 (each a new version: BM25 updated from its stored postings, or before a391e5a rebuilt from
every live document). For each phase: seconds and the growth of anonymous memory (RssAnon, sampled every 0.2 s)
over its value when the phase began, which is what the phase itself needed; peak RSS (ru_maxrss, file pages included) is the build's. The last line:
``engine scale: N docs, peak RSS X GB, build T s, add +A GB, delete +D GB``.
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
ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--docs", type=int, required=True)
    ap.add_argument("--dir", type=Path, default=None, help="where the engine goes (default: a temporary directory)")
    ap.add_argument("--md", type=Path, default=None, help="append the result as a table row to this markdown file")
    ap.add_argument("--label", default="", help="a name for the code measured (the row's first column)")
    ap.add_argument("--words", type=int, default=8, help="words per document besides its topic word (8: ~60 bytes; "
                    "150: ~1 KB, a typical passage)")
    args = ap.parse_args()

    from scale import AnonPeak, documents

    from tests.conftest import build_tiny_bert
    from twostage.engine.search_engine import SearchEngine
    from twostage.indexer.records import Document

    phases: dict[str, tuple[float, float]] = {}  # name -> (seconds, anonymous growth GB)

    def phase(name: str, work):
        start = AnonPeak.now()
        t = time.perf_counter()
        with AnonPeak() as anon:
            out = work()
        phases[name] = (time.perf_counter() - t, (anon.peak - start) / 2**30)
        return out

    with tempfile.TemporaryDirectory(dir=args.dir) as tmp:
        bert = build_tiny_bert(Path(tmp) / "bert")
        base = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 / 2**30
        engine = phase("build", lambda: SearchEngine.build(documents(args.docs, words=args.words), Path(tmp) / "engine",
                                                            retriever=bert, precision="fp32", batch_size=256))
        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 / 2**30
        hits = phase("first search", lambda: engine.search("t17 w5 w9", k=10, rerank=False))
        assert len(engine) == args.docs and len(hits.hits) == 10 and hits.hits[0].text
        new = [Document(f"new{i}", f"t{i % 2000} w{i} w{i + 1} w{i + 2}") for i in range(1000)]
        added = phase("add 1k", lambda: engine.add(new))
        step = max(1, args.docs // 1000)  # 1,000 ids spread over the corpus
        deleted = phase("delete 1k", lambda: added.delete([f"d{i * step}" for i in range(min(1000, args.docs))]))
        assert "new5" in deleted and f"d{step}" not in deleted
        for e in (engine, added, deleted):
            e.close()
    row = {name: f"{s:.0f} s, +{gb:.2f}" for name, (s, gb) in phases.items()}
    if args.md:
        fresh = not args.md.exists()
        with open(args.md, "a", encoding="utf-8") as fh:
            if fresh:
                fh.write("| code | docs | words | build: s, anonymous growth GB | peak RSS GB | first search with hits | add 1k | "
                         "delete 1k | RSS before the build GB |\n|---|---|---|---|---|---|---|---|---|\n")
            fh.write(f"| {args.label} | {args.docs:,} | {args.words} | {row['build']} | {peak:.2f} | {row['first search']} | "
                     f"{row['add 1k']} | {row['delete 1k']} | {base:.2f} |\n")
    print("; ".join(f"{name}: {v}" for name, v in row.items()))
    print(f"engine scale: {args.docs} docs, peak RSS {peak:.2f} GB, build {phases['build'][0]:.0f} s, "
          f"add +{phases['add 1k'][1]:.2f} GB, delete +{phases['delete 1k'][1]:.2f} GB")


if __name__ == "__main__":
    main()
