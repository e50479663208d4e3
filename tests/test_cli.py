import json

import pytest

from eval.cli import main


def test_bench_writes_outputs(tmp_path, sample_dir, capsys):
    rc = main(["-q", "bench", "--data", str(sample_dir), "--split", "test", "--systems", "bm25", "--out", str(tmp_path / "o")])
    assert rc == 0
    assert "| bm25 |" in capsys.readouterr().out
    config = json.loads((tmp_path / "o" / "config.json").read_text())
    assert config["command"].startswith("twostage -q bench --data") and config["systems"] == ["bm25"]


@pytest.mark.parametrize(
    "args,message",
    [
        (["--split", "dev"], "unknown split 'dev'"),
        (["--systems", "nope"], "unknown system"),
        (["--k", "0"], "k must be a positive integer"),
    ],
)
def test_errors_are_one_line(tmp_path, sample_dir, capsys, args, message):
    rc = main(["-q", "bench", "--data", str(sample_dir), "--out", str(tmp_path / "o"), *args])
    err = capsys.readouterr().err
    assert rc == 2 and message in err and err.startswith("twostage: error:") and err.count("\n") == 1
    assert "Traceback" not in err


def test_missing_data_dir(tmp_path, capsys):
    assert main(["bench", "--data", str(tmp_path / "none"), "--out", str(tmp_path / "o")]) == 2
    assert "no such dataset directory" in capsys.readouterr().err


def test_verbose_shows_the_traceback(tmp_path):
    from indexer.errors import DataNotFoundError

    with pytest.raises(DataNotFoundError):
        main(["-v", "bench", "--data", str(tmp_path / "none"), "--out", str(tmp_path / "o")])


def test_demo_runs_on_the_sample(tmp_path, capsys):
    assert main(["-q", "demo", "--out", str(tmp_path / "demo")]) == 0
    out = capsys.readouterr().out
    assert "| bm25 |" in out and out.count("\nquery ") == 3
