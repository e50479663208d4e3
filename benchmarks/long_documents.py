"""Long documents: the engine with passages against the same engine without, on long SciFact documents and on
SciFact itself.

Usage (from the repository root, after the one-command run trained its models on SciFact train):
    python benchmarks/long_documents.py --retriever runs/models/scifact-e2e-fit/retriever \\
        --reranker runs/models/scifact-e2e-fit/reranker

1. **Long SciFact** (built here, never written to the repository): each document judged relevant to a test query,
   and as many other documents again up to ``--documents``, is placed at a random position among filler documents
   of the same collection (each as "title. text" paragraphs) until the composite has a random length of 1,500 to
   3,000 words. Fillers are drawn from the documents no train or test query judges relevant, so a composite is
   relevant to a query exactly when the document inside it is; the qrels are mapped to the composites. Composites
   have no title (the inner document's would give it away). Seeded: the same corpus every run.
2. **SciFact test** as it is (300 queries): the passage engine (the defaults) against today's whole-document
   engine, to check that passages cost nothing on short documents.

For each collection both engines are built with the same models and settings except ``passage_words``; reported:
BM25, hybrid and hybrid+rerank nDCG@10 and Recall@100; on SciFact also build time, engine size on disk and
p50/p95 latency of one query at a time (hybrid+rerank), measured in one run, the two engines alternating query
by query. Writes benchmarks/results/long_documents.md and .json.
"""

from __future__ import annotations

import argparse
import json
import platform
import random
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
DATA = ROOT.parent / "shared" / "data" / "scifact"
SYSTEMS = {"bm25": {"first_stage": "bm25", "rerank": False}, "hybrid": {"first_stage": "hybrid", "rerank": False},
           "hybrid+rerank": {"first_stage": "hybrid", "rerank": True}}
METRICS = ["ndcg@10", "recall@100"]


def long_collection(data: Path, documents: int, seed: int, split_name: str = "test",
                    query_ids: set[str] | None = None) -> tuple[list[Any], list[Any], Any, dict[str, Any]]:
    """The composite corpus, the split's queries (only ``query_ids`` when given), their qrels mapped to
    composites, and a description."""
    from twostage.indexer.beir import BeirDataset
    from twostage.indexer.records import Document, Judgment, Qrels

    ds = BeirDataset(data)
    test = ds.split(split_name)
    queries, split_qrels = list(test.queries), test.qrels
    if query_ids is not None:
        queries, split_qrels = [q for q in queries if q.id in query_ids], split_qrels.subset(query_ids)
    corpus = {d.id: d for d in ds.corpus}
    judged: set[str] = set()
    for split in ds.splits:
        judged |= {j.doc_id for j in ds.split(split).qrels}
    rng = random.Random(seed)
    targets = sorted({j.doc_id for j in split_qrels if j.grade > 0 and j.doc_id in corpus})
    others = sorted(set(corpus) - judged)
    extra = rng.sample(others, max(0, documents - len(targets)))
    fillers = [d for d in others if d not in set(extra)]
    words = []
    composites = []
    for target in targets + extra:
        goal = rng.randint(1500, 3000)
        parts = [corpus[target]]
        size = len(corpus[target].full_text.split())
        while size < goal:
            filler = corpus[rng.choice(fillers)]
            parts.insert(rng.randint(0, len(parts)), filler)
            size += len(filler.full_text.split())
        text = "\n\n".join(f"{p.title}. {p.text}" if p.title else p.text for p in parts)
        words.append(len(text.split()))
        composites.append(Document(f"long-{target}", text, "", {"inner": target}))
    qrels = Qrels(Judgment(j.query_id, f"long-{j.doc_id}", j.grade) for j in split_qrels if j.doc_id in corpus)
    about = {"composites": len(composites), "relevant_inside": len(targets), "fillers_pool": len(fillers),
             "words_median": statistics.median(words), "words_min": min(words), "words_max": max(words)}
    return composites, queries, qrels, about


def evaluate_engine(engine: Any, queries: list[Any], qrels: Any) -> dict[str, dict[str, float]]:
    import numpy as np

    from twostage.eval.metrics import evaluate
    from twostage.indexer.records import RankedList

    out = {}
    texts = [q.text for q in queries]
    for name, knobs in SYSTEMS.items():
        if knobs["rerank"] and engine.manifest.reranker is None:
            continue
        results = [r for i in range(0, len(texts), 32) for r in engine.search_batch(texts[i:i + 32], k=100, **knobs)]
        run = {q.id: RankedList(np.array(r.ids, dtype=object), np.array([h.score for h in r.hits], dtype=np.float32))
               for q, r in zip(queries, results)}
        table = evaluate(qrels, run, METRICS)
        out[name] = {m: float(table[m].mean()) for m in METRICS}
        print(f"  {name}: {out[name]}", flush=True)
    return out


def size_of(path: Path) -> int:
    """Bytes on disk of the engine's current version (hard links counted once)."""
    seen, total = set(), 0
    for p in path.rglob("*"):
        if p.is_file():
            st = p.stat()
            if (st.st_dev, st.st_ino) not in seen:
                seen.add((st.st_dev, st.st_ino))
                total += st.st_size
    return total


def build_pair(corpus: Any, root: Path, args: argparse.Namespace) -> tuple[dict[str, Any], dict[str, float]]:
    """The engine without and with passages, each built here; their build seconds."""
    from twostage.engine.search_engine import SearchEngine

    engines, seconds = {}, {}
    for name, words in (("whole documents", 0), ("passages", args.passage_words)):
        t = time.perf_counter()
        engines[name] = SearchEngine.build(corpus, root / name.replace(" ", "-"), retriever=args.retriever,
                                           reranker=args.reranker, precision=args.precision, passage_words=words,
                                           passage_stride=args.passage_stride or max(1, words // 2),
                                           show_progress=False)
        seconds[name] = time.perf_counter() - t
        print(f"built {name}: {seconds[name]:.0f} s; {engines[name].reading()['summary']}", flush=True)
    return engines, seconds


def latency(engines: dict[str, Any], queries: list[Any]) -> dict[str, dict[str, float]]:
    """p50/p95 ms of one query at a time, hybrid+rerank, the engines alternating query by query."""
    times: dict[str, list[float]] = {name: [] for name in engines}
    for e in engines.values():
        e.search_batch([q.text for q in queries[:8]], k=10)  # models loaded, caches warm
    for q in queries:
        for name, e in engines.items():
            t = time.perf_counter()
            e.search(q.text, k=10)
            times[name].append((time.perf_counter() - t) * 1000)
    import numpy as np

    return {name: {"p50": float(np.percentile(v, 50)), "p95": float(np.percentile(v, 95))} for name, v in times.items()}


def table(results: dict[str, dict[str, dict[str, float]]]) -> list[str]:
    lines = ["| system | whole documents nDCG@10 | passages nDCG@10 | Δ | whole documents Recall@100 | "
             "passages Recall@100 |", "|---|---|---|---|---|---|"]
    for system in SYSTEMS:
        if system not in results["passages"]:
            continue
        w, p = results["whole documents"][system], results["passages"][system]
        lines.append(f"| {system} | {w['ndcg@10']:.4f} | {p['ndcg@10']:.4f} | **{p['ndcg@10'] - w['ndcg@10']:+.4f}** "
                     f"| {w['recall@100']:.4f} | {p['recall@100']:.4f} |")
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--retriever", required=True)
    parser.add_argument("--reranker", default=None)
    parser.add_argument("--data", type=Path, default=DATA)
    parser.add_argument("--documents", type=int, default=500, help="composite documents in the long collection")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--passage-words", type=int, default=None, help="default: the engine's default")
    parser.add_argument("--passage-stride", type=int, default=None, help="default: the engine's default")
    parser.add_argument("--precision", default="auto")
    parser.add_argument("--skip-scifact", action="store_true", help="the long collection only")
    parser.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results" / "long_documents")
    args = parser.parse_args()

    from twostage.engine.settings import EngineSettings
    from twostage.indexer.beir import BeirDataset

    defaults = EngineSettings()
    args.passage_words = args.passage_words or defaults.passage_words
    args.passage_stride = args.passage_stride or defaults.passage_stride
    t0 = time.perf_counter()
    report: dict[str, Any] = {"command": "python benchmarks/long_documents.py " + " ".join(
        f"--{k.replace('_', '-')} {v}" for k, v in vars(args).items() if v not in (None, False) and k != "out"),
        "passage_words": args.passage_words, "passage_stride": args.passage_stride}
    with tempfile.TemporaryDirectory() as tmp:
        corpus, queries, qrels, about = long_collection(args.data, args.documents, args.seed)
        report["long"] = {"collection": about}
        print("long collection:", about, flush=True)
        engines, seconds = build_pair(corpus, Path(tmp) / "long", args)
        report["long"]["build_s"] = seconds
        served = engines["passages"].manifest.settings
        report["fusion"] = served.fusion_label
        report["rerank_blend"] = served.blend_for("hybrid") if args.reranker else None
        report["long"]["results"] = {name: evaluate_engine(e, queries, qrels) for name, e in engines.items()}
        for e in engines.values():
            e.close()
        if not args.skip_scifact:
            ds = BeirDataset(args.data)
            split = ds.split("test")
            engines, seconds = build_pair(args.data, Path(tmp) / "scifact", args)
            report["scifact"] = {"build_s": seconds,
                                 "bytes": {n: size_of(e.version_dir) for n, e in engines.items()},
                                 "rows": {n: e.manifest.passages or len(e) for n, e in engines.items()},
                                 "reading": {n: e.reading()["summary"] for n, e in engines.items()},
                                 "results": {n: evaluate_engine(e, list(split.queries), split.qrels)
                                             for n, e in engines.items()},
                                 "latency_ms": latency(engines, list(split.queries))}
    report["minutes"] = (time.perf_counter() - t0) / 60
    report["machine"] = f"{platform.machine()}, {__import__('os').cpu_count()} cores"
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.with_suffix(".json").write_text(json.dumps(report, indent=2))
    args.out.with_suffix(".md").write_text(render(report))
    print(render(report))


def render(r: dict[str, Any]) -> str:
    long, about = r["long"], r["long"]["collection"]
    lines = ["# Long documents: passages against whole documents", "", f"Command: `{r['command']}`", "",
             f"Passages of {r['passage_words']} words, a new one every {r['passage_stride']} (the engine's defaults); "
             f"hybrid fuses by {r.get('fusion', 'the default of the day')}"
             + (f", the reranker's dev-chosen blend {r['rerank_blend']}" if r.get("rerank_blend") is not None else "")
             + "; "
             "the same models (trained on SciFact train only), settings and precision for both engines; every number "
             "on test queries. Machine: " + r["machine"] + f"; {r['minutes']:.1f} min.", "",
             "## Long SciFact (300 test queries)", "",
             f"{about['composites']} composite documents ({about['relevant_inside']} hold a document relevant to a "
             f"test query), {about['words_min']}-{about['words_max']} words (median {about['words_median']:.0f}); "
             "construction in `long_collection` of the script. Build: whole documents "
             f"{long['build_s']['whole documents']:.0f} s, passages {long['build_s']['passages']:.0f} s.", ""]
    lines += table(long["results"])
    if "scifact" in r:
        s = r["scifact"]
        lines += ["", "## SciFact test as it is (300 queries, 5,183 documents)", ""] + table(s["results"])
        w, p = s["results"]["whole documents"], s["results"]["passages"]
        best = "hybrid+rerank" if "hybrid+rerank" in p else "hybrid"
        lines += ["", "| engine | build s | size on disk MB | index rows | p50 ms | p95 ms |", "|---|---|---|---|---|---|"]
        for name in ("whole documents", "passages"):
            lat = s["latency_ms"][name]
            lines.append(f"| {name} | {s['build_s'][name]:.0f} | {s['bytes'][name] / 1e6:.1f} | {s['rows'][name]} | "
                         f"{lat['p50']:.1f} | {lat['p95']:.1f} |")
        ratio = {k: s["latency_ms"]["passages"][k] / s["latency_ms"]["whole documents"][k] for k in ("p50", "p95")}
        lines += ["", f"Passages against whole documents on SciFact: {best} nDCG@10 "
                  f"{p[best]['ndcg@10'] - w[best]['ndcg@10']:+.4f}; build "
                  f"{s['build_s']['passages'] / s['build_s']['whole documents']:.2f}x, size "
                  f"{s['bytes']['passages'] / s['bytes']['whole documents']:.2f}x, latency p50 {ratio['p50']:.2f}x, "
                  f"p95 {ratio['p95']:.2f}x (one query at a time, {best}, the two engines alternating).",
                  "", "What each engine says about long documents (`info`):", ""]
        lines += [f"- {name}: {text}" for name, text in s["reading"].items()]
    lines.append("")
    return "\n".join(lines)


if __name__ == "__main__":
    main()
