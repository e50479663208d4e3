"""Records that travel through every layer: documents, queries, relevance judgments and ranked results.

A hit's :class:`Explanation`: how its score was made (``search(..., explain=True)``), the parts, and the arithmetic
that puts them together.

A hit's score is built in up to four steps, each recorded here with the numbers it used, so that
:meth:`Explanation.recomposed` computes the score again from them alone:

1. **first stage**: one stage's own score (``bm25`` or ``dense``), or the fusion of both: ``rrf``, the sum over stages
   of ``1 / (k_rrf + rank)``, or ``blend``, the sum of ``weight * minmax(score)`` over each stage's candidates;
2. **reranker** (when it read the hit): ``blend * minmax(rerank) + (1 - blend) * minmax(first stage)`` over the
   documents it read (or its own score, with no blend); a hit below the rerank depth follows the reranked ones:
   ``lowest reranked score - 1 - its position among those below``;
3. **diversity** (when asked): ``(1 - diversity) * minmax(relevance) - diversity * redundancy``, the relevance being
   step 2's score and the redundancy its highest similarity with a hit chosen before it (its cosine above the floor,
   :data:`twostage.engine.steer.FLOOR`, scaled to [0, 1]).

BM25's part lists the query terms the document matched (feedback terms too) with their share of its BM25 score, and
a calibrated reranker adds the probability of relevance; neither takes part in the arithmetic.

Ranked lists are cut and merged here too: deterministic top-k selection over a score vector (ties broken by row
number, lowest first) and the exact merge of per-shard top-k lists.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np

from twostage.indexer.errors import ConfigError, DataError


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
    elif isinstance(value, float) and not math.isfinite(value):
        # JSON has no NaN or infinity (it would be served back as null), and no filter can compare one
        raise DataError(f"{what}: {value!r} is not a finite number (NaN, Infinity, or past 1e308 like 1e999); "
                        "store a finite number, null, or a string")
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
    (:mod:`twostage.indexer.records`), when asked for.
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


def scaled(value: float, low: float, high: float) -> float:
    """min-max scaling of one value (0 when the range is empty), as :func:`twostage.engine.fusion.minmax`."""
    return 0.0 if high == low else (value - low) / (high - low)


@dataclass(frozen=True)
class StagePart:
    """One first stage's part in a hit's first-stage score. ``score`` None: the stage did not find the hit.
    ``low``/``high``: the stage's scores' range over its candidates (blend's min-max); ``contribution``: what it
    adds to the fusion. ``terms``: BM25's matched terms and each one's share of its score."""

    name: str
    score: float | None
    rank: int | None
    weight: float
    low: float
    high: float
    contribution: float
    terms: tuple[tuple[str, float], ...] = ()


@dataclass(frozen=True)
class RerankPart:
    """The reranker's part: its score of the hit, the blend against the first stage (None: its score alone), and the
    ranges min-max scaling used over the documents it read. ``below``: a hit under the rerank depth, its position
    among those (from 0), placed under ``floor``, the lowest reranked score."""

    score: float | None
    blend: float | None
    rerank_range: tuple[float, float] = (0.0, 0.0)
    first_range: tuple[float, float] = (0.0, 0.0)
    below: int | None = None
    floor: float = 0.0


@dataclass(frozen=True)
class DiversityPart:
    """Maximal marginal relevance's part: the weight of diversity, the hit's relevance (the score before) and its
    range over the candidates, its redundancy and the hit chosen before it that it is most like."""

    diversity: float
    relevance: float
    low: float
    high: float
    redundancy: float
    most_like: str | None


@dataclass(frozen=True)
class Explanation:
    """How one hit's score was made. ``fusion``: ``rrf``, ``blend``, or the one stage (``bm25``, ``dense``) that
    ranked alone; ``k_rrf``: rrf's constant; ``probability``: a calibrated reranker's probability of relevance."""

    score: float
    fusion: str
    stages: tuple[StagePart, ...]
    k_rrf: float = 60.0
    rerank: RerankPart | None = None
    diversity: DiversityPart | None = None
    probability: float | None = None
    maxsim: RerankPart | None = None  # late interaction's part, between the first stage and the reranker

    @property
    def first_stage(self) -> float:
        """The first-stage score from its parts."""
        if self.fusion in ("rrf", "wsum"):
            return sum(s.contribution for s in self.stages)
        return next(s.score for s in self.stages if s.name == self.fusion and s.score is not None)

    def recomposed(self) -> float:
        """The score computed again from the parts (equal to :attr:`score` up to float32 rounding)."""
        value = self.first_stage
        for r in (self.maxsim, self.rerank):
            if r is None:
                continue
            if r.below is not None:
                value = r.floor - 1.0 - r.below
            elif r.blend is None:
                assert r.score is not None
                value = r.score
            else:
                assert r.score is not None
                value = r.blend * scaled(r.score, *r.rerank_range) + (1 - r.blend) * scaled(value, *r.first_range)
        d = self.diversity
        if d is not None:
            value = (1 - d.diversity) * scaled(value, d.low, d.high) - d.diversity * d.redundancy
        return float(value)

    def lines(self) -> list[str]:
        """The explanation in words, one line a step, as ``twostage search --explain`` prints it."""
        out = []
        for s in self.stages:
            found = "not found" if s.score is None else f"{s.score:.4f} (rank {s.rank})"
            line = f"{s.name}: {found}"
            if self.fusion == "rrf" and s.score is not None:
                line += f" -> 1/({self.k_rrf:g}+{s.rank}) = {s.contribution:.5f}"
            elif self.fusion == "wsum" and s.score is not None:
                line += (f" -> {s.weight:g} x minmax in [{s.low:.4f}, {s.high:.4f}] = {s.contribution:.4f}")
            out.append(line)
            if s.terms:
                out.append("  terms: " + ", ".join(f"{t} {w:.3f}" for t, w in s.terms))
        fused = {"rrf": "rrf sum", "wsum": "weighted sum"}.get(self.fusion, f"{self.fusion} alone")
        out.append(f"first stage ({fused}): {self.first_stage:.5f}")
        for name, r, before in (("maxsim", self.maxsim, "first stage"),
                                ("reranker", self.rerank, "maxsim" if self.maxsim is not None else "first stage")):
            if r is None:
                continue
            if r.below is not None:
                out.append(f"below the {name} depth: lowest {name} score {r.floor:.4f} - 1 - {r.below}")
            elif r.blend is None:
                out.append(f"{name}: {r.score:.4f} (its score alone)")
            else:
                out.append(f"{name}: {r.score:.4f} -> {r.blend:g} x minmax({name} in [{r.rerank_range[0]:.4f}, "
                           f"{r.rerank_range[1]:.4f}]) + {1 - r.blend:g} x minmax({before} in "
                           f"[{r.first_range[0]:.5f}, {r.first_range[1]:.5f}])")
        if self.probability is not None:
            out.append(f"probability of relevance: {self.probability:.3f}")
        d = self.diversity
        if d is not None:
            like = f" (most like {d.most_like})" if d.most_like is not None else ""
            out.append(f"diversity {d.diversity:g}: {1 - d.diversity:g} x minmax(relevance {d.relevance:.4f} in "
                       f"[{d.low:.4f}, {d.high:.4f}]) - {d.diversity:g} x redundancy {d.redundancy:.3f}{like}")
        out.append(f"score: {self.recomposed():.6f}")
        return out

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready, with ``lines`` (the words) beside the numbers."""
        data = asdict(self)
        data["first_stage"] = self.first_stage
        data["lines"] = self.lines()
        return data


def check_k(k: int) -> int:
    if isinstance(k, bool) or not isinstance(k, (int, np.integer)) or k <= 0:
        raise ConfigError(f"k must be a positive integer, got {k!r}")
    return int(k)


def top_k(scores: np.ndarray, k: int, *, positive_only: bool = False) -> tuple[np.ndarray, np.ndarray]:
    """Rows and scores of the ``k`` highest scores, best first; equal scores keep row order.

    With ``positive_only`` rows whose score is not > 0 are left out (a lexical retriever's non-matches),
    so fewer than ``k`` rows may come back.
    """
    k = check_k(k)
    scores = np.asarray(scores)
    rows = np.flatnonzero(scores > 0) if positive_only else np.arange(len(scores))
    sub = scores[rows]
    if k < len(rows):
        kth = np.partition(sub, len(sub) - k)[len(sub) - k]
        keep = sub >= kth
        rows, sub = rows[keep], sub[keep]
    order = np.lexsort((rows, -sub))[:k]
    return rows[order], sub[order]


def merge_topk(results: Sequence[RankedList], k: int) -> RankedList:
    """The global top ``k`` of per-shard results (each best first). Ties: earlier shard, then better rank, which with
    contiguous shards is corpus order: exact shards give exactly one exact index's answer."""
    k = check_k(k)
    results = [r for r in results if len(r)]
    if not results:
        return RankedList(np.array([], dtype=object), np.array([], dtype=np.float32))
    ids = np.concatenate([np.asarray(r.ids, dtype=object) for r in results])
    scores = np.concatenate([np.asarray(r.scores, dtype=np.float32) for r in results])
    shard = np.concatenate([np.full(len(r), i) for i, r in enumerate(results)])
    rank = np.concatenate([np.arange(len(r)) for r in results])
    order = np.lexsort((rank, shard, -scores))[:k]
    return RankedList(ids[order], scores[order])


def contiguous_bounds(n: int, shards: int) -> list[tuple[int, int]]:
    """The (start, stop) rows of ``shards`` contiguous slices of ``n`` rows, of nearly equal size, in order."""
    if shards <= 0:
        raise ConfigError(f"the number of shards must be positive, got {shards}")
    if shards > n:
        raise ConfigError(f"{shards} shards for {n} documents: use at most one shard per document")
    bounds = np.linspace(0, n, shards + 1).round().astype(int)
    return [(int(a), int(b)) for a, b in itertools.pairwise(bounds)]
