"""What an engine's models leave unread: the documents and queries longer than the retriever or the reranker reads.

A bench report lists these counts (:func:`reading_notes`), so nothing is cut without it being said: a whole-document
engine counts the documents the retriever read only the beginning of when they were added; every engine counts
the queries longer than the retriever reads, and those that take more than half of a reranker pair's tokens (cut,
with a long document, to about half each, longest side first).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any


def reading_notes(engine: Any, queries: Sequence[str], *, dense: bool, rerank: bool) -> list[str]:
    """One line for each thing ``engine`` cuts when it answers ``queries`` with its dense stage (``dense``) and its
    reranker (``rerank``)."""
    notes = []
    reading = getattr(engine, "reading", None)
    if reading is not None:
        notes.append(str(reading()["summary"]))
    if dense:
        encoder = engine.encoder
        count = getattr(encoder, "longer_than_read", None)
        if count is not None:
            notes.append(f"{count(queries, 'query')} of {len(queries)} queries are longer than the retriever reads "
                         f"({encoder.config.max_length} tokens): it reads their beginning")
    reranker = engine.reranker if rerank else None
    if reranker is not None and hasattr(reranker, "long_queries"):
        notes.append(f"{reranker.long_queries(queries)} of {len(queries)} queries take more than half of what the "
                     f"reranker reads ({reranker.max_length} tokens a pair): with a document as long, both are cut "
                     "to about half each (longest side first)")
    return notes
