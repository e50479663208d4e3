"""The OpenVINO runtime: same numbers as torch, exports cached under the weights' sha256, stale or damaged exports
rebuilt, never used."""

from __future__ import annotations

import json
import logging
import shutil
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("openvino")
pytest.importorskip("nncf")

from twostage.indexer.errors import ConfigError
from twostage.models import runtime
from twostage.models.weights import sha256_of_weights
from twostage.reranker.cross_encoder import CrossEncoder
from twostage.retriever.biencoder import BiEncoder

TEXTS = ["cats purr when they are content", "rain forms when water vapour condenses into droplets",
         "dogs pant to cool down", "snowflakes are ice crystals with six arms", "a b c"]


@pytest.fixture
def model_dir(tmp_path, tiny_bert_dir) -> Path:
    """A private copy of the tiny BERT without the exports other tests left beside it."""
    return Path(shutil.copytree(tiny_bert_dir, tmp_path / "model", ignore=shutil.ignore_patterns("twostage-openvino")))


def _export_dir(model: Path, precision: str) -> Path:
    return model / "twostage-openvino" / precision


def test_openvino_fp32_equals_torch_and_int8_stays_close(model_dir):
    ref = BiEncoder.load(model_dir).encode(TEXTS)
    ov = BiEncoder.load(model_dir, precision="openvino-fp32")
    fp32 = ov.encode(TEXTS)
    assert np.abs(fp32 - ref).max() < 1e-5
    # many batches: same vectors, in input order
    many = ov.encode(TEXTS * 7, batch_size=3)
    assert np.abs(many - np.tile(ref, (7, 1))).max() < 1e-5
    int8 = BiEncoder.load(model_dir, precision="openvino-int8", calibration=TEXTS * 4).encode(TEXTS)
    assert int8.shape == ref.shape and int8.dtype == np.float32
    assert (int8 * ref).sum(axis=1).min() > 0.95  # cosine to fp32, per text
    assert not np.allclose(int8, ref, atol=1e-6)  # it really ran in int8
    manifest = json.loads((_export_dir(model_dir, "openvino-int8") / "manifest.json").read_text())
    assert manifest["source_weights_sha256"] == sha256_of_weights(model_dir)
    assert manifest["calibration"]["rows"] >= len(TEXTS) * 4  # documents and their query-like prefixes


def test_rows_split_over_streams_come_back_in_order(model_dir):
    enc = BiEncoder.load(model_dir, precision="openvino-fp32")
    one = runtime.openvino_runner(enc, enc.tokenize(["a", "b"]), model_dir, "openvino-fp32", threads=2, streams=1)
    three = runtime.openvino_runner(enc, enc.tokenize(["a", "b"]), model_dir, "openvino-fp32", threads=3, streams=3)
    assert (one.streams, three.streams) == (1, 3) and one.single is None and three.single is not None
    for n in (1, 2, 3, 5, 7):  # fewer rows than streams, equal, and slices of unequal size
        features = {k: v.numpy() for k, v in enc.tokenize((TEXTS * 2)[:n]).items()}
        want, got = one(features), three(features)
        assert got.shape == want.shape == (n, enc.dim)
        assert np.abs(got - want).max() < 1e-5


def test_cross_encoder_scores_match_torch(model_dir):
    ce = CrossEncoder.load(model_dir, allow_untrained_head=True)
    ce.head_trained = True
    saved = ce.save(model_dir.parent / "ce")
    pairs = [("why do cats purr", t) for t in TEXTS]
    ref = CrossEncoder.load(saved).predict(pairs)
    ov = CrossEncoder.load(saved, precision="openvino-fp32")
    assert np.abs(ov.predict(pairs) - ref).max() < 1e-5
    assert np.abs(ov.predict(pairs * 6, batch_size=4) - np.tile(ref, 6)).max() < 1e-5  # many batches, in order
    int8 = CrossEncoder.load(saved, precision="openvino-int8").predict(pairs)  # calibrated on the bundled sample
    assert np.abs(int8 - ref).max() < 0.05
    raw = CrossEncoder.load(saved, precision="openvino-fp32").predict(pairs, activation=None)
    assert np.allclose(1 / (1 + np.exp(-raw)), ref, atol=1e-5)


def test_the_export_is_reused_and_rebuilt_when_the_weights_change(model_dir, monkeypatch):
    BiEncoder.load(model_dir, precision="openvino-fp32")
    calls = []
    real = runtime._export
    monkeypatch.setattr(runtime, "_export", lambda *a, **k: (calls.append(1), real(*a, **k)))
    BiEncoder.load(model_dir, precision="openvino-fp32")
    assert calls == []  # read from the cache
    # new weights in the same directory: the old export is stale and must not be used
    import torch
    from transformers import AutoModel

    model = AutoModel.from_pretrained(model_dir)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.05 * torch.randn_like(p))
    model.save_pretrained(model_dir, safe_serialization=True)
    fresh = BiEncoder.load(model_dir, precision="openvino-fp32").encode(TEXTS)
    assert calls == [1]
    assert np.abs(fresh - BiEncoder.load(model_dir).encode(TEXTS)).max() < 1e-5
    manifest = json.loads((_export_dir(model_dir, "openvino-fp32") / "manifest.json").read_text())
    assert manifest["source_weights_sha256"] == sha256_of_weights(model_dir)


@pytest.mark.parametrize("damage", ["flip a byte of model.bin", "manifest names a file outside", "manifest not JSON"])
def test_a_damaged_export_is_rebuilt_not_used(model_dir, damage, caplog):
    ref = BiEncoder.load(model_dir).encode(TEXTS)
    BiEncoder.load(model_dir, precision="openvino-fp32")
    where = _export_dir(model_dir, "openvino-fp32")
    if damage.startswith("flip"):
        data = bytearray((where / "model.bin").read_bytes())
        data[len(data) // 2] ^= 0xFF
        (where / "model.bin").write_bytes(bytes(data))
    elif damage.startswith("manifest names"):
        manifest = json.loads((where / "manifest.json").read_text())
        manifest["files"]["../../escape.bin"] = manifest["files"].pop("model.bin")
        (where / "manifest.json").write_text(json.dumps(manifest))
    else:
        (where / "manifest.json").write_text("{ not json")
    with caplog.at_level(logging.WARNING, logger="twostage.models.runtime"):
        out = BiEncoder.load(model_dir, precision="openvino-fp32").encode(TEXTS)
    assert "exporting again" in caplog.text
    assert np.abs(out - ref).max() < 1e-5
    manifest = json.loads((where / "manifest.json").read_text())
    assert set(manifest["files"]) == {"model.xml", "model.bin"}


def test_a_read_only_model_directory_exports_to_the_user_cache(model_dir, tmp_path, monkeypatch):
    monkeypatch.setenv("TWOSTAGE_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr(runtime.os, "access", lambda path, mode: Path(path) != model_dir)
    BiEncoder.load(model_dir, precision="openvino-fp32").encode(TEXTS)
    assert not (model_dir / "twostage-openvino").exists()
    digest = sha256_of_weights(model_dir)
    assert (tmp_path / "cache" / "openvino" / digest / "openvino-fp32" / "manifest.json").is_file()


def test_saved_directories_still_load_in_sentence_transformers(model_dir, tmp_path):
    st = pytest.importorskip("sentence_transformers")
    saved = BiEncoder.load(model_dir).save(tmp_path / "bi")
    ours = BiEncoder.load(saved, precision="openvino-fp32").encode(TEXTS)
    theirs = st.SentenceTransformer(str(saved), device="cpu").encode(TEXTS)
    assert np.abs(ours - theirs).max() < 1e-5


def test_missing_openvino_is_one_clear_error(model_dir, monkeypatch):
    monkeypatch.setattr(runtime, "openvino_available", lambda: False)
    with pytest.raises(ConfigError, match=r"pip install 'twostage-search\[openvino\]'"):
        BiEncoder.load(model_dir, precision="openvino-int8")


def test_auto_precision_is_openvino_per_model_when_installed(monkeypatch):
    import importlib.util

    from twostage.models.device import resolve_precision

    assert resolve_precision("auto", "reranker") == "openvino-int8"
    assert resolve_precision("auto", "retriever") == "openvino-fp32"  # int8 costs a fine-tuned bi-encoder quality
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "openvino" else real(name, *a))
    assert resolve_precision("auto", "reranker") == resolve_precision("auto", "retriever") in ("fp32", "bf16")
    assert resolve_precision("fp32", "retriever") == "fp32"
    with pytest.raises(ConfigError, match="role"):
        resolve_precision("auto", "ranker")


def test_an_auto_engine_runs_each_model_in_its_own_precision(model_dir, tmp_path):
    from twostage import SearchEngine
    from twostage.indexer.records import Document

    ce = CrossEncoder.load(model_dir, allow_untrained_head=True)
    ce.head_trained = True
    reranker = ce.save(tmp_path / "ce")
    docs = [Document(f"d{i}", f"document number {i} about cats rain and snow {i % 3}") for i in range(40)]
    engine = SearchEngine.build(docs, tmp_path / "engine", retriever=model_dir, reranker=reranker, backend="flat")
    assert engine.precision == "retriever openvino-fp32, reranker openvino-int8"
    assert len(engine.search("cats and rain", k=5).hits) == 5
    reopened = SearchEngine.load(tmp_path / "engine")
    assert (reopened.encoder.precision, reopened.reranker.precision) == ("openvino-fp32", "openvino-int8")
    assert not _export_dir(model_dir, "openvino-int8").exists() and _export_dir(reranker, "openvino-int8").is_dir()


def test_an_engine_build_calibrates_int8_on_its_own_corpus(model_dir, tmp_path):
    from twostage import SearchEngine
    from twostage.indexer.records import Document

    ce = CrossEncoder.load(model_dir, allow_untrained_head=True)
    ce.head_trained = True
    reranker = ce.save(tmp_path / "ce")
    docs = [Document(f"d{i}", f"document number {i} about cats rain and snow {i % 3}") for i in range(40)]
    engine = SearchEngine.build(docs, tmp_path / "engine", retriever=model_dir, reranker=reranker,
                                precision="openvino-int8", backend="flat")
    assert engine.precision == "openvino-int8"
    hits = engine.search("cats and rain", k=5).hits
    assert len(hits) == 5
    bi = json.loads((_export_dir(model_dir, "openvino-int8") / "manifest.json").read_text())["calibration"]
    pairs = json.loads((_export_dir(reranker, "openvino-int8") / "manifest.json").read_text())["calibration"]
    assert bi["rows"] == 40 + 20  # the 40 documents and the first words of every second one (the sample: 450)
    assert pairs["rows"] == 80  # each document with its own first words and with its neighbour's
    # a reopened engine reads the same exports (no second quantisation)
    before = (_export_dir(model_dir, "openvino-int8") / "manifest.json").stat().st_mtime_ns
    again = SearchEngine.load(tmp_path / "engine")
    assert [h.id for h in again.search("cats and rain", k=5).hits] == [h.id for h in hits]
    assert (_export_dir(model_dir, "openvino-int8") / "manifest.json").stat().st_mtime_ns == before


def test_an_int8_export_leaves_the_applications_log_handlers_alone(tmp_path, tiny_bert_dir):
    """Quantising quiets NNCF's logger for its duration only and never changes the level of a handler: a handler
    attached to the nncf logger (pytest's log capture is one) keeps its level, and the logger's level is restored."""
    model_dir = tmp_path / "m"
    shutil.copytree(tiny_bert_dir, model_dir, ignore=shutil.ignore_patterns("twostage-openvino"))  # export anew
    handler = logging.Handler(logging.INFO)
    nncf_log = logging.getLogger("nncf")
    before = nncf_log.level
    nncf_log.addHandler(handler)
    try:
        BiEncoder.load(model_dir, precision="openvino-int8", calibration=TEXTS * 4)
    finally:
        nncf_log.removeHandler(handler)
    assert handler.level == logging.INFO and nncf_log.level == before


_COLD = """
import json, sys
from twostage.engine.door import open_engine
engine = open_engine(sys.argv[1], device=sys.argv[2])
result = engine.search(sys.argv[3], k=5)
print(json.dumps({"torch": "torch" in sys.modules, "transformers": "transformers" in sys.modules,
                  "encoder": type(engine.query_side).__name__,
                  "hits": [[h.id, h.score] for h in result.hits]}))
"""


def _cold(engine: Path, query: str, device: str = "cpu") -> dict:
    import subprocess
    import sys

    out = subprocess.run([sys.executable, "-c", _COLD, str(engine), device, query], capture_output=True, text=True,
                         check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_a_cold_search_encodes_its_query_without_torch_and_finds_what_the_full_model_finds(model_dir, tmp_path):
    """#81: a cold search spent 5 of its 6.5 s importing torch and loading the model to encode one query."""
    from twostage.engine.search_engine import SearchEngine
    from twostage.indexer.records import Document

    docs = [Document(f"d{i}", f"{TEXTS[i % len(TEXTS)]} number {i}") for i in range(20)]
    engine = SearchEngine.build(docs, tmp_path / "e", retriever=model_dir, precision="openvino-fp32",
                                first_stage="hybrid", device="cpu")
    side = model_dir / "twostage-openvino" / "query-openvino-fp32"
    assert (side / "tokenizer.json").is_file()  # written when the build loaded the model
    query = "why do cats purr"
    full = [[h.id, h.score] for h in engine.search(query, k=5).hits]  # the full model, loaded by the build
    cold = _cold(tmp_path / "e", query)
    assert cold["encoder"] == "QueryEncoder" and not cold["torch"] and not cold["transformers"]
    assert [h[0] for h in cold["hits"]] == [h[0] for h in full]
    assert np.allclose([h[1] for h in cold["hits"]], [h[1] for h in full], atol=1e-6)
    # a damaged query side is never used: the full model encodes (same hits), and writes it again
    (side / "tokenizer.json").write_text("{}")
    again = _cold(tmp_path / "e", query)
    assert again["encoder"] == "BiEncoder" and again["torch"] and [h[0] for h in again["hits"]] == [h[0] for h in full]
    assert _cold(tmp_path / "e", query)["encoder"] == "QueryEncoder"
    # a stale export (other weights) is never read either
    manifest = model_dir / "twostage-openvino" / "openvino-fp32" / "manifest.json"
    manifest.write_text(manifest.read_text().replace(sha256_of_weights(model_dir), "0" * 64))
    assert _cold(tmp_path / "e", query)["encoder"] == "BiEncoder"


def test_the_query_encoder_tokenises_and_truncates_as_the_bi_encoder(model_dir):
    from twostage.retriever.query_encoder import QueryEncoder

    full = BiEncoder.load(model_dir, precision="openvino-fp32")
    fast = QueryEncoder.open(model_dir, sha256_of_weights(model_dir), "openvino-fp32")
    assert fast is not None and fast.max_length == full.config.max_length
    queries = ["cats", "a b c " * 200, "Ünïcödé straße", "rain " * 3, " spaced  out "]
    features = fast.features(queries)
    for i, q in enumerate(queries):  # the same tokens (batches pad differently: vectors equal to rounding)
        ids = full.features([q], full.config.query_prefix, "np")["input_ids"][0]
        assert features["input_ids"][i][features["attention_mask"][i] == 1].tolist() == ids.tolist()
    assert np.abs(fast.encode(queries, batch_size=2) - full.encode(queries, kind="query")).max() < 1e-6
    assert fast.truncated == full.truncated == 1 and fast.longer_than_read(queries) == 1
    with pytest.raises(ConfigError, match="queries only"):
        fast.encode(["x"], kind="document")
    assert QueryEncoder.open(model_dir, "0" * 64, "openvino-fp32") is None  # other weights: not this export
    assert QueryEncoder.open(model_dir, sha256_of_weights(model_dir), "fp32") is None
