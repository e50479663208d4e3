"""What one HTTP request may make the server do, bounded before any of the work starts.

Limits on a body's shape (texts a request, characters a text) are not enough: a rerank call within every one of
them (a long query against a thousand long documents) can still ask the cross-encoder for minutes of work. A
:class:`Budgets` bounds the work itself: the tokens the models read for one embeddings or rerank request (each text
or pair counted after truncation, the way the model will read it), the pairs of one rerank call, the texts of one
embeddings call, the pairs the cross-encoder and the candidates MaxSim read for one search request (a batch's
summed over its queries; each pair is read truncated to the model's length, so pairs bound its tokens too), and
for writes the rows (passages) a request makes and the characters, metadata fields and metadata bytes of one
document: counted before the work, the way the engine will cut it (a CJK character is a word). A request over
a budget is answered 413 with one line naming the budget and the ``twostage serve`` flag that raises it
(:meth:`Budgets.refuse`); nothing of it has run. Bulk calls within budget are computed a piece at a time behind
every search (:mod:`twostage.app.batching`).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass, fields
from typing import Any

from twostage.indexer.errors import ConfigError


class OverBudget(Exception):
    """A request over one of the server's budgets (answered 413)."""


@dataclass(frozen=True)
class Budgets:
    """The server's per-request budgets (``twostage serve --max-...``; docs/serving.md, "Budgets")."""

    request_tokens: int = 131_072  # tokens the models read for one /v1/embeddings or /v1/rerank request
    rerank_documents: int = 1000  # pairs one rerank call scores
    embedding_texts: int = 2048  # texts one embeddings call encodes
    document_chars: int = 1_000_000  # characters of one written document (title and text)
    metadata_keys: int = 256  # metadata fields of one written document (nested objects' fields counted too)
    metadata_bytes: int = 65_536  # bytes of one written document's metadata as JSON
    write_rows: int = 4096  # rows (passages) one write request makes, all its documents together
    search_pairs: int = 5120  # (query, candidate) pairs the cross-encoder scores for one search request (summed)
    maxsim_candidates: int = 25_600  # candidates MaxSim reads for one search request (summed over a batch)
    piece: int = 8  # texts or pairs of a bulk call computed at a time, between searches

    def __post_init__(self) -> None:
        for f in fields(self):
            value = getattr(self, f.name)
            if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
                raise ConfigError(f"{flag(f.name)} must be a positive whole number, got {value!r}")

    def refuse(self, name: str, asked: int, what: str) -> OverBudget:
        return OverBudget(f"{what}: {asked:,} is over this server's budget of {getattr(self, name):,} "
                          f"({name.replace('_', ' ')}); send less per request, or start the server with "
                          f"{flag(name)} N to raise it")

    def check_count(self, name: str, asked: int, what: str) -> None:
        if asked > getattr(self, name):
            raise self.refuse(name, asked, what)

    def check_search(self, work: Any) -> None:
        """One search request's work (:class:`twostage.engine.search.SearchWork`: a batch's summed over its
        queries) within the pair and MaxSim budgets."""
        per = f" ({work.queries} queries)" if work.queries > 1 else ""
        self.check_count("search_pairs", work.pairs, f"pairs the reranker would score{per}")
        self.check_count("maxsim_candidates", work.maxsim, f"candidates MaxSim would read{per}")

    def check_document(self, doc_id: str, text: str, title: str, metadata: Any) -> None:
        """A written document within the character, metadata-field and metadata-byte budgets."""
        self.check_count("document_chars", len(text) + len(title), f"document {doc_id[:80]!r}: characters")
        self.check_count("metadata_keys", _keys(metadata, self.metadata_keys),
                         f"document {doc_id[:80]!r}: metadata fields")
        size = len(json.dumps(metadata, ensure_ascii=False, default=str).encode("utf-8", "surrogatepass"))
        self.check_count("metadata_bytes", size, f"document {doc_id[:80]!r}: metadata bytes")


HELP = {
    "request_tokens": "tokens the models read for one /v1/embeddings or /v1/rerank request",
    "rerank_documents": "documents one /v1/rerank call scores (at most 1000)",
    "embedding_texts": "texts one /v1/embeddings call encodes (at most 2048)",
    "document_chars": "characters of one written document (title and text)",
    "metadata_keys": "metadata fields of one written document",
    "metadata_bytes": "bytes of one written document's metadata as JSON",
    "write_rows": "rows (passages) one write request makes, its documents together (a CJK character is a word)",
    "search_pairs": "pairs the reranker scores for one search request (a batch: summed over its queries)",
    "maxsim_candidates": "candidates MaxSim reads for one search request (a batch: summed over its queries)",
}  # the budgets a flag sets (``piece`` is the batchers', not a client's)


def flag(name: str) -> str:
    """The ``twostage serve`` flag of a budget."""
    return "--max-" + name.replace("_", "-")


def _keys(value: Any, limit: int, depth: int = 0) -> int:
    """Fields in ``value`` and the objects inside it; counting stops a little past ``limit``."""
    n = 0
    if isinstance(value, dict):
        n += len(value)
        for v in value.values():
            if n > limit or depth > 32:
                break
            n += _keys(v, limit, depth + 1)
    elif isinstance(value, list):
        for v in value:
            if n > limit or depth > 32:
                break
            n += _keys(v, limit, depth + 1)
    return n


def text_tokens(model: Any, texts: Sequence[str], stop_over: int | None = None) -> int:
    """Tokens a bi-encoder reads for ``texts`` (each cut to its ``max_length``), counted without tokenising a long
    text whole (0 for a model without a tokenizer). ``stop_over``: when the texts certainly hold more tokens than
    this (each text of more words than the model reads is read as ``max_length`` tokens), that lower bound is
    returned without tokenising anything."""
    from twostage.models.base import head_words

    tokenizer = getattr(model, "tokenizer", None)
    limit = getattr(model, "max_length", None) or getattr(getattr(model, "config", None), "max_length", None)
    if tokenizer is None or not limit:
        return 0
    heads = head_words(tokenizer, texts, int(limit))
    surely = sum(int(limit) for head, text in zip(heads, texts) if len(head) < len(text))
    if stop_over is not None and surely > stop_over:
        return surely
    ids = tokenizer(heads, truncation=True, max_length=int(limit), verbose=False)["input_ids"]
    return int(sum(len(row) for row in ids))


def pair_tokens(model: Any, query: str, documents: Sequence[str]) -> int:
    """Tokens a cross-encoder reads for ``query`` against each of ``documents`` (0 without a tokenizer)."""
    count = getattr(model, "pair_tokens", None)
    if count is None or getattr(model, "tokenizer", None) is None:
        return 0
    return int(sum(count([query] * len(documents), list(documents))))
