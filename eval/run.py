"""A run: one system's ranked list for every query, readable and writable as a TREC run file."""

from __future__ import annotations

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
        """Write ``qid Q0 docid rank score name`` lines (rank from 1), atomically."""
        lines = []
        for qid, ranked in self._lists.items():
            for rank, (doc, score) in enumerate(zip(ranked.ids, ranked.scores), start=1):
                lines.append(f"{qid} Q0 {doc} {rank} {float(score):.6f} {self.name}\n")
        atomic_write_text(path, "".join(lines))

    @classmethod
    def from_trec(cls, path: str | Path, name: str | None = None) -> Run:
        """Read a TREC run file; each query's list is ordered by the rank column."""
        rows: dict[str, list[tuple[int, str, float]]] = {}
        tag = name
        for number, line in iter_lines(path):
            cols = line.split()
            if len(cols) != 6:
                raise DataError(f"{path}:{number}: a TREC run line has 6 columns (qid Q0 docid rank score tag), got {len(cols)}")
            try:
                rank, score = int(cols[3]), float(cols[4])
            except ValueError:
                raise DataError(f"{path}:{number}: rank {cols[3]!r} or score {cols[4]!r} is not a number") from None
            rows.setdefault(cols[0], []).append((rank, cols[2], score))
            tag = tag or cols[5]
        lists = {}
        for qid, items in rows.items():
            items.sort()
            lists[qid] = RankedList(np.array([d for _, d, _ in items], dtype=object),
                                    np.array([s for _, _, s in items], dtype=np.float32))
        return cls(tag or Path(path).stem, lists)
