"""Scale benchmark: build and query a dense index (documents in parquet, float32 vectors, ANN structure: the
engine's dense part) over N synthetic documents, for one vector mode.

Usage (from the repository root):
    python benchmarks/scale.py --docs 1000000 --mode int8
    python benchmarks/scale.py --docs 100000 --mode float32 --md benchmarks/results/scale.md   # appends a row

Documents are short synthetic texts ("t417 w2093 w77 ..."): a topic word (of 2,000) and eight words (of 20,000, uniform). The encoder is a fast
deterministic stand-in (a fixed random vector per topic plus the mean of fixed random word vectors, 384-d),
so encoding is not what is measured and the vectors have the cluster structure of real embeddings. Queries
are held-out texts from the same law.

Modes: float32 (hnswlib over float32 vectors), int8 (faiss HNSW over int8 scalar codes), int8-ivf (faiss IVF
over int8 codes), binary (faiss binary HNSW over sign bits), ivfpq (faiss IVF-PQ); every compressed mode
rescores its candidates with the memory-mapped float32 vectors. Peak RSS is the process's peak at the end of
the build (before the recall check reads every vector). Recall@10 is against exact search (numpy over the same
float32 vectors); p50 is one query at a time (encoding included, ANN search + rescoring).
The last line: ``scale: N docs, mode M, peak RSS X GB, recall@10 R, p50 T ms``.

``--mode bm25 --words W``: a shard's lexical part instead: BM25 (bm25s, English analysis) built a chunk at a time
over N documents of a topic word and W words, saved; build seconds, anonymous peak, disk, postings, and one query
at a time (5 words of the same law, top 10) loaded back from disk. Recall is 1.000 by construction (it is exact).

``--mode tokens --tokens T --token-dim D --bits B``: a shard's late-interaction part instead: N rows of T tokens
on average (uniform in [T/2, 3T/2]), random unit vectors of D dimensions, written as the engine writes them
(segments of 65,536 rows, each coded 256 rows at a time: ``code_rows``, ``join_coded``, ``write_coded``); build
seconds, anonymous peak, disk, then MaxSim of one query (32 tokens) against ``--depth`` random rows at a time
(``TokenPart.scores``: gather from the memory maps, decode, score), p50 / p95 over the queries.
"""

from __future__ import annotations

import argparse
import os
import resource
import tempfile
import threading
import time
from pathlib import Path

import numpy as np

os.environ.setdefault("HF_HUB_OFFLINE", "1")

from twostage.indexer.build import build_index  # noqa: E402
from twostage.indexer.manifest import EncoderInfo  # noqa: E402
from twostage.indexer.records import Document  # noqa: E402
from twostage.indexer.vectors import BackendConfig  # noqa: E402

MODES = {"float32": "hnswlib", "int8": "faiss-hnsw-sq8", "int8-ivf": "faiss-ivf-sq8", "binary": "faiss-binary",
         "ivfpq": "faiss-ivfpq"}
DIM, TOPICS, WORDS, PER_DOC = 384, 2000, 20000, 8


class SyntheticEncoder:
    """text -> topic vector + 1.5 * mean of word vectors (fixed random tables, seed 0): clusters whose spread is
    about half their distance from the origin, as in benchmarks/experiments/ann.py."""

    def __init__(self) -> None:
        rng = np.random.default_rng(0)
        self.topics = rng.normal(size=(TOPICS, DIM)).astype(np.float32)
        self.words = rng.normal(size=(WORDS, DIM)).astype(np.float32)

    def encode(self, texts: list[str], kind: str = "document", **kw: object) -> np.ndarray:
        ids = np.array([[int(tok[1:]) for tok in t.split()] for t in texts], dtype=np.int64)
        out = self.topics[ids[:, 0]]
        for start in range(0, len(ids), 1024):  # (batch, words, dim) stays small
            out[start:start + 1024] += 1.5 * self.words[ids[start:start + 1024, 1:]].mean(axis=1)
        return out

    def info(self) -> EncoderInfo:
        return EncoderInfo("synthetic-384", DIM, weights_sha256="synthetic-0")


def texts(n: int, seed: int, words: int = PER_DOC) -> list[str]:
    rng = np.random.default_rng(seed)
    topic = rng.integers(0, TOPICS, n)
    ids = rng.integers(0, WORDS, size=(n, words))
    return [f"t{t} " + " ".join(f"w{w}" for w in row) for t, row in zip(topic, ids)]


def document_chunks(n: int, chunk: int = 100_000, words: int = PER_DOC):
    for start in range(0, n, chunk):
        yield [Document(f"d{start + i}", text)
               for i, text in enumerate(texts(min(chunk, n - start), seed=1 + start // chunk, words=words))]


def documents(n: int, chunk: int = 100_000, words: int = PER_DOC):
    for docs in document_chunks(n, chunk, words):
        yield from docs


def exact_top10(index: object, queries: np.ndarray, chunk: int = 200_000) -> np.ndarray:
    """Exact search over the index's float32 vectors, read in slices from the memory maps."""
    best_s = np.full((len(queries), 10), -np.inf, dtype=np.float32)
    best_i = np.zeros((len(queries), 10), dtype=np.int64)
    n = index.manifest.rows  # type: ignore[attr-defined]
    for start in range(0, n, chunk):
        s = queries @ index.rows(np.arange(start, min(n, start + chunk))).T  # type: ignore[attr-defined]
        top = np.argpartition(-s, min(10, s.shape[1] - 1), axis=1)[:, :10]
        s_all = np.concatenate([best_s, np.take_along_axis(s, top, 1)], 1)
        i_all = np.concatenate([best_i, top + start], 1)
        keep = np.argsort(-s_all, axis=1)[:, :10]
        best_s, best_i = np.take_along_axis(s_all, keep, 1), np.take_along_axis(i_all, keep, 1)
    return best_i


class AnonPeak:
    """The peak of the process's anonymous memory (RssAnon: heap and arrays, not the page cache of memory-mapped
    files, which ru_maxrss counts too), sampled every 0.2 s on a thread while the block runs. Linux only."""

    def __init__(self) -> None:
        self.peak = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    @staticmethod
    def now() -> int:
        try:
            with open("/proc/self/status", encoding="ascii") as fh:
                return next(int(line.split()[1]) * 1024 for line in fh if line.startswith("RssAnon:"))
        except (OSError, StopIteration):
            return 0

    def _run(self) -> None:
        while not self._stop.wait(0.2):
            self.peak = max(self.peak, self.now())

    def __enter__(self) -> AnonPeak:  # noqa: PYI034 - a benchmark script, not a base class
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()
        self.peak = max(self.peak, self.now())


def report(args: argparse.Namespace, row: str, peak: float, p50: float) -> None:
    """An exact part's result: its table row (appended to ``--md`` when given) and the last line."""
    if args.md:
        with open(args.md, "a", encoding="utf-8") as fh:
            fh.write(row + "\n")
    print(row)
    print(f"scale: {args.docs} docs, mode {args.mode}, peak RSS {peak:.2f} GB, recall@10 1.000, p50 {p50:.2f} ms")


def bm25_shard(args: argparse.Namespace) -> None:
    from twostage.retriever.analyzer import AnalyzerConfig
    from twostage.retriever.bm25 import BM25Config, BM25Retriever

    config = BM25Config(analyzer=AnalyzerConfig(language="en"))
    with tempfile.TemporaryDirectory(dir=args.dir) as tmp:
        t = time.perf_counter()
        with AnonPeak() as anon:
            bm25 = BM25Retriever.build_chunked(lambda: document_chunks(args.docs, 100_000, args.words), config)
            bm25.save(Path(tmp) / "bm25")
        build_s = time.perf_counter() - t
        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 / 2**30
        del bm25
        size = sum(f.stat().st_size for f in (Path(tmp) / "bm25").rglob("*") if f.is_file())
        with AnonPeak() as query_anon:
            loaded = BM25Retriever.load(Path(tmp) / "bm25")
            rng = np.random.default_rng(10**6)
            queries = [" ".join(f"w{w}" for w in rng.integers(0, WORDS, 5)) for _ in range(args.queries)]
            loaded.search(queries[0], 10)
            times = []
            for q in queries:
                t = time.perf_counter()
                loaded.search(q, 10)
                times.append(time.perf_counter() - t)
    p50, p95 = (float(np.percentile(times, p)) * 1000 for p in (50, 95))
    postings = args.docs * min(args.words + 1, WORDS)  # distinct terms a document, at most (a few repeat)
    row = (f"| {args.docs:,} | bm25 ({args.words + 1} terms a document, <= {postings / 1e6:,.0f}M postings) | "
           f"bm25s, en | {build_s:.0f} | {size / 2**20:.0f} | {peak:.2f} ({anon.peak / 2**30:.2f}, "
           f"{query_anon.peak / 2**30:.2f}) | 1.000 | {p50:.2f} | {p95:.2f} | - |")
    report(args, row, peak, p50)


def token_shard(args: argparse.Namespace) -> None:
    from twostage.indexer.tokens import TokenCodec, TokenPart, code_rows, join_coded, write_coded, write_manifest

    codec, segment, piece = TokenCodec(args.bits), 65536, 256
    rng = np.random.default_rng(0)
    with tempfile.TemporaryDirectory(dir=args.dir) as tmp:
        out = Path(tmp) / "late"
        t = time.perf_counter()
        segments, starts, tokens = [], [], 0
        with AnonPeak() as anon:
            for start in range(0, args.docs, segment):
                rows = min(segment, args.docs - start)
                pieces = []
                for p in range(0, rows, piece):
                    lengths = rng.integers(args.tokens // 2, args.tokens * 3 // 2 + 1, min(piece, rows - p))
                    v = rng.standard_normal((int(lengths.sum()), args.token_dim), dtype=np.float32)
                    v /= np.linalg.norm(v, axis=1, keepdims=True)
                    pieces.append(code_rows(np.split(v, np.cumsum(lengths)[:-1]), args.token_dim, codec))
                segments.append(write_coded(out, f"seg{len(segments):05d}", join_coded(pieces)))
                starts.append(start)
                tokens += segments[-1].tokens
            write_manifest(out, args.token_dim, segments, codec)
        build_s = time.perf_counter() - t
        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 / 2**30
        size = sum(f.stat().st_size for f in out.iterdir())
        with AnonPeak() as query_anon:
            part = TokenPart.open(out, [(s.name, a, s.rows) for s, a in zip(segments, starts)])
            times = []
            for _ in range(args.queries):
                q = rng.standard_normal((32, args.token_dim), dtype=np.float32)
                rows = rng.choice(args.docs, args.depth, replace=False)
                t = time.perf_counter()
                part.scores(q, rows)
                times.append(time.perf_counter() - t)
    first = float(np.median(times[:10])) * 1000
    p50, p95 = (float(np.percentile(times[10:], p)) * 1000 for p in (50, 95))
    row = (f"| {args.docs:,} | tokens ({tokens / args.docs:.0f} a row, {args.token_dim} d, {args.bits} bits: "
           f"{tokens / 1e6:,.0f}M tokens, {size / tokens:.1f} B a token) | MaxSim over {args.depth} rows | "
           f"{build_s:.0f} | {size / 2**20:,.0f} | {peak:.2f} ({anon.peak / 2**30:.2f}, {query_anon.peak / 2**30:.2f})"
           f" | 1.000 | {p50:.2f} (first 10: {first:.2f}) | {p95:.2f} | - |")
    report(args, row, peak, p50)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--docs", type=int, required=True)
    ap.add_argument("--mode", choices=[*sorted(MODES), "bm25", "tokens"], default="float32")
    ap.add_argument("--queries", type=int, default=200)
    ap.add_argument("--words", type=int, default=PER_DOC, help="words a document (bm25 mode; passages: ~100)")
    ap.add_argument("--tokens", type=int, default=128, help="tokens a row on average (tokens mode)")
    ap.add_argument("--token-dim", type=int, default=128, help="dimensions a token vector (tokens mode)")
    ap.add_argument("--bits", type=int, choices=(8, 4), default=4, help="bits a dimension (tokens mode)")
    ap.add_argument("--depth", type=int, default=50, help="rows MaxSim reads a query (tokens mode: maxsim_depth)")
    ap.add_argument("--dir", type=Path, default=None, help="where the index goes (default: a temporary directory)")
    ap.add_argument("--md", type=Path, default=None, help="append the result as a table row to this markdown file")
    ap.add_argument("--nprobe", type=int, nargs="*", default=[],
                    help="IVF modes: also measure these probe counts (printed lines, before the default's row)")
    ap.add_argument("--ef", type=int, nargs="*", default=[],
                    help="HNSW modes: also measure these ef_search values (printed lines, after the default's row)")
    args = ap.parse_args()
    if args.mode == "bm25":
        return bm25_shard(args)
    if args.mode == "tokens":
        return token_shard(args)

    encoder = SyntheticEncoder()
    with tempfile.TemporaryDirectory(dir=args.dir) as tmp:
        t = time.perf_counter()
        with AnonPeak() as anon:
            index = build_index(documents(args.docs), encoder, Path(tmp) / "idx",
                                backend=BackendConfig(MODES[args.mode], "cosine"), chunk_size=65536, batch_size=4096)
        build_s = time.perf_counter() - t
        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 / 2**30  # the build's (before the checks)
        size = sum(f.stat().st_size for f in (Path(tmp) / "idx").rglob("*") if f.is_file())
        ann = next((f.stat().st_size for f in index.version_dir.glob("ann.*")), 0)
        query_texts = texts(args.queries, seed=10**6)
        qv = encoder.encode(query_texts)
        qv /= np.linalg.norm(qv, axis=1, keepdims=True)
        truth = exact_top10(index, qv)
        index.attach_encoder(encoder)

        def one_at_a_time(**kw: int) -> tuple[list, list[float]]:
            index.search(query_texts[0], 10, **kw)  # warm-up
            times, found = [], []
            for q in query_texts:
                t = time.perf_counter()
                found.append(index.search(q, 10, **kw).ids)
                times.append(time.perf_counter() - t)
            return found, times

        def recall_of(found: list) -> float:
            return float(np.mean([len({int(d[1:]) for d in f} & set(e.tolist())) / 10 for f, e in zip(found, truth)]))

        for nprobe in args.nprobe:  # other probe counts of the same IVF index, before the default row
            f, ts = one_at_a_time(nprobe=nprobe)
            print(f"scale: {args.docs} docs, mode {args.mode}, nprobe {nprobe}: recall@10 {recall_of(f):.3f}, "
                  f"p50 {np.percentile(ts, 50) * 1000:.2f} ms, p95 {np.percentile(ts, 95) * 1000:.2f} ms", flush=True)
        with AnonPeak() as query_anon:
            found, times = one_at_a_time()
        t = time.perf_counter()
        index.search_batch(query_texts, 10)
        qps = len(query_texts) / (time.perf_counter() - t)
        recall = recall_of(found)
        for ef in args.ef:  # larger candidate lists of the same graph, after the default row (a warm page cache)
            f, ts = one_at_a_time(ef_search=ef)
            print(f"scale: {args.docs} docs, mode {args.mode}, ef_search {ef}: recall@10 {recall_of(f):.3f}, "
                  f"p50 {np.percentile(ts, 50) * 1000:.2f} ms, p95 {np.percentile(ts, 95) * 1000:.2f} ms", flush=True)
        params = dict(index.manifest.params)  # (loading the index again would hold a second ANN in memory)
        index.close()
    p50, p95 = (float(np.percentile(times, p)) * 1000 for p in (50, 95))
    if args.md:
        new = not args.md.exists()
        with open(args.md, "a", encoding="utf-8") as fh:
            if new:
                fh.write("| docs | mode | backend, params | build s | disk MB (ANN MB) | peak RSS GB (anonymous: build, "
                         "queries) | recall@10 | p50 ms | p95 ms | queries/s (batch) |\n"
                         "|---|---|---|---|---|---|---|---|---|---|\n")
            fh.write(f"| {args.docs:,} | {args.mode} | {MODES[args.mode]} {params} | {build_s:.0f} | "
                     f"{size / 2**20:.0f} ({ann / 2**20:.0f}) | {peak:.2f} ({anon.peak / 2**30:.2f}, "
                     f"{query_anon.peak / 2**30:.2f}) | {recall:.3f} | {p50:.2f} | {p95:.2f} | {qps:.0f} |\n")
    print(f"anonymous memory: build peak {anon.peak / 2**30:.2f} GB, queries peak {query_anon.peak / 2**30:.2f} GB")
    print(f"build {build_s:.1f} s, disk {size / 2**20:.0f} MB (ANN {ann / 2**20:.0f} MB), p95 {p95:.2f} ms, "
          f"{qps:.0f} queries/s in one batch, params {params}")
    print(f"scale: {args.docs} docs, mode {args.mode}, peak RSS {peak:.2f} GB, recall@10 {recall:.3f}, p50 {p50:.2f} ms")


if __name__ == "__main__":
    main()
