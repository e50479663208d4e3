"""Run files both ways (eval, rerank), trec_eval's order and numbers, significance tests as IR papers run them."""

from __future__ import annotations

import json
import os
import sys

import numpy as np
import pandas as pd
import pytest

from twostage.app.cli import main
from twostage.eval.metrics import evaluate
from twostage.eval.run import Run, strictly_decreasing
from twostage.eval.significance import adjust, compare, p_value, randomization_p
from twostage.indexer.errors import ConfigError, DataError
from twostage.indexer.records import Judgment, Qrels, RankedList

TREC_NAMES = [("ndcg@10", "ndcg_cut_10"), ("recall@10", "recall_10"), ("recall@100", "recall_100"),
              ("p@10", "P_10"), ("map@100", "map_cut_100"), ("mrr@100", "recip_rank")]


def pytrec_scores(qrels: Qrels, path, rel_level: int = 1) -> dict[str, dict[str, float]]:
    """pytrec_eval (trec_eval's code) on a run file, read as trec_eval reads it."""
    pytrec_eval = pytest.importorskip("pytrec_eval")
    run: dict[str, dict[str, float]] = {}
    for line in path.read_text().splitlines():
        q, _, d, _, s, _ = line.split()
        run.setdefault(q, {})[d] = float(s)
    judged = {q: dict(qrels.grades(q)) for q in qrels.query_ids}
    return pytrec_eval.RelevanceEvaluator(judged, {t for _, t in TREC_NAMES}, relevance_level=rel_level).evaluate(run)


def assert_agrees_with_trec_eval(qrels: Qrels, path, rel_level: int = 1) -> None:
    theirs = pytrec_scores(qrels, path, rel_level)
    ours = evaluate(qrels, Run.from_trec(path), [m for m, _ in TREC_NAMES], rel_level=rel_level)
    both = [q for q in ours.index if q in theirs]
    assert len(both) >= 10
    for ours_name, trec_name in TREC_NAMES:
        np.testing.assert_allclose(ours.loc[both, ours_name].to_numpy(), [theirs[q][trec_name] for q in both],
                                   atol=1e-9, err_msg=f"{ours_name} vs trec_eval's {trec_name}")


@pytest.fixture
def graded():
    """40 queries with graded judgments (0-3) and a run full of tied scores."""
    rng = np.random.default_rng(0)
    docs = [f"d{i}" for i in range(80)]
    judgments, lists = [], {}
    for q in range(40):
        for d in rng.choice(docs, 15, replace=False):
            judgments.append(Judgment(f"q{q}", str(d), int(rng.integers(0, 4))))
        ids = rng.choice(docs, 60, replace=False)
        scores = np.round(rng.random(60), 1)  # 11 distinct values among 60 documents: many ties
        order = np.argsort(-scores, kind="stable")
        lists[f"q{q}"] = RankedList(np.array(ids[order], dtype=object), scores[order].astype(np.float32))
    return Qrels(judgments), lists


def test_written_runs_keep_our_order_and_trec_eval_agrees(tmp_path, graded):
    qrels, lists = graded
    Run("sys", lists).to_trec(tmp_path / "ours.trec")
    back = Run.from_trec(tmp_path / "ours.trec")
    assert all(list(back[q].ids) == list(lists[q].ids) for q in lists)  # ties written so trec_eval keeps our order
    for level in (1, 2, 3):
        assert_agrees_with_trec_eval(qrels, tmp_path / "ours.trec", level)
    # the same list with its ties written as they are: we read it in trec_eval's order (score, then docno desc)
    with (tmp_path / "tied.trec").open("w") as fh:
        for q, r in lists.items():
            fh.writelines(f"{q} Q0 {d} {i} {s:.1f} other\n" for i, (d, s) in enumerate(zip(r.ids, r.scores), 1))
    tied = Run.from_trec(tmp_path / "tied.trec")
    assert any(list(tied[q].ids) != list(lists[q].ids) for q in lists)
    first = tied["q0"]
    for a, b, sa, sb in zip(first.ids, first.ids[1:], first.scores, first.scores[1:]):
        assert sa > sb or (sa == sb and a > b)
    for level in (1, 2):
        assert_agrees_with_trec_eval(qrels, tmp_path / "tied.trec", level)


def test_strictly_decreasing_only_touches_ties():
    out = strictly_decreasing(np.array([3.0, 2.0, 2.0, 2.0, 5.0, 1.0], dtype=np.float32))
    assert out[:2] == [3.0, 2.0] and all(a > b for a, b in zip(out, out[1:]))
    assert out[-1] == 1.0 and np.float32(out[2]) == out[2]  # single-precision values, read back exactly


@pytest.mark.parametrize("line,message", [
    ("q1 Q0 d1 1 0.5", "6 columns"), ("q1 Q0 d1 one 0.5 x", "not a number"), ("q1 Q0 d1 1 nan x", "finite"),
])
def test_bad_run_lines(tmp_path, line, message):
    (tmp_path / "r.trec").write_text(f"q1 Q0 d0 1 0.9 x\n{line}\n")
    with pytest.raises(DataError, match=rf"r.trec:2: .*{message}"):
        Run.from_trec(tmp_path / "r.trec")


def test_a_document_twice_in_one_query_is_refused(tmp_path):
    (tmp_path / "r.trec").write_text("q1 Q0 d0 1 0.9 x\nq1 Q0 d0 2 0.8 x\n")
    with pytest.raises(DataError, match=r"r.trec:2: document 'd0' is listed twice .*line 1"):
        Run.from_trec(tmp_path / "r.trec")


def test_holm_and_bonferroni_by_hand():
    p = [0.01, 0.04, 0.03, 0.5]
    np.testing.assert_allclose(adjust(p, "bonferroni"), [0.04, 0.16, 0.12, 1.0])
    # Holm: sorted 0.01*4, 0.03*3, 0.04*2, 0.5*1, made monotone
    np.testing.assert_allclose(adjust(p, "holm"), [0.04, 0.09, 0.09, 0.5])
    with pytest.raises(ConfigError, match="unknown correction"):
        adjust(p, "sidak")


RANX_FISHER = """
import json, sys
from ranx.statistical_tests import fisher_randomization_test
out = []
for control, treatment, n in json.load(sys.stdin):
    import numpy as np
    out.append(float(fisher_randomization_test(np.array(control), np.array(treatment), n, 0.05, 42)[0]))
print(json.dumps(out))
"""


def test_randomization_test_equals_ranx_and_exact_enumeration():
    """Fisher p-values equal ranx's fisher_randomization_test run as written (numba off: its only reproducible
    mode) to 1e-12, on scores with ties, both argument orders and several sizes; and approach the exact test (all
    2^14 swaps)."""
    import json
    import os
    import subprocess
    import sys

    pytest.importorskip("ranx.statistical_tests")
    rng = np.random.default_rng(3)
    cases = []
    for n, digits in ((14, 2), (60, 3), (300, 1), (7, 1)):
        base = np.round(rng.random(n), digits)
        system = np.clip(np.round(base + rng.normal(0.03, 0.1, n), digits), 0, 1)
        system[: n // 4] = base[: n // 4]  # ties: queries both systems score alike
        cases += [(base, system, 2000), (system, base, 2000)]
    env = {**os.environ, "NUMBA_DISABLE_JIT": "1"}
    done = subprocess.run([sys.executable, "-c", RANX_FISHER], input=json.dumps(
        [[a.tolist(), b.tolist(), n] for a, b, n in cases]), capture_output=True, text=True, env=env, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    theirs = json.loads(done.stdout)
    ours = [p_value(b, a, "fisher", permutations=n) for a, b, n in cases]
    assert len(set(theirs)) > 2 and ours == pytest.approx(theirs, abs=1e-12)
    diff = rng.normal(0.05, 0.2, 14)
    signs = np.array([[1 if (i >> j) & 1 else -1 for j in range(14)] for i in range(2 ** 14)])
    exact = float(np.mean(np.abs(signs @ diff) / 14 >= abs(diff.mean()) - 1e-12))  # every one of 2^14 swaps
    p = randomization_p(diff, np.zeros(14), 100_000)
    assert p == pytest.approx(exact, abs=0.005) and randomization_p(diff, np.zeros(14), 100_000) == p


def test_t_test_equals_ranx_and_holm_adjusts_it(graded):
    ranx = pytest.importorskip("ranx")
    qrels, lists = graded
    rng = np.random.default_rng(1)
    runs = {"base": lists}
    for name, swaps in (("a", 5), ("b", 20)):
        runs[name] = {}
        for q, r in lists.items():
            ids = list(r.ids)
            for _ in range(swaps):
                i, j = rng.integers(0, 30, 2)
                ids[i], ids[j] = ids[j], ids[i]
            runs[name][q] = RankedList(np.array(ids, dtype=object), r.scores)
    metrics = ["ndcg@10", "recall@100"]
    tables = {n: evaluate(qrels, run, metrics) for n, run in runs.items()}
    ranx_qrels = ranx.Qrels({q: dict(qrels.grades(q)) for q in qrels.query_ids})
    ranx_runs = [ranx.Run({q: {str(d): float(len(r.ids) - i) for i, d in enumerate(r.ids)} for q, r in run.items()},
                          name=n) for n, run in runs.items()]
    ours = compare(tables, "base", metrics, test="t", correction="holm").set_index(["system", "metric"])
    report = ranx.compare(ranx_qrels, ranx_runs, metrics, stat_test="student")
    for system in ("a", "b"):
        for m in metrics:
            theirs = report.comparisons[frozenset(["base", system])][m]["p_value"]
            if np.isnan(theirs):  # identical scores on every query (swaps inside the top 30 keep recall@100)
                assert ours.loc[(system, m), "p_value"] == 1.0
            else:
                assert ours.loc[(system, m), "p_value"] == pytest.approx(theirs, abs=1e-6)
    for m in metrics:
        raw = [ours.loc[(s, m), "p_value"] for s in ("a", "b")]
        np.testing.assert_allclose([ours.loc[(s, m), "p_adjusted"] for s in ("a", "b")], adjust(raw, "holm"))
    for row in ours.itertuples():  # the 95% interval excludes 0 exactly when the t-test's p < 0.05
        assert row.ci_low <= row.delta <= row.ci_high
        assert (row.ci_low > 0 or row.ci_high < 0) == (row.p_value < 0.05)
    fisher = compare(tables, "base", metrics, test="fisher").set_index(["system", "metric"])
    assert fisher.loc[("a", "recall@100"), "p_value"] == 1.0
    assert fisher.loc[("b", "ndcg@10"), "p_value"] == pytest.approx(ours.loc[("b", "ndcg@10"), "p_value"], abs=0.05)


def test_compare_names_an_unknown_baseline():
    table = pd.DataFrame({"ndcg@10": [0.1, 0.2]})
    with pytest.raises(ConfigError, match="baseline 'bm25' is not among .*hybrid"):
        compare({"hybrid": table}, "bm25", ["ndcg@10"])


@pytest.fixture(scope="module")
def bench_out(tmp_path_factory, models, ):
    """bench on the sample: bm25, rank-bm25 and bm25+rerank with the tiny cross-encoder, fisher + holm."""
    from tests.conftest import ROOT

    out = tmp_path_factory.mktemp("bench") / "o"
    rc = main(["-q", "bench", "--data", str(ROOT / "data" / "sample"), "--systems", "bm25,rank-bm25,bm25+rerank",
               "--reranker-model", str(models[1]), "--rerank-depth", "20", "--baseline", "bm25", "--test", "fisher",
               "--correction", "holm", "--out", str(out)])
    assert rc == 0
    return out


def test_eval_reproduces_bench_metrics_and_trec_eval(bench_out, sample_dir, capsys):
    from twostage.indexer.beir import BeirDataset

    metrics = json.loads((bench_out / "metrics.json").read_text())
    qrels = BeirDataset(sample_dir).split("test").qrels
    for name in metrics:
        path = bench_out / "runs" / f"{name}.trec"
        capsys.readouterr()
        assert main(["-q", "eval", "--run", str(path), "--data", str(sample_dir), "--json"]) == 0
        got = json.loads(capsys.readouterr().out)[name]
        for m in ("ndcg@10", "mrr@10", "recall@10", "recall@100", "map@100"):
            assert got[m] == pytest.approx(metrics[name][m], abs=1e-4), (name, m)
        assert_agrees_with_trec_eval(qrels, path)
    sig = pd.read_csv(bench_out / "significance.csv")
    assert set(sig.system) == {"rank-bm25", "bm25+rerank"} and (sig.p_adjusted >= sig.p_value).all()
    report = (bench_out / "report.md").read_text()
    assert "Fisher's randomization test" in report and "adjusted by holm" in report and "95% CI" in report


def test_eval_compares_runs(bench_out, sample_dir, capsys):
    runs = bench_out / "runs"
    assert main(["-q", "eval", "--run", str(runs / "bm25.trec"), "--run", str(runs / "bm25+rerank.trec"),
                 "--data", str(sample_dir), "--test", "fisher", "--correction", "bonferroni"]) == 0
    out = capsys.readouterr().out
    assert "| bm25+rerank |" in out and "against bm25 (fisher, bonferroni)" in out and "adjusted" in out


def test_rerank_a_run_equals_bench(bench_out, sample_dir, models, tmp_path, capsys):
    assert main(["-q", "rerank", "--run", str(bench_out / "runs" / "bm25.trec"), "--data", str(sample_dir),
                 "--reranker", str(models[1]), "--rerank-depth", "20", "--out", str(tmp_path / "r.trec")]) == 0
    ours, bench = Run.from_trec(tmp_path / "r.trec"), Run.from_trec(bench_out / "runs" / "bm25+rerank.trec")
    assert ours.name == "bm25+rerank" and set(ours) == set(bench)
    for q in bench:  # the same documents with the same scores; in the same order but among near-ties
        a = dict(zip(map(str, ours[q].ids), ours[q].scores))
        b = dict(zip(map(str, bench[q].ids), bench[q].scores))
        assert set(a) == set(b)
        np.testing.assert_allclose([a[d] for d in b], list(b.values()), rtol=1e-6, atol=1e-6)
        # the tiny random reranker gives near-equal scores, whose order a 1e-7 difference (a batch padded
        # otherwise, the machine loaded) may flip: CI saw one such swap under load
        order = [b[str(d)] for d in ours[q].ids]
        assert all(x >= y - 1e-6 for x, y in zip(order, order[1:]))


def test_rerank_and_eval_errors_name_the_thing(bench_out, sample_dir, models, tmp_path, capsys):
    (tmp_path / "other.trec").write_text("q-unknown Q0 d1 1 0.5 x\n")
    args = ["rerank", "--run", str(tmp_path / "other.trec"), "--data", str(sample_dir), "--reranker", str(models[1]),
            "--out", str(tmp_path / "out.trec")]
    assert main(args) == 2
    assert "query 'q-unknown' is not in" in capsys.readouterr().err and not (tmp_path / "out.trec").exists()
    assert main(["eval", "--run", str(tmp_path / "other.trec"), "--data", str(sample_dir)]) == 2
    assert "none of its 1 queries has judgments" in capsys.readouterr().err
    assert main(["bench", "--data", str(sample_dir), "--systems", "bm25,rank-bm25", "--baseline", "hybrid",
                 "--out", str(tmp_path / "b")]) == 2
    assert "--baseline hybrid: not among --systems" in capsys.readouterr().err
    assert main(["eval", "--run", str(bench_out / "runs" / "bm25.trec"), "--data", str(sample_dir),
                 "--rel-level", "0"]) == 2
    assert "rel_level must be an integer >= 1" in capsys.readouterr().err


CLI_JIT = """
import sys
from twostage.app.cli import main
assert main(["eval", "--run", sys.argv[1], "--data", sys.argv[2]]) == 2  # no such run: before any evaluation
import numba
print("DISABLE_JIT", int(numba.config.DISABLE_JIT))
"""


@pytest.mark.parametrize("env,expected", [(None, 1), ("0", 0)])
def test_the_command_line_runs_ranx_as_python_unless_told(tmp_path, sample_dir, env, expected):
    # a fresh install compiled ranx for 78 s before its first evaluation (app/cli.py _metrics_as_python)
    import subprocess

    environ = {k: v for k, v in os.environ.items() if k != "NUMBA_DISABLE_JIT"}
    if env is not None:
        environ["NUMBA_DISABLE_JIT"] = env
    done = subprocess.run([sys.executable, "-c", CLI_JIT, str(tmp_path / "missing.trec"), str(sample_dir)],
                          capture_output=True, text=True, env=environ, timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    assert f"DISABLE_JIT {expected}" in done.stdout


def test_eval_ignores_identical_ids_as_bench_does(make_beir, tmp_path, capsys):
    """#46: ArguAna's queries are in its corpus; `twostage eval` of bench's run must score what bench scored."""
    words = ["cats purr", "dogs bark", "rain falls", "snow melts", "birds sing", "fish swim"]
    corpus = [{"_id": f"a{i}", "text": f"{w} argument {i}"} for i, w in enumerate(words)] + \
        [{"_id": f"c{i}", "text": f"{w} counter {i}"} for i, w in enumerate(words)]
    queries = [{"_id": f"a{i}", "text": f"{w} argument {i}"} for i, w in enumerate(words)]  # a query is a document
    data = make_beir(corpus, queries, {"test": [(f"a{i}", f"c{i}", 1) for i in range(len(words))]}, name="argu")
    out = tmp_path / "bench"
    assert main(["-q", "bench", "--data", str(data), "--systems", "bm25", "--ignore-identical-ids",
                 "--out", str(out)]) == 0
    want = json.loads((out / "metrics.json").read_text())["bm25"]
    capsys.readouterr()
    run = out / "runs" / "bm25.trec"
    assert main(["-q", "eval", "--run", str(run), "--data", str(data), "--json", "--ignore-identical-ids"]) == 0
    got = json.loads(capsys.readouterr().out)["bm25"]
    for m in ("ndcg@10", "mrr@10", "recall@100"):
        assert got[m] == pytest.approx(want[m], abs=1e-6), m
    assert main(["-q", "eval", "--run", str(run), "--data", str(data), "--json"]) == 0
    captured = capsys.readouterr()
    assert json.loads(captured.out)["bm25"]["ndcg@10"] < want["ndcg@10"]  # each query's own document ranks first
    assert "retrieve a document with their own id" in captured.err and "--ignore-identical-ids" in captured.err
