"""The wheel: built from the repository, installed into a fresh virtual environment outside it, it holds one
top-level package (``twostage``) with the sample data, and its ``twostage build`` / ``twostage search --json`` work.

The fresh environment borrows this one's third-party packages through a path file (no download, and none of this
checkout's own files: the editable install's finder is not activated by a path entry), so what runs is the wheel.
"""

from __future__ import annotations

import json
import os
import site
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


@pytest.mark.slow
def test_wheel_installs_one_package_that_builds_and_searches(tmp_path, tiny_bert_dir):
    from twostage.reranker.cross_encoder import CrossEncoder

    dist = tmp_path / "dist"
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", str(ROOT),
                    "-w", str(dist)], check=True, capture_output=True, timeout=600)
    (wheel,) = dist.glob("twostage_search-*.whl")
    with zipfile.ZipFile(wheel) as z:
        tops = {name.split("/")[0] for name in z.namelist()}
        names = set(z.namelist())
    assert {t for t in tops if not t.endswith(".dist-info")} == {"twostage"}, tops
    assert {"twostage/data/sample/corpus.jsonl", "twostage/data/sample/qrels/test.tsv", "twostage/py.typed",
            "twostage/app/cli.py", "twostage/indexer/py.typed", "twostage/app/static/search.html",
            "twostage/app/server.py", "twostage/engine/search_engine.py"} <= names

    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=300)
    (purelib,) = venv.glob("lib/python*/site-packages")
    (purelib / "_borrowed_dependencies.pth").write_text("\n".join(site.getsitepackages()) + "\n")
    python = venv / "bin" / "python"
    subprocess.run([sys.executable, "-m", "pip", "--python", str(python), "install", "--no-deps", "-q", str(wheel)],
                   check=True, capture_output=True, timeout=600)
    installed = {p.name for p in purelib.iterdir()} - {"_borrowed_dependencies.pth", "__pycache__"}
    assert {n for n in installed if not n.endswith(".dist-info")} == {"twostage"}, installed

    ce = CrossEncoder.load(tiny_bert_dir, allow_untrained_head=True)
    ce.head_trained = True
    ce.save(tmp_path / "ce")
    work = tmp_path / "elsewhere"
    work.mkdir()
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH",)} | {"HF_HUB_OFFLINE": "1"}

    def run(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([str(venv / "bin" / "twostage"), *args], cwd=work, env=env, capture_output=True,
                              text=True, timeout=600)

    where = subprocess.run([str(python), "-c", "import twostage, pathlib; p = pathlib.Path(twostage.__file__).parent; "
                            "print(p); print(p / 'data' / 'sample')"], cwd=work, env=env, capture_output=True,
                           text=True, check=True).stdout.split()
    assert Path(where[0]).is_relative_to(venv), where  # the wheel's copy, not this checkout
    sample = where[1]
    proc = run("-q", "build", "--corpus", sample, "--out", "eng", "--retriever", str(tiny_bert_dir),
               "--reranker", str(tmp_path / "ce"))
    assert proc.returncode == 0, proc.stderr
    assert "205 documents" in proc.stdout
    proc = run("search", "eng", "why do cats purr", "--json", "--k", "3")
    assert proc.returncode == 0, proc.stderr
    result = json.loads(proc.stdout)
    assert len(result["hits"]) == 3 and {"bm25", "dense", "rerank"} & set(result["hits"][0]["stage_scores"])
    assert proc.stderr == ""  # no library noise
