"""Calibration and "nothing relevant" (#47): is the engine's probability of relevance honest, and does
``min_relevance`` leave a query without hits when nothing relevant is left?

    python benchmarks/experiments/calibration.py --retriever runs/models/scifact-one-path/retriever \\
        --reranker runs/models/scifact-one-path/reranker

1. **SciFact.** An engine (the defaults) with the two models; its calibration fitted with ``twostage calibrate`` on
   SciFact train (only the queries the reranker held out as dev: it was trained on the others). On test: every
   query's reranked top 20 as the engine serves it, each pair labelled by the qrels; expected calibration error
   (10 bins) of the raw score and of the calibrated probability; a reliability plot.
2. **NFCorpus.** The same on NFCorpus: an engine with the same models (zero-shot there), calibrated on NFCorpus
   dev, measured on test.
3. **Nothing relevant** (SciFact). The relevant documents of a seeded half of the dev queries are deleted from a
   copy of the engine; the threshold is the smallest of a grid with no hit left for >= 80% of those queries
   (chosen on dev). Then the same on test, on another copy: the relevant documents of half the test queries
   deleted; with the dev-chosen ``min_relevance``: the share of those queries with no hit, and nDCG@10 of the
   other half against no threshold. Every search goes through ``SearchEngine.search_batch``.

Writes benchmarks/results/calibration.md, calibration.json and calibration.png.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[2]
DATA = ROOT.parent / "shared" / "data"
GRID = tuple(round(0.05 * i, 2) for i in range(1, 20))


def ndcg(engine: Any, queries: list[Any], qrels: Any, **knobs: Any) -> np.ndarray:
    from twostage.eval.metrics import ndcg10_by_query

    results = engine.search_batch([q.text for q in queries], 10, **knobs)
    run = {q.id: r for q, r in zip(queries, (res_ranked(x) for x in results))}
    return np.asarray(ndcg10_by_query(qrels.subset(q.id for q in queries), run), dtype=np.float64)


def res_ranked(result: Any) -> Any:
    from twostage.indexer.records import RankedList

    return RankedList(np.array([h.id for h in result.hits], dtype=object),
                      np.array([h.score for h in result.hits], dtype=np.float32))


def measured_ece(engine: Any, queries: list[Any], qrels: Any) -> dict[str, Any]:
    from twostage.engine.calibration import (
        expected_calibration_error,
        probability,
        reliability,
        reranked_pairs,
    )

    scores, labels = reranked_pairs(engine, queries, qrels)
    p = probability(scores, engine.settings.rerank_calibration)
    return {"pairs": len(scores), "relevant": int(labels.sum()), "ece_raw": expected_calibration_error(scores, labels),
            "ece": expected_calibration_error(p, labels), "reliability": reliability(p, labels),
            "reliability_raw": reliability(scores, labels), "mean_p": float(p.mean()), "rate": float(labels.mean())}


def copy_without_relevant(engine: Any, queries: list[Any], qrels: Any, seed: int, where: Path) -> tuple[Any, list, list]:
    """A copy of ``engine`` without the relevant documents of a seeded half of ``queries``; (copy, that half, the
    queries of the other half that keep every relevant document: SciFact's claims often share their abstract with
    another claim, and a query whose relevant documents went with the removed half's has nothing relevant left
    either, so it belongs to neither side)."""
    from twostage.engine.search_engine import SearchEngine

    order = np.random.default_rng(seed).permutation(len(queries))
    half = len(queries) // 2
    removed, other = [queries[i] for i in sorted(order[:half])], [queries[i] for i in sorted(order[half:])]
    shutil.copytree(engine.root, where, ignore=shutil.ignore_patterns("LOCK"))
    copy = SearchEngine.load(where, verify=False)
    gone = sorted({d for q in removed for d in qrels.relevant(q.id)} & set(copy.document_ids()))
    copy = copy.delete(gone)
    kept = [q for q in other if not qrels.relevant(q.id) & set(gone)]
    return copy, removed, kept


def empty_share(engine: Any, queries: list[Any], threshold: float) -> float:
    results = engine.search_batch([q.text for q in queries], 10, min_relevance=threshold)
    return float(np.mean([not r.hits for r in results]))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--retriever", required=True, help="bi-encoder directory (the one-command run's)")
    ap.add_argument("--reranker", required=True, help="cross-encoder directory (the one-command run's)")
    ap.add_argument("--seed", type=int, default=7)
    ap.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results")
    ap.add_argument("--nothing-relevant-only", action="store_true",
                    help="only part 3 (SciFact), the rest read back from the last calibration.json")
    args = ap.parse_args()

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from twostage.engine.calibration import calibrate
    from twostage.engine.search_engine import SearchEngine
    from twostage.indexer.beir import BeirDataset

    started = time.perf_counter()
    work = Path(tempfile.mkdtemp(prefix="twostage-calibration-"))
    result: dict[str, Any] = {"command": "python benchmarks/experiments/calibration.py " + " ".join(sys.argv[1:])}
    parts = (("scifact", "train"), ("nfcorpus", "dev"))
    if args.nothing_relevant_only:
        earlier = json.loads((args.out / "calibration.json").read_text())
        result = {**earlier, "command_nothing_relevant": result["command"]}
        parts = (("scifact", "train"),)
    try:
        for name, fit_split in parts:
            ds = BeirDataset(DATA / name)
            t = time.perf_counter()
            engine = SearchEngine.build(ds.corpus, work / name, retriever=args.retriever, reranker=args.reranker,
                                        show_progress=True)
            build_s = time.perf_counter() - t
            engine, fitted, said = calibrate(engine, ds, fit_split)
            test = ds.split("test")
            queries = [q for q in test.queries if test.qrels.relevant(q.id)]
            if not args.nothing_relevant_only:
                result[name] = {"fit": {"on": said, "a": fitted.a, "b": fitted.b, "pairs": fitted.pairs,
                                        "relevant": fitted.positives}, "build_s": build_s,
                                "test": measured_ece(engine, queries, test.qrels), "settings": {
                                    "rerank_depth": engine.settings.rerank_depth,
                                    "rerank_blend": engine.settings.rerank_blend}}
                print(name, json.dumps({k: v for k, v in result[name]["test"].items() if "reliability" not in k}),
                      flush=True)
            if name != "scifact":
                engine.close()
                continue
            # nothing relevant: the threshold chosen on dev (the reranker's held-out train queries), applied on test
            from twostage.engine.calibration import calibration_queries

            dev, dev_qrels, _ = calibration_queries(engine, ds, "train")
            dev_copy, dev_removed, _ = copy_without_relevant(engine, dev, dev_qrels, args.seed, work / "dev-copy")
            shares = {t_: empty_share(dev_copy, dev_removed, t_) for t_ in GRID}
            chosen = next((t_ for t_ in GRID if shares[t_] >= 0.8), GRID[-1])
            dev_copy.close()
            test_copy, removed, kept = copy_without_relevant(engine, queries, test.qrels, args.seed + 1,
                                                             work / "test-copy")
            plain = ndcg(test_copy, kept, test.qrels)
            thresholded = ndcg(test_copy, kept, test.qrels, min_relevance=chosen)
            curve = {t_: {"empty_removed": empty_share(test_copy, removed, t_),
                          "ndcg_kept": float(ndcg(test_copy, kept, test.qrels, min_relevance=t_).mean())}
                     for t_ in GRID}
            result["nothing_relevant"] = {
                "dev_queries_removed": len(dev_removed), "dev_empty_by_threshold": shares, "chosen": chosen,
                "test_removed": len(removed), "test_kept": len(kept),
                "empty_removed": empty_share(test_copy, removed, chosen),
                "empty_kept": empty_share(test_copy, kept, chosen),
                "ndcg_kept_plain": float(plain.mean()), "ndcg_kept_threshold": float(thresholded.mean()),
                "test_curve": curve}
            print("nothing relevant", json.dumps({k: v for k, v in result["nothing_relevant"].items()
                                                  if k not in ("test_curve", "dev_empty_by_threshold")}), flush=True)
            test_copy.close()
            engine.close()
    finally:
        shutil.rmtree(work, ignore_errors=True)
    result["seconds" if not args.nothing_relevant_only else "seconds_nothing_relevant"] = \
        time.perf_counter() - started

    fig, axes = plt.subplots(1, 2, figsize=(10, 4.5))
    for ax, name in zip(axes, ("scifact", "nfcorpus")):
        r = result[name]["test"]
        for key, label, style in (("reliability_raw", "raw score", "o--"), ("reliability", "calibrated", "s-")):
            xs, ys, ns = zip(*r[key])
            ax.plot(xs, ys, style, label=f"{label} (ECE {r['ece_raw' if key.endswith('raw') else 'ece']:.3f})")
        ax.plot([0, 1], [0, 1], ":", color="grey")
        ax.set(title=f"{name} test: reranked top {result[name]['settings']['rerank_depth']}",
               xlabel="predicted probability of relevance", ylabel="observed rate", xlim=(0, 1), ylim=(0, 1))
        ax.legend(loc="upper left")
    fig.tight_layout()
    fig.savefig(args.out / "calibration.png", dpi=110)
    (args.out / "calibration.json").write_text(json.dumps(result, indent=2) + "\n")
    (args.out / "calibration.md").write_text(report(result))
    print((args.out / "calibration.md").read_text())
    return 0


def report(r: dict[str, Any]) -> str:
    lines = ["# Calibration and \"nothing relevant\"", "", f"Command: `{r['command']}`", "",
             *([f"\"Nothing relevant\" measured again by `{r['command_nothing_relevant']}`.", ""]
               if "command_nothing_relevant" in r else []),
             "Expected calibration error (10 equal-width bins, weighted by pairs) of the reranker's score over every "
             "test query's reranked top 20, as the engine serves it (hybrid first stage, the blend in the "
             "manifest, OpenVINO int8 reranker); pairs labelled by the test qrels. The calibration (Platt scaling) "
             "is fitted by `twostage calibrate` on other queries: SciFact train queries the reranker held out as "
             "dev, NFCorpus dev. The reliability plot: [calibration.png](calibration.png). "
             f"Machine: 2-core x86_64 CPU; {r['seconds'] / 60:.1f} min.", "",
             "| collection | fitted on | pairs (relevant) fitted | test pairs (relevant) | ECE raw score | "
             "ECE calibrated | mean p / observed rate |", "|---|---|---|---|---|---|---|"]
    for name in ("scifact", "nfcorpus"):
        f, t = r[name]["fit"], r[name]["test"]
        lines.append(f"| {name} | {f['on']} | {f['pairs']} ({f['relevant']}) | {t['pairs']} ({t['relevant']}) | "
                     f"{t['ece_raw']:.3f} | **{t['ece']:.3f}** | {t['mean_p']:.3f} / {t['rate']:.3f} |")
    n = r["nothing_relevant"]
    lines += ["", "## Nothing relevant (SciFact test)", "",
              f"The relevant documents of {n['test_removed']} test queries (a seeded half) deleted from a copy of "
              f"the engine; the other side: the {n['test_kept']} queries of the other half that keep every relevant "
              "document (SciFact claims share abstracts: the rest lost theirs too and belong to neither side); "
              f"`min_relevance` {n['chosen']} chosen on dev (the smallest of 0.05, 0.10, ... with no hit "
              f"for >= 80% of {n['dev_queries_removed']} dev queries whose relevant documents were deleted the same "
              "way).", "",
              "| | value |", "|---|---|",
              f"| queries with nothing relevant left that get no hit | **{n['empty_removed']:.1%}** |",
              f"| the other {n['test_kept']} queries that get no hit | {n['empty_kept']:.1%} |",
              f"| nDCG@10 of the other queries, no threshold | {n['ndcg_kept_plain']:.4f} |",
              f"| nDCG@10 of the other queries, min_relevance {n['chosen']} | {n['ndcg_kept_threshold']:.4f} "
              f"({n['ndcg_kept_threshold'] - n['ndcg_kept_plain']:+.4f}) |", "",
              "Every threshold on test (for the trade-off; the choice above was made on dev):", "",
              "| min_relevance | no hit, nothing relevant left | nDCG@10 of the others |", "|---|---|---|"]
    for t_, v in n["test_curve"].items():
        lines.append(f"| {t_} | {v['empty_removed']:.1%} | {v['ndcg_kept']:.4f} |")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    raise SystemExit(main())
