import json
import shutil

import numpy as np
import pytest

from twostage.indexer.errors import ConfigError, DataError
from twostage.models.weights import ModelNotFoundError, resolve_model
from twostage.retriever.biencoder import BiEncoder

TEXTS = ["why do cats purr", "a dog pants to cool down on hot days", "rain", "snowflakes are ice crystals with six arms"]


@pytest.fixture(scope="module")
def enc(tiny_bert_dir):
    return BiEncoder.load(tiny_bert_dir)


def test_encode_shape_norm_and_order(enc):
    e = enc.encode(TEXTS)
    assert e.shape == (4, 32) and e.dtype == np.float32
    np.testing.assert_allclose(np.linalg.norm(e, axis=1), 1, atol=1e-5)
    one_by_one = np.vstack([enc.encode([t]) for t in TEXTS])  # length-sorted batches keep input order
    np.testing.assert_allclose(e, one_by_one, atol=1e-5)


def test_pooling_modes_differ(tiny_bert_dir):
    out = {m: BiEncoder.load(tiny_bert_dir, pooling=m, normalize=False).encode(TEXTS[:2]) for m in ("mean", "cls", "max")}
    assert not np.allclose(out["mean"], out["cls"]) and not np.allclose(out["mean"], out["max"])
    with pytest.raises(ConfigError, match="unknown pooling"):
        BiEncoder.load(tiny_bert_dir, pooling="sum")


def test_truncation_is_counted(tiny_bert_dir):
    enc = BiEncoder.load(tiny_bert_dir, max_length=16)
    enc.encode(["cats " * 100, "short one"])
    assert enc.truncated == 1


def test_prefixes(tiny_bert_dir):
    enc = BiEncoder.load(tiny_bert_dir, query_prefix="query: ", document_prefix="passage: ")
    assert not np.allclose(enc.encode(["rain"], kind="query"), enc.encode(["rain"], kind="document"))
    with pytest.raises(ConfigError, match="kind"):
        enc.encode(["rain"], kind="passage")


@pytest.mark.parametrize("texts,message", [(["ok", None], "#1 is NoneType"), (["ok", 3], "#1 is int"),
                                           (["ok", "  "], "#1 is empty"), ("just a string", "expected a list")])
def test_bad_texts_name_the_item(enc, texts, message):
    with pytest.raises(DataError, match=message):
        enc.encode(texts)


def test_empty_documents_allowed_when_asked(enc):
    assert enc.encode(["", "rain"], allow_empty=True).shape == (2, 32)
    assert enc.encode([]).shape == (0, 32)
    with pytest.raises(ConfigError):
        enc.encode(["x"], batch_size=0)


def test_save_layout_and_round_trip(tmp_path, enc):
    enc.save(tmp_path / "m")
    names = {p.relative_to(tmp_path / "m").as_posix() for p in (tmp_path / "m").rglob("*") if p.is_file()}
    assert {"config.json", "model.safetensors", "modules.json", "1_Pooling/config.json", "twostage.json",
            "sentence_bert_config.json", "config_sentence_transformers.json"} <= names
    assert not any(n.endswith((".bin", ".pt", ".pkl")) for n in names)
    again = BiEncoder.load(tmp_path / "m")
    assert again.config == enc.config
    np.testing.assert_allclose(again.encode(TEXTS), enc.encode(TEXTS), atol=1e-6)


def test_sentence_transformers_reads_ours_and_we_read_theirs(tmp_path, tiny_bert_dir):
    st = pytest.importorskip("sentence_transformers")
    ours = BiEncoder.load(tiny_bert_dir, pooling="max", max_length=64, query_prefix="q: ")
    ours.save(tmp_path / "ours")
    theirs = st.SentenceTransformer(str(tmp_path / "ours"), device="cpu")
    np.testing.assert_allclose(theirs.encode(TEXTS), ours.encode(TEXTS), atol=1e-5)
    assert theirs.max_seq_length == 64
    np.testing.assert_allclose(theirs.encode_query(TEXTS[:1]), ours.encode(TEXTS[:1], kind="query"), atol=1e-5)
    theirs.save(str(tmp_path / "theirs"))  # the layout of the installed sentence-transformers version
    back = BiEncoder.load(tmp_path / "theirs")
    assert (back.config.pooling, back.config.normalize, back.config.max_length) == ("max", True, 64)
    np.testing.assert_allclose(back.encode(TEXTS), ours.encode(TEXTS), atol=1e-5)


@pytest.mark.parametrize("precision", ["bf16", "int8"])
def test_reduced_precision_stays_close(tiny_bert_dir, precision):
    ref = BiEncoder.load(tiny_bert_dir).encode(TEXTS)
    low = BiEncoder.load(tiny_bert_dir, precision=precision)
    got = low.encode(TEXTS)
    assert np.all((ref * got).sum(1) > 0.98)
    with pytest.raises(ConfigError, match="fp32"):
        low.save("/nonexistent/never-written")


def test_directories_without_weights_or_tokenizer(tmp_path, tiny_bert_dir):
    no_weights = tmp_path / "no-weights"
    shutil.copytree(tiny_bert_dir, no_weights)
    (no_weights / "model.safetensors").unlink()
    with pytest.raises(ModelNotFoundError, match="no model weights"):
        BiEncoder.load(no_weights)
    (no_weights / "pytorch_model.bin").write_bytes(b"pickle")
    with pytest.raises(ModelNotFoundError, match="safetensors only"):
        BiEncoder.load(no_weights)
    no_tok = tmp_path / "no-tokenizer"
    shutil.copytree(tiny_bert_dir, no_tok)
    for f in ("vocab.txt", "tokenizer.json"):
        (no_tok / f).unlink(missing_ok=True)
    with pytest.raises(ModelNotFoundError, match="no tokenizer"):
        BiEncoder.load(no_tok)
    with pytest.raises(ModelNotFoundError, match="no config.json"):
        resolve_model(tmp_path)


def test_unknown_name_offline_is_a_clear_error(monkeypatch, tmp_path):
    monkeypatch.setenv("TWOSTAGE_CACHE", str(tmp_path))
    with pytest.raises(ModelNotFoundError, match="hub cannot be reached.*all-MiniLM-L6-v2"):
        resolve_model("someone/unknown-model")


def test_saved_config_records_training(tmp_path, enc):
    enc.save(tmp_path / "m", training={"epochs": 2})
    meta = json.loads((tmp_path / "m" / "twostage.json").read_text())
    assert meta["training"] == {"epochs": 2} and meta["settings"]["pooling"] == "mean" and meta["format"] == "twostage.model"


@pytest.mark.slow
def test_real_minilm_matches_sentence_transformers():
    st = pytest.importorskip("sentence_transformers")
    path = resolve_model("all-MiniLM-L6-v2")  # cache, else the PyPI wheel (sha256-checked)
    ours = BiEncoder.load("all-MiniLM-L6-v2")
    theirs = st.SentenceTransformer(str(path), device="cpu")
    np.testing.assert_allclose(ours.encode(TEXTS), theirs.encode(TEXTS), atol=1e-5)
    assert ours.dim == 384 and ours.config.max_length == 256


def test_thread_count_is_respected_and_restored(enc, monkeypatch):
    import torch

    seen = []
    real = enc.forward
    monkeypatch.setattr(enc, "forward", lambda f: (seen.append(torch.get_num_threads()), real(f))[1])
    before = torch.get_num_threads()
    enc.encode(TEXTS, threads=1)
    assert seen and set(seen) == {1} and torch.get_num_threads() == before
    with pytest.raises(ConfigError):
        enc.encode(TEXTS, threads=0)


def test_a_cross_encoder_is_refused_as_a_bi_encoder(models, tmp_path):
    import json

    from twostage.indexer.errors import ConfigError
    from twostage.retriever.biencoder import BiEncoder

    retriever, reranker = models
    with pytest.raises(ConfigError, match="not a bi-encoder.*--reranker"):
        BiEncoder.load(reranker)
    saved = BiEncoder.load(retriever).save(tmp_path / "bi")
    assert json.loads((saved / "twostage.json").read_text())["kind"] == "bi-encoder"
    assert BiEncoder.load(saved).dim == BiEncoder.load(retriever).dim


def test_head_words_keep_every_token_truncation_keeps(tiny_bert_dir):
    """Cutting long texts to their head words before tokenising gives the same inputs as tokenising them whole,
    for single texts and for pairs under longest_first (the document cut, queries of any length), with words that tokenise to several pieces, punctuation,
    accents, control and format characters; a tokeniser of another kind is passed through."""
    import random

    from transformers import AutoTokenizer

    from twostage.models.base import cut_pairs, head_words

    tok = AutoTokenizer.from_pretrained(tiny_bert_dir)
    rng = random.Random(0)
    pieces = ["cats", "purr", "xylophonez", "a.b", "(dogs)", "naïve", "e\u0301", "\u0301", "\u200b", "\x00",
              "\x1c", "tab\there", "line\u2028sep", "日本語", "\ufffd", "[SEP]", "--", "z" * 120]
    texts = [" ".join(rng.choice(pieces) for _ in range(rng.randint(1, 60))) for _ in range(300)]
    texts[100:150] = texts[250:] = [" ".join(rng.choices(["cats", "purr"], k=rng.randint(1, 40))) for _ in range(50)]
    cut_any = False
    for max_length in (8, 16, 33):
        heads = head_words(tok, texts, max_length)
        cut_any |= heads != texts
        assert tok(texts, truncation=True, max_length=max_length)["input_ids"] == \
            tok(heads, truncation=True, max_length=max_length)["input_ids"]
        queries, docs = texts[:150], texts[150:]
        cut_queries, cut_docs = cut_pairs(tok, queries, docs, max_length)
        cut_any |= cut_docs != docs
        assert tok(queries, docs, truncation="longest_first", max_length=max_length)["input_ids"] == \
            tok(cut_queries, cut_docs, truncation="longest_first", max_length=max_length)["input_ids"]
    assert cut_any
    plain = ["word " * 50]
    assert head_words(object(), plain, 8) == plain  # not a BERT-style fast tokenizer: never cut


def test_tokenize_once_equals_truncating_each_text(tiny_bert_dir):
    """One tokenisation pass gives exactly the ids, type ids and masks of truncating at max_length, and counts the
    texts that were longer, for BERT's template and for templates with a special token only at the end or only at
    the start."""
    import random

    from tokenizers import Tokenizer, models, pre_tokenizers, processors
    from transformers import AutoTokenizer, PreTrainedTokenizerFast

    from twostage.models.base import padded, tokenize_once

    words = ["cats", "purr", "dogs", "bark", "loud"]
    vocab = {w: i for i, w in enumerate(["<s>", "</s>", "<pad>", "[UNK]", *words])}

    def custom(template: str) -> PreTrainedTokenizerFast:
        raw = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
        raw.pre_tokenizer = pre_tokenizers.Whitespace()
        raw.post_processor = processors.TemplateProcessing(single=template, special_tokens=[("<s>", 0), ("</s>", 1)])
        return PreTrainedTokenizerFast(tokenizer_object=raw, bos_token="<s>", eos_token="</s>", pad_token="<pad>",
                                       unk_token="[UNK]")

    rng = random.Random(1)
    texts = ["", *(" ".join(rng.choices(words + ["zebra"], k=rng.randint(1, 30))) for _ in range(200))]
    for tok in (AutoTokenizer.from_pretrained(tiny_bert_dir), custom("$A </s>"), custom("<s> $A")):
        for max_length in (4, 9, 17):
            rows, long = tokenize_once(tok, texts, max_length)
            want = tok(texts, truncation=True, max_length=max_length)
            assert set(rows) == set(want.keys())
            assert all(rows[k] == want[k] for k in rows), (tok, max_length)
            assert long == sum(len(ids) > max_length for ids in tok(texts, verbose=False)["input_ids"]) > 0
            batch = padded(tok, rows, [3, 0, 7], "np")
            direct = tok([texts[3], texts[0], texts[7]], truncation=True, max_length=max_length, padding=True)
            assert all(batch[k].tolist() == direct[k] for k in batch)


def test_encoding_runs_without_dropout_and_leaves_each_modules_mode_as_it_was(enc):
    """#83: encoding switches only the modules in training mode to eval, and back after, so that serving one query at
    a time does not walk and set every submodule on each query."""
    first = enc.encode(TEXTS[:2])
    enc.train()
    enc.model.embeddings.train(False)  # a mixed state is given back as it was
    assert np.allclose(enc.encode(TEXTS[:2]), first, atol=1e-6)  # no dropout while encoding
    assert enc.training and enc.model.encoder.training and not enc.model.embeddings.training
    enc.eval()
    assert not any(m.training for m in enc.modules())
    enc.encode(TEXTS[:2])
    assert not any(m.training for m in enc.modules())
