"""Model swaps gated by quality (#47): built beside the engine, compared on judged queries, committed only when not
worse; a server moves to the new models without a restart; a refused or failed swap changes nothing."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from twostage import SearchEngine
from twostage.app.cli import main
from twostage.eval.swap import swap
from twostage.indexer.errors import ConfigError
from twostage.indexer.versions import current_version

SAMPLE = Path(__file__).parent.parent / "data" / "sample"


@pytest.fixture(scope="module")
def built(tmp_path_factory, models):
    retriever, reranker = models
    root = tmp_path_factory.mktemp("swap")
    eng = SearchEngine.build(SAMPLE, root / "e", retriever=retriever, reranker=reranker, backend="flat")
    eng.close()
    return root / "e"


@pytest.fixture
def engine_dir(built, tmp_path):
    shutil.copytree(built, tmp_path / "e", ignore=shutil.ignore_patterns("LOCK"))
    return tmp_path / "e"


def other_bert(tmp_path: Path, tiny_bert_dir: Path) -> Path:
    """The tiny BERT with other random weights: another model, the same shape."""
    import torch
    from safetensors.torch import load_file, save_file

    out = tmp_path / "other-bert"
    shutil.copytree(tiny_bert_dir, out)
    weights = load_file(out / "model.safetensors")
    gen = torch.Generator().manual_seed(7)
    save_file({k: (torch.randn(v.shape, generator=gen) * 0.05 if v.dtype.is_floating_point else v).contiguous()
               for k, v in weights.items()}, out / "model.safetensors")
    return out


def test_the_same_model_is_not_worse_and_is_promoted(engine_dir, models):
    before = current_version(engine_dir).name
    d = swap(engine_dir, retriever=models[0], qrels=SAMPLE, split="train")
    assert d.promoted and not d.forced and d.delta == 0.0 and d.p_value == 1.0 and d.queries > 20
    assert d.version_before == before and d.version_after != before == d.version_before
    assert current_version(engine_dir).name == d.version_after
    again = SearchEngine.load(engine_dir, verify=True)  # every checksum of the promoted version holds
    assert len(again) == 205 and again.manifest.retriever.sha256 == SearchEngine.load(engine_dir).manifest.retriever.sha256
    assert not list(engine_dir.parent.glob(".e.swap-*"))  # the staging directory is gone
    again.close()


def test_a_refused_swap_changes_nothing_and_force_says_by_how_much(engine_dir, models, tmp_path, tiny_bert_dir):
    files = sorted(p.name for p in engine_dir.iterdir())
    before = current_version(engine_dir).name
    d = swap(engine_dir, retriever=models[0], pseudo_queries=40, min_gain=0.01)  # equal cannot gain 0.01
    assert not d.promoted and d.version_after == before == current_version(engine_dir).name
    assert sorted(p.name for p in engine_dir.iterdir()) == files and "pseudo-queries" in d.judged_by
    new = other_bert(tmp_path, tiny_bert_dir)
    d = swap(engine_dir, retriever=new, qrels=SAMPLE, split="train", min_gain=1.0, force=True)
    assert d.promoted and d.forced and d.delta < 1.0 and d.version_after != before
    assert "promoted (forced)" in d.line() and f"{d.delta:+.4f}" in d.line()
    swapped = SearchEngine.load(engine_dir)
    assert Path(swapped.manifest.retriever.path) == new.resolve()
    swapped.close()


def test_a_swap_is_refused_when_the_engine_changed_meanwhile(engine_dir, models, monkeypatch):
    from twostage import Document
    from twostage.eval import swap as swap_module

    real = swap_module._per_query
    calls = []

    def write_meanwhile(engine, queries, judged, metric):  # another writer commits while the candidate is judged
        if not calls:
            SearchEngine.load(engine_dir, verify=False).add([Document("late", "a late document")]).close()
        calls.append(1)
        return real(engine, queries, judged, metric)

    monkeypatch.setattr(swap_module, "_per_query", write_meanwhile)
    with pytest.raises(ConfigError, match="changed while the candidate was built"):
        swap(engine_dir, retriever=models[0], qrels=SAMPLE, split="train")
    assert "late" in SearchEngine.load(engine_dir)  # the other writer's commit stands


def test_cli_swap_and_bad_input(engine_dir, models, capsys):
    assert main(["-q", "swap", str(engine_dir), "--retriever", str(models[0]), "--qrels", str(SAMPLE),
                 "--split", "train", "--min-gain", "0.5"]) == 1
    out = capsys.readouterr().out
    assert out.startswith("refused: ndcg@10") and "--force promotes" in out
    assert main(["-q", "swap", str(engine_dir), "--retriever", str(models[0])]) == 2
    assert "--qrels DIR" in capsys.readouterr().err
    assert main(["-q", "swap", str(engine_dir), "--qrels", str(SAMPLE)]) == 2
    assert "needs a new --retriever" in capsys.readouterr().err


def test_a_server_moves_to_swapped_models_without_a_restart(engine_dir, models, tmp_path, tiny_bert_dir):
    pytest.importorskip("fastapi")
    from fastapi.testclient import TestClient

    from twostage.app.server import create_app

    new = other_bert(tmp_path, tiny_bert_dir)
    with TestClient(create_app(engine_dir, verify=False), raise_server_exceptions=False) as client:
        first = client.post("/search", json={"query": "why do cats purr", "k": 5, "first_stage": "dense",
                                             "rerank": False}).json()
        d = swap(engine_dir, retriever=new, qrels=SAMPLE, split="train", force=True)
        import time

        deadline = time.monotonic() + 20  # the server looks for a newer version every 0.25 s: poll, never guess
        while True:
            after = client.post("/search", json={"query": "why do cats purr", "k": 5, "first_stage": "dense",
                                                 "rerank": False}).json()
            if after["version"] != first["version"] or time.monotonic() > deadline:
                break
            time.sleep(0.05)
        assert after["version"] == d.version_after != first["version"]
        want = SearchEngine.load(engine_dir).search("why do cats purr", k=5, first_stage="dense", rerank=False)
        assert [h["id"] for h in after["hits"]] == want.ids  # the new retriever answers, not the old one
        assert [h["id"] for h in after["hits"]] != [h["id"] for h in first["hits"]] or \
            [h["score"] for h in after["hits"]] != [h["score"] for h in first["hits"]]
        stats = client.get("/stats").json()
        assert stats["engine"]["version"] == d.version_after
        metrics = client.get("/metrics").text
        assert f'version="{d.version_after}"' in metrics and 'twostage_model_load_seconds{model="retriever"}' in metrics
    assert json.dumps(stats)  # serialisable
