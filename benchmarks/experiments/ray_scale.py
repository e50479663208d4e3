"""Ray Data encoding against the single-process path on this machine.

Usage (from the repository root, with the extra installed: pip install -e ".[ray]"):
    python benchmarks/experiments/ray_scale.py [--docs 1024]

1. Encoding: the first --docs SciFact documents, all-MiniLM-L6-v2 fp32, written as an index directory (flat):
   `build_index` in one process (torch on every core) against `build_index_ray` (2 actors x 1 core each), in
   alternating rounds, median of 3. Ray's start-up (ray.init) is excluded; actor start-up (model load) is in.

Shards served by Ray actors are measured on the sharded engine (benchmarks/experiments/sharded.py); the 100M plan is in
benchmarks/results/scale.md.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import tempfile
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import numpy as np  # noqa: E402

from twostage.eval.report import versions  # noqa: E402
from twostage.indexer.build import build_index  # noqa: E402
from twostage.indexer.corpus import iter_documents  # noqa: E402
from twostage.indexer.index import Index  # noqa: E402
from twostage.retriever.biencoder import BiEncoder  # noqa: E402
from twostage.retriever.distributed import build_index_ray  # noqa: E402


def encoding(tmp: Path, n_docs: int, model: str) -> dict:
    import ray

    docs = [d for _, d in zip(range(n_docs), iter_documents(Path("../shared/data/scifact")))]
    corpus = tmp / "corpus.jsonl"
    corpus.write_text("".join(json.dumps({"_id": d.id, "title": d.title, "text": d.text}) + "\n" for d in docs))
    ray.init(address="local", num_cpus=os.cpu_count(), include_dashboard=False, log_to_driver=False)
    serial_s, ray_s = [], []
    encoder = BiEncoder.load(model)
    for _ in range(3):
        t = time.perf_counter()
        a = build_index(corpus, encoder, tmp / "serial", backend="flat", chunk_size=256)
        serial_s.append(time.perf_counter() - t)
        t = time.perf_counter()
        build_index_ray(corpus, model, tmp / "ray", backend="flat", num_actors=2, cpus_per_actor=1, chunk_size=256)
        ray_s.append(time.perf_counter() - t)
    diff = float(np.abs(a.rows(np.arange(a.manifest.rows)) - Index.load(tmp / "ray").rows(np.arange(a.manifest.rows))).max())
    ray.shutdown()
    s, r = statistics.median(serial_s), statistics.median(ray_s)
    return {"docs": n_docs, "serial_docs_s": n_docs / s, "ray_docs_s": n_docs / r, "ratio": s / r,
            "max_abs_diff": diff, "serial_s": serial_s, "ray_s": ray_s, "cores": os.cpu_count(),
            "per_core_docs_s": n_docs / s / os.cpu_count()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--docs", type=int, default=1024)
    parser.add_argument("--model", default="all-MiniLM-L6-v2")
    parser.add_argument("--out", type=Path, default=Path("benchmarks/results/ray_scale.md"))
    args = parser.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="ray-scale-"))
    try:
        enc = encoding(tmp, args.docs, args.model)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    lines = ["# Ray against the single-process path (2-core CPU)\n",
             f"Command: `python benchmarks/experiments/ray_scale.py --docs {args.docs}`\n",
             "## Encoding into an index directory (SciFact documents, all-MiniLM-L6-v2 fp32, median of 3)\n",
             "| path | docs/s | ratio |", "|---|---|---|",
             f"| build_index, one process (torch on {enc['cores']} cores) | {enc['serial_docs_s']:.1f} | 1.00x |",
             f"| build_index_ray, 2 actors x 1 core | {enc['ray_docs_s']:.1f} | {enc['ratio']:.2f}x |",
             f"\n{enc['docs']} documents; same vectors (max |difference| {enc['max_abs_diff']:.1e}). Rounds (s): "
             f"serial {', '.join(f'{x:.1f}' for x in enc['serial_s'])}; ray {', '.join(f'{x:.1f}' for x in enc['ray_s'])}.\n"]
    lines += ["\nVersions: " + ", ".join(f"{k} {v}" for k, v in versions().items()) + "\n"]
    args.out.write_text("\n".join(lines))
    Path(str(args.out).replace(".md", ".json")).write_text(json.dumps({"encoding": enc}, indent=2))
    print("\n".join(lines))


if __name__ == "__main__":
    main()
