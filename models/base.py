"""What the bi-encoder and the cross-encoder share: a Hugging Face transformer and its tokenizer, loaded from a
directory or a name, checked, placed on a device, run in a precision (torch or OpenVINO) and saved atomically.

:class:`~twostage.retriever.biencoder.BiEncoder` (texts -> vectors) and
:class:`~twostage.reranker.cross_encoder.CrossEncoder` (pairs -> scores) each bring what is theirs: the head
(pooling, or a one-output classifier), how texts become inputs, the example an OpenVINO export is traced with and the
inputs its int8 scales are measured on, and their own files in the saved layout.

The helpers below (tokenizer checks, precision, padded batches) serve both models and their training.

``twostage.json``: what twostage records beside a saved model's weights, one schema for both model types.

    {"format": "twostage.model", "format_version": 1,
     "kind": "bi-encoder" | "cross-encoder" | "late-interaction",
     "base": the model it started from,
     "languages": the languages its base model's card lists (absent when the card says none),
     "settings": how the model runs (the bi-encoder's pooling, normalisation, length and prefixes; the
                 cross-encoder's length and whether its head is trained): never search policy,
     "training": what trained it (recipe, data, history, and for a reranker what dev chose: its blend with each
                 first stage and its score's calibration, which an engine built with it writes into its own
                 manifest; empty for a model never trained here),
     "versions": the libraries that wrote it}

Files written before this schema (``encoder`` or top-level settings, no ``format``) are still read.
"""

from __future__ import annotations

import json
import logging
import unicodedata
from abc import ABC, abstractmethod
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import numpy as np
import torch

from twostage.indexer.atomic import atomic_directory
from twostage.indexer.errors import ConfigError, DataError
from twostage.indexer.records import check_encodable
from twostage.models.runtime import OpenVINORunner, is_openvino, openvino_runner
from twostage.models.weights import ModelNotFoundError, resolve_model


class HFModel(torch.nn.Module, ABC):
    """A transformer with its tokenizer; subclasses add the head and the inputs.

    ``precision``: how it runs (``fp32``, ``bf16``, ``int8``, ``openvino-fp32``, ``openvino-int8``); ``runtime``:
    the OpenVINO runner when the precision is an OpenVINO one (inference runs there, the torch model stays fp32);
    ``path``: the directory it was loaded from.
    """

    export_kind = ""  # what sets this model's OpenVINO exports apart from others of the same weights

    def __init__(self, model: Any, tokenizer: Any, name: str = "") -> None:
        super().__init__()
        self.model, self.tokenizer, self.name = model, tokenizer, name
        self.precision = "fp32"
        self.path: Path | None = None
        self.runtime: OpenVINORunner | None = None

    # ---- loading -----------------------------------------------------------------------------------------------
    @staticmethod
    def model_dir(name_or_path: str | Path) -> Path:
        """The directory of a model given by path or name (:func:`~twostage.models.weights.resolve_model`), after
        checking it holds safetensors weights (never pickle) and a tokenizer."""
        path = resolve_model(name_or_path)
        if not list(path.glob("*.safetensors")):
            if list(path.glob("*.bin")):
                raise ModelNotFoundError(f"{path}: only pickle-based .bin weights; twostage loads safetensors only "
                                         "(convert with transformers' save_pretrained(safe_serialization=True))")
            raise ModelNotFoundError(f"{path}: no model weights (model.safetensors)")
        require_tokenizer_files(path)
        return path

    @staticmethod
    def read_pretrained(path: Path, auto_class: Any, trust_remote_code: bool, **kwargs: Any) -> tuple[Any, Any, Any]:
        """(model, tokenizer, loading info) from ``path`` by ``auto_class`` (transformers' ``AutoModel...``), the
        tokenizer checked against the model (a tokenizer of another model is one ConfigError)."""
        from transformers import AutoTokenizer

        tokenizer = AutoTokenizer.from_pretrained(path, trust_remote_code=trust_remote_code)
        with unreadable_weights(path):
            model, info = auto_class.from_pretrained(path, trust_remote_code=trust_remote_code, use_safetensors=True,
                                                     output_loading_info=True, **kwargs)
        check_tokenizer(model, tokenizer, path)
        return model, tokenizer, info

    def placed(self, path: Path, device: str | None) -> HFModel:
        """This model, loaded from ``path``, on ``device`` (a torch device; None: where it is), in eval mode."""
        self.path = path
        if device:
            self.to(device)
        self.eval()
        return self

    @property
    def device(self) -> torch.device:
        return next(self.model.parameters()).device

    # ---- precision ---------------------------------------------------------------------------------------------
    def with_precision(self, precision: str, *, calibration: Sequence[Any] | None = None) -> Any:
        """Run in ``precision``: ``fp32``; ``bf16`` (weights in bfloat16); ``int8`` (dynamic int8 Linear layers, CPU
        only, a copy); ``openvino-fp32`` / ``openvino-int8`` (the OpenVINO runtime, :mod:`twostage.models.runtime`;
        int8 scales measured on ``calibration``, texts or pairs of the user's corpus, default the bundled sample)."""
        self.model = with_precision(self.model, precision)
        self.runtime = openvino_runner(self, self.trace_example(), self.path, precision,
                                       lambda: self.calibration_batches(calibration), kind=self.export_kind) \
            if is_openvino(precision) else None
        self.precision = precision
        return self

    @abstractmethod
    def trace_example(self) -> dict[str, torch.Tensor]:
        """The inputs an OpenVINO export is traced with."""

    @abstractmethod
    def calibration_batches(self, calibration: Sequence[Any] | None) -> list[dict[str, np.ndarray]]:
        """The input batches ``openvino-int8`` measures its scales on (``calibration``, else the bundled sample)."""

    # ---- saving ------------------------------------------------------------------------------------------------
    @contextmanager
    def saving(self, path: str | Path) -> Iterator[Path]:
        """A directory written atomically at ``path``, holding the weights (safetensors) and the tokenizer; the
        subclass adds its own files inside the ``with`` block. Only an fp32 model (or one run by OpenVINO, which keeps
        its fp32 torch model) is saved."""
        if self.precision != "fp32" and not is_openvino(self.precision):
            raise ConfigError(f"save an fp32 model; this one runs in {self.precision} (load it again in fp32)")
        with atomic_directory(Path(path)) as tmp:
            self.model.save_pretrained(tmp, safe_serialization=True)
            self.tokenizer.save_pretrained(tmp)
            yield tmp


logger = logging.getLogger(__name__)
PRECISIONS = ("fp32", "bf16", "int8", "openvino-fp32", "openvino-int8")


@contextmanager
def evaluating(module: torch.nn.Module) -> Iterator[None]:
    """Inference mode with ``module`` and every submodule in eval mode, each put back as it was after. Only the
    modules in training mode are switched: ``Module.eval()`` and ``train()`` set every submodule, about 1 ms each for
    a MiniLM, and an encoder serving one query at a time paid both on every query."""
    training = [m for m in module.modules() if m.training]
    for m in training:
        m.training = False
    try:
        with torch.inference_mode():
            yield
    finally:
        for m in training:
            m.training = True


def check_texts(texts: Sequence[str], kind: str, allow_empty: bool = False) -> list[str]:
    """Texts as a list; None, non-strings and (unless allowed) blank strings are errors naming the item."""
    if isinstance(texts, str) or not isinstance(texts, Sequence):
        raise DataError(f"expected a list of {kind} texts, got {type(texts).__name__}")
    for i, t in enumerate(texts):
        if not isinstance(t, str):
            raise DataError(f"{kind} text #{i} is {type(t).__name__}, not a string")
        if not allow_empty and not t.strip():
            raise DataError(f"{kind} text #{i} is empty; give it some words")
        check_encodable(t, f"{kind} text #{i}")
    return list(texts)



def cap_max_length(model: Any, max_length: int) -> int:
    """``max_length``, lowered to the model's position embeddings when it has fewer (longer inputs crash)."""
    positions = getattr(model.config, "max_position_embeddings", None)
    if positions and max_length > positions:
        logger.info("max_length %d capped at the model's %d positions", max_length, positions)
        return int(positions)
    return max_length


@contextmanager
def unreadable_weights(path: Any) -> Iterator[None]:
    """A truncated or damaged ``model.safetensors`` (or a config that does not fit it) becomes one clear error."""
    try:
        yield
    except (OSError, ValueError, RuntimeError) as exc:
        if isinstance(exc, ConfigError | ModelNotFoundError):
            raise
        first = str(exc).strip().splitlines()[0][:200] if str(exc).strip() else type(exc).__name__
        raise ModelNotFoundError(f"{path}: the model weights cannot be read ({first}); the files are damaged or "
                                 "incomplete: restore or re-download the model") from None
    except Exception as exc:  # safetensors raises its own error type for a broken header
        if type(exc).__name__ != "SafetensorError":
            raise
        raise ModelNotFoundError(f"{path}: model.safetensors is damaged ({str(exc)[:200]}); restore or re-download "
                                 "the model") from None


TOKENIZER_FILES = ("tokenizer.json", "vocab.txt", "tokenizer.model", "vocab.json")


def require_tokenizer_files(path: Any) -> None:
    """A model directory must hold its tokenizer (we never fetch one from elsewhere)."""
    if not any((path / f).is_file() for f in TOKENIZER_FILES):
        raise ModelNotFoundError(f"{path}: no tokenizer files (tokenizer.json or vocab.txt)")


def check_tokenizer(model: Any, tokenizer: Any, where: Any) -> None:
    """Refuse a tokenizer whose ids run past the model's embeddings (another model's tokenizer): it would fail
    deep inside torch with an index error, or on some builds read garbage."""
    vocab = getattr(model.config, "vocab_size", None)
    if vocab and len(tokenizer) > vocab:
        raise ConfigError(f"{where}: the tokenizer has {len(tokenizer)} tokens but the model's embeddings hold "
                          f"{vocab}: the tokenizer belongs to another model; save the model with its own tokenizer")


# Unicode categories a BERT normaliser may delete (control and format characters, combining marks under accent
# stripping) or that Python splits words on but BERT does not (line and paragraph separators), and code points
# whose handling is not worth guessing (surrogates, private use, unassigned).
_DELETABLE = frozenset({"Cc", "Cf", "Mn", "Me", "Zl", "Zp", "Cs", "Co", "Cn"})


def _has_deletable(text: str) -> bool:
    return any(unicodedata.category(c) in _DELETABLE for c in set(text) - {"\t", "\n", "\r"})


def head_words(tokenizer: Any, texts: Sequence[str], words: int | Sequence[int]) -> list[str]:
    """``texts`` with each one cut after its first ``words`` words (one count for all, or one per text) where that
    is exact, so that long documents are not tokenised in full only to be truncated.

    Every whitespace-separated word gives at least one token, so a text cut after ``n`` words still has at least
    ``n`` tokens, the first ones unchanged: a single text truncated to ``max_length`` tokens is unchanged with
    ``words=max_length`` (pairs: :func:`cut_pairs`). Applied only where that premise holds: BERT-style tokenisers
    (BERT pre-tokeniser, BERT or no normaliser), and heads free of characters such a normaliser may delete
    (``_DELETABLE``); any other text, or any text for another tokeniser, is passed through whole."""
    texts = list(texts)
    backend = getattr(tokenizer, "_tokenizer", None)
    if backend is None or type(backend.pre_tokenizer).__name__ != "BertPreTokenizer" \
            or type(backend.normalizer).__name__ not in ("BertNormalizer", "NoneType"):
        return texts
    counts = [words] * len(texts) if isinstance(words, int) else list(words)
    out = []
    for text, n in zip(texts, counts, strict=True):
        parts = text.split(maxsplit=n)
        if len(parts) > n:
            head = text[:len(text) - len(parts[-1])]
            if not _has_deletable(head):
                text = head
        out.append(text)
    return out


def head_tokens(tokenizer: Any, texts: Sequence[str], n: Sequence[int], over: int = 0) -> list[str]:
    """``texts`` with each one longer than ``over`` characters cut after its ``n[i]``-th token (a fast tokenizer's
    offsets), the others as they are. For a WordPiece tokenizer (BERT, MiniLM) the cut text tokenises to the same
    first ``n[i]`` tokens (greedy longest match from the left; an unknown word is one token spanning it whole).
    This is how text without spaces (Chinese, Japanese, a hostile run of one character) is cut, which
    :func:`head_words` cannot do."""
    texts = list(texts)
    long = [i for i, t in enumerate(texts) if len(t) > over and n[i] >= 0]
    if not long or not getattr(tokenizer, "is_fast", False):
        return texts
    enc = tokenizer([texts[i] for i in long], add_special_tokens=False, truncation=True,
                    max_length=max(n[i] for i in long) + 1, return_offsets_mapping=True, verbose=False)
    for i, offsets in zip(long, enc["offset_mapping"]):
        if len(offsets) > n[i]:
            texts[i] = texts[i][:int(offsets[n[i] - 1][1])] if n[i] > 0 else ""
    return texts


def cut_pairs(tokenizer: Any, queries: Sequence[str], documents: Sequence[str],
              max_length: int) -> tuple[list[str], list[str]]:
    """(query, document) pairs with both sides cut where truncating the pair ``longest_first`` to ``max_length``
    then keeps the same tokens, so that no pair is tokenised far past what the model reads. (The tokenizer
    truncates a pair whose two sides are both far over the budget with memory and time that grow with the product
    of their lengths: 2,000 tokens a side at 128, 58 MB and 0.24 s a pair.)

    With ``q`` query tokens and ``b`` tokens of budget (``max_length`` less the special tokens), a query within the
    budget decides the split alone once the document has at least ``max(q, b - q)`` tokens: the document is then
    the longer side (or as long) and keeps at most that many. So each document is cut after that many words
    (:func:`head_words`; SciFact abstracts at 128 tokens: rerank tokenisation 1.4x faster), and one still over
    ``8 b`` characters (text without spaces) after that many tokens; such queries are not cut. A query over it (``q > b``)
    decides nothing but which side is the longer: longest-first truncation then keeps half the budget a side, the
    odd token going to the longer one (or to the document on a tie). So the query is cut to ``b + 1`` tokens and
    each document to ``b + 1`` tokens when it is at least as long as the query, else to at most ``b``: the same
    split, from pairs of at most ``2 b + 2`` tokens."""
    queries, documents = list(queries), list(documents)
    budget = max_length - tokenizer.num_special_tokens_to_add(pair=True)
    unique = list(dict.fromkeys(queries))
    q_len = dict(zip(unique, map(len, tokenizer(unique, add_special_tokens=False, verbose=False)["input_ids"])))
    normal = [i for i, q in enumerate(queries) if q_len[q] <= budget]
    long_q = [i for i, q in enumerate(queries) if q_len[q] > budget]
    n = [-1] * len(documents)
    if normal:
        heads = head_words(tokenizer, [documents[i] for i in normal],
                           [max(q_len[queries[i]], budget - q_len[queries[i]]) for i in normal])
        for i, text in zip(normal, heads):
            documents[i] = text
            n[i] = max(q_len[queries[i]], budget - q_len[queries[i]]) if len(text) > 8 * budget else -1
    if long_q:
        # each document's length against its query's: one cut to q + 1 words has more tokens than the query
        # (every word a token at least), any other is counted, as far as its query's length
        originals = [documents[i] for i in long_q]
        heads = head_words(tokenizer, originals, [q_len[queries[i]] + 1 for i in long_q])
        longer = [h != o for h, o in zip(heads, originals)]
        count = [k for k, more in enumerate(longer) if not more]
        lengths = dict(zip(count, map(len, tokenizer([heads[k] for k in count], add_special_tokens=False,
                                                     truncation=True, max_length=max(q_len[queries[long_q[k]]]
                                                                                     for k in count) + 1,
                                                     verbose=False)["input_ids"]))) if count else {}
        heads = [head_words(tokenizer, [h], budget + 1)[0] if more else h for h, more in zip(heads, longer)]
        for k, (i, text) in enumerate(zip(long_q, heads)):
            documents[i] = text
            n[i] = budget + 1 if longer[k] or lengths[k] >= q_len[queries[i]] else min(lengths[k], budget)
        cut = dict(zip([q for q in unique if q_len[q] > budget],
                       head_tokens(tokenizer, [q for q in unique if q_len[q] > budget],
                                   [budget + 1] * sum(q_len[q] > budget for q in unique))))
        queries = [cut.get(q, q) for q in queries]
    return queries, head_tokens(tokenizer, documents, n)


def pair_lengths(tokenizer: Any, queries: Sequence[str], documents: Sequence[str], max_length: int) -> list[int]:
    """The tokens each pair is read as after ``longest_first`` truncation to ``max_length``, counted from each
    side alone (``min(q + d, b)`` plus the special tokens), never by tokenising long pairs."""
    queries, documents = cut_pairs(tokenizer, queries, documents, max_length)
    special = tokenizer.num_special_tokens_to_add(pair=True)
    budget = max_length - special
    unique = list(dict.fromkeys(queries))
    q = dict(zip(unique, map(len, tokenizer(unique, add_special_tokens=False, truncation=True, max_length=budget,
                                            verbose=False)["input_ids"])))
    d = tokenizer(list(documents), add_special_tokens=False, truncation=True, max_length=budget,
                  verbose=False)["input_ids"]
    return [min(q[a] + len(b), budget) + special for a, b in zip(queries, d)]


def tokenize_once(tokenizer: Any, texts: Sequence[str], max_length: int) -> tuple[dict[str, list[list[int]]], int]:
    """Each text tokenised once, truncated to ``max_length`` tokens and not padded (batches are padded by
    :func:`padded`), and how many texts were longer than that.

    Tokenising at ``max_length + 1`` tells the long texts apart; their last content token is then dropped, which is
    what truncating at ``max_length`` keeps (the special tokens are fixed, the content a prefix). Tokenising twice
    (once for the lengths, once per batch) held an H100 encode at 0.70x sentence-transformers' speed
    (benchmarks/results/gpu.md)."""
    enc = tokenizer(list(texts), truncation=True, max_length=max_length + 1, return_special_tokens_mask=True,
                    verbose=False)
    special = enc.pop("special_tokens_mask")
    rows = {k: list(v) for k, v in enc.items()}
    long = 0
    for i, ids in enumerate(rows["input_ids"]):
        if len(ids) > max_length:
            long += 1
            cut = max(j for j, flag in enumerate(special[i]) if not flag)
            for values in rows.values():
                values[i] = values[i][:cut] + values[i][cut + 1:]
    return rows, long


def padded(tokenizer: Any, rows: dict[str, list[list[int]]], idx: Sequence[int], tensors: str) -> dict[str, Any]:
    """Rows ``idx`` of :func:`tokenize_once`'s output as one padded batch (see :func:`arrays`)."""
    return arrays(tokenizer.pad({k: [v[i] for i in idx] for k, v in rows.items()}, padding=True), tensors)


def arrays(batch: Any, tensors: str) -> dict[str, Any]:
    """A tokenizer's padded lists as int64 arrays (``tensors``: "np" or "pt"). Faster than the tokenizer's own
    ``return_tensors``, which walks every token in Python to check for emptiness (transformers 5)."""
    if tensors not in ("np", "pt"):
        raise ConfigError(f"tensors must be 'np' or 'pt', got {tensors!r}")
    out = {k: np.asarray(v, dtype=np.int64) for k, v in batch.items()}
    return {k: torch.from_numpy(v) for k, v in out.items()} if tensors == "pt" else out


def with_precision(model: Any, precision: str) -> Any:
    """The torch model for inference in ``fp32``; ``bf16`` (weights cast in place); ``int8`` (dynamic int8 Linear
    layers, CPU only, a new module). The OpenVINO precisions keep the fp32 torch model (the runtime, in
    :mod:`twostage.models.runtime`, is exported from it)."""
    if precision not in PRECISIONS:
        raise ConfigError(f"unknown precision {precision!r}; use one of {', '.join(PRECISIONS)}")
    if precision == "bf16":
        return model.to(torch.bfloat16)
    if precision == "int8":
        return torch.ao.quantization.quantize_dynamic(model, {torch.nn.Linear}, dtype=torch.qint8)
    return model
