"""Late interaction: the token encoder in its three layouts, MaxSim, and the token-vector files."""

from __future__ import annotations

import dataclasses
import json
import string
from pathlib import Path

import numpy as np
import pytest
import torch

from tests.harness.gradients import assert_same_step
from twostage.indexer.errors import ConfigError, IndexFormatError
from twostage.indexer.tokens import (
    TokenCodec,
    TokenPart,
    dequantise,
    maxsim,
    quantise,
    read_manifest,
    write_manifest,
    write_segment,
)
from twostage.models.weights import ModelNotFoundError
from twostage.retriever.late import LateEncoder, layout_of

WORDS = "the cat sat on a mat why do cats purr rain forms when water vapour condenses into droplets dogs pant".split()


def _tiny(path: Path, extra: list[str], seed: int) -> tuple[object, object]:
    from transformers import BertConfig, BertModel, BertTokenizerFast

    vocab = ["[PAD]", "[unused0]", "[unused1]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", *string.punctuation,
             *(chr(c) for c in range(ord("a"), ord("z") + 1)), *(f"##{chr(c)}" for c in range(ord("a"), ord("z") + 1)),
             *WORDS, *extra]
    tokenizer = BertTokenizerFast(vocab={w: i for i, w in enumerate(dict.fromkeys(vocab))}, do_lower_case=True)
    torch.manual_seed(seed)
    config = BertConfig(vocab_size=len(tokenizer) + 2, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                        intermediate_size=64, max_position_embeddings=128)
    path.mkdir(parents=True, exist_ok=True)
    return BertModel(config).eval(), tokenizer


@pytest.fixture(scope="module")
def stanford_dir(tmp_path_factory) -> Path:
    """A tiny random checkpoint in Stanford ColBERT's layout: BERT under ``bert.`` and ``linear`` in one file."""
    from safetensors.torch import save_file

    path = tmp_path_factory.mktemp("stanford")
    bert, tokenizer = _tiny(path, [], 1)
    torch.manual_seed(2)
    tensors = {f"bert.{k}": v.contiguous() for k, v in bert.state_dict().items()}
    tensors["linear.weight"] = torch.randn(16, 32)
    save_file(tensors, str(path / "model.safetensors"))
    config = bert.config.to_dict()
    config["architectures"] = ["HF_ColBERT"]
    (path / "config.json").write_text(json.dumps(config))
    tokenizer.save_pretrained(path)
    (path / "artifact.metadata").write_text(json.dumps({
        "query_token_id": "[unused0]", "doc_token_id": "[unused1]", "query_maxlen": 12, "doc_maxlen": 20,
        "dim": 16, "similarity": "cosine", "attend_to_mask_tokens": False, "mask_punctuation": True}))
    return path


@pytest.fixture(scope="module")
def pylate_dir(tmp_path_factory) -> Path:
    """A tiny random checkpoint in PyLate's layout: a transformer, then a Dense projection module."""
    from safetensors.torch import save_file

    path = tmp_path_factory.mktemp("pylate")
    bert, tokenizer = _tiny(path, [], 3)
    tokenizer.add_tokens(["[Q] ", "[D] "])
    bert.save_pretrained(path, safe_serialization=True)
    tokenizer.save_pretrained(path)
    (path / "modules.json").write_text(json.dumps([
        {"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},
        {"idx": 1, "name": "1", "path": "1_Dense", "type": "pylate.models.Dense.Dense"}]))
    (path / "1_Dense").mkdir()
    (path / "1_Dense" / "config.json").write_text(json.dumps({
        "in_features": 32, "out_features": 8, "bias": False,
        "activation_function": "torch.nn.modules.linear.Identity", "use_residual": False}))
    torch.manual_seed(4)
    save_file({"linear.weight": torch.randn(8, 32)}, str(path / "1_Dense" / "model.safetensors"))
    (path / "config_sentence_transformers.json").write_text(json.dumps({
        "query_prefix": "[Q] ", "document_prefix": "[D] ", "query_length": 10, "document_length": 16,
        "attend_to_expansion_tokens": False, "skiplist_words": list(string.punctuation), "do_query_expansion": True}))
    return path


def reference(path: Path, weight_key: str, texts: list[str], kind: str, marker: str, length: int,
              dense: Path | None = None) -> list[np.ndarray]:
    """Token vectors computed the way the ColBERT libraries describe it, step by step, from the raw files."""
    from safetensors.torch import load_file
    from transformers import AutoTokenizer, BertModel

    tok = AutoTokenizer.from_pretrained(path)
    bert = BertModel.from_pretrained(path).eval()
    weight = load_file(str(dense or path / "model.safetensors"))[weight_key]
    marker_id = tok.convert_tokens_to_ids(marker)
    punct = {tok.convert_tokens_to_ids(p) for p in string.punctuation}
    out = []
    for text in texts:
        ids = tok(text, truncation=True, max_length=length - 1)["input_ids"]
        ids = ids[:1] + [marker_id] + ids[1:]
        attention = [1] * len(ids)
        if kind == "query":  # padded with [MASK], not attended to, kept
            attention += [0] * (length - len(ids))
            ids += [tok.mask_token_id] * (length - len(ids))
        with torch.no_grad():
            h = bert(input_ids=torch.tensor([ids]), attention_mask=torch.tensor([attention])).last_hidden_state[0]
            v = torch.nn.functional.normalize(h @ weight.T, dim=-1).numpy()
        keep = [True] * len(ids) if kind == "query" else [i not in punct for i in ids]
        out.append(v[np.array(keep)])
    return out


TEXTS = ["Why do cats purr?", "rain forms when water vapour condenses into droplets, on a mat.", "dogs pant"]


def test_layouts_are_told_apart(stanford_dir, pylate_dir, tiny_bert_dir):
    assert layout_of(stanford_dir) == "stanford"
    assert layout_of(pylate_dir) == "pylate"
    assert layout_of(tiny_bert_dir) == "plain"


@pytest.mark.parametrize("kind", ["query", "document"])
def test_stanford_checkpoint_scores_as_colbert_does(stanford_dir, kind):
    enc = LateEncoder.load(stanford_dir)
    assert enc.dim == 16 and enc.config.query_length == 12 and enc.config.document_length == 20
    got = enc.encode_tokens(TEXTS, kind=kind)
    marker = "[unused0]" if kind == "query" else "[unused1]"
    want = reference(stanford_dir, "linear.weight", TEXTS, kind, marker, 12 if kind == "query" else 20)
    for g, w in zip(got, want):
        assert g.shape == w.shape
        np.testing.assert_allclose(g, w, atol=1e-5)
    if kind == "query":
        assert all(len(g) == 12 for g in got)  # padded with mask tokens to the query length


@pytest.mark.parametrize("kind", ["query", "document"])
def test_pylate_checkpoint_scores_as_pylate_does(pylate_dir, kind):
    enc = LateEncoder.load(pylate_dir)
    assert enc.dim == 8
    got = enc.encode_tokens(TEXTS, kind=kind)
    marker = "[Q] " if kind == "query" else "[D] "
    want = reference(pylate_dir, "linear.weight", TEXTS, kind, marker, 10 if kind == "query" else 16,
                     dense=pylate_dir / "1_Dense" / "model.safetensors")
    for g, w in zip(got, want):
        np.testing.assert_allclose(g, w, atol=1e-5)


def test_saved_model_reloads_with_the_same_vectors(pylate_dir, tmp_path):
    enc = LateEncoder.load(pylate_dir)
    enc.save(tmp_path / "saved")
    again = LateEncoder.load(tmp_path / "saved")
    assert layout_of(tmp_path / "saved") == "pylate" and again.config == enc.config
    for a, b in zip(enc.encode_tokens(TEXTS), again.encode_tokens(TEXTS)):
        np.testing.assert_allclose(a, b, atol=1e-6)
    modules = json.loads((tmp_path / "saved" / "modules.json").read_text())
    assert modules[1]["type"] == "pylate.models.Dense.Dense"


def test_zero_shot_bi_encoder_gives_its_token_states(tiny_bert_dir):
    enc = LateEncoder.load(tiny_bert_dir)
    assert enc.projection is None and enc.config.layout == "plain" and enc.dim == 32
    q = enc.encode_tokens(["why do cats purr"], kind="query")[0]
    assert len(q) == 6  # [CLS] 4 words [SEP]: no markers, no augmentation
    np.testing.assert_allclose(np.linalg.norm(q, axis=1), 1.0, atol=1e-5)


def test_broken_projection_is_one_clear_error(pylate_dir, tmp_path):
    import shutil

    from safetensors.torch import save_file

    bad = tmp_path / "bad"
    shutil.copytree(pylate_dir, bad)
    save_file({"linear.weight": torch.randn(8, 31)}, str(bad / "1_Dense" / "model.safetensors"))
    with pytest.raises(ModelNotFoundError, match="expected \\(dim, 32\\)"):
        LateEncoder.load(bad)
    (bad / "1_Dense" / "model.safetensors").write_bytes(b"garbage")
    with pytest.raises(ModelNotFoundError, match="unreadable"):
        LateEncoder.load(bad)
    (bad / "config_sentence_transformers.json").write_text(json.dumps({"query_length": "long"}))
    with pytest.raises(ConfigError, match="query_length must be an integer"):
        LateEncoder.load(bad)


def test_maxsim_is_the_sum_of_best_matches():
    rng = np.random.default_rng(0)
    q = rng.normal(size=(5, 8)).astype(np.float32)
    docs = [rng.normal(size=(n, 8)).astype(np.float32) for n in (3, 0, 7, 1)]
    bounds = np.concatenate([[0], np.cumsum([len(d) for d in docs])])
    got = maxsim(q, np.concatenate(docs), bounds)
    want = [0.0 if len(d) == 0 else float((q @ d.T).max(axis=1).sum()) for d in docs]
    np.testing.assert_allclose(got, want, rtol=1e-5)


def test_int8_codes_keep_scores_close():
    rng = np.random.default_rng(1)
    v = rng.normal(size=(200, 32)).astype(np.float32)
    v /= np.linalg.norm(v, axis=1, keepdims=True)
    codes, scales = quantise(v)
    assert codes.dtype == np.int8 and scales.dtype == np.float16
    assert np.abs(dequantise(codes, scales) - v).max() < 0.01


def test_maxsim_multiplies_on_one_blas_thread(monkeypatch):
    """The product runs inside :func:`one_blas_thread` (on two, OpenBLAS's spinning workers slowed the next model's
    forward pass); an empty candidate list does not enter it."""
    from contextlib import contextmanager

    from twostage.indexer import tokens

    entered: list[int] = []

    @contextmanager
    def recording():
        entered.append(1)
        yield

    monkeypatch.setattr(tokens, "one_blas_thread", recording)
    q = np.ones((2, 3), dtype=np.float32)
    assert maxsim(q, np.ones((4, 3), dtype=np.float32), np.array([0, 1, 4]))[1] == 6.0 and entered == [1]
    maxsim(q, np.zeros((0, 3), dtype=np.float32), np.array([0, 0]))
    assert entered == [1]


def test_one_blas_thread_limits_within_the_block_and_gives_the_limit_back():
    """Inside the block every BLAS runs on one thread, nested blocks too; after it, the process's own limit is
    back. A block in another thread meanwhile changes nothing, and leaves nothing changed (a search in a server's
    worker thread never strands numpy on one thread)."""
    import threading

    from threadpoolctl import threadpool_info

    from twostage.indexer.blas import one_blas_thread

    def blas_threads() -> list[int]:
        return [lib["num_threads"] for lib in threadpool_info() if lib["user_api"] == "blas"]

    before = blas_threads()
    seen: list[list[int]] = []

    def other() -> None:
        with one_blas_thread():
            seen.append(blas_threads())

    with one_blas_thread():
        assert blas_threads() and set(blas_threads()) == {1}
        with one_blas_thread():
            assert set(blas_threads()) == {1}
        assert set(blas_threads()) == {1}
        worker = threading.Thread(target=other)
        worker.start()
        worker.join(10)
        assert set(blas_threads()) == {1} and seen == [[1] * len(before)]
    assert blas_threads() == before
    worker = threading.Thread(target=other)  # with the main thread's block over, a worker holds the limit in turn
    worker.start()
    worker.join(10)
    assert seen[-1] == [1] * len(before) and blas_threads() == before


@pytest.mark.parametrize("bits", [8, 4])
def test_token_part_scores_equal_maxsim_over_the_decoded_vectors(tmp_path, bits):
    """MaxSim over codes, scaled after the product, equals MaxSim over the dequantised vectors, within one segment
    and across two, rows in any order, an empty row scoring 0."""
    rng = np.random.default_rng(5)
    rows = [rng.normal(size=(n, 7)).astype(np.float32) for n in (4, 0, 6, 3, 5)]
    d = tmp_path / "late"
    codec = TokenCodec(bits)
    segs = [write_segment(d, "a", rows[:3], 7, codec), write_segment(d, "b", rows[3:], 7, codec)]
    write_manifest(d, 7, segs, codec)
    part = TokenPart.open(d, [("a", 0, 3), ("b", 3, 2)])
    q = rng.normal(size=(3, 7)).astype(np.float32)
    for order in ([2, 0, 1], [4, 1, 0, 3, 2], [3, 4], [2, 4, 2], [1]):
        decoded = []
        for r in order:
            codes, scales = quantise(rows[r], bits) if len(rows[r]) else (None, None)
            decoded.append(dequantise(codes, scales, bits, 7) if codes is not None else np.zeros((0, 7), np.float32))
        bounds = np.concatenate([[0], np.cumsum([len(x) for x in decoded])])
        expected = maxsim(q, np.concatenate(decoded), bounds)
        np.testing.assert_allclose(part.scores(q, order), expected, rtol=1e-5, atol=1e-5)
        if 1 in order:
            assert part.scores(q, order)[order.index(1)] == 0.0
    assert part.scores(q, []).shape == (0,)
    for outside in (5, -1):
        with pytest.raises(IndexError, match=f"row {outside} "):
            part.gather([0, outside])


def test_token_part_round_trip_and_hostile_files(tmp_path):
    rng = np.random.default_rng(2)
    rows = [rng.normal(size=(n, 4)).astype(np.float32) for n in (2, 5, 0, 3)]
    d = tmp_path / "late"
    segs = [write_segment(d, "a", rows[:3], 4), write_segment(d, "b", rows[3:], 4)]
    write_manifest(d, 4, segs)
    part = TokenPart.open(d, [("a", 0, 3), ("b", 3, 1)], verify=True)
    values, scales, bounds = part.gather([3, 1])
    assert list(np.diff(bounds)) == [3, 5]
    np.testing.assert_allclose(values * scales[:, None], np.concatenate([rows[3], rows[1]]), atol=0.05)
    q = rng.normal(size=(2, 4)).astype(np.float32)
    np.testing.assert_allclose(part.scores(q, [1, 2]), [maxsim(q, rows[1], np.array([0, 5]))[0], 0.0], atol=0.05)
    with pytest.raises(IndexFormatError, match="do not match"):
        TokenPart.open(d, [("a", 0, 4)])
    np.save(d / "a.offsets.npy", np.array([0, 9, 7, 7], dtype=np.int64))
    with pytest.raises(IndexFormatError):
        TokenPart.open(d, [("a", 0, 3), ("b", 3, 1)])  # sizes differ from the manifest's, or bad offsets
    write_manifest(d, 4, segs)  # the manifest agrees with the hostile file now: the offsets are checked
    with pytest.raises(IndexFormatError, match="rising offsets"):
        TokenPart.open(d, [("a", 0, 3), ("b", 3, 1)])
    (d / "manifest.json").write_text("{")
    with pytest.raises(IndexFormatError, match="unreadable"):
        read_manifest(d)


# ---- the MaxSim stage in an engine ---------------------------------------------------------------------------------

SAMPLE = Path(__file__).resolve().parent.parent / "data" / "sample"


def sample_queries() -> list[str]:
    from twostage.indexer.beir import BeirDataset

    return [q.text for q in BeirDataset(SAMPLE).split("test").queries]


@pytest.fixture(scope="module")
def late_engines(tmp_path_factory, models):
    """A whole-document engine and a passage engine with token vectors (the tiny BERT read token by token)."""
    from twostage import SearchEngine

    retriever, reranker = models
    root = tmp_path_factory.mktemp("late")
    whole = SearchEngine.build(SAMPLE, root / "whole", retriever=retriever, reranker=reranker, passage_words=0,
                               backend="flat", late_interaction=retriever, device="cpu")
    passages = SearchEngine.build(SAMPLE, root / "passages", retriever=retriever, reranker=reranker,
                                  passage_words=24, passage_stride=12, late_interaction=retriever, device="cpu")
    yield whole, passages
    whole.close()
    passages.close()


def direct(engine, query: str, texts: list[str]) -> np.ndarray:
    late = engine.late
    q = late.encode_tokens([query], kind="query")[0]
    docs = late.encode_tokens(texts, kind="document", allow_empty=True)
    return np.array([maxsim(q, d, np.array([0, len(d)]))[0] for d in docs])


def test_the_stage_scores_are_maxsim_over_the_stored_tokens(late_engines):
    whole = late_engines[0]
    for query in sample_queries()[:4]:
        result = whole.search(query, 10, rerank=False, maxsim_blend="none")
        got = np.array([h.stage_scores["maxsim"] for h in result.hits])
        want = direct(whole, query, [whole.documents([h.id])[0].full_text for h in result.hits])
        np.testing.assert_allclose(got, want, atol=0.03)  # int8 codes
        assert list(got) == sorted(got, reverse=True)  # MaxSim alone orders its depth
        assert [h.score for h in result.hits] == pytest.approx(list(got), abs=1e-5)


def test_updates_keep_the_token_vectors_in_step(late_engines, tmp_path):
    import shutil

    from twostage import Document, SearchEngine

    shutil.copytree(late_engines[0].root, tmp_path / "e")
    engine = SearchEngine.load(tmp_path / "e")
    query = "rain and snow"
    engine = engine.add([Document("x-1", "snow falls on the mountains in winter"), Document("x-2", "rice is cooked")])
    engine = engine.upsert([Document("cook-01", "rain and snow all day")]).delete(["home-05"])
    for step in ("updated", "compacted"):
        ids = [str(i) for i in engine.index.doc_ids[~engine.index.deleted]]
        texts = [d.full_text for d in engine.documents(ids)]
        np.testing.assert_allclose(engine.token_scores(engine.late.encode_tokens([query], kind="query")[0], ids),
                                   direct(engine, query, texts), atol=0.03, err_msg=step)
        engine = engine.compact()
    assert len(engine.tokens.segments) == 1
    reopened = SearchEngine.load(tmp_path / "e", verify=True)
    assert [h.id for h in reopened.search(query, 5).hits] == [h.id for h in engine.search(query, 5).hits]


@pytest.mark.parametrize("which", [0, 1])
def test_explanations_recompose_with_the_maxsim_stage(late_engines, which):
    engine = late_engines[which]
    checked = 0
    for options in ({"first_stage": "hybrid"}, {"first_stage": "dense"}, {"first_stage": "bm25"},
                    {"maxsim_blend": "none"}, {"maxsim_depth": 5}):
        for rerank in (False, True):
            for extra in ({}, {"diversity": 0.3}):
                for result in engine.search_batch(sample_queries(), 10, rerank=rerank, explain=True, **options,
                                                  **extra):
                    for hit in result.hits:
                        e = hit.explanation
                        assert abs(e.recomposed() - hit.score) <= 1e-6, (options, rerank, extra, hit.id, e)
                        assert (e.maxsim is not None and e.maxsim.score is not None) == ("maxsim" in hit.stage_scores)
                        checked += 1
    assert checked > 500
    lines = engine.search(sample_queries()[0], 1, explain=True).hits[0].explanation.lines()
    assert any(line.startswith("maxsim: ") for line in lines) and any("minmax(maxsim" in line for line in lines)


def test_maxsim_knobs(late_engines, models):
    whole = late_engines[0]
    query = sample_queries()[0]
    assert "maxsim" not in whole.search(query, 3, maxsim=False).hits[0].stage_scores
    assert "maxsim_s" in whole.search(query, 3).timings
    for bad in ({"maxsim_depth": 0}, {"maxsim_blend": 1.5}, {"maxsim": "yes"}):
        with pytest.raises(ConfigError):
            whole.search(query, 3, **bad)
    plain = whole.with_settings()  # a view keeps the stage
    assert "maxsim" in plain.search(query, 3).hits[0].stage_scores


def test_views_with_another_reranker_load_the_late_encoder_once(late_engines, models):
    """A with_reranker view (the blend's dev selection makes one a weight) shares the engine's late encoder: the
    first view to search loads it into the engine, every later view finds it there."""
    from twostage import SearchEngine
    from twostage.reranker.cross_encoder import CrossEncoder

    reranker = CrossEncoder.load(models[1])
    engine = SearchEngine.load(late_engines[0].root, verify=False)  # nothing loaded yet
    assert engine.loaded_models.late is None
    first = engine.with_reranker(reranker)
    first.search(sample_queries()[0], 3)
    assert engine.loaded_models.late is not None
    second = engine.with_reranker(reranker)
    second.search(sample_queries()[1], 3)
    assert second.late is first.late is engine.loaded_models.late
    engine.close()


def test_an_engine_without_token_vectors_refuses_maxsim(tmp_path, models):
    from twostage import SearchEngine

    engine = SearchEngine.build(SAMPLE, tmp_path / "e", retriever=models[0], passage_words=0, backend="flat",
                                device="cpu")
    with pytest.raises(ConfigError, match="no token vectors"):
        engine.search("rain", 3, maxsim=True)
    assert engine.search("rain", 3).hits  # the default: no stage, nothing asked
    with pytest.raises(ConfigError, match="retriever too"):
        SearchEngine.build(SAMPLE, tmp_path / "b", retriever=None, late_interaction=models[0], device="cpu")


@pytest.mark.parametrize("damage", ["flip", "truncate", "remove", "offsets"])
def test_damaged_token_files_are_one_clear_error(late_engines, tmp_path, damage):
    import shutil

    from twostage import SearchEngine

    shutil.copytree(late_engines[1].root, tmp_path / "e")
    version = SearchEngine.load(tmp_path / "e").version_dir
    late = version / "late"
    codes = next(late.glob("*.codes.npy"))
    if damage == "flip":
        data = bytearray(codes.read_bytes())
        data[len(data) // 2] ^= 0x40
        codes.write_bytes(bytes(data))
    elif damage == "truncate":
        codes.write_bytes(codes.read_bytes()[:200])
    elif damage == "remove":
        shutil.rmtree(late)
    else:  # offsets rewritten and the part's manifest made to agree: the offsets themselves are checked
        offsets = next(late.glob("*.offsets.npy"))
        values = np.load(offsets)
        values[1] = values[-1] + 5
        np.save(offsets, values)
        manifest = read_manifest(late)
        write_manifest(late, manifest["dim"], manifest["segments"])
        from dataclasses import replace

        from twostage.engine.on_disk import engine_files, read_engine_manifest
        m = read_engine_manifest(version)
        (version / "manifest.json").write_text(replace(m, files=engine_files(version)).to_json())
    with pytest.raises(IndexFormatError):
        SearchEngine.load(tmp_path / "e", verify=True)


def test_a_colbert_checkpoint_serves_in_an_engine_and_the_cli(tmp_path, models, stanford_dir, capsys):
    from twostage.app.cli import main

    rc = main(["-q", "build", "--corpus", str(SAMPLE), "--out", str(tmp_path / "e"), "--retriever", str(models[0]),
               "--late-interaction", str(stanford_dir), "--passage-words", "0", "--device", "cpu",
               "--maxsim-depth", "30"])
    assert rc == 0
    capsys.readouterr()
    assert main(["search", str(tmp_path / "e"), "rain and snow", "--k", "3", "--json"]) == 0
    hits = json.loads(capsys.readouterr().out)
    rows = hits if isinstance(hits, list) else hits["hits"]
    assert len(rows) == 3
    assert main(["search", str(tmp_path / "e"), "rain", "--maxsim-blend", "2"]) == 2
    assert "--maxsim-blend" in capsys.readouterr().err
    assert main(["search", str(tmp_path / "e"), "rain", "--no-maxsim", "--k", "2"]) == 0


def test_token_vectors_added_to_a_built_engine(tmp_path, models, late_engines, capsys):
    from twostage import SearchEngine
    from twostage.app.cli import main

    SearchEngine.build(SAMPLE, tmp_path / "e", retriever=models[0], reranker=models[1], passage_words=24,
                       passage_stride=12, device="cpu").delete(["home-05"])
    assert main(["-q", "late", str(tmp_path / "e"), "--model", str(models[0]), "--device", "cpu"]) == 0
    assert "token vectors of" in capsys.readouterr().out
    late = SearchEngine.load(tmp_path / "e", verify=True)
    built = late_engines[1]  # built with the same models and passages from the start
    rows = [str(i) for i in late.index.doc_ids[~late.index.deleted]]
    assert not any(r.startswith("home-05") for r in rows)
    q = late.late.encode_tokens(["rain and snow"], kind="query")[0]
    np.testing.assert_allclose(late.token_scores(q, rows), built.token_scores(q, rows), atol=1e-5)
    assert "maxsim" in late.search("rain and snow", 5).hits[0].stage_scores
    assert main(["late", str(tmp_path / "nope"), "--model", str(models[0])]) == 2


def test_http_carries_the_maxsim_knobs(late_engines):
    pytest.importorskip("fastapi")
    from fastapi.testclient import TestClient

    from twostage.app.server import create_app

    whole = late_engines[0]
    client = TestClient(create_app(whole.root), raise_server_exceptions=False)
    body = client.post("/search", json={"query": "rain and snow", "k": 3, "maxsim_blend": "none", "rerank": False})
    assert body.status_code == 200, body.text
    hits = body.json()["hits"]
    assert "maxsim" in hits[0]["stage_scores"] and hits[0]["score"] == pytest.approx(hits[0]["stage_scores"]["maxsim"])
    off = client.post("/search", json={"query": "rain and snow", "k": 3, "maxsim": False}).json()["hits"]
    assert "maxsim" not in off[0]["stage_scores"]
    assert client.post("/search", json={"query": "rain", "maxsim_depth": 0}).status_code == 422
    info = whole.info()["late_interaction"]
    assert info["dim"] == 32 and info["tokens"] > 0 and info["bytes"] > 0


def test_http_rerank_by_maxsim(late_engines):
    pytest.importorskip("fastapi")
    from fastapi.testclient import TestClient

    from twostage.app.budgets import Budgets
    from twostage.app.server import create_app

    whole = late_engines[0]
    client = TestClient(create_app(whole.root), raise_server_exceptions=False)
    query = "why do cats purr"
    texts = [d.full_text for d in whole.documents([str(i) for i in whole.index.doc_ids[:6]])]
    want = direct(whole, query, texts)
    for model in ("maxsim", whole.manifest.late.name):
        body = client.post("/v1/rerank", json={"query": query, "documents": texts, "model": model, "top_n": 5})
        assert body.status_code == 200, body.text
        results = body.json()["results"]
        assert [r["index"] for r in results] == sorted(range(len(texts)), key=lambda i: (-want[i], i))[:5]
        assert [r["relevance_score"] for r in results] == pytest.approx([float(want[r["index"]]) for r in results],
                                                                         abs=1e-5)
        assert body.json()["model"] == model and body.json()["usage"]["total_tokens"] > 0
    crossed = client.post("/v1/rerank", json={"query": query, "documents": texts[:3]}).json()  # the cross-encoder
    assert crossed["model"] == whole.manifest.reranker.name
    assert all(0 <= r["relevance_score"] <= 1 for r in crossed["results"])
    budgeted = TestClient(create_app(whole.root, budgets=Budgets(request_tokens=10)), raise_server_exceptions=False)
    refused = budgeted.post("/v1/rerank", json={"query": query, "documents": texts, "model": "maxsim"})
    assert refused.status_code == 413 and "late-interaction" in refused.json()["error"]


def test_bench_systems_with_and_without_maxsim(models, tmp_path):
    from twostage.eval.systems import SYSTEMS, SystemOptions, engine_for, resolve_systems
    from twostage.indexer.beir import BeirDataset

    retriever, reranker = models
    corpus = BeirDataset(SAMPLE).corpus
    options = SystemOptions(retriever_model=str(retriever), reranker_model=str(reranker), late_model=str(retriever),
                            device="cpu")
    assert {"hybrid+maxsim", "hybrid+maxsim+rerank"} <= set(resolve_systems("all", options))
    assert "hybrid+maxsim" not in resolve_systems("all", SystemOptions(retriever_model=str(retriever)))
    queries = sample_queries()[:8]
    engine = engine_for(corpus, options)
    runs = {name: SYSTEMS[name](corpus, options).search_batch(queries, 10)
            for name in ("hybrid", "hybrid+maxsim", "hybrid+rerank", "hybrid+maxsim+rerank")}
    for name, knobs in (("hybrid", {"maxsim": False, "rerank": False}), ("hybrid+maxsim", {"rerank": False}),
                        ("hybrid+rerank", {"maxsim": False}), ("hybrid+maxsim+rerank", {})):
        for query, got in zip(queries, runs[name]):  # each system is the engine's own search with its stages
            hits = engine.search(query, 10, **knobs).hits
            assert list(got.ids) == [h.id for h in hits], name
            np.testing.assert_allclose(got.scores, [h.score for h in hits], rtol=1e-5)  # float32
    assert any(list(a.ids) != list(b.ids) for a, b in zip(runs["hybrid"], runs["hybrid+maxsim"]))
    with pytest.raises(ConfigError, match="--late-model"):
        SYSTEMS["hybrid+maxsim"](corpus, SystemOptions(retriever_model=str(retriever), device="cpu"))


def test_four_bit_codes_and_the_projection():
    from twostage.indexer.tokens import TokenCodec, fit_projection

    rng = np.random.default_rng(3)
    v = rng.normal(size=(300, 33)).astype(np.float32)
    v /= np.linalg.norm(v, axis=1, keepdims=True)
    codes, scales = quantise(v, 4)
    assert codes.dtype == np.uint8 and codes.shape == (300, 17)
    back = dequantise(codes, scales, 4, 33)
    assert back.shape == v.shape and np.abs(back - v).max() <= float(scales.astype(np.float32).max()) / 2 + 1e-6
    low_rank = rng.normal(size=(400, 4)) @ rng.normal(size=(4, 12))  # vectors in a 4-d subspace of 12
    p = fit_projection(low_rank, 4)
    np.testing.assert_allclose((low_rank @ p) @ (low_rank @ p).T, low_rank @ low_rank.T, atol=1e-6 * 400)
    assert TokenCodec(4, p).stored_dim(12) == 4


@pytest.mark.parametrize("dim, bits", [(16, 4), (0, 4), (12, 8)])
def test_compact_token_vectors_keep_maxsim_and_their_codec_through_updates(tmp_path, models, dim, bits):
    from twostage import Document, SearchEngine

    engine = SearchEngine.build(SAMPLE, tmp_path / "e", retriever=models[0], passage_words=0, backend="flat",
                                device="cpu").late_interaction(models[0], dim=dim, bits=bits)
    part = engine.tokens
    assert part.codec.bits == bits and part.dim == (dim or 32)
    assert (part.codec.projection is not None) == bool(dim)
    engine = engine.add([Document("x-1", "snow falls on the mountains in winter")]).compact()
    reopened = SearchEngine.load(tmp_path / "e", verify=True)
    assert reopened.tokens.codec.bits == bits and reopened.tokens.dim == part.dim
    ids = [str(i) for i in reopened.index.doc_ids[~reopened.index.deleted]]
    q = reopened.late.encode_tokens(["rain and snow"], kind="query")[0]
    texts = [d.full_text for d in reopened.documents(ids)]
    docs = reopened.late.encode_tokens(texts, kind="document")
    project = part.codec.project
    want = np.array([maxsim(project(q), project(d), np.array([0, len(d)]))[0] for d in docs])
    got = reopened.token_scores(q, ids)
    assert np.abs(got - want).max() < (0.3 if bits == 4 else 0.05) * max(1.0, float(np.abs(want).max()) / 5)
    assert np.corrcoef(got, want)[0, 1] > (0.9 if bits == 4 else 0.98)  # 4 bits: 15 levels a dimension
    with pytest.raises(ConfigError, match="bits must be 8 or 4"):
        reopened.late_interaction(models[0], bits=2)
    with pytest.raises(ConfigError, match="give fewer"):
        reopened.late_interaction(models[0], dim=64)


def test_maxsim_loss_is_cross_entropy_over_the_engines_maxsim():
    """The training loss scores each (query, document) as the engine does (indexer.tokens.maxsim over the kept
    tokens) and is the in-batch cross-entropy with each query's own positive first."""
    from twostage.retriever.losses import MaxSimLoss, maxsim_matrix

    g = torch.Generator().manual_seed(0)
    q = torch.nn.functional.normalize(torch.randn(3, 5, 8, generator=g), dim=-1)
    d = torch.nn.functional.normalize(torch.randn(6, 7, 8, generator=g), dim=-1)
    q_keep = torch.tensor([[1, 1, 1, 0, 0], [1, 1, 1, 1, 1], [1, 0, 0, 0, 0]], dtype=torch.bool)
    d_keep = torch.ones(6, 7, dtype=torch.bool)
    d_keep[1, 3:] = False
    d_keep[4, 1:] = False
    got = maxsim_matrix(q, q_keep, d, d_keep)
    for i in range(3):
        tokens = np.concatenate([d[j][d_keep[j]].numpy() for j in range(6)])
        bounds = np.concatenate([[0], np.cumsum(d_keep.sum(1).numpy())])
        want = maxsim(q[i][q_keep[i]].numpy(), tokens, bounds)
        assert np.allclose(got[i].numpy(), want, atol=1e-5)
    loss = MaxSimLoss(temperature=0.5)(q, q_keep, d, d_keep)
    want_loss = torch.nn.functional.cross_entropy(got / 0.5, torch.arange(3))
    assert torch.allclose(loss, want_loss, atol=1e-6)
    with pytest.raises(ConfigError, match="need at least their 3 positives"):
        MaxSimLoss()(q, q_keep, d[:2], d_keep[:2])


def test_a_late_interaction_model_trains_with_the_retrievers_loop(tmp_path, tiny_bert_dir, sample_dir):
    """RetrieverRecipe(late=True) through the one training entry: mined negatives, the MaxSim objective, the epoch
    chosen by MaxSim over the dev pool; the saved model is a PyLate-layout late-interaction model that an engine
    reads; a recipe mixing it with bi-encoder-only data is one clear error."""
    from twostage.eval.workflows import train
    from twostage.models.model_meta import read_model_meta
    from twostage.retriever.recipe import RetrieverRecipe
    from twostage.retriever.trainer import TrainConfig

    recipe = RetrieverRecipe(train=TrainConfig(epochs=2, batch_size=8, lr=1e-3, bf16=False), negatives=1, late=True)
    before = LateEncoder.load(tiny_bert_dir)
    result = train(recipe, sample_dir, "train", tmp_path / "late", base=str(tiny_bert_dir), dev_fraction=0.2)
    assert [h["epoch"] for h in result.history] == [1, 2] and all(0 <= h["dev"] <= 1 for h in result.history)
    assert layout_of(tmp_path / "late") == "pylate"
    kind, _, training = read_model_meta(tmp_path / "late")
    assert kind == "late-interaction" and training["recipe"]["late"] is True
    after = LateEncoder.load(tmp_path / "late")
    text = ["why do cats purr"]
    assert not np.allclose(after.encode_tokens(text, kind="query")[0], before.encode_tokens(text, kind="query")[0])
    with pytest.raises(ConfigError, match="query-document pairs only"):
        RetrieverRecipe(late=True, title_pairs=10)


def test_query_augmentation_trains_and_is_saved_with_the_model(tmp_path, tiny_bert_dir, sample_dir):
    """#83: a late recipe with query_augmentation pads every query to that many tokens with mask tokens while it
    trains, and saves that setting with the model (PyLate's do_query_expansion / query_length), so the engine
    pads queries the same way; only a late recipe takes it."""
    import json

    from twostage.eval.workflows import train
    from twostage.retriever.recipe import RetrieverRecipe
    from twostage.retriever.trainer import TrainConfig

    recipe = RetrieverRecipe(train=TrainConfig(epochs=1, batch_size=8, lr=1e-3, bf16=False), negatives=1, late=True,
                             query_augmentation=12)
    train(recipe, sample_dir, "train", tmp_path / "late", base=str(tiny_bert_dir))
    st = json.loads((tmp_path / "late" / "config_sentence_transformers.json").read_text())
    assert st["do_query_expansion"] is True and st["query_length"] == 12
    model = LateEncoder.load(tmp_path / "late")
    assert model.config.expand_query and model.config.query_length == 12
    assert [len(v) for v in model.encode_tokens(["why do cats purr", "rain"], kind="query")] == [12, 12]
    plain = LateEncoder.load(tiny_bert_dir)
    assert len(plain.encode_tokens(["why do cats purr"], kind="query")[0]) < 12
    with pytest.raises(ConfigError, match="query_augmentation"):
        RetrieverRecipe(query_augmentation=32)
    with pytest.raises(ConfigError, match="query_augmentation"):
        RetrieverRecipe(late=True, query_augmentation=2)


def test_maxsim_temperature_reaches_both_maxsim_losses_and_only_a_late_recipe_takes_it():
    """#83: TrainConfig.maxsim_temperature (``--maxsim-temperature``) divides the MaxSim scores of the objective the
    run builds, plain, distilled or through GradCache; a bi-encoder recipe or a temperature of 0 is one clear error."""
    from twostage.retriever.gradcache import CachedMaxSimLoss
    from twostage.retriever.objectives import OBJECTIVES
    from twostage.retriever.recipe import RetrieverRecipe
    from twostage.retriever.trainer import TrainConfig

    for mini in (0, 4):
        config = TrainConfig(maxsim_temperature=0.5, mini_batch_size=mini)
        for name in ("maxsim", "maxsim_margin_mse"):
            loss = OBJECTIVES[name].build(object(), 0, config)
            assert isinstance(loss, CachedMaxSimLoss) == bool(mini)
            assert getattr(loss, "inner", loss).temperature == 0.5
    assert OBJECTIVES["maxsim"].build(object(), 0, TrainConfig()).temperature == 1.0
    RetrieverRecipe(train=TrainConfig(maxsim_temperature=0.5), late=True)
    with pytest.raises(ConfigError, match="maxsim_temperature 0.5: .*late=True"):
        RetrieverRecipe(train=TrainConfig(maxsim_temperature=0.5))
    with pytest.raises(ConfigError, match="maxsim_temperature must be positive"):
        TrainConfig(maxsim_temperature=0.0)


def test_maxsim_margin_mse_matches_its_formula():
    """#83: (s(q, p) - s(q, n) - margin)^2 over MaxSim scores, plus in-batch MaxSim contrast by its weight."""
    from twostage.retriever.losses import MaxSimLoss, MaxSimMarginMSELoss, maxsim_matrix

    g = torch.Generator().manual_seed(0)
    q = torch.nn.functional.normalize(torch.randn(2, 4, 8, generator=g), dim=-1)
    d = torch.nn.functional.normalize(torch.randn(2 + 2 * 3, 5, 8, generator=g), dim=-1)
    q_keep, d_keep = torch.ones(2, 4, dtype=torch.bool), torch.rand(8, 5, generator=g) > 0.3
    d_keep[:, 0] = True
    margins = torch.randn(2, 3, generator=g)
    s = maxsim_matrix(q, q_keep, d, d_keep)
    student = torch.stack([s[i, i] - s[i, 2 + 3 * i: 5 + 3 * i] for i in range(2)])
    want = ((student - margins) ** 2).mean()
    assert torch.allclose(MaxSimMarginMSELoss(rank_weight=0)(q, q_keep, d, d_keep, margins), want, atol=1e-6)
    both = MaxSimMarginMSELoss(rank_weight=0.5)(q, q_keep, d, d_keep, margins)
    assert torch.allclose(both, want + 0.5 * MaxSimLoss()(q, q_keep, d, d_keep), atol=1e-6)
    assert MaxSimMarginMSELoss(rank_weight=0)(q, q_keep, d, d_keep, student.detach()).item() < 1e-10
    with pytest.raises(ConfigError, match="B positives, then m negatives"):
        MaxSimMarginMSELoss()(q, q_keep, d[:6], d_keep[:6], margins)


def test_the_teachers_scores_are_cached_and_resumed(tmp_path):
    """#83: a teacher scores each pair once; a run started again reads the cache and scores only what it lacks; a
    cache of another teacher is scored again."""
    from twostage.retriever.training_data import teacher_scores

    calls = []

    def teacher(pairs):
        calls.append(len(pairs))
        return [float(len(a) - len(b)) for a, b in pairs]

    pairs = [(f"query {i}", f"document {j}" * (j + 1)) for i in range(3) for j in range(4)]
    cache = tmp_path / "t.parquet"
    first = teacher_scores(pairs[:7], teacher, cache, "ce-1", chunk=3)
    assert calls == [3, 3, 1] and first == {p: float(len(p[0]) - len(p[1])) for p in pairs[:7]}
    calls.clear()
    again = teacher_scores(pairs, teacher, cache, "ce-1", chunk=3)
    assert calls == [3, 2] and again == {p: float(len(p[0]) - len(p[1])) for p in pairs}
    calls.clear()
    teacher_scores(pairs, teacher, cache, "ce-1")
    assert calls == []
    teacher_scores(pairs, teacher, cache, "ce-2")
    assert calls == [12]


def test_a_late_model_distils_a_cross_encoder(tmp_path, tiny_bert_dir, sample_dir, models, monkeypatch):
    """#83: RetrieverRecipe(late=True) with a teacher trains on the cross-encoder's margins over MaxSim
    (maxsim_margin_mse), its scores kept beside the model; a reranker recipe refuses a teacher."""
    from dataclasses import replace

    import pandas as pd

    from twostage.eval.workflows import train
    from twostage.models.model_meta import read_model_meta
    from twostage.reranker.training import RerankerConfig
    from twostage.retriever import objectives
    from twostage.retriever.recipe import RetrieverRecipe
    from twostage.retriever.trainer import TrainConfig

    _, reranker = models
    used = []
    distil = objectives.OBJECTIVES["maxsim_margin_mse"]
    monkeypatch.setitem(objectives.OBJECTIVES, "maxsim_margin_mse", replace(
        distil, compute=lambda *a: used.append(len(a[2])) or distil.compute(*a)))
    recipe = RetrieverRecipe(train=TrainConfig(epochs=1, batch_size=8, lr=1e-3, bf16=False), negatives=2, late=True)
    result = train(recipe, sample_dir, "train", tmp_path / "late", base=str(tiny_bert_dir), dev_fraction=0.2,
                   teacher=reranker)
    _, _, training = read_model_meta(tmp_path / "late")
    assert training["teacher"] == str(reranker) and result.steps > 0 and used and all(n <= 8 for n in used)
    scores = pd.read_parquet(tmp_path / "late.teacher.parquet")
    assert len(scores) > 0 and set(scores["teacher"]) == {str(reranker)} and scores["score"].notna().all()
    with pytest.raises(ConfigError, match="a RerankerConfig trains the cross-encoder itself"):
        train(RerankerConfig(), sample_dir, "train", tmp_path / "ce", base=str(tiny_bert_dir), teacher=reranker)


def test_maxsim_steps_aside_for_a_language_its_model_does_not_list(tmp_path, models):
    """#80: token states of a model whose card says English never reorder a Chinese query's candidates; the
    dense model (no card: every language) still serves it."""
    import shutil

    from twostage import Document, SearchEngine

    retriever, _ = models
    english = tmp_path / "late-en"
    shutil.copytree(retriever, english)
    (english / "README.md").write_text("---\nlanguage: en\n---\n# a tiny English model read token by token\n")
    docs = [Document(f"en{i}", f"rain and snow fall on the hills, day {i}") for i in range(6)] + \
        [Document(f"zh{i}", f"长江是中国最长的河流，第{i}天下雨又下雪。") for i in range(6)]
    engine = SearchEngine.build(docs, tmp_path / "e", retriever=retriever, passage_words=0, backend="flat",
                                late_interaction=str(english), device="cpu")
    assert engine.late_languages() == ("en",)
    for query, read in (("中国最长的河流下雪", False), ("rain and snow on the hills", True)):
        hits = engine.search(query, 5, rerank=False).hits
        assert all(("maxsim" in h.stage_scores) == read for h in hits), query
        if not read:
            first = engine.ranked(query, 5, rerank=False, maxsim=False)
            assert [h.id for h in hits] == list(first.ids)
    engine.close()


def test_maxsim_serves_its_weight_for_another_corpus_off_the_dev_corpus(tmp_path, tiny_bert_dir, sample_dir, models,
                                                                        capsys):
    """#83: a MaxSim weight chosen on one corpus's dev queries is served over that corpus (or one sharing most of its
    documents); over another corpus the engine serves the record's weight for another corpus (the one-SE weight),
    and says so: `build`, `late` and bench's +maxsim systems alike. A record from before names no corpus: its weight
    everywhere. A damaged corpus record is one clear error."""
    from twostage import SearchEngine
    from twostage.app.cli import main
    from twostage.engine.knobs import MAXSIM_CHOICE, maxsim_choice, served_maxsim
    from twostage.eval.systems import SystemOptions, maxsim_weight
    from twostage.eval.workflows import StageChoice, record_maxsim_choice, recorded_maxsim_choice, train
    from twostage.indexer.corpus import Corpus
    from twostage.indexer.records import Document
    from twostage.models.model_meta import read_model_meta, record_training
    from twostage.retriever.recipe import RetrieverRecipe
    from twostage.retriever.trainer import TrainConfig

    late = tmp_path / "late"
    train(RetrieverRecipe(train=TrainConfig(epochs=1, batch_size=8, lr=1e-3, bf16=False), negatives=1, late=True),
          sample_dir, "train", late, base=str(tiny_bert_dir), dev_fraction=0.2)
    sample = Corpus.load(SAMPLE)
    other = Corpus([Document(f"other-{i}", f"weather report number {i} with {w}", "")
                    for i, w in enumerate(["rain", "snow", "wind", "sun", "fog", "hail"] * 20)])
    record_maxsim_choice(late, StageChoice("MaxSim", 1.0, ((0.0, 0.6), (0.4, 0.66), (1.0, 0.7)), 8, "gated_best", 0.4),
                         other)  # chosen on the dev queries of `other`
    recorded = read_model_meta(late)[2][MAXSIM_CHOICE]
    assert recorded["elsewhere"] == 0.4 and recorded["home"]["documents"] == 120
    assert maxsim_choice(late, other.ids) == 1.0 and maxsim_choice(late, sample.ids) == 0.4
    assert maxsim_choice(late) == 1.0  # no corpus given: the dev choice
    most = [*other.ids[:100], *sample.ids[:20]]  # the dev corpus with a few documents more or less: still its choice
    assert served_maxsim(late, most).home and maxsim_choice(late, most) == 1.0
    assert maxsim_weight(SystemOptions(late_model=str(late)), sample) == 0.4
    assert maxsim_weight(SystemOptions(late_model=str(late)), other) == 1.0
    said = recorded_maxsim_choice(late, sample).line
    assert "on another corpus 0.4" in said and "Here: weight 0.4, the weight for another corpus" in said
    assert "shares 0% of this one's" in said and "Here:" not in recorded_maxsim_choice(late, other).line

    build = ["build", "--corpus", str(SAMPLE), "--retriever", str(models[0]), "--late-interaction", str(late),
             "--passage-words", "0", "--device", "cpu"]
    capsys.readouterr()
    assert main([*build, "--out", str(tmp_path / "there")]) == 0
    out = capsys.readouterr().out
    assert "weight 0.4 against the first stage" in out and "dev chose 1 on a corpus of 120 documents" in out
    assert SearchEngine.load(tmp_path / "there").settings.maxsim_blend == 0.4
    plain = ["build", "--corpus", str(SAMPLE), "--retriever", str(models[0]), "--passage-words", "0", "--device", "cpu"]
    assert main([*plain, "--out", str(tmp_path / "later")]) == 0
    assert main(["late", str(tmp_path / "later"), "--model", str(late), "--device", "cpu"]) == 0
    assert SearchEngine.load(tmp_path / "later").settings.maxsim_blend == 0.4
    assert "the weight for another corpus" in capsys.readouterr().out

    record_training(late, MAXSIM_CHOICE, {**recorded, "elsewhere": 0.9})  # written before the cap: served at 0.5
    assert maxsim_choice(late, sample.ids) == 0.5 and maxsim_choice(late, other.ids) == 1.0
    assert "at most 0.5 (level with the first stage)" in served_maxsim(late, sample.ids).line
    assert "on another corpus 0.5" in recorded_maxsim_choice(late, sample).line
    legacy = {k: v for k, v in recorded.items() if k not in ("elsewhere", "home")}  # a record from before
    record_training(late, MAXSIM_CHOICE, legacy)
    assert maxsim_choice(late, sample.ids) == 1.0 and served_maxsim(late, sample.ids).similarity is None
    for bad, key in (({**recorded, "home": {"documents": 3, "sketch": ["xyz"]}}, f"{MAXSIM_CHOICE}.home"),
                     ({**recorded, "elsewhere": 2}, f"{MAXSIM_CHOICE}.elsewhere")):
        record_training(late, MAXSIM_CHOICE, bad)
        capsys.readouterr()
        assert main([*build, "--out", str(tmp_path / "bad")]) == 2
        assert key in capsys.readouterr().err and not (tmp_path / "bad").exists()


def test_the_maxsim_weight_chosen_on_dev_travels_with_the_model(tmp_path, tiny_bert_dir, sample_dir, models, capsys):
    """#83: the weight the one command's dev rule chose for MaxSim is kept in the late model's training record; an
    engine built with that model serves it (0.0: MaxSim off by default, a search may still ask for it), and so do
    bench's +maxsim systems; a damaged record is one clear error and no engine."""
    from twostage import SearchEngine
    from twostage.app.cli import main
    from twostage.engine.knobs import MAXSIM_CHOICE, maxsim_choice, with_maxsim_choice
    from twostage.engine.settings import EngineSettings
    from twostage.eval.systems import SystemOptions, maxsim_depth, maxsim_weight
    from twostage.eval.workflows import StageChoice, record_maxsim_choice, recorded_maxsim_choice, train
    from twostage.indexer.corpus import Corpus
    from twostage.models.model_meta import read_model_meta, record_training
    from twostage.retriever.recipe import RetrieverRecipe
    from twostage.retriever.trainer import TrainConfig

    late = tmp_path / "late"
    train(RetrieverRecipe(train=TrainConfig(epochs=1, batch_size=8, lr=1e-3, bf16=False), negatives=1, late=True),
          sample_dir, "train", late, base=str(tiny_bert_dir), dev_fraction=0.2)
    home = Corpus.load(SAMPLE)
    assert maxsim_choice(late) is None and with_maxsim_choice(EngineSettings(), late) == EngineSettings()
    record_maxsim_choice(late, StageChoice("MaxSim", 0.0, ((0.0, 0.61), (0.3, 0.60)), 8), home)
    assert maxsim_choice(late) == 0.0 and maxsim_weight(SystemOptions(late_model=str(late)), home) == 0.0
    assert maxsim_weight(SystemOptions(late_model=str(late), maxsim_blend=0.2), home) == 0.2
    build = ["build", "--corpus", str(SAMPLE), "--retriever", str(models[0]), "--late-interaction", str(late),
             "--passage-words", "0", "--device", "cpu"]
    assert main([*build, "--out", str(tmp_path / "off")]) == 0
    assert "off by default (the weight chosen on dev was 0.0" in capsys.readouterr().out
    off = SearchEngine.load(tmp_path / "off")
    assert off.settings.maxsim is False and "maxsim" not in off.search("rain and snow", 3).hits[0].stage_scores
    assert "maxsim" in off.search("rain and snow", 3, maxsim=True).hits[0].stage_scores
    record_maxsim_choice(late, StageChoice("MaxSim", 0.4, ((0.0, 0.61), (0.4, 0.70)), 8, "gated_best"), home)
    assert recorded_maxsim_choice(late).rule == "gated_best"  # the rule travels with the choice
    assert main([*build, "--out", str(tmp_path / "on")]) == 0
    assert "weight 0.4 against the first stage" in capsys.readouterr().out
    on = SearchEngine.load(tmp_path / "on").settings
    assert on.maxsim is True and on.maxsim_blend == 0.4
    assert main([*build, "--out", str(tmp_path / "given"), "--maxsim-blend", "0.9"]) == 0  # the flag wins
    assert SearchEngine.load(tmp_path / "given").settings.maxsim_blend == 0.9
    plain = ["build", "--corpus", str(SAMPLE), "--retriever", str(models[0]), "--passage-words", "0", "--device", "cpu"]
    assert main([*plain, "--out", str(tmp_path / "later")]) == 0  # token vectors added later: the same choice
    before = SearchEngine.load(tmp_path / "later").settings
    assert main(["late", str(tmp_path / "later"), "--model", str(late), "--device", "cpu", "--keep-settings"]) == 0
    assert SearchEngine.load(tmp_path / "later").settings == before  # asked to: as they were
    capsys.readouterr()
    assert main(["late", str(tmp_path / "later"), "--model", str(late), "--device", "cpu"]) == 0
    said = capsys.readouterr().out
    assert "weight 0.4 against the first stage" in said and "this corpus is the dev corpus: 100% shared" in said
    served = SearchEngine.load(tmp_path / "later").settings
    assert served == dataclasses.replace(before, maxsim=True, maxsim_blend=0.4)
    assert maxsim_depth(SystemOptions(late_model=str(late)), home) is None  # no depth recorded: the engine's

    deep = StageChoice("MaxSim", 0.4, ((0.0, 0.61), (0.4, 0.70)), 8, "gated_best", depth=100,
                       dev_by_depth=((50, 0.68, 0.4), (100, 0.70, 0.4)))
    record_maxsim_choice(late, deep, home)  # the depth chosen with the weight travels too
    recorded = recorded_maxsim_choice(late, home)
    assert recorded.depth == 100 and recorded.dev_by_depth == deep.dev_by_depth
    assert "over its top 100" in recorded.line and "top 50 0.680 (weight 0.4)" in recorded.line
    assert maxsim_depth(SystemOptions(late_model=str(late)), home) == 100
    assert maxsim_depth(SystemOptions(late_model=str(late), maxsim_depth=30), home) == 30  # given: it wins
    capsys.readouterr()
    assert main([*build, "--out", str(tmp_path / "deep")]) == 0
    assert "reorder the top 100 (weight 0.4" in capsys.readouterr().out
    assert SearchEngine.load(tmp_path / "deep").settings.maxsim_depth == 100
    assert main([*build, "--out", str(tmp_path / "flag"), "--maxsim-depth", "20"]) == 0  # the flag wins
    assert SearchEngine.load(tmp_path / "flag").settings.maxsim_depth == 20
    record = read_model_meta(late)[2][MAXSIM_CHOICE]
    for bad, key in ((0, "depth"), ("100", "depth"), (True, "depth"), ([[50, 0.6]], "dev_by_depth")):
        record_training(late, MAXSIM_CHOICE, {**record, key: bad})
        capsys.readouterr()
        assert main([*build, "--out", str(tmp_path / "bad")]) == 2
        assert f"{MAXSIM_CHOICE}.{key}" in capsys.readouterr().err and not (tmp_path / "bad").exists()
    record_training(late, MAXSIM_CHOICE, {"weight": 3})
    capsys.readouterr()
    assert main([*build, "--out", str(tmp_path / "bad")]) == 2
    assert f"{MAXSIM_CHOICE}.weight" in capsys.readouterr().err and not (tmp_path / "bad").exists()


@pytest.mark.parametrize("dropout,distil", [(False, False), (True, False), (True, True)])
def test_gradcache_maxsim_equals_the_plain_loss(tiny_bert_dir, dropout, distil):
    """#83: GradCache for a late-interaction model gives the plain loss's value and parameter gradients, though its
    mini-batches come out padded to lengths of their own. With dropout the reference embeds the same mini-batches in
    the same order from the same seed, so each mask must be replayed exactly; the distilled loss reads the margins."""
    from twostage.retriever.gradcache import CachedMaxSimLoss
    from twostage.retriever.losses import MaxSimLoss, MaxSimMarginMSELoss
    from twostage.retriever.objectives import OBJECTIVES
    from twostage.retriever.trainer import TrainConfig

    queries = ["why do cats purr", "rain", "dogs panting in the summer heat", "six arms of ice"]
    documents = ["cats purr when content and calm", "rain forms from vapour", "dogs pant", "snowflakes have arms",
                 "dogs bark at the mail carrier every morning", "snow", "cats sleep", "rain drops on a roof"]
    margins = torch.tensor([[1.5], [0.2], [-0.3], [2.0]])
    extra = (margins,) if distil else ()

    def inner():
        return MaxSimMarginMSELoss(rank_weight=0.5) if distil else MaxSimLoss()

    def in_chunks(model, texts, kind):
        parts = [model.train_tokens(texts[i:i + 3], kind) for i in range(0, len(texts), 3)]
        longest = max(v.shape[1] for v, _ in parts)
        assert len({v.shape[1] for v, _ in parts}) > 1  # the mini-batches' own lengths differ: padding is exercised
        pad = longest - np.array([v.shape[1] for v, _ in parts])
        vectors = torch.cat([torch.nn.functional.pad(v, (0, 0, 0, int(n))) for (v, _), n in zip(parts, pad)])
        keep = torch.cat([torch.nn.functional.pad(k, (0, int(n))) for (_, k), n in zip(parts, pad)])
        return vectors, keep

    def run(cached: bool):
        model = LateEncoder.load(tiny_bert_dir)
        model.train(dropout)
        torch.manual_seed(0)
        if cached:
            return model, CachedMaxSimLoss(model, inner(), mini_batch_size=3)(queries, documents, *extra)
        q, q_keep = in_chunks(model, queries, "query")
        d, d_keep = in_chunks(model, documents, "document")
        return model, inner()(q, q_keep, d, d_keep, *extra)

    assert_same_step(run)
    model = LateEncoder.load(tiny_bert_dir)
    objective = OBJECTIVES["maxsim_margin_mse" if distil else "maxsim"]
    assert isinstance(objective.build(model, 0, TrainConfig(mini_batch_size=3)), CachedMaxSimLoss)
    assert isinstance(objective.build(model, 0, TrainConfig()), type(inner()))
