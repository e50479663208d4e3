"""A run: one system's ranked list for every query, readable and writable as a TREC run file.

trec_eval (and pytrec_eval, which is its code) ignores a run file's rank column: it orders each query's documents
by score, highest first, and breaks ties by document id, the larger id (byte order) first. :meth:`Run.from_trec`
reads a file the same way, so ``twostage eval`` scores any run exactly as trec_eval does. :meth:`Run.to_trec`
writes scores that are strictly decreasing down each list (a score equal to the one above it, or above it, is
written as the largest single-precision value below that one), so the order trec_eval reads back is the order we
ranked, ties included.
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Mapping
from pathlib import Path

import numpy as np

from twostage.indexer.atomic import atomic_write_text
from twostage.indexer.errors import DataError
from twostage.indexer.jsonl import iter_lines
from twostage.indexer.records import RankedList


class Run(Mapping[str, RankedList]):
    """Query id -> :class:`RankedList` of one system, in the order queries were run."""

    def __init__(self, name: str, lists: Mapping[str, RankedList]) -> None:
        self.name = name
        self._lists = dict(lists)

    def __getitem__(self, query_id: str) -> RankedList:
        return self._lists[query_id]

    def __iter__(self) -> Iterator[str]:
        return iter(self._lists)

    def __len__(self) -> int:
        return len(self._lists)

    def to_trec(self, path: str | Path) -> None:
        """Write ``qid Q0 docid rank score name`` lines (rank from 1), atomically, with scores trec_eval orders
        as we ranked (:func:`strictly_decreasing`)."""
        lines = []
        tag = self.name.replace(" ", "_") or "run"
        for qid, ranked in self._lists.items():
            for rank, (doc, score) in enumerate(zip(ranked.ids, strictly_decreasing(ranked.scores)), start=1):
                lines.append(f"{qid} Q0 {doc} {rank} {score!r} {tag}\n")
        atomic_write_text(path, "".join(lines))

    @classmethod
    def from_trec(cls, path: str | Path, name: str | None = None) -> Run:
        """Read a TREC run file (``qid Q0 docid rank score tag``); each query's list is in trec_eval's order: by
        score (as a single-precision value, as trec_eval holds it), highest first, ties by the larger document id. A malformed line, a score that is not a finite
        number or a document listed twice for one query is a DataError naming the file and line."""
        rows: dict[str, dict[str, tuple[float, int]]] = {}
        tag = name
        for number, line in iter_lines(path):
            cols = line.split()
            if len(cols) != 6:
                raise DataError(f"{path}:{number}: a TREC run line has 6 columns (qid Q0 docid rank score tag), "
                                f"got {len(cols)}")
            try:
                score = float(cols[4])
                int(cols[3])
            except ValueError:
                raise DataError(f"{path}:{number}: rank {cols[3]!r} or score {cols[4]!r} is not a number") from None
            if not math.isfinite(score):
                raise DataError(f"{path}:{number}: score {cols[4]!r} is not a finite number")
            seen = rows.setdefault(cols[0], {})
            if cols[2] in seen:
                raise DataError(f"{path}:{number}: document {cols[2]!r} is listed twice for query {cols[0]!r} "
                                f"(first on line {seen[cols[2]][1]}); a run lists each document once per query")
            seen[cols[2]] = (float(np.float32(score)), number)  # trec_eval keeps a score as a C float
            tag = tag or cols[5]
        if not rows:
            raise DataError(f"{path}: no run lines; a TREC run has lines 'qid Q0 docid rank score tag'")
        lists = {}
        for qid, docs in rows.items():
            order = sorted(docs, key=lambda d: d.encode("utf-8"), reverse=True)  # ties: the larger docno first
            order.sort(key=lambda d: -docs[d][0])  # stable: by score, highest first
            lists[qid] = RankedList(np.array(order, dtype=object),
                                    np.array([docs[d][0] for d in order], dtype=np.float32))
        return cls(tag or Path(path).stem, lists)


def strictly_decreasing(scores: np.ndarray) -> list[float]:
    """``scores`` (best first) as single-precision values, each below the one before it: a score not below its
    predecessor becomes the largest float32 under it. Single precision because pytrec_eval reads scores into
    floats (a nudge of one double ulp would come back a tie); a float32 printed with ``repr`` of its double is
    read back exactly by both. The order is kept; decreasing float32 scores are unchanged."""
    values = np.asarray(scores, dtype=np.float32).copy()
    for i in range(1, len(values)):
        if not values[i] < values[i - 1]:
            values[i] = np.nextafter(values[i - 1], np.float32(-np.inf))
    return [float(v) for v in values]
