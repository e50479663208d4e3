"""The cross-encoder: reads a query and a document together and scores the pair (higher is better).

A Hugging Face sequence-classification model with one output, on the models' common base
(:class:`~twostage.models.base.HFModel`: loading, precision, OpenVINO, saving). Pairs are truncated longest side
first: a normal query is never cut and the document gets the rest; a query longer than the budget is cut too. Saved
models are Hugging Face directories (with sentence-transformers' CrossEncoder marker in config.json), so
``sentence_transformers.CrossEncoder(path)`` loads them and gives the same scores.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch

from twostage.indexer.errors import ConfigError, DataError, UntrainedHeadError
from twostage.indexer.work import checkpoint
from twostage.models.base import (
    HFModel,
    arrays,
    cap_max_length,
    check_texts,
    cut_pairs,
    pair_lengths,
)
from twostage.models.model_meta import read_model_meta, write_model_meta
from twostage.models.runtime import sample_texts, spread

logger = logging.getLogger(__name__)


class CrossEncoder(HFModel):
    """Scores (query, document) pairs. ``load`` any HF cross-encoder or a base model (new head).

    >>> ce = CrossEncoder.load("models/reranker")
    >>> ce.score("why do cats purr", ["Cats purr when content.", "Rain forms..."])
    array([ 0.93,  0.02], dtype=float32)
    """

    def __init__(self, model: Any, tokenizer: Any, *, max_length: int = 512, head_trained: bool = True,
                 name: str = "") -> None:
        super().__init__(model, tokenizer, name)
        self.max_length = max_length
        self.head_trained = head_trained

    @classmethod
    def load(cls, name_or_path: str | Path, *, max_length: int | None = None, allow_untrained_head: bool = False,
             precision: str = "fp32", calibration: Sequence[tuple[str, str]] | None = None,
             device: str | None = None, trust_remote_code: bool = False) -> CrossEncoder:
        """Load a cross-encoder. A base model gets a new one-output head; scoring with it is refused unless
        ``allow_untrained_head`` (training sets it to trained). ``calibration``: (query, document) pairs from the
        user's corpus that ``openvino-int8`` measures its scales on when it has no export of these weights yet
        (default: pairs made from the bundled sample). ``device``: a torch device (``cuda``) to run on.
        ``trust_remote_code`` runs Python code shipped with the model (only for a model you trust; off by default)."""
        from transformers import AutoModelForSequenceClassification

        path = cls.model_dir(name_or_path)
        model, tokenizer, info = cls.read_pretrained(path, AutoModelForSequenceClassification, trust_remote_code,
                                                     num_labels=1, ignore_mismatched_sizes=True)
        body_mismatch = [m[0] for m in info.get("mismatched_keys", ())
                         if not m[0].startswith(("classifier", "score", "pre_classifier"))]
        if body_mismatch:
            raise ConfigError(f"{path}: weights do not fit the model's config ({', '.join(body_mismatch[:3])}); "
                              "the config.json and model.safetensors come from different models")
        head_new = any(k.startswith(("classifier", "score", "pre_classifier")) for k in
                       set(info.get("missing_keys", ())) | {m[0] for m in info.get("mismatched_keys", ())})
        meta = _read_meta(path)
        head_trained = not head_new and meta.get("head_trained", True)
        limit = max_length or meta.get("max_length") or min(512, int(getattr(tokenizer, "model_max_length", 512)
                                                                      or 512))
        ce = cls(model, tokenizer, max_length=cap_max_length(model, int(limit)), head_trained=bool(head_trained),
                 name=str(name_or_path))
        ce.allow_untrained_head = allow_untrained_head
        ce.placed(path, device)
        return ce.with_precision(precision, calibration=calibration)

    def trace_example(self) -> dict[str, torch.Tensor]:
        return self.tokenize(["a query"], ["an example document to trace"])

    def calibration_batches(self, calibration: Sequence[tuple[str, str]] | None) -> list[dict[str, np.ndarray]]:
        pairs = spread(list(calibration or [])) or calibration_pairs(sample_texts())
        return [dict(self.features([q for q, _ in pairs[i:i + 16]], [d for _, d in pairs[i:i + 16]], "np"))
                for i in range(0, len(pairs), 16)]

    allow_untrained_head = False

    def features(self, queries: Sequence[str], documents: Sequence[str], tensors: str = "pt") -> Any:
        """Pairs as model inputs (``tensors``: "pt" or "np"), cut to ``max_length``: the longer side loses tokens
        first, so a short query is never cut and the document gets the rest, while a query longer than the whole
        budget (a pasted paragraph) is cut too instead of failing (``only_second`` cannot cut the query side).
        Long sides are first cut where that is exact (:func:`~twostage.models.base.cut_pairs`)."""
        queries, documents = cut_pairs(self.tokenizer, queries, documents, self.max_length)
        return arrays(self.tokenizer(queries, documents, padding=True, truncation="longest_first",
                                     max_length=self.max_length), tensors)

    def pair_tokens(self, queries: Sequence[str], documents: Sequence[str]) -> list[int]:
        """The tokens each (query, document) pair is read as, after truncation (what :meth:`features` keeps),
        counted without tokenising long texts whole (:func:`~twostage.models.base.pair_lengths`)."""
        return pair_lengths(self.tokenizer, queries, documents, self.max_length)

    def long_queries(self, queries: Sequence[str]) -> int:
        """How many ``queries`` take more than half of the pair's token budget: against a document at least as long,
        both sides are cut (longest first, :meth:`features`), so such a query is read only in part."""
        budget = self.max_length - self.tokenizer.num_special_tokens_to_add(pair=True)
        if not queries:
            return 0
        ids = self.tokenizer(list(queries), add_special_tokens=False, verbose=False)["input_ids"]
        return sum(1 for row in ids if len(row) > budget // 2)

    def tokenize(self, queries: Sequence[str], documents: Sequence[str]) -> dict[str, torch.Tensor]:
        """:meth:`features` as torch tensors on the model's device."""
        return {k: v.to(self.device) for k, v in self.features(queries, documents).items()}

    def forward(self, features: dict[str, torch.Tensor]) -> torch.Tensor:
        """Raw logits, one per pair (training uses these)."""
        return self.model(**features).logits[:, 0]

    def predict(self, pairs: Sequence[tuple[str, str]], *, batch_size: int = 32, activation: str | None = "sigmoid",
                show_progress: bool = False) -> np.ndarray:
        """Scores of (query, document) pairs, float32, in input order (batches sorted by length)."""
        from tqdm.auto import tqdm

        if not self.head_trained and not self.allow_untrained_head:
            raise UntrainedHeadError(f"{self.name}: the classification head is randomly initialised; train it "
                                     "(twostage train-reranker) or load with allow_untrained_head=True")
        if activation not in (None, "sigmoid"):
            raise ConfigError(f"activation must be 'sigmoid' or None (raw logits), got {activation!r}")
        if not pairs:
            raise DataError("no (query, document) pairs to score: the candidate list is empty")
        queries = check_texts([q for q, _ in pairs], "query")
        docs = check_texts([d for _, d in pairs], "document", allow_empty=True)
        order = np.argsort([-(len(q) + len(d)) for q, d in zip(queries, docs)], kind="stable")
        out = np.empty(len(pairs), dtype=np.float32)
        slices = [order[start:start + batch_size] for start in range(0, len(pairs), batch_size)]
        if self.runtime is not None:  # OpenVINO
            for idx in tqdm(slices, desc="rerank", unit="batch", disable=not show_progress):
                checkpoint()
                raw = self.runtime(self.features([queries[i] for i in idx], [docs[i] for i in idx], "np")).reshape(-1)
                out[idx] = 1.0 / (1.0 + np.exp(-raw)) if activation == "sigmoid" else raw
            return out
        with torch.inference_mode():
            for idx in tqdm(slices, desc="rerank", unit="batch", disable=not show_progress):
                checkpoint()
                logits = self.forward(self.tokenize([queries[i] for i in idx], [docs[i] for i in idx])).float()
                out[idx] = (torch.sigmoid(logits) if activation == "sigmoid" else logits).cpu().numpy()
        return out

    def score(self, query: str, documents: Sequence[str], **kw: Any) -> np.ndarray:
        return self.predict([(query, d) for d in documents], **kw)

    def save(self, path: str | Path, training: dict[str, Any] | None = None) -> Path:
        """Write a Hugging Face directory that sentence-transformers' CrossEncoder also reads, atomically."""
        self.model.config.sentence_transformers = {"activation_fn": "torch.nn.modules.activation.Sigmoid"}
        with self.saving(path) as tmp:
            settings = {"max_length": self.max_length, "head_trained": self.head_trained}
            write_model_meta(tmp, "cross-encoder", self.name, settings, training)
        return Path(path)


def calibration_pairs(texts: Sequence[str]) -> list[tuple[str, str]]:
    """(query, document) pairs made from documents alone, for int8 calibration: each document's first words as the
    query, paired with the document and with its neighbour (a related and an unrelated pair)."""
    texts = [t for t in texts if t.strip()]
    pairs = []
    for i, text in enumerate(texts):
        query = " ".join(text.split()[:10])
        pairs += [(query, text), (query, texts[(i + 1) % len(texts)])]
    return spread(pairs)


def _read_meta(path: Path) -> dict[str, Any]:
    """The settings a cross-encoder directory records; none for a bi-encoder given as a base to train from."""
    meta = read_model_meta(path)
    return meta[1] if meta is not None and meta[0] == "cross-encoder" else {}
