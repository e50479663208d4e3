"""Hostile and broken inputs from the command line: one line on stderr naming the thing, exit status 2,
nothing changed on disk, never a traceback or a crash."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from twostage.app.cli import main
from twostage.indexer.versions import current_version


def snapshot(path: Path) -> dict[str, tuple[int, float]]:
    return {str(p.relative_to(path)): (p.stat().st_size, p.stat().st_mtime) for p in path.rglob("*")
            if p.is_file() and p.name not in ("LOCK", "READERS")}


def one_line_error(capsys, *needles: str) -> str:
    err = capsys.readouterr().err.split("\r")[-1]  # what is left on the terminal once a progress bar is cleared
    assert err.count("\n") == 1 and err.startswith("twostage: error:") and "Traceback" not in err, err
    for needle in needles:
        assert needle in err, err
    return err


@pytest.fixture(scope="module")
def engine_dir(tmp_path_factory, tiny_bert_dir):
    from twostage.reranker.cross_encoder import CrossEncoder

    root = tmp_path_factory.mktemp("hostile")
    ce = CrossEncoder.load(tiny_bert_dir, allow_untrained_head=True)
    ce.head_trained = True
    ce.save(root / "ce")
    shutil.copytree(tiny_bert_dir, root / "bi")
    corpus = root / "c.jsonl"
    corpus.write_text("".join(json.dumps({"_id": f"d{i}", "text": f"rain snow cats {i}", "year": 1950 + i}) + "\n"
                              for i in range(20)))
    assert main(["-q", "build", "--corpus", str(corpus), "--out", str(root / "eng"), "--retriever", str(root / "bi"),
                 "--reranker", str(root / "ce")]) == 0
    return root


def fresh(engine_dir: Path, tmp_path: Path) -> Path:
    shutil.copytree(engine_dir / "eng", tmp_path / "eng")
    return tmp_path / "eng"


@pytest.mark.parametrize("damage", ["traversal", "absolute", "rows-string", "current-bytes", "newer"])
def test_damaged_engine_directories(engine_dir, tmp_path, capsys, damage):
    eng = fresh(engine_dir, tmp_path)
    version = current_version(eng)
    dense = json.loads((version / "dense" / "manifest.json").read_text())
    top = json.loads((version / "manifest.json").read_text())
    if damage == "traversal":
        dense["segments"][0]["name"] = "../../../outside"
        (version / "dense" / "manifest.json").write_text(json.dumps(dense))
        top["files"]["dense/manifest.json"]["sha256"] = __import__("hashlib").sha256(
            (version / "dense" / "manifest.json").read_bytes()).hexdigest()
        top["files"]["dense/manifest.json"]["bytes"] = (version / "dense" / "manifest.json").stat().st_size
        (version / "manifest.json").write_text(json.dumps(top))
        needle = "malformed segment"
    elif damage == "absolute":
        top["files"]["/etc/passwd"] = {"bytes": 1, "sha256": "0" * 64}
        (version / "manifest.json").write_text(json.dumps(top))
        needle = "not a plain name"
    elif damage == "rows-string":
        top["counts"]["documents"] = "20"
        (version / "manifest.json").write_text(json.dumps(top))
        needle = "counts.documents"
    elif damage == "current-bytes":
        (eng / "CURRENT").write_bytes(b"\xff\xfe v000001\n")
        needle = "not UTF-8"
    else:
        top["format_version"] = 99
        (version / "manifest.json").write_text(json.dumps(top))
        needle = "newer than this library"
    before = snapshot(eng)
    assert main(["search", str(eng), "rain"]) == 2
    one_line_error(capsys, needle)
    assert main(["add", str(eng), str(engine_dir / "c.jsonl")]) == 2
    one_line_error(capsys)
    assert snapshot(eng) == before


def test_tampered_weights_and_broken_models(engine_dir, tmp_path, capsys):
    eng = fresh(engine_dir, tmp_path)
    ce = Path(json.loads((current_version(eng) / "manifest.json").read_text())["reranker"]["path"])
    backup = tmp_path / "ce-backup"
    shutil.copytree(ce, backup)
    try:
        weights = ce / "model.safetensors"
        data = bytearray(weights.read_bytes())
        data[-3] ^= 0x10
        weights.write_bytes(bytes(data))
        assert main(["search", str(eng), "rain"]) == 2
        one_line_error(capsys, "reranker", "no longer matches")
        assert main(["search", str(eng), "rain", "--no-rerank"]) == 0  # the first stage does not need it
        capsys.readouterr()
    finally:
        shutil.rmtree(ce)
        shutil.copytree(backup, ce)
    broken = tmp_path / "broken"
    shutil.copytree(engine_dir / "bi", broken)
    data = (broken / "model.safetensors").read_bytes()
    (broken / "model.safetensors").write_bytes(data[: len(data) // 3])
    assert main(["build", "--corpus", str(engine_dir / "c.jsonl"), "--out", str(tmp_path / "x"),
                 "--retriever", str(broken)]) == 2
    one_line_error(capsys, "model.safetensors is damaged")
    assert not (tmp_path / "x").exists() or not any((tmp_path / "x").iterdir())


@pytest.mark.parametrize("case", ["empty-csv", "garbage-parquet", "content-column", 
                                  "out-is-file", "where-format"])
def test_bad_inputs_are_one_line(engine_dir, tmp_path, capsys, case):
    bi = str(engine_dir / "bi")
    if case == "empty-csv":
        (tmp_path / "c.csv").write_text("")
        args, needle = ["build", "--corpus", str(tmp_path / "c.csv"), "--out", str(tmp_path / "o"), "--retriever", bi], \
            "empty file"
    elif case == "garbage-parquet":
        (tmp_path / "c.parquet").write_bytes(b"PAR1 not really")
        args, needle = ["build", "--corpus", str(tmp_path / "c.parquet"), "--out", str(tmp_path / "o"),
                        "--retriever", bi], "not a readable parquet file"
    elif case == "content-column":
        (tmp_path / "c.csv").write_text("id,content\na,rain snow\nb,cats\n")
        args, needle = ["build", "--corpus", str(tmp_path / "c.csv"), "--out", str(tmp_path / "o"), "--retriever", bi], \
            "--text-field"
    elif case == "out-is-file":
        (tmp_path / "o").write_text("x")
        args, needle = ["build", "--corpus", str(engine_dir / "c.jsonl"), "--out", str(tmp_path / "o"),
                        "--retriever", bi], "is a file"
    else:
        args, needle = ["search", str(engine_dir / "eng"), "rain", "--where", "year"], "expected KEY=VALUE"
    assert main(args) == 2
    one_line_error(capsys, needle)
    if case == "content-column":
        assert main(["-q", *args, "--text-field", "content"]) == 0


def test_typed_where_filters(engine_dir, capsys):
    eng = str(engine_dir / "eng")
    assert main(["search", eng, "rain", "--where", "year=1951", "--json", "--no-rerank"]) == 0
    hits = json.loads(capsys.readouterr().out)["hits"]
    assert [h["id"] for h in hits] == ["d1"] and hits[0]["metadata"]["year"] == 1951
    assert main(["search", eng, "rain", "--where", 'year="1951"', "--json"]) == 2  # a string is not the number
    err = capsys.readouterr().err
    assert "year" in err and "numbers" in err and len(err.strip().splitlines()) == 1
