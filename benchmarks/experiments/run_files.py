"""Run files both ways on SciFact test: `twostage eval` against `bench`'s metrics.json and trec_eval's code,
`twostage rerank` of the BM25 run against `bench`'s bm25+rerank, and the significance report's tests.

Usage (from the repository root, with a trained reranker, e.g. the one-command run's):
    python benchmarks/experiments/run_files.py --reranker runs/models/scifact-e2e-fit/reranker

1. `twostage bench --systems bm25,rank-bm25,bm25+rerank --reranker-model M --baseline bm25 --test fisher
   --correction holm` writes runs/*.trec, metrics.json and significance.csv.
2. `twostage eval --run R --json` on every run file: its means against metrics.json (must agree to 1e-4), and
   pytrec_eval (trec_eval's code, reading the file as trec_eval does) against our per-query numbers.
3. `twostage rerank --run runs/bm25.trec --reranker M` against runs/bm25+rerank.trec: the same documents in the
   same order for every query, and the largest score difference.
4. significance.csv's t-test p-values against ranx's `student` test (to 1e-6), its Fisher p-values against ranx's
   `fisher_randomization_test` run as written (NUMBA_DISABLE_JIT=1, 10,000 permutations, seed 42; to 1e-6) and
   computed again (reproducible), beside ranx's compiled fisher called five times (irreproducible); the Holm
   adjustment recomputed.
5. With --retriever: the same checks for `bench --systems bm25,hybrid,hybrid+rerank --baseline hybrid --test fisher
   --correction holm` (steps 2 and 4).
Writes benchmarks/results/run_files.md and .json; the last line says PASS or FAIL.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
DATA = ROOT.parent / "shared" / "data" / "scifact"
TREC = {"ndcg@10": "ndcg_cut_10", "recall@100": "recall_100", "map@100": "map_cut_100", "recall@10": "recall_10"}


def twostage(*args: str) -> str:
    out = subprocess.run([sys.executable, "-m", "twostage", "-q", *args], capture_output=True, text=True)
    if out.returncode:
        raise SystemExit(f"twostage {' '.join(args)} failed:\n{out.stderr}")
    return out.stdout


def check_eval(bench: Path, data: Path, qrels: Any, checks: dict[str, bool]) -> list[dict[str, Any]]:
    """`twostage eval --json` on every run file of a bench directory against its metrics.json and pytrec_eval."""
    import numpy as np
    import pytrec_eval

    from twostage.eval.metrics import evaluate
    from twostage.eval.run import Run

    metrics = json.loads((bench / "metrics.json").read_text())
    evaluator = pytrec_eval.RelevanceEvaluator({q: dict(qrels.grades(q)) for q in qrels.query_ids}, set(TREC.values()))
    rows = []
    for name in metrics:
        path = bench / "runs" / f"{name}.trec"
        got = json.loads(twostage("eval", "--run", str(path), "--data", str(data), "--json"))[name]
        worst_bench = max(abs(got[m] - metrics[name][m]) for m in ("ndcg@10", "mrr@10", "recall@10", "recall@100",
                                                                   "map@100"))
        run: dict[str, dict[str, float]] = {}
        for line in path.read_text().splitlines():
            q, _, d, _, s, _ = line.split()
            run.setdefault(q, {})[d] = float(s)
        theirs = evaluator.evaluate(run)
        ours = evaluate(qrels, Run.from_trec(path), list(TREC))
        both = [q for q in ours.index if q in theirs]
        worst_trec = max(float(np.max(np.abs(ours.loc[both, m].to_numpy() - [theirs[q][tm] for q in both])))
                         for m, tm in TREC.items())
        ties = sum(1 for lst in run.values() for a, b in zip(sorted(lst.values()), sorted(lst.values())[1:]) if a == b)
        rows.append({"run": name, "ndcg@10 (eval)": got["ndcg@10"], "ndcg@10 (metrics.json)": metrics[name]["ndcg@10"],
                     "max |eval - metrics.json|": worst_bench, "max |ours - pytrec_eval| per query": worst_trec,
                     "queries": len(both), "tied scores written": ties})
        checks[f"eval {name} = metrics.json (1e-4)"] = worst_bench <= 1e-4
        checks[f"eval {name} = pytrec_eval (1e-9)"] = worst_trec <= 1e-9 and len(both) == len(ours)
    return rows


def ranx_fisher_as_written(system: Any, baseline: Any, permutations: int) -> float:
    """ranx's fisher_randomization_test with numba off (its Python as written: seeded, reproducible), in a fresh
    interpreter, since numba reads NUMBA_DISABLE_JIT when it is first imported."""
    import os

    code = ("import json, sys, numpy as np\nfrom ranx.statistical_tests import fisher_randomization_test as f\n"
            "a, b, n = json.load(sys.stdin)\nprint(float(f(np.array(a), np.array(b), n, 0.05, 42)[0]))")
    out = subprocess.run([sys.executable, "-c", code], input=json.dumps([list(map(float, system)),
                         list(map(float, baseline)), permutations]), capture_output=True, text=True,
                         env={**os.environ, "NUMBA_DISABLE_JIT": "1"})
    if out.returncode:
        raise SystemExit(f"ranx's fisher test failed:\n{out.stderr[-2000:]}")
    return float(out.stdout.strip())


def check_significance(bench: Path, baseline: str, qrels: Any, checks: dict[str, bool]) -> list[dict[str, Any]]:
    """significance.csv (fisher + holm) against our tests run again and ranx's student and fisher tests."""
    import numpy as np
    import pandas as pd
    import ranx
    from ranx.statistical_tests import fisher_randomization_test

    from twostage.eval.metrics import evaluate
    from twostage.eval.run import Run
    from twostage.eval.significance import adjust, p_value

    metrics = json.loads((bench / "metrics.json").read_text())
    sig = pd.read_csv(bench / "significance.csv")
    runs = {n: Run.from_trec(bench / "runs" / f"{n}.trec") for n in metrics}
    ranx_runs = [ranx.Run({q: {str(d): float(len(r[q].ids) - i) for i, d in enumerate(r[q].ids)} for q in r},
                          name=n) for n, r in runs.items()]
    student = ranx.compare(ranx.Qrels({q: dict(qrels.grades(q)) for q in qrels.query_ids}), ranx_runs, ["ndcg@10"],
                           stat_test="student")
    tables = {n: evaluate(qrels, r, ["ndcg@10"]) for n, r in runs.items()}
    order = sorted(tables[baseline].index)
    rows = []
    for name in runs:
        if name == baseline:
            continue
        a, b = tables[name].loc[order, "ndcg@10"].to_numpy(), tables[baseline].loc[order, "ndcg@10"].to_numpy()
        t_ours = p_value(a, b, "t")
        t_ranx = student.comparisons[frozenset([baseline, name])]["ndcg@10"]["p_value"]
        f_ours = [p_value(a, b, "fisher") for _ in range(2)]
        f_ranx = [float(fisher_randomization_test(a, b, 10_000, 0.05, 42)[0]) for _ in range(5)]
        f_plain = ranx_fisher_as_written(a, b, 10_000)
        row = sig[(sig.system == name) & (sig.metric == "ndcg@10")].iloc[0]
        rows.append({"baseline": baseline, "system": name, "delta": float(row.delta),
                     "ci": [float(row.ci_low), float(row.ci_high)], "fisher_p (report)": float(row.p_value),
                     "holm_p (report)": float(row.p_adjusted), "fisher_p ours x2": f_ours, "fisher_p ranx x5": f_ranx,
                     "fisher_p ranx numba off": f_plain,
                     "t_p ours": t_ours, "t_p ranx": t_ranx})
        nan_both = np.isnan(t_ranx) and t_ours == 1.0
        checks[f"t-test {name} vs {baseline} = ranx student (1e-6)"] = nan_both or abs(t_ours - t_ranx) <= 1e-6
        checks[f"fisher {name} vs {baseline} reproducible"] = f_ours[0] == f_ours[1] == float(row.p_value)
        checks[f"fisher {name} vs {baseline} = ranx fisher as written (1e-6)"] = abs(f_plain - float(row.p_value)) <= 1e-6
    family = sig[sig.metric == "ndcg@10"]
    checks[f"holm over the systems against {baseline}"] = bool(np.allclose(
        family.p_adjusted.to_numpy(), adjust(family.p_value.to_numpy(), "holm")))
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--reranker", required=True)
    parser.add_argument("--retriever", default=None, help="also bench bm25, hybrid and hybrid+rerank with "
                        "--baseline hybrid --test fisher --correction holm (builds a passage engine: ~7 min)")
    parser.add_argument("--data", type=Path, default=DATA)
    parser.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results" / "run_files")
    args = parser.parse_args()

    import numpy as np

    from twostage.eval.metrics import evaluate
    from twostage.eval.run import Run
    from twostage.indexer.beir import BeirDataset

    qrels = BeirDataset(args.data).split("test").qrels
    checks: dict[str, bool] = {}
    report: dict[str, Any] = {}
    with tempfile.TemporaryDirectory(prefix="twostage-runfiles-") as tmp_str:
        tmp = Path(tmp_str)
        t = time.perf_counter()
        twostage("bench", "--data", str(args.data), "--split", "test", "--systems", "bm25,rank-bm25,bm25+rerank",
                 "--reranker-model", args.reranker, "--baseline", "bm25", "--test", "fisher", "--correction", "holm",
                 "--out", str(tmp / "bench"))
        report["bench_s"] = time.perf_counter() - t
        metrics = json.loads((tmp / "bench" / "metrics.json").read_text())
        eval_rows = check_eval(tmp / "bench", args.data, qrels, checks)
        t = time.perf_counter()
        twostage("rerank", "--run", str(tmp / "bench" / "runs" / "bm25.trec"), "--data", str(args.data),
                 "--reranker", args.reranker, "--out", str(tmp / "reranked.trec"))
        report["rerank_s"] = time.perf_counter() - t
        ours_rr, bench_rr = Run.from_trec(tmp / "reranked.trec"), Run.from_trec(tmp / "bench" / "runs" /
                                                                              "bm25+rerank.trec")
        same = sum(1 for q in bench_rr if q in ours_rr and list(ours_rr[q].ids) == list(bench_rr[q].ids))
        diff = max(float(np.max(np.abs(ours_rr[q].scores - bench_rr[q].scores))) for q in bench_rr)
        rr_ndcg = float(evaluate(qrels, ours_rr, ["ndcg@10"])["ndcg@10"].mean())
        report["rerank"] = {"queries": len(bench_rr), "same_order": same, "max_score_diff": diff,
                            "ndcg@10_rerank_cli": rr_ndcg, "ndcg@10_bench": metrics["bm25+rerank"]["ndcg@10"]}
        checks["rerank = bench bm25+rerank (every query's order)"] = same == len(bench_rr) == len(ours_rr)
        sig_rows = check_significance(tmp / "bench", "bm25", qrels, checks)
        if args.retriever:
            t = time.perf_counter()
            twostage("bench", "--data", str(args.data), "--split", "test", "--systems", "bm25,hybrid,hybrid+rerank",
                     "--retriever-model", args.retriever, "--reranker-model", args.reranker, "--baseline", "hybrid",
                     "--test", "fisher", "--correction", "holm", "--out", str(tmp / "hybrid"))
            report["bench_hybrid_s"] = time.perf_counter() - t
            eval_rows += check_eval(tmp / "hybrid", args.data, qrels, checks)
            sig_rows += check_significance(tmp / "hybrid", "hybrid", qrels, checks)
        report["eval"], report["significance"] = eval_rows, sig_rows
    report["checks"] = checks
    ok = all(checks.values())

    command = f"python benchmarks/experiments/run_files.py --reranker {args.reranker}" + \
        (f" --retriever {args.retriever}" if args.retriever else "")
    timing = f"bench {report['bench_s']:.0f} s, rerank {report['rerank_s']:.0f} s" + \
        (f", bench with the hybrid baseline {report['bench_hybrid_s']:.0f} s" if args.retriever else "")
    lines = ["# Run files both ways, significance tests (SciFact test, 300 queries)", "",
             f"Command: `{command}` (2-core CPU; models in the engine's `auto` precision). {timing}.", "",
             "## `twostage eval` on the run files `bench` wrote", "",
             "| run | nDCG@10 (eval) | nDCG@10 (metrics.json) | max abs diff, 5 metrics | max abs diff vs pytrec_eval, "
             "per query, 4 metrics | queries | tied scores written |", "|---|---|---|---|---|---|---|"]
    for r in eval_rows:
        lines.append(f"| {r['run']} | {r['ndcg@10 (eval)']:.4f} | {r['ndcg@10 (metrics.json)']:.4f} | "
                     f"{r['max |eval - metrics.json|']:.1e} | {r['max |ours - pytrec_eval| per query']:.1e} | "
                     f"{r['queries']} | {r['tied scores written']} |")
    rr = report["rerank"]
    lines += ["", "## `twostage rerank` of bench's BM25 run against bench's bm25+rerank", "",
              f"{rr['same_order']} of {rr['queries']} queries in the same order; largest score difference "
              f"{rr['max_score_diff']:.2e}; nDCG@10 {rr['ndcg@10_rerank_cli']:.4f} (rerank) vs "
              f"{rr['ndcg@10_bench']:.4f} (bench).", "",
              "## Significance, nDCG@10 (`bench --baseline B --test fisher --correction holm`)", "",
              "Fisher: our randomization test (10,000 permutations, ranx's draws) as the report gives it, and computed "
              "again; ranx's `fisher_randomization_test` (10,000 permutations, seed 42) run as written "
              "(NUMBA_DISABLE_JIT=1), and compiled by numba (its default) called five times on the same scores.", "",
              "| baseline | system | delta [95% CI] | Fisher p (report) | Holm-adjusted | ours again | ranx fisher, "
              "numba off | ranx fisher compiled, 5 calls | t-test p ours | ranx student |",
              "|---|---|---|---|---|---|---|---|---|---|"]
    for r in sig_rows:
        lines.append(f"| {r['baseline']} | {r['system']} | {r['delta']:+.4f} [{r['ci'][0]:+.4f}, {r['ci'][1]:+.4f}] | "
                     f"{r['fisher_p (report)']:.4f} | {r['holm_p (report)']:.4f} | {r['fisher_p ours x2'][1]:.4f} | "
                     f"{r['fisher_p ranx numba off']:.4f} | {', '.join(f'{p:.3f}' for p in r['fisher_p ranx x5'])} | {r['t_p ours']:.3g} | "
                     f"{r['t_p ranx']:.3g} |")
    lines += ["", "## Checks", ""] + [f"- {'ok' if v else 'FAILED'}: {k}" for k, v in checks.items()]
    lines += ["", "PASS" if ok else "FAIL"]
    args.out.with_suffix(".md").write_text("\n".join(lines) + "\n")
    args.out.with_suffix(".json").write_text(json.dumps(report, indent=2, default=float) + "\n")
    print("\n".join(lines))
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
