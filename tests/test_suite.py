"""The benchmark suite: several collections in one bench call, one matrix report with published anchors."""

import json
import shutil
from pathlib import Path

import pytest

from twostage.app.cli import main
from twostage.eval.suite import read_anchors
from twostage.indexer.errors import ConfigError

SAMPLE = Path(__file__).resolve().parents[1] / "data" / "sample"


def test_bench_over_two_collections_writes_the_matrix(tmp_path, capsys):
    for name in ("alpha", "beta"):
        shutil.copytree(SAMPLE, tmp_path / name)
    (tmp_path / "anchors.tsv").write_text("collection\tsystem\tndcg@10\trecall@100\tsource\n"
                                          "alpha\tsomeone's model\t0.512\t\ta paper\n")
    out = tmp_path / "suite"
    assert main(["-q", "bench", "--data", str(tmp_path / "alpha"), "--data", str(tmp_path / "beta"), "--systems",
                 "bm25,rank-bm25", "--out", str(out), "--anchors", str(tmp_path / "anchors.tsv")]) == 0
    report = (out / "suite.md").read_text()
    single = json.loads((out / "alpha" / "metrics.json").read_text())
    assert (out / "beta" / "report.md").is_file()
    row = next(line for line in report.splitlines() if line.startswith("| bm25 |"))
    value = f"{single['bm25']['ndcg@10']:.3f}"
    assert row == f"| bm25 | {value} | {value} | {value} |"  # the same collection twice: the mean equals both
    assert "| alpha | someone's model | 0.512 |  | a paper |" in report and "## recall@100" in report
    saved = json.loads((out / "suite.json").read_text())
    assert set(saved["collections"]) == {"alpha", "beta"}


def test_suite_flags_are_checked(tmp_path, capsys):
    shutil.copytree(SAMPLE, tmp_path / "alpha")
    args = ["-q", "bench", "--data", str(tmp_path / "alpha"), "--data", str(SAMPLE), "--out", str(tmp_path / "o")]
    assert main([*args, "--ignore-identical-ids", "gamma"]) == 2
    assert "gamma: no such --data collection" in capsys.readouterr().err
    assert main([*args, "--train-split", "train"]) == 2
    assert "one collection" in capsys.readouterr().err
    assert not (tmp_path / "o").exists()


def test_anchors_are_validated(tmp_path):
    assert any(a.collection == "arguana" and a.ndcg10 == 0.596 for a in read_anchors())
    bad = tmp_path / "a.tsv"
    bad.write_text("collection\tsystem\tndcg@10\trecall@100\tsource\nx\ty\t1.7\t\tz\n")
    with pytest.raises(ConfigError, match="a.tsv:2: '1.7' is not a metric value"):
        read_anchors(bad)
    bad.write_text("name\tsystem\n")
    with pytest.raises(ConfigError, match="header"):
        read_anchors(bad)


def test_suite_lists_what_each_collection_cut():
    from twostage.eval.suite import CollectionScores, suite_report

    scores = [CollectionScores("alpha", 3, {"bm25": {"ndcg@10": 0.5, "recall@100": 0.9}}, {}, ("2 of 3 queries are "
                                                                                              "longer",)),
              CollectionScores("beta", 4, {"bm25": {"ndcg@10": 0.7, "recall@100": 0.8}}, {})]
    report = suite_report(scores, [], command="twostage bench")
    assert report.endswith("## What the models cut\n\n- alpha: 2 of 3 queries are longer\n")
    assert "What the models cut" not in suite_report(scores[1:], [], command="twostage bench")
