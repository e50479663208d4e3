"""Row numbers and document ids of an index version (or of a BM25 index), without a Python object per document.

The ids are one Arrow string array (their UTF-8 bytes and an 8-byte offset per row); finding an id's rows goes
through the ids' 64-bit hashes, sorted, with their row numbers beside them (16 bytes a row, built on the first
lookup). Measured at ten million documents in ``benchmarks/results/id_memory.md``, against an object array and two
dicts of Python strings.
Indexing with row numbers, a boolean mask or a slice gives a NumPy object array of ``str``, as before.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any

import numpy as np

HASH_SLICE = 1 << 20  # ids converted to Python strings for hashing at a time


def hash_ids(ids: Sequence[str] | np.ndarray) -> np.ndarray:
    """64-bit hashes of ids (pandas' SipHash with its fixed key: the same in every process)."""
    import pandas as pd

    return pd.util.hash_array(np.asarray(ids, dtype=object), categorize=False)


class IdMap:
    """The ids of an index's rows, in row order; several rows may hold one id (an upserted document's tombstoned
    row and its new one), the caller knows which rows are live."""

    def __init__(self, ids: Any) -> None:
        """``ids``: an Arrow (chunked) string array, one id per row."""
        import pyarrow as pa

        if isinstance(ids, pa.ChunkedArray):
            ids = ids.cast(pa.large_string()).combine_chunks() if ids.num_chunks else pa.array([], pa.large_string())
        else:
            ids = ids.cast(pa.large_string())
        self._ids = ids
        # the array's own buffers, for reading one id without boxing a pyarrow scalar
        self._offsets = np.frombuffer(ids.buffers()[1], dtype=np.int64)[ids.offset:ids.offset + len(ids) + 1] \
            if len(ids) else np.zeros(1, dtype=np.int64)
        self._data = memoryview(ids.buffers()[2]) if len(ids) and ids.buffers()[2] is not None else memoryview(b"")
        self._hashed: tuple[np.ndarray, np.ndarray] | None = None  # (rows by hash, sorted hashes): on first lookup

    @classmethod
    def of(cls, ids: Sequence[str]) -> IdMap:
        import pyarrow as pa

        return cls(pa.array(list(ids), pa.large_string()))

    def kept_then(self, keep: np.ndarray, new_ids: Sequence[str]) -> IdMap:
        """The ids of the rows ``keep`` marks, in order, then ``new_ids``: an update's, without a Python string
        per kept id."""
        import pyarrow as pa

        return IdMap(pa.concat_arrays([self._ids.filter(pa.array(np.asarray(keep, dtype=bool))),
                                       pa.array(list(new_ids), pa.large_string())]))

    def _lookup(self) -> tuple[np.ndarray, np.ndarray]:
        """The rows ordered by their ids' hashes and the sorted hashes (16 bytes a row), built on the first lookup
        by id: a map that only names rows (BM25's) never pays for them. Threads racing here build equal arrays."""
        if self._hashed is None:
            hashes = np.empty(len(self._ids), dtype=np.uint64)
            for start in range(0, len(self._ids), HASH_SLICE):
                hashes[start:start + HASH_SLICE] = hash_ids(self._ids.slice(start, HASH_SLICE)
                                                            .to_numpy(zero_copy_only=False))
            order = np.argsort(hashes, kind="stable")
            self._hashed = (order, hashes[order])
        return self._hashed

    def __len__(self) -> int:
        return len(self._ids)

    @property
    def arrow(self) -> Any:
        """The ids as one Arrow large_string array (no copy)."""
        return self._ids

    def __getitem__(self, rows: Any) -> Any:
        """The ids at these rows (an int array or list, a boolean mask over every row, or a slice) as an object array;
        one row number gives one ``str``."""
        import pyarrow as pa

        if isinstance(rows, (int, np.integer)):
            return self._id_at(int(rows) + len(self) if rows < 0 else int(rows))
        if isinstance(rows, slice):
            start, stop, step = rows.indices(len(self))
            rows = np.arange(start, stop, step)
        rows = np.asarray(rows)
        if rows.dtype == bool:
            if len(rows) != len(self):
                raise IndexError(f"a mask of {len(rows)} rows for {len(self)} ids")
            rows = np.flatnonzero(rows)
        if not len(rows):
            return np.array([], dtype=object)
        if len(rows) <= 64:  # a search's hits: read from the buffers, no Arrow call
            out = np.empty(len(rows), dtype=object)
            out[:] = [self._id_at(r) for r in rows.tolist()]
            return out
        return self._ids.take(pa.array(rows.astype(np.int64, copy=False))).to_numpy(zero_copy_only=False)

    def _id_at(self, row: int) -> str:
        if not -len(self) <= row < len(self):
            raise IndexError(f"row {row} is outside the {len(self)} ids")
        row %= len(self)
        return bytes(self._data[self._offsets[row]:self._offsets[row + 1]]).decode("utf-8")

    def __iter__(self) -> Iterator[str]:
        for start in range(0, len(self), HASH_SLICE):
            yield from self._ids.slice(start, HASH_SLICE).to_pylist()

    def rows_of(self, doc_id: str, hashed: np.uint64 | None = None) -> list[int]:
        """Every row holding ``doc_id``, ascending (``hashed``: its hash, when already computed)."""
        h = hash_ids([doc_id])[0] if hashed is None else hashed
        order, hashes = self._lookup()
        at = int(np.searchsorted(hashes, h, side="left"))
        rows = []
        while at < len(hashes) and hashes[at] == h:  # one row, unless an id was upserted (or collided)
            row = int(order[at])
            if self._id_at(row) == doc_id:
                rows.append(row)
            at += 1
        return sorted(rows)

    def live_rows(self, ids: Sequence[str], deleted: np.ndarray) -> list[int | None]:
        """The live row of each id (None: no live row; the first, should an id have several), with the ids hashed
        and looked up in one call each."""
        if not len(ids):
            return []
        hashes = hash_ids(list(ids))
        order, sorted_hashes = self._lookup()
        starts = np.searchsorted(sorted_hashes, hashes, side="left").tolist()
        n = len(sorted_hashes)
        out: list[int | None] = []
        for doc_id, h, at in zip(ids, hashes.tolist(), starts):
            found = None
            while at < n and int(sorted_hashes[at]) == h:  # one row, unless an id was upserted (or collided)
                row = int(order[at])
                if not deleted[row] and (found is None or row < found) and self._id_at(row) == doc_id:
                    found = row
                at += 1
            out.append(found)
        return out
