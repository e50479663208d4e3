"""BEIR-format collections: ``corpus.jsonl``, ``queries.jsonl`` and ``qrels/<split>.tsv``."""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from pathlib import Path

from twostage.indexer.corpus import Corpus, load_corpus
from twostage.indexer.errors import ConfigError, DataError, DataNotFoundError
from twostage.indexer.jsonl import iter_jsonl, iter_lines, optional_string, require_string_id
from twostage.indexer.records import Judgment, Qrels, Query

logger = logging.getLogger(__name__)


def load_queries(path: str | Path) -> list[Query]:
    """Read ``queries.jsonl``; an empty query text or a duplicate id is an error naming file and line."""
    path = Path(path)
    queries: list[Query] = []
    seen: dict[str, int] = {}
    for number, obj in iter_jsonl(path):
        where = f"{path}:{number}"
        qid = require_string_id(obj, ("_id", "id", "query_id", "qid"), where)
        text = optional_string(obj, "text", f"{where} (query {qid!r})")
        if not text.strip():
            raise DataError(f"{where}: query {qid!r} has empty text; remove it or give it words")
        if qid in seen:
            raise DataError(f"{where}: duplicate query id {qid!r} (first seen at line {seen[qid]})")
        seen[qid] = number
        queries.append(Query(qid, text))
    if not queries:
        raise DataError(f"{path}: no queries")
    return queries


def load_qrels(path: str | Path) -> Qrels:
    """Read a qrels TSV (``query-id  corpus-id  score``, header optional; TREC's 4-column form too).

    A line with the wrong number of columns or a non-integer grade is an error naming file and line; a
    repeated (query, document) pair with the same grade is counted in a warning, with another grade it is
    an error.
    """
    path = Path(path)
    judgments: dict[tuple[str, str], tuple[int, int]] = {}
    repeated = 0
    for number, line in iter_lines(path):
        cols = line.split("\t") if "\t" in line else line.split()
        if len(cols) == 4:  # TREC qrels: qid iteration docid grade
            cols = [cols[0], cols[2], cols[3]]
        if len(cols) != 3:
            raise DataError(f"{path}:{number}: expected 3 tab-separated columns (query-id, corpus-id, score), got {len(cols)}")
        qid, did, grade_text = (c.strip() for c in cols)
        try:
            grade = int(float(grade_text))
        except ValueError:
            if number == 1 or not judgments:
                continue  # header line
            raise DataError(f"{path}:{number}: score {grade_text!r} of query {qid!r}, document {did!r} is not an integer") from None
        key = (qid, did)
        if key in judgments:
            if judgments[key][0] != grade:
                raise DataError(
                    f"{path}:{number}: query {qid!r}, document {did!r} judged {grade} here but "
                    f"{judgments[key][0]} at line {judgments[key][1]}"
                )
            repeated += 1
            continue
        judgments[key] = (grade, number)
    if not judgments:
        raise DataError(f"{path}: no judgments")
    if repeated:
        logger.warning("%s: %d repeated judgment lines (same grade) counted once", path, repeated)
    return Qrels(Judgment(q, d, g) for (q, d), (g, _) in judgments.items())


@dataclass(frozen=True)
class QrelsCheck:
    """What checking a split's qrels against the corpus and queries found (reported, not fatal)."""

    unknown_queries: tuple[str, ...] = ()
    unknown_documents: tuple[tuple[str, str], ...] = ()  # (query id, doc id)
    queries_without_relevant: tuple[str, ...] = ()
    notes: tuple[str, ...] = field(default=())

    @property
    def ok(self) -> bool:
        return not (self.unknown_queries or self.unknown_documents or self.queries_without_relevant)

    def lines(self) -> list[str]:
        out = []
        if self.unknown_queries:
            out.append(f"{len(self.unknown_queries)} queries in qrels are not in queries.jsonl and are skipped "
                       f"(first: {', '.join(self.unknown_queries[:5])})")
        if self.unknown_documents:
            first = ", ".join(f"{q}/{d}" for q, d in self.unknown_documents[:5])
            out.append(f"{len(self.unknown_documents)} judgments name documents not in the corpus; they stay in "
                       f"the qrels and count as missed (first query/doc: {first})")
        if self.queries_without_relevant:
            out.append(f"{len(self.queries_without_relevant)} queries have no relevant document and are skipped "
                       f"(first: {', '.join(self.queries_without_relevant[:5])})")
        return out


@dataclass(frozen=True)
class Split:
    """The queries of one split that can be evaluated, with their qrels, and what the check found."""

    name: str
    queries: tuple[Query, ...]
    qrels: Qrels
    check: QrelsCheck


class BeirDataset:
    """A BEIR directory. The corpus is read once, on first use; queries and qrels per split."""

    def __init__(self, root: str | Path) -> None:
        self.root = Path(root)
        if not self.root.is_dir():
            raise DataNotFoundError(f"{self.root}: no such dataset directory")
        for name in ("corpus.jsonl", "queries.jsonl"):
            if not (self.root / name).is_file():
                raise DataNotFoundError(f"{self.root}: missing {name}; a BEIR directory holds corpus.jsonl, queries.jsonl and qrels/<split>.tsv")
        self._corpus: Corpus | None = None
        self._queries: dict[str, Query] | None = None

    @property
    def name(self) -> str:
        return self.root.name

    @property
    def splits(self) -> list[str]:
        qrels_dir = self.root / "qrels"
        return sorted(p.stem for p in qrels_dir.glob("*.tsv")) if qrels_dir.is_dir() else []

    @property
    def corpus(self) -> Corpus:
        if self._corpus is None:
            self._corpus = load_corpus(self.root / "corpus.jsonl")
        return self._corpus

    @property
    def queries(self) -> dict[str, Query]:
        if self._queries is None:
            self._queries = {q.id: q for q in load_queries(self.root / "queries.jsonl")}
        return self._queries

    def qrels_path(self, split: str) -> Path:
        path = self.root / "qrels" / f"{split}.tsv"
        if not path.is_file():
            known = ", ".join(self.splits) or "none"
            raise ConfigError(f"{self.root}: unknown split {split!r} (no qrels/{split}.tsv); splits here: {known}")
        return path

    def split(self, split: str) -> Split:
        """Queries and qrels of ``split``, checked against the corpus and the queries file."""
        path = self.qrels_path(split)
        qrels = load_qrels(path)
        queries, corpus = self.queries, self.corpus
        unknown_q = tuple(q for q in qrels.query_ids if q not in queries)
        unknown_d = tuple((j.query_id, j.doc_id) for j in qrels if j.doc_id not in corpus)
        no_rel = tuple(q for q in qrels.query_ids if q in queries and not qrels.relevant(q))
        check = QrelsCheck(unknown_q, unknown_d, no_rel)
        for line in check.lines():
            logger.warning("%s: %s", path, line)
        skip = set(no_rel)
        keep = [q for q in qrels.query_ids if q in queries and q not in skip]
        if not keep:
            raise DataError(f"{path}: no query of this split can be evaluated (see the warnings above)")
        return Split(split, tuple(queries[q] for q in keep), qrels.subset(keep), check)
