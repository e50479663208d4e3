"""Ray against the single-process path on this machine, and what a 100M-document corpus would need.

Usage (from the repository root, with the extra installed: pip install -e ".[ray]"):
    python benchmarks/ray_scale.py [--docs 1024] [--vectors 200000]

1. Encoding: the first --docs SciFact documents, all-MiniLM-L6-v2 fp32, written as an index directory (flat):
   `build_index` in one process (torch on every core) against `build_index_ray` (2 actors x 1 core each), in
   alternating rounds, median of 3. Ray's start-up (ray.init) is excluded; actor start-up (model load) is in.
2. Search: --vectors random unit vectors (dim 384) split into 1, 2 and 4 exact shards; 200 queries one at a
   time, p50/p95 latency: one index in process, shards in process, shards as Ray actors. Results checked equal.
3. Per-shard numbers for the 100M estimate: HNSW (M=16) over 1M vectors from benchmarks/results/ann-synthetic.md
   (same machine), encoding throughput per core from (1).
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
from twostage.indexer.manifest import EncoderInfo  # noqa: E402
from twostage.indexer.shards import ShardedIndex, write_manifest  # noqa: E402
from twostage.retriever.biencoder import BiEncoder  # noqa: E402
from twostage.retriever.distributed import build_index_ray  # noqa: E402


class TableEncoder:
    """Precomputed vectors by text (the search benchmark measures search, not encoding)."""

    def __init__(self, table: dict[str, np.ndarray], dim: int) -> None:
        self.table, self.dim = table, dim

    def encode(self, texts, kind="document", batch_size=32, **kw):
        return np.stack([self.table[t] for t in texts])

    def info(self) -> EncoderInfo:
        return EncoderInfo("table", self.dim)


def encoding(tmp: Path, n_docs: int, model: str) -> dict:
    import ray

    docs = [d for _, d in zip(range(n_docs), iter_documents(Path("../shared/data/scifact")))]
    corpus = tmp / "corpus.jsonl"
    corpus.write_text("".join(json.dumps({"_id": d.id, "title": d.title, "text": d.text}) + "\n" for d in docs))
    ray.init(num_cpus=os.cpu_count(), include_dashboard=False, log_to_driver=False)
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


def search(tmp: Path, n: int, dim: int = 384, queries: int = 200) -> list[dict]:
    import ray

    rng = np.random.default_rng(0)
    vectors = rng.standard_normal((n, dim)).astype(np.float32)
    vectors /= np.linalg.norm(vectors, axis=1, keepdims=True)
    q = rng.standard_normal((queries, dim)).astype(np.float32)
    q /= np.linalg.norm(q, axis=1, keepdims=True)
    from twostage.indexer.records import Document

    texts = [f"d{i}" for i in range(n)]
    enc = TableEncoder(dict(zip(texts, vectors)), dim)
    docs = [Document(t, t) for t in texts]
    single = build_index(docs, enc, tmp / "single", backend="flat", chunk_size=65536)
    rows = []

    def time_it(name: str, fn) -> np.ndarray:
        fn(q[:1])  # warm-up
        lat, out = [], []
        for i in range(queries):
            t = time.perf_counter()
            out.append(fn(q[i:i + 1])[0])
            lat.append((time.perf_counter() - t) * 1000)
        rows.append({"system": name, "p50_ms": float(np.percentile(lat, 50)), "p95_ms": float(np.percentile(lat, 95))})
        return out

    want = time_it("one index, in process", lambda v: single.search_batch(v, 10))
    ray.init(num_cpus=os.cpu_count(), include_dashboard=False, log_to_driver=False)
    # fan-out cost alone: 4 tiny shards (500 vectors each), in process vs Ray actors
    tiny = tmp / "tiny"
    write_manifest(tiny, [f"shard-{i:03d}" for i in range(4)])
    for i in range(4):
        build_index(docs[i * 500:(i + 1) * 500], enc, tiny / f"shard-{i:03d}", backend="flat")
    for remote in (False, True):
        idx = ShardedIndex.open(tiny, enc, ray=remote)
        time_it(f"4 tiny shards (500 vectors each), {'Ray actors' if remote else 'in process'}",
                lambda v: idx.search_vectors(v, 10))
        idx.close()
    for shards in (2, 4):
        root = tmp / f"shards{shards}"
        bounds = np.linspace(0, n, shards + 1).astype(int)
        names = []
        for i, (a, b) in enumerate(zip(bounds[:-1], bounds[1:])):
            build_index(docs[a:b], enc, root / f"shard-{i:03d}", backend="flat", chunk_size=65536)
            names.append(f"shard-{i:03d}")
        write_manifest(root, names)
        for remote in (False, True):
            idx = ShardedIndex.open(root, enc, ray=remote)
            got = time_it(f"{shards} shards, {'Ray actors' if remote else 'in process'}",
                          lambda v: idx.search_vectors(v, 10))
            rows[-1]["equal_to_one_index"] = all(list(a.ids) == list(b.ids) for a, b in zip(got, want))
            idx.close()
    ray.shutdown()
    return rows


# measured on this machine by `python benchmarks/ann.py --data synthetic --n 1000000` (ann-synthetic.md) and
# `python benchmarks/encode_speed.py` (encode_speed.md)
HNSW_1M = {"build_s": 101.9, "index_mb": 1607, "batch_qps": 6277, "recall": 0.984}  # M=16, efC 100, ef 256
BF16_SPEEDUP = 2.76


def estimate(enc: dict, srch: list[dict], n: float = 100e6, shard: float = 10e6) -> list[str]:
    """The 100M-document estimate, every input a measured number of this machine."""
    import math

    from twostage.indexer.corpus import load_corpus

    frame = load_corpus("../shared/data/scifact").to_frame()
    path = Path(tempfile.mkdtemp()) / "docs.parquet"
    frame.to_parquet(path)
    bytes_per_doc = path.stat().st_size / len(frame)
    shutil.rmtree(path.parent, ignore_errors=True)
    per_core = enc["per_core_docs_s"]
    core_h_fp32 = n / per_core / 3600
    core_h_bf16 = core_h_fp32 / BF16_SPEEDUP
    shards = math.ceil(n / shard)
    growth = math.log(shard) / math.log(1e6)
    build_h = HNSW_1M["build_s"] * (shard / 1e6) * growth / 3600
    shard_gb = HNSW_1M["index_mb"] * shard / 1e6 / 1024
    per_query_ms = 1000 / HNSW_1M["batch_qps"] * growth
    by = {r["system"]: r for r in srch}
    fan = by["4 tiny shards (500 vectors each), Ray actors"]["p50_ms"] - by["4 tiny shards (500 vectors each), in process"]["p50_ms"]
    return [
        f"\n## Estimate: {n / 1e6:.0f}M documents (SciFact-like abstracts, all-MiniLM-L6-v2, 384 dims)\n",
        "Every input is a number measured on this machine; the scaling assumptions are stated.\n",
        f"- **Encoding**: {per_core:.1f} docs/s per core in fp32 (above) -> {core_h_fp32:,.0f} core-hours; with bf16 "
        f"({BF16_SPEEDUP}x, quality kept, encode_speed.md) {core_h_bf16:,.0f} core-hours, e.g. "
        f"{core_h_bf16 / (50 * 16):.1f} h on 50 machines x 16 cores. Ray's own cost was nil here ({enc['ratio']:.2f}x on 2 cores, "
        "where it cannot gain); it scales by adding machines, the driver only writes chunks.",
        f"- **Shards**: {shards} shards of {shard / 1e6:.0f}M. HNSW (M=16) measured at 1M: {HNSW_1M['index_mb']:,} MB "
        f"with the vectors, build {HNSW_1M['build_s']:.0f} s on 2 cores, recall@10 {HNSW_1M['recall']}. Assuming "
        f"memory linear and build n log n: ~{shard_gb:.1f} GB RAM and ~{build_h:.1f} h (2 cores) per shard, all shards "
        f"in parallel; {shards * shard_gb:,.0f} GB RAM in all.",
        f"- **Document store**: {bytes_per_doc:,.0f} bytes per document as parquet (SciFact, measured) -> "
        f"{n * bytes_per_doc / 1e9:,.0f} GB on disk, read only for the hits.",
        f"- **Query latency**: HNSW at 1M answers {HNSW_1M['batch_qps']:,} queries/s on 2 cores ({1000 / HNSW_1M['batch_qps']:.2f} ms "
        f"of 2-core time each); at {shard / 1e6:.0f}M, assuming log n growth, ~{per_query_ms:.2f} ms per shard, shards in "
        f"parallel. Ray fan-out to 4 actors costs {fan:.1f} ms p50 over in-process (tiny shards above). Query encoding "
        "(MiniLM, one query) and the reranker dominate: the rerank stage is 240 ms at depth 20 on 2 cores "
        "(rerank-scifact), independent of corpus size.",
        "- **Not covered**: building one index per shard from Ray-encoded chunks without the driver holding every "
        "document text (the merge step does today; stream it before going past ~10M per shard), replicas for "
        "throughput, and shard rebalancing on updates.",
    ]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--docs", type=int, default=1024)
    parser.add_argument("--vectors", type=int, default=200_000)
    parser.add_argument("--model", default="all-MiniLM-L6-v2")
    parser.add_argument("--out", type=Path, default=Path("benchmarks/results/ray_scale.md"))
    args = parser.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="ray-scale-"))
    try:
        enc = encoding(tmp, args.docs, args.model)
        srch = search(tmp, args.vectors)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    base = srch[0]["p50_ms"]
    lines = ["# Ray against the single-process path (2-core CPU)\n",
             f"Command: `python benchmarks/ray_scale.py --docs {args.docs} --vectors {args.vectors}`\n",
             "## Encoding into an index directory (SciFact documents, all-MiniLM-L6-v2 fp32, median of 3)\n",
             "| path | docs/s | ratio |", "|---|---|---|",
             f"| build_index, one process (torch on {enc['cores']} cores) | {enc['serial_docs_s']:.1f} | 1.00x |",
             f"| build_index_ray, 2 actors x 1 core | {enc['ray_docs_s']:.1f} | {enc['ratio']:.2f}x |",
             f"\n{enc['docs']} documents; same vectors (max |difference| {enc['max_abs_diff']:.1e}). Rounds (s): "
             f"serial {', '.join(f'{x:.1f}' for x in enc['serial_s'])}; ray {', '.join(f'{x:.1f}' for x in enc['ray_s'])}.\n",
             f"## Exact search, {args.vectors:,} x 384 vectors, top 10, 200 queries one at a time\n",
             "| system | p50 ms | p95 ms | p50 vs one index | same top 10 as one index |", "|---|---|---|---|---|"]
    for r in srch:
        lines.append(f"| {r['system']} | {r['p50_ms']:.2f} | {r['p95_ms']:.2f} | {r['p50_ms'] / base:.2f}x | "
                     f"{r.get('equal_to_one_index', '-')} |")
    lines += estimate(enc, srch)
    lines += ["\nVersions: " + ", ".join(f"{k} {v}" for k, v in versions().items()) + "\n"]
    args.out.write_text("\n".join(lines))
    Path(str(args.out).replace(".md", ".json")).write_text(json.dumps({"encoding": enc, "search": srch}, indent=2))
    print("\n".join(lines))


if __name__ == "__main__":
    main()
