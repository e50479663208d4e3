"""Records that travel through every layer: documents, queries, relevance judgments and ranked results."""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from twostage.indexer.errors import DataError
from twostage.indexer.explanation import Explanation


def _check_id(kind: str, value: object) -> None:
    if not isinstance(value, str) or not value:
        raise DataError(f"{kind} id must be a non-empty string, got {value!r}")
    check_encodable(value, f"{kind} id {value[:40]!r}")


def check_encodable(text: str, what: str) -> str:
    """``text`` unchanged if it is valid Unicode (UTF-8 encodable); a lone surrogate (``"\\ud800"``, which JSON can
    carry) is a DataError naming ``what``, raised before the text reaches a tokenizer, a file or a shared batch."""
    if not text.isascii():
        try:
            text.encode("utf-8")
        except UnicodeEncodeError as exc:
            raise DataError(f"{what} holds a lone surrogate (U+{ord(text[exc.start]):04X} at character {exc.start}), "
                            "which is not valid Unicode; send the text as UTF-8") from None
    return text


MAX_METADATA_INT = 10**308  # float64's range: metadata numbers are filtered as float64


def check_metadata(value: Any, what: str, depth: int = 0) -> None:
    """Every string in a metadata value (field names included) valid Unicode and every integer within float64's
    range, else a DataError naming it. Run where
    documents come in (:func:`twostage.indexer.corpus.iter_documents`, the HTTP routes), not on every Document made
    from the store."""
    if isinstance(value, str):
        check_encodable(value, what)
    elif isinstance(value, int) and not isinstance(value, bool) and not -MAX_METADATA_INT <= value <= MAX_METADATA_INT:
        # filters compare numbers as float64: a JSON integer past its range could never be compared (or stored)
        raise DataError(f"{what}: the number {str(value)[:20]}... ({len(str(value))} digits) is too large for a "
                        "metadata number (at most 1e308 either way); store it as a string")
    elif isinstance(value, Mapping) and depth < 64:
        for k, v in value.items():
            if isinstance(k, str):
                check_encodable(k, f"{what}: a field name")
            check_metadata(v, f"{what}.{k}" if isinstance(k, str) and k.isascii() else what, depth + 1)
    elif isinstance(value, (list, tuple)) and depth < 64:
        for v in value:
            check_metadata(v, what, depth + 1)


@dataclass(frozen=True)
class Document:
    """One document of a corpus. ``metadata`` holds any extra fields (JSON-serialisable values)."""

    id: str
    text: str
    title: str = ""
    metadata: Mapping[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        _check_id("document", self.id)
        if not isinstance(self.text, str) or not isinstance(self.title, str):
            raise DataError(f"document {self.id!r}: title and text must be strings")
        check_encodable(self.text, f"document {self.id!r}: its text")
        check_encodable(self.title, f"document {self.id!r}: its title")

    @property
    def full_text(self) -> str:
        """Title and text joined the way BEIR systems index them."""
        if self.title and self.text:
            return f"{self.title} {self.text}"
        return self.title or self.text


@dataclass(frozen=True)
class Query:
    """One query. Its text is never empty or blank."""

    id: str
    text: str

    def __post_init__(self) -> None:
        _check_id("query", self.id)
        if not isinstance(self.text, str) or not self.text.strip():
            raise DataError(f"query {self.id!r} has empty text; give every query some words")
        check_encodable(self.text, f"query {self.id!r}")


@dataclass(frozen=True)
class Passage:
    """The part of a hit's document that scored best: its text, where it sits in the document's text
    (``text == document.text[start:end]``), and the spans (start, end) of the query's terms inside ``text``."""

    text: str
    start: int
    end: int
    spans: tuple[tuple[int, int], ...] = ()

    def to_dict(self) -> dict[str, Any]:
        return {"text": self.text, "start": self.start, "end": self.end, "spans": [list(s) for s in self.spans]}


@dataclass(frozen=True)
class Hit:
    """One result shown to a user: higher ``score`` is better, ``rank`` starts at 1.

    ``stage_scores`` holds each stage's own score of the document (``bm25``, ``dense``, ``first_stage`` (the
    fused score when the first stage is hybrid), ``rerank``); a stage that did not find the document is absent.
    ``passage`` is the best-scoring part of the document with the query's terms marked (the engine's hits).
    ``group``: the hit's value of the field a grouped search groups by; ``explanation``: how its score was made
    (:mod:`twostage.indexer.explanation`), when asked for.
    """

    doc_id: str
    score: float
    rank: int
    first_stage_score: float | None = None
    text: str | None = None
    title: str = ""
    metadata: Mapping[str, Any] = field(default_factory=dict)
    stage_scores: Mapping[str, float] = field(default_factory=dict)
    passage: Passage | None = None
    group: Any = None
    explanation: Explanation | None = None

    @property
    def id(self) -> str:
        return self.doc_id

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready: id, score, rank, title, text, metadata, stage_scores, passage (or None); ``group`` (a grouped
        search) and ``explanation`` (an explained one) when present."""
        out = {"id": self.doc_id, "score": self.score, "rank": self.rank, "title": self.title, "text": self.text,
               "metadata": dict(self.metadata), "stage_scores": dict(self.stage_scores),
               "passage": self.passage.to_dict() if self.passage is not None else None}
        if self.group is not None:
            out["group"] = self.group
        if self.explanation is not None:
            out["explanation"] = self.explanation.to_dict()
        return out


@dataclass(frozen=True)
class SearchResult:
    """Hits of one query, best first, with the seconds spent in each stage (``timings``)."""

    query: str
    hits: tuple[Hit, ...]
    timings: Mapping[str, float]
    next_page: str | None = None  # pass as page_token for the next k hits (None: no further page)

    def __len__(self) -> int:
        return len(self.hits)

    @property
    def ids(self) -> list[str]:
        return [h.doc_id for h in self.hits]

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready: ``{"query", "hits": [...], "timings": {...}, "next_page"}``."""
        return {"query": self.query, "hits": [h.to_dict() for h in self.hits], "timings": dict(self.timings),
                "next_page": self.next_page}


@dataclass(frozen=True)
class RankedList:
    """The ranked result of one query: document ids and scores, best first (scores never increase).

    Ties are already broken (by corpus order) so ``ids`` is the one true order of the list.
    """

    ids: np.ndarray
    scores: np.ndarray

    def __post_init__(self) -> None:
        if len(self.ids) != len(self.scores):
            raise ValueError(f"RankedList: {len(self.ids)} ids but {len(self.scores)} scores")

    def __len__(self) -> int:
        return len(self.ids)

    def hits(self) -> list[Hit]:
        return [Hit(str(d), float(s), r + 1) for r, (d, s) in enumerate(zip(self.ids, self.scores))]

    def truncate(self, k: int) -> RankedList:
        return RankedList(self.ids[:k], self.scores[:k])


@dataclass(frozen=True)
class Judgment:
    """One line of a qrels file: how relevant a document is to a query (grade > 0 means relevant)."""

    query_id: str
    doc_id: str
    grade: int


class Qrels:
    """Relevance judgments of a set of queries, read-only.

    Build it from :class:`Judgment` records (:meth:`from_judgments`) or read it from a qrels file
    (``indexer.beir.load_qrels``).
    """

    def __init__(self, judgments: Iterable[Judgment]) -> None:
        table: dict[str, dict[str, int]] = {}
        for j in judgments:
            table.setdefault(j.query_id, {})[j.doc_id] = int(j.grade)
        self._table = table

    @classmethod
    def from_judgments(cls, judgments: Iterable[Judgment]) -> Qrels:
        return cls(judgments)

    def __len__(self) -> int:
        return len(self._table)

    def __contains__(self, query_id: object) -> bool:
        return query_id in self._table

    def __iter__(self) -> Iterator[Judgment]:
        for q, docs in self._table.items():
            for d, g in docs.items():
                yield Judgment(q, d, g)

    @property
    def query_ids(self) -> tuple[str, ...]:
        return tuple(self._table)

    @property
    def num_judgments(self) -> int:
        return sum(len(d) for d in self._table.values())

    def grades(self, query_id: str) -> Mapping[str, int]:
        """All judged documents of a query and their grades (empty when the query has none)."""
        return dict(self._table.get(query_id, {}))

    def relevant(self, query_id: str) -> frozenset[str]:
        """Ids of the documents judged relevant (grade > 0) to a query."""
        return frozenset(d for d, g in self._table.get(query_id, {}).items() if g > 0)

    def subset(self, query_ids: Iterable[str]) -> Qrels:
        keep = set(query_ids)
        return Qrels(j for j in self if j.query_id in keep)

    def to_dict(self) -> dict[str, dict[str, int]]:
        """A plain nested dict copy, the format metric libraries (ranx, pytrec_eval) take."""
        return {q: dict(d) for q, d in self._table.items()}

    def to_frame(self) -> Any:
        import pandas as pd

        rows = list(self)
        return pd.DataFrame(
            {
                "query_id": [j.query_id for j in rows],
                "doc_id": [j.doc_id for j in rows],
                "grade": np.array([j.grade for j in rows], dtype=np.int64),
            }
        )

    def __repr__(self) -> str:
        return f"Qrels({len(self)} queries, {self.num_judgments} judgments)"
