"""The reranker over windows of each candidate (MaxP) instead of its head: an ablation on dev, reported on test.

Usage (from the repository root):
    python benchmarks/experiments/rerank_windows.py --models runs/models/scifact-e2e-fit

The reranker reads a candidate's first ``max_length`` tokens (128 for the one-command model: the title and about
the first 80 words of a SciFact abstract, which run to about 220). MaxP (Dai & Callan 2019) scores each window
of the document instead and keeps the best. Variants: windows of W words with stride S, the title in front of each
window (``title``) or windows over the title and text as one (``full``); ``head`` is the engine's reranker.

Every variant reranks the same hybrid top 20 (the one-command bi-encoder, RRF with BM25, exact search) of SciFact
dev (the 10% of train the one-command run holds out, seed 42; the reranker chose its epoch and blends there) and
test, alone and blended with the first stage (``final = a * minmax(rerank) + (1 - a) * minmax(first)``). The blend
``a`` of each variant is chosen on dev by the engine's rule (the smallest ``a`` within one standard error of the
best, ``reranker/interpolation.py``) and applied on test. The reranker runs as the engine's ``auto``
does here (OpenVINO int8 with the openvino extra, calibrated on the engine's own sample of the corpus) unless ``--precision`` says otherwise; a window's score is
computed once per (query, window) and shared by the variants that contain it.

Writes benchmarks/results/rerank-windows.md; last line: ``windows: best VARIANT on dev, test alone X (head Y),
blended Z (head W), N pairs per query (head 20)``.
"""

from __future__ import annotations

import argparse
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[2]
DEPTH = 20
ALPHAS = tuple(round(a, 1) for a in np.linspace(0.0, 1.0, 11))


def windows(words: list[str], size: int, stride: int) -> list[str]:
    """Windows of ``size`` words every ``stride`` words, the last one ending at the last word."""
    starts = list(range(0, max(len(words) - size, 0) + 1, stride))
    if starts[-1] + size < len(words):
        starts.append(len(words) - size)
    return [" ".join(words[s:s + size]) for s in starts]


def dev_and_test(ds: Any) -> dict[str, tuple[list, Any]]:
    """split -> (queries, qrels): SciFact dev (the 10% of train the one-command run holds out, seed 42) and test."""
    from twostage.retriever.training_data import hold_out

    train, test = ds.split("train"), ds.split("test")
    _, dev = hold_out(list(train.queries), 0.1, 42)
    return {"dev": (dev, train.qrels.subset([q.id for q in dev])), "test": (list(test.queries), test.qrels)}


def hybrid_first_stage(ds: Any, retriever: Path, prefix: str) -> Any:
    """The engine's hybrid (RRF of BM25 and ``retriever``, exact search, fp32) in a throwaway directory."""
    from twostage.engine.search_engine import SearchEngine
    from twostage.indexer.engine_dir import EngineSettings

    engine = SearchEngine.build(ds.corpus, Path(tempfile.mkdtemp(prefix=prefix)) / "engine", retriever=str(retriever),
                                settings=EngineSettings(precision="fp32", backend="flat"), show_progress=True)
    return engine.as_retriever(first_stage="hybrid", rerank=False)


def blends(first: Any, rerank: np.ndarray) -> dict[float | None, Any]:
    """``first`` (a RankedList) reordered by the reranker alone (key None) and at every blend of :data:`ALPHAS`."""
    from twostage.indexer.records import RankedList
    from twostage.reranker.interpolation import interpolate, order_by

    out = {}
    for a in (None, *ALPHAS):
        final = interpolate(first.scores, rerank, a)
        order = order_by(final)
        out[a] = RankedList(first.ids[order], final[order])
    return out


def variants() -> dict[str, Callable]:
    def titled(size: int, stride: int) -> Callable:
        return lambda d: [f"{d.title} {w}".strip() for w in windows(d.text.split(), size, stride)]

    return {"head": lambda d: [d.full_text], "80/80 title": titled(80, 80), "80/40 title": titled(80, 40),
            "60/30 title": titled(60, 30), "80/40 full": lambda d: windows(d.full_text.split(), 80, 40)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", type=Path, required=True, help="the one-command models directory")
    parser.add_argument("--data", type=Path, default=ROOT.parent / "shared" / "data" / "scifact")
    parser.add_argument("--precision", default="auto")
    parser.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results" / "rerank-windows.md")
    args = parser.parse_args()

    from twostage.engine.search_engine import calibration_texts
    from twostage.eval.metrics import mean_ndcg10, ndcg10_by_query
    from twostage.indexer.beir import BeirDataset
    from twostage.indexer.records import RankedList
    from twostage.reranker.cross_encoder import CrossEncoder, calibration_pairs
    from twostage.reranker.interpolation import one_se_blend
    from twostage.retriever.precision import resolve_precision

    start = time.perf_counter()
    ds = BeirDataset(args.data)
    splits = dev_and_test(ds)
    dev = splits["dev"][0]
    hybrid = hybrid_first_stage(ds, args.models / "retriever", "twostage-windows-")
    precision = resolve_precision(args.precision, "reranker")
    sample = calibration_texts(args.data / "corpus.jsonl", precision == "openvino-int8")  # the engine's sample
    reranker = CrossEncoder.load(args.models / "reranker", precision=precision,
                                 calibration=calibration_pairs(sample) if sample else None)
    docs = {i: ds.corpus.get(i) for i in ds.corpus.ids}
    scored: dict[tuple[str, str], float] = {}
    table: dict[str, dict[str, dict]] = {}
    for split, (queries, qrels) in splits.items():
        first = {q.id: hybrid.search(q.text, DEPTH) for q in queries}
        table.setdefault("hybrid", {})[split] = {"alone": mean_ndcg10(qrels, first)}
        for name, cut in variants().items():
            texts = {q.id: [cut(docs[str(d)]) for d in first[q.id].ids] for q in queries}
            todo = sorted({(q.text, w) for q in queries for ws in texts[q.id] for w in ws} - scored.keys())
            if todo:
                scored.update(zip(todo, reranker.predict(todo, activation=None, show_progress=True).tolist()))
            runs: dict[float | None, dict[str, RankedList]] = {a: {} for a in (None, *ALPHAS)}
            for q in queries:
                best = np.array([max(scored[(q.text, w)] for w in ws) for ws in texts[q.id]], dtype=np.float32)
                for a, ranked in blends(first[q.id], best).items():
                    runs[a][q.id] = ranked
            per_query = {a: ndcg10_by_query(qrels, runs[a]) for a in ALPHAS}
            table.setdefault(name, {})[split] = {
                "alone": mean_ndcg10(qrels, runs[None]),
                "by_alpha": {a: float(v.mean()) for a, v in per_query.items()},
                "pick": one_se_blend(list(per_query.items())),
                "pairs": sum(len(ws) for q in queries for ws in texts[q.id]) / len(queries)}
            print(split, name, round(table[name][split]["alone"], 4), flush=True)

    lines = ["# The reranker over windows of each candidate (MaxP): ablation on SciFact dev, reported on test", "",
             f"Command: `python benchmarks/experiments/rerank_windows.py --models {args.models}`", "",
             (f"Reranker {args.models / 'reranker'} in {precision}; first stage: hybrid (the one-command bi-encoder, "
             f"RRF with BM25), its top {DEPTH} reranked. Dev: {len(dev)} held-out train queries (the reranker chose "
             f"its epoch and blends on them); test: {len(splits['test'][0])} queries. The blend `a` is chosen on dev "
             "(best mean nDCG@10) and applied to test. What each variant is: the script's docstring."), "",
             "| variant | pairs per query | dev alone | dev blended (a) | test alone | test blended at dev's a |",
             "|---|---|---|---|---|---|"]
    hyb = {s: table["hybrid"][s]["alone"] for s in splits}
    lines.append(f"| hybrid first stage (no reranker) | 0 | {hyb['dev']:.4f} | - | {hyb['test']:.4f} | - |")
    chosen = {}
    for name in variants():
        d, t = table[name]["dev"], table[name]["test"]
        a = d["pick"]
        chosen[name] = (a, d["by_alpha"][a], t["by_alpha"][a])
        lines.append(f"| {name} | {t['pairs']:.1f} | {d['alone']:.4f} | {d['by_alpha'][a]:.4f} ({a:g}) | "
                     f"{t['alone']:.4f} | {t['by_alpha'][a]:.4f} |")
    best = max((n for n in variants() if n != "head"), key=lambda n: table[n]["dev"]["alone"])
    head_a = chosen["head"][0]
    lines += ["", "Test nDCG@10 at every blend (a = 0 is the first stage, 1 the reranker alone):", "",
              "| variant | " + " | ".join(f"{a:g}" for a in ALPHAS) + " |", "|---|" + "---|" * len(ALPHAS)]
    lines += [f"| {n} | " + " | ".join(f"{table[n]['test']['by_alpha'][a]:.4f}" for a in ALPHAS) + " |"
              for n in variants()]
    lines += ["", f"{(time.perf_counter() - start) / 60:.1f} min on this machine.", "",
              (f"windows: best {best} on dev, test alone {table[best]['test']['alone']:.4f} (head "
              f"{table['head']['test']['alone']:.4f}), blended {chosen[best][2]:.4f} (head {chosen['head'][2]:.4f} at "
              f"a {head_a:g}), {table[best]['test']['pairs']:.0f} pairs per query (head {DEPTH})")]
    args.out.write_text("\n".join(lines) + "\n", encoding="utf-8")
    print(lines[-1])


if __name__ == "__main__":
    main()
