"""The passage a hit shows: the part of its document that scored best, with the query's terms marked.

A passage engine knows which passage scored best (the one the reranker read, or the first stage's best); a
whole-document engine shows the window of :data:`WINDOW` words that holds the most distinct query terms. Term
spans come from the engine's BM25 analyzer, so a stemmed match is marked too.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from twostage.indexer.passages import PassageShape, join, split
from twostage.indexer.records import Document, Passage

WINDOW = PassageShape(60, 30, title_in_front=False)  # what a whole-document hit shows


def hit_passage(query: str, doc: Document, passages: Sequence[Document], starts: Sequence[int], best: int | None,
                analyzer: Any) -> Passage:
    """The passage to show for ``doc``: passage number ``best`` of ``passages`` (which start at ``starts`` in its
    text), or with ``best`` None the densest window of query terms; whitespace around it trimmed."""
    if best is not None and 0 <= best < len(passages):
        start = starts[best]
        return _passage(query, doc.text, start, start + len(passages[best].text), analyzer)
    windows = split(Document(doc.id, doc.text), WINDOW)
    if len(windows) == 1:
        return _passage(query, doc.text, 0, len(doc.text), analyzer)
    _, at = join(windows, WINDOW)
    spans = analyzer.term_spans(doc.text, query)

    def distinct(i: int) -> int:
        lo, hi = at[i], at[i] + len(windows[i].text)
        return len({doc.text[s:e].lower() for s, e in spans if lo <= s and e <= hi})

    i = max(range(len(windows)), key=lambda j: (distinct(j), -j))
    return _passage(query, doc.text, at[i], at[i] + len(windows[i].text), analyzer)


def _passage(query: str, text: str, start: int, end: int, analyzer: Any) -> Passage:
    piece = text[start:end]
    lead = len(piece) - len(piece.lstrip())
    piece = piece.strip()
    start += lead
    spans = tuple(analyzer.term_spans(piece, query))
    return Passage(piece, start, start + len(piece), spans)
