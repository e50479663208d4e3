"""Dense query-encoding latency, one query at a time, split by whether the query's token length was seen before
(a new shape can cost kernel set-up). ``python benchmarks/experiments/query_tail.py MODEL_DIR`` (SciFact test queries)."""
import argparse
import time

import numpy as np

from twostage.indexer.beir import BeirDataset
from twostage.retriever.biencoder import BiEncoder


def main() -> None:
    parser = argparse.ArgumentParser(description="Dense query latency split by new vs seen token lengths.")
    parser.add_argument("model", help="bi-encoder directory")
    args = parser.parse_args()
    qs = [q.text for q in BeirDataset("../shared/data/scifact").split("test").queries]
    for prec in ("bf16", "fp32"):
        m = BiEncoder.load(args.model, precision=prec)
        m.encode(["warm up"])
        for rnd in (1, 2):
            seen, first, again = set(), [], []
            for q in qs:
                n = len(m.tokenizer(q)["input_ids"])
                t = time.perf_counter(); m.encode([q]); dt = (time.perf_counter() - t) * 1000
                (again if n in seen else first).append(dt); seen.add(n)
            allv = first + again
            print(prec, "round", rnd, f"p50 {np.percentile(allv,50):.1f} p95 {np.percentile(allv,95):.1f} ms;",
                  f"new length ({len(first)}): median {np.median(first):.1f}; seen length ({len(again)}): median {np.median(again):.1f}")


if __name__ == "__main__":
    main()
