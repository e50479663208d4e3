"""Passages: a long document cut into overlapping windows of words, and put back together.

A passage engine stores each document as consecutive rows of its dense index and BM25, one per passage, with the
ids ``DOC_ID + SEP + n`` (n = 0, 1, ...). Passage ``n`` starts at word ``n * stride`` and holds ``words`` words;
its text is the document's text from the start of its first word to the start of the word after its last (so it
keeps the whitespace after it; the first passage also keeps any whitespace before the first word). Consecutive
passages overlap by ``words - stride`` words, and :func:`join` rebuilds the document's text exactly from them.
A document of at most ``words`` words, or at most ``whole_up_to`` words when that is larger, is one passage, the
whole text: a short document is scored as a whole (BM25's length normalisation and the dense model see all of it).

The title is stored with every passage (and so read by both first stages in front of each passage) when
``title_in_front``; otherwise only with the first.

The passage a hit shows (:func:`hit_passage`): the part of its document that scored best, with the query's terms
marked, grown to the start of the sentence it begins in and the end of the one it ends in (each within
:data:`REACH` characters; else its ends are moved in to the nearest sentence boundary, a sentence's end or a line
break, within its first and last quarter where no marked term is lost). :func:`snippet` cuts a line of about a width around the first term at a sentence start or a word's
start, and at a word's end.

A passage engine knows which passage scored best (the one the reranker read, or the first stage's best); a
whole-document engine shows the window of :data:`WINDOW` words that holds the most distinct query terms. Term
spans come from the engine's BM25 analyzer, so a stemmed match is marked too.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from itertools import islice
from typing import Any

import numpy as np

from twostage.indexer.errors import ConfigError, DataError
from twostage.indexer.records import Document, Passage, RankedList

SEP = "\x1f"  # the ASCII unit separator: between a document's id and its passage number
WORD = re.compile(r"\S+")
# Han and Kana characters (Chinese and Japanese, written without spaces), each one word; between them, words as above
_HAN_KANA = "\u3040-\u30ff\u31f0-\u31ff\u3400-\u4dbf\u4e00-\u9fff\uf900-\ufaff\uff66-\uff9f\U00020000-\U0003134f"
WORD_CJK = re.compile(rf"[{_HAN_KANA}]|(?:(?![{_HAN_KANA}])\S)+")
# a sentence's end: . ! ? (or the ideographic 。！？) and any closing quotes or brackets, then space; or a line break
_SENTENCE_END = re.compile(r"[.!?](?:[\"'\u201d\u2019)\]]*)\s+|[\u3002\uff01\uff1f]\s*|\n\s*")
_CJK_CHAR = re.compile(rf"[{_HAN_KANA}]")


@dataclass(frozen=True)
class PassageShape:
    """How documents are cut: ``words`` per passage (0: whole documents), a new passage every ``stride`` words."""

    words: int
    stride: int
    title_in_front: bool = True
    whole_up_to: int = 0  # a document of at most this many words stays one passage (0: at most ``words``)
    # each Han or Kana character counts as a word (a passage of Chinese is 100 characters, not one endless
    # "word"); False in engines built before languages, which cut at spaces only
    cjk_characters: bool = True

    def __post_init__(self) -> None:
        for name in ("words", "stride", "whole_up_to"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise ConfigError(f"passage_{name} must be an integer >= 0, got {value!r}")
        if self.words and not 0 < self.stride <= self.words:
            raise ConfigError(f"passage_stride must be between 1 and passage_words ({self.words}), got {self.stride}; "
                              "a larger stride would skip words")

    @property
    def enabled(self) -> bool:
        return self.words > 0


def passage_id(doc_id: str, n: int) -> str:
    return f"{doc_id}{SEP}{n}"


def split_id(pid: str) -> tuple[str, int]:
    """The document id and the passage number of a passage id."""
    doc_id, _, n = pid.rpartition(SEP)
    return doc_id, int(n)


def doc_id_of(pid: str) -> str:
    return pid.rpartition(SEP)[0]


def word_starts(text: str, cjk_characters: bool = True) -> list[int]:
    """Where each word of ``text`` starts: runs of non-space characters, and each Han or Kana character on its own
    when ``cjk_characters``."""
    return [m.start() for m in (WORD_CJK if cjk_characters else WORD).finditer(text)]


def split(doc: Document, shape: PassageShape) -> list[Document]:
    """The passages of ``doc`` as Documents (ids ``doc.id + SEP + n``, the document's metadata on each)."""
    if SEP in doc.id:
        raise DataError(f"document id {doc.id!r} contains the character U+001F, which passage ids use; "
                        "remove it from the id")
    starts = word_starts(doc.text, shape.cjk_characters)
    count = passage_count(len(starts), shape)
    out = []
    for n in range(count):
        first = n * shape.stride
        begin = 0 if n == 0 else starts[first]
        after = first + shape.words
        end = starts[after] if after < len(starts) and n < count - 1 else len(doc.text)
        title = doc.title if shape.title_in_front or n == 0 else ""
        out.append(Document(passage_id(doc.id, n), doc.text[begin:end], title, doc.metadata))
    return out


def passage_count(words: int, shape: PassageShape) -> int:
    """How many passages a document of ``words`` words becomes (at least one)."""
    if words <= max(shape.words, shape.whole_up_to):
        return 1
    return 1 + -(-(words - shape.words) // shape.stride)


def rows_of(docs: Iterable[Document], shape: PassageShape) -> int:
    """How many rows (passages, or whole documents when ``shape`` is off) ``docs`` become, counted without cutting
    them (a CJK character is a word here, as :func:`split` reads it)."""
    if not shape.enabled:
        return sum(1 for _ in docs)
    return sum(passage_count(len(word_starts(d.text, shape.cjk_characters)), shape) for d in docs)


def split_all(docs: Iterable[Document], shape: PassageShape) -> list[Document]:
    return [p for d in docs for p in split(d, shape)]


def join(passages: Sequence[Document], shape: PassageShape) -> tuple[Document, list[int]]:
    """The document the passages (all of one document, in order) were cut from, and where each one starts in
    its text."""
    first = passages[0]
    text, starts = first.text, [0]
    for prev, p in zip(passages, passages[1:]):
        word = next(islice((WORD_CJK if shape.cjk_characters else WORD).finditer(prev.text), shape.stride, None), None)
        step = word.start() if word is not None else len(prev.text)  # where its `stride`-th word starts
        start = starts[-1] + step
        starts.append(start)
        text += p.text[len(text) - start:]
    return Document(doc_id_of(first.id), text, first.title, first.metadata), starts


def group_starts(ids: Sequence[str] | np.ndarray) -> np.ndarray:
    """Positions in ``ids`` (passage ids, a document's passages consecutive) where a document's first passage is."""
    import pyarrow as pa
    import pyarrow.compute as pc

    arr = pa.array(ids, pa.string()) if not isinstance(ids, (pa.Array, pa.ChunkedArray)) else ids
    return np.flatnonzero(np.asarray(pc.ends_with(arr, SEP + "0").to_numpy(zero_copy_only=False), dtype=bool))


def best_per_document(ranked: RankedList, n: int) -> RankedList:
    """The first ``n`` documents of a list of passages, each once by its best (first) passage; ids stay passage
    ids."""
    seen: set[str] = set()
    keep: list[int] = []
    for i, pid in enumerate(ranked.ids):
        doc_id = doc_id_of(str(pid))
        if doc_id not in seen:
            seen.add(doc_id)
            keep.append(i)
            if len(keep) == n:
                break
    at = np.array(keep, dtype=np.int64)
    return RankedList(ranked.ids[at], ranked.scores[at])


def by_document(lists: dict[str, list[RankedList]]) -> tuple[dict[str, list[RankedList]],
                                                              list[dict[str, tuple[str, ...]]]]:
    """Each stage's lists of best passages (one per document) as lists of documents, and for each query the
    passages each document is read by: its best passage in every stage, once each, the passage of the stage that
    ranked the document highest first (the one a hit shows)."""
    out: dict[str, list[RankedList]] = {}
    found: list[dict[str, list[tuple[int, str]]]] = []  # each query: document -> (rank, passage) in every stage
    for stage, ranked_lists in lists.items():
        out[stage] = []
        for q, ranked in enumerate(ranked_lists):
            if q == len(found):
                found.append({})
            pids = [str(p) for p in ranked.ids]
            docs = [doc_id_of(p) for p in pids]
            out[stage].append(RankedList(np.array(docs, dtype=object), ranked.scores))
            first_here: set[str] = set()
            for pos, (d, p) in enumerate(zip(docs, pids)):
                if d not in first_here:  # a stage's best passage of each document
                    first_here.add(d)
                    found[q].setdefault(d, []).append((pos, p))
    reads = [{d: tuple(dict.fromkeys(p for _, p in sorted(seen, key=lambda x: x[0])))
              for d, seen in per_query.items()} for per_query in found]
    return out, reads


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
    start, end = sentence_bounds(text, start, end)
    piece = text[start:end]
    spans = analyzer.term_spans(piece, query)
    ends = text[:end].rstrip().endswith(_ENDS) or end >= len(text)
    lo, hi = sentence_trim(piece, spans, head=not _at_sentence_start(text, start), tail=not ends)
    piece = piece[lo:hi]
    lead = len(piece) - len(piece.lstrip())
    piece = piece.strip()
    start += lo + lead
    # the trim cuts at sentence ends and whitespace, outside every span: the spans found above, shifted, are the
    # piece's own (the piece is not analysed again)
    cut = lo + lead
    spans = [(a - cut, b - cut) for a, b in spans if a >= cut and b - cut <= len(piece)]
    return Passage(piece, start, start + len(piece), tuple(spans))


REACH = 200  # characters a shown passage may grow by at either end, to a sentence's start or end


def sentence_bounds(text: str, start: int, end: int, reach: int = REACH) -> tuple[int, int]:
    """``text[start:end]`` (a passage of a document) grown to the start of the sentence it begins in and to the end
    of the one it ends in, each where that lies within ``reach`` characters (else left as it is)."""
    if start > 0 and not _at_sentence_start(text, start):
        begins = [m.end() for m in _SENTENCE_END.finditer(text, max(0, start - reach), start) if m.end() <= start]
        if begins:
            start = begins[-1]
        elif start <= reach:
            start = 0  # the document's first sentence
    if end < len(text):
        close = _SENTENCE_END.search(text, max(start, end - 1), min(len(text), end + reach))
        if close is not None:
            group = close.group(0)
            end = max(end, close.end() - (len(group) - len(group.rstrip())))
        elif len(text) - end <= reach:
            end = len(text)
    return start, end


_ENDS = (".", "!", "?", "\u3002", "\uff01", "\uff1f")  # what a sentence ends with


def _at_sentence_start(text: str, at: int) -> bool:
    before = text[:at].rstrip(" \t")
    return not before or before.endswith(("\n", ":", *_ENDS))


def sentence_trim(text: str, spans: Sequence[tuple[int, int]], share: float = 0.25, *, head: bool = True,
                  tail: bool = True) -> tuple[int, int]:
    """Where ``text`` (a passage) is cut to start at a sentence's start (with ``head``) and end at a sentence's end
    (with ``tail``): the first sentence boundary in its first ``share`` of characters and the last in its last
    ``share``, each kept only where no span (a marked term) lies in the part cut off."""
    n = len(text)
    if n == 0:
        return 0, 0
    first = min((a for a, _ in spans), default=n)
    last = max((b for _, b in spans), default=0)
    lo = 0
    opening = _SENTENCE_END.search(text, 0, int(n * share)) if head else None
    if opening is not None and opening.end() <= first and opening.end() < n:
        lo = opening.end()
    hi = n
    closing = [m for m in _SENTENCE_END.finditer(text, max(lo, int(n * (1 - share))))] if tail else []
    if closing:
        cut = closing[-1].end() - (len(closing[-1].group(0)) - len(closing[-1].group(0).rstrip()))
        if last <= cut and cut > lo:
            hi = cut
    return lo, hi


def snippet(text: str, spans: Sequence[tuple[int, int]], width: int) -> tuple[int, int]:
    """Where a line of about ``width`` characters around the first span of ``text`` starts and ends: at the start
    of the sentence that holds it where that is at most ``width // 2`` before it, else at the first word's start
    from ``width // 3`` before it; it ends at a sentence's or a word's end (each Han or Kana character a word)."""
    first = spans[0][0] if spans else 0
    first_end = spans[0][1] if spans else 0
    lo = max(0, first - width // 3)
    if lo > 0:
        begins = [m.end() for m in _SENTENCE_END.finditer(text, max(0, first - width // 2), first) if m.end() <= first]
        if begins:
            lo = begins[-1]
        elif not (text[lo - 1].isspace() or _CJK_CHAR.match(text, lo - 1) or _CJK_CHAR.match(text, lo)):
            rest = re.compile(r"\S*\s+").match(text, lo)  # the rest of a word cut in two, and the space after it
            lo = min(first, rest.end()) if rest is not None else first
    hi = min(len(text), lo + width)
    if hi < len(text) and not (text[hi].isspace() or _CJK_CHAR.match(text, hi) or _CJK_CHAR.match(text, hi - 1)):
        ends = [m.start() + 1 for m in _SENTENCE_END.finditer(text, lo + (2 * width) // 3, hi)]
        space = max(text.rfind(" ", lo, hi), text.rfind("\n", lo, hi))
        cut = ends[-1] if ends else space
        hi = cut if cut >= max(first_end, lo + 1) else hi
    return lo, hi
