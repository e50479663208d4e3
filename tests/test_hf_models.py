"""Any Hugging Face model by directory or hub name: sentence-transformers cross-encoders, plain one-label
classifiers, and names resolved offline from a hub-layout cache with their revision recorded."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch

from twostage import SearchEngine
from twostage.reranker.cross_encoder import CrossEncoder

SAMPLE = Path(__file__).resolve().parent.parent / "data" / "sample"
PAIRS = [(q, d) for q in ("why do cats purr", "how does rain form", "what makes dough puff up", "snow crystals")
         for d in ("Cats purr when they are content.", "Rain forms when water vapour condenses into droplets.",
                   "Yeast makes dough rise by releasing gas.", "Snowflakes are ice crystals with six arms.",
                   "The stock market fell on Tuesday.")]


@pytest.fixture(scope="module")
def st_cross_encoder(tiny_bert_dir, tmp_path_factory) -> Path:
    """A cross-encoder made and saved by sentence-transformers' CrossEncoder (its head given spread-out weights,
    so scores differ from pair to pair)."""
    st = pytest.importorskip("sentence_transformers")
    model = st.CrossEncoder(str(tiny_bert_dir), num_labels=1, device="cpu")
    torch.manual_seed(1)
    with torch.no_grad():
        for p in model.model.classifier.parameters():
            p.normal_(0, 20.0)
    out = tmp_path_factory.mktemp("st") / "ce"
    model.save(str(out))
    return out


def test_a_sentence_transformers_cross_encoder_scores_as_there(st_cross_encoder):
    st = pytest.importorskip("sentence_transformers")
    assert len(PAIRS) == 20
    theirs = st.CrossEncoder(str(st_cross_encoder), device="cpu").predict(PAIRS)
    ours = CrossEncoder.load(st_cross_encoder)
    assert ours.head_trained
    np.testing.assert_allclose(ours.predict(PAIRS), theirs, atol=1e-4)
    logits = st.CrossEncoder(str(st_cross_encoder), device="cpu").predict(PAIRS, activation_fn=torch.nn.Identity())
    np.testing.assert_allclose(ours.predict(PAIRS, activation=None), logits, atol=1e-4)
    assert np.ptp(logits) > 1e-2  # the scores really differ from pair to pair


def test_any_one_label_sequence_classifier(tiny_bert_dir, tmp_path):
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    torch.manual_seed(2)
    model = AutoModelForSequenceClassification.from_pretrained(tiny_bert_dir, num_labels=1)
    with torch.no_grad():
        model.classifier.weight.normal_(0, 2.0)
    model.save_pretrained(tmp_path / "clf")
    AutoTokenizer.from_pretrained(tiny_bert_dir).save_pretrained(tmp_path / "clf")
    ours = CrossEncoder.load(tmp_path / "clf")
    tok = AutoTokenizer.from_pretrained(tmp_path / "clf")
    with torch.no_grad():
        logits = model.eval()(**tok([q for q, _ in PAIRS], [d for _, d in PAIRS], padding=True,
                                    return_tensors="pt")).logits[:, 0].numpy()
    np.testing.assert_allclose(ours.predict(PAIRS, activation=None), logits, atol=1e-4)


def hub_layout(cache: Path, repo: str, source: Path, revision: str) -> Path:
    """``source`` laid out as the Hugging Face hub cache holds a download of ``repo`` at ``revision``."""
    root = cache / f"models--{repo.replace('/', '--')}"
    snapshot = root / "snapshots" / revision
    shutil.copytree(source, snapshot)
    (root / "refs").mkdir(parents=True)
    (root / "refs" / "main").write_text(revision)
    return snapshot


def test_hub_names_resolve_offline_and_the_revision_is_recorded(models, st_cross_encoder, tmp_path, monkeypatch):
    pytest.importorskip("huggingface_hub")
    import huggingface_hub.constants

    cache = tmp_path / "hub"
    bi_rev, ce_rev = "a" * 40, "b" * 40
    hub_layout(cache, "acme/tiny-bi", models[0], bi_rev)
    hub_layout(cache, "acme/tiny-ce", st_cross_encoder, ce_rev)
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_CACHE", str(cache))
    engine = SearchEngine.build(SAMPLE, tmp_path / "eng", retriever="acme/tiny-bi", reranker="acme/tiny-ce")
    manifest = json.loads((engine.version_dir / "manifest.json").read_text())
    assert manifest["retriever"]["name"] == "acme/tiny-bi" and manifest["retriever"]["revision"] == bi_rev
    assert manifest["reranker"]["revision"] == ce_rev
    hits = SearchEngine.load(tmp_path / "eng").search("why do cats purr", k=3).hits
    assert len(hits) == 3 and "rerank" in hits[0].stage_scores


def test_the_readmes_published_reranker_name_builds_and_reranks(models, st_cross_encoder, tmp_path, monkeypatch,
                                                                capsys):
    """The README's route for a newcomer without a reranker of their own: a published cross-encoder by its hub name
    (here a tiny checkpoint laid out as the hub cache holds that name), reranking by its own scores, and the build
    line saying so."""
    import re

    pytest.importorskip("huggingface_hub")
    import huggingface_hub.constants

    from twostage.app.cli import main

    readme = (Path(__file__).resolve().parent.parent / "README.md").read_text()
    name = re.search(r"--reranker (cross-encoder/\S+)", readme).group(1)
    cache = tmp_path / "hub"
    hub_layout(cache, name, st_cross_encoder, "c" * 40)
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_CACHE", str(cache))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    assert main(["-q", "build", "--corpus", str(SAMPLE), "--out", str(tmp_path / "e"), "--retriever",
                 str(models[0]), "--backend", "flat"] + ["--reranker", name]) == 0
    assert f"second stage: reranker {name} (top 20, by its own scores)" in capsys.readouterr().out
    engine = SearchEngine.load(tmp_path / "e")
    hits = engine.search("why do cats purr", k=3).hits
    assert "rerank" in hits[0].stage_scores and hits[0].score == hits[0].stage_scores["rerank"]


def test_trust_remote_code_is_off_unless_asked_and_recorded(models, tmp_path, monkeypatch, sample_dir, capsys):
    from transformers import AutoModel, AutoTokenizer

    from twostage.app.cli import main

    seen: list[bool] = []
    for cls in (AutoModel, AutoTokenizer):
        original = cls.from_pretrained.__func__

        def spy(klass, *args, _original=original, **kwargs):
            seen.append(kwargs.get("trust_remote_code"))
            return _original(klass, *args, **kwargs)

        monkeypatch.setattr(cls, "from_pretrained", classmethod(spy))
    retriever = str(models[0])
    assert main(["-q", "build", "--corpus", str(sample_dir), "--out", str(tmp_path / "off"), "--retriever",
                 retriever, "--backend", "flat"]) == 0
    assert seen and not any(seen)
    seen.clear()
    assert main(["-q", "build", "--corpus", str(sample_dir), "--out", str(tmp_path / "on"), "--retriever",
                 retriever, "--backend", "flat", "--trust-remote-code"]) == 0
    assert seen and all(seen)
    on = json.loads((SearchEngine.load(tmp_path / "on").version_dir / "manifest.json").read_text())
    off = json.loads((SearchEngine.load(tmp_path / "off").version_dir / "manifest.json").read_text())
    assert on["retriever"]["trust_remote_code"] is True and off["retriever"]["trust_remote_code"] is False
    seen.clear()
    capsys.readouterr()
    assert main(["search", str(tmp_path / "on"), "why do cats purr", "--k", "2"]) == 0  # loads as it was built
    assert seen and all(seen)
