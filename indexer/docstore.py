"""The documents of an index version, read from its segments' parquet files a row group at a time.

Each segment's ``.parquet`` file holds ``id, title, text, metadata`` (JSON) per row, written in row groups of
:data:`ROW_GROUP` rows. Reading a document decodes only its row group; decoded groups are kept in a cache bounded
in bytes (:data:`CACHE_BYTES`), so a small corpus ends up wholly in memory after a few searches while a large
one never does. Whole passes (BM25 over every live document, a ``where`` function) stream the groups and leave
the cache alone. Files written before row groups were bounded (one group per segment) are read the same way.

Their ids (:class:`IdMap`): row numbers and document ids of an index version (or of a BM25 index), without a Python
object per document. The ids are one Arrow string array (their UTF-8 bytes and an 8-byte offset per row); finding an
id's rows goes through the ids' 64-bit hashes, sorted, with their row numbers beside them (16 bytes a row, built on
the first lookup). Measured at ten million documents in ``benchmarks/results/id_memory.md``, against an object array
and two dicts of Python strings. Indexing with row numbers, a boolean mask or a slice gives a NumPy object array of
``str``, as before.
"""

from __future__ import annotations

import json
import threading
from collections import OrderedDict
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from twostage.indexer.errors import IndexFormatError
from twostage.indexer.manifest import Segment
from twostage.indexer.records import Document

ROW_GROUP = 1024  # rows per parquet row group: what one document read decodes
CACHE_BYTES = 256 * 2**20  # decoded row groups kept for later reads
COLUMNS = ("id", "title", "text", "metadata")


def write_documents(path: Path, docs: Sequence[Document]) -> None:
    """Write ``docs`` as one segment's parquet file (:func:`write_table`)."""
    import pyarrow as pa

    write_table(path, pa.table({"id": [d.id for d in docs], "title": [d.title for d in docs],
                                "text": [d.text for d in docs],
                                "metadata": [json.dumps(dict(d.metadata), sort_keys=True, default=str) for d in docs]}))


def write_table(path: Path, table: Any) -> None:
    """Write a table of the store's columns as a segment's parquet file, in row groups of :data:`ROW_GROUP` rows."""
    import pyarrow.parquet as pq

    pq.write_table(table, path, row_group_size=ROW_GROUP)


def read_ids(path: Path) -> Any:
    """The id column of one segment's parquet file, as an Arrow array (an IndexFormatError names a broken file)."""
    import pyarrow.parquet as pq

    try:
        return pq.read_table(path, columns=["id"]).column("id")
    except Exception as exc:  # noqa: BLE001 - pyarrow raises several types on a broken file
        raise IndexFormatError(f"{path}: not a readable parquet file ({str(exc)[:200]}); restore or rebuild") from None


def row_document(columns: dict[str, list[Any]], row: int, parsed: dict[str, Any] | None = None) -> Document:
    """The Document in row ``row`` of a segment's columns (as stored: metadata in JSON). ``parsed``: metadata
    already parsed, by its JSON text (a document's passages carry the same metadata: parsed once)."""
    text = columns["metadata"][row]
    if parsed is None:
        return Document(columns["id"][row], columns["text"][row], columns["title"][row], json.loads(text))
    if text not in parsed:
        parsed[text] = json.loads(text)
    return Document(columns["id"][row], columns["text"][row], columns["title"][row], parsed[text])


class DocStore:
    """Random and sequential access to the documents of one version's segments, by row number."""

    def __init__(self, segments_dir: Path, segments: Sequence[Segment], cache_bytes: int = CACHE_BYTES) -> None:
        self._paths = [segments_dir / f"{s.name}.parquet" for s in segments]
        self._starts = np.array([s.start for s in segments], dtype=np.int64)
        self._rows = np.array([s.rows for s in segments], dtype=np.int64)
        self._meta: dict[int, Any] = {}  # segment -> parquet footer (row group sizes)
        self._group_starts: dict[int, np.ndarray] = {}
        self._cache: OrderedDict[tuple[int, int], Any] = OrderedDict()
        self._cached_bytes = 0
        self._cache_limit = cache_bytes
        self._lock = threading.Lock()

    def __len__(self) -> int:
        return int(self._rows.sum())

    # ---- locating rows ---------------------------------------------------------------------
    def _groups(self, seg: int) -> np.ndarray:
        """The first row (within the segment) of each row group of segment ``seg``; its footer is read once."""
        starts = self._group_starts.get(seg)
        if starts is None:
            import pyarrow.parquet as pq

            path = self._paths[seg]
            try:
                meta = pq.read_metadata(path)
            except Exception as exc:  # noqa: BLE001
                raise IndexFormatError(f"{path}: not a readable parquet file ({str(exc)[:200]}); restore or "
                                       "rebuild") from None
            sizes = [meta.row_group(g).num_rows for g in range(meta.num_row_groups)]
            if sum(sizes) != self._rows[seg]:
                raise IndexFormatError(f"{path}: {sum(sizes)} documents, the manifest says {self._rows[seg]}")
            starts = np.cumsum([0, *sizes])[:-1]
            self._meta[seg], self._group_starts[seg] = meta, starts
        return starts

    def _locate(self, rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        if len(rows) and (rows.min() < 0 or rows.max() >= len(self)):
            raise IndexError(f"row {int(rows.max() if rows.max() >= len(self) else rows.min())} is outside the "
                             f"{len(self)} rows of the store")
        seg = np.searchsorted(self._starts, rows, side="right") - 1
        return seg, rows - self._starts[seg]

    def _read_group(self, seg: int, group: int, columns: Sequence[str] = COLUMNS) -> Any:
        import pyarrow.parquet as pq

        self._groups(seg)
        path = self._paths[seg]
        try:
            return pq.ParquetFile(path, metadata=self._meta[seg]).read_row_group(group, columns=list(columns))
        except Exception as exc:  # noqa: BLE001
            raise IndexFormatError(f"{path}: row group {group} is not readable ({str(exc)[:200]}); restore or "
                                   "rebuild") from None

    def _cached_group(self, seg: int, group: int) -> dict[str, list[Any]]:
        key = (seg, group)
        with self._lock:
            hit = self._cache.get(key)
            if hit is not None:
                self._cache.move_to_end(key)
                return hit[0]
        table = self._read_group(seg, group)
        columns, size = {c: table.column(c).to_pylist() for c in COLUMNS}, table.nbytes
        with self._lock:
            if key not in self._cache:
                self._cache[key] = (columns, size)
                self._cached_bytes += size
                while self._cached_bytes > self._cache_limit and len(self._cache) > 1:
                    _, (_, freed) = self._cache.popitem(last=False)
                    self._cached_bytes -= freed
        return columns

    # ---- reading ---------------------------------------------------------------------------
    def documents_at(self, rows: Sequence[int] | np.ndarray) -> list[Document]:
        """The documents at these row numbers, in the order given (each row group read once)."""
        rows = np.asarray(rows, dtype=np.int64)
        seg, local = self._locate(rows)
        out: list[Document | None] = [None] * len(rows)
        parsed: dict[str, Any] = {}
        for s in np.unique(seg):
            at = np.flatnonzero(seg == s)
            starts = self._groups(int(s))
            group = np.searchsorted(starts, local[at], side="right") - 1
            for g in np.unique(group):
                cols = self._cached_group(int(s), int(g))
                for i in at[group == g]:
                    r = int(local[i] - starts[g])
                    out[i] = row_document(cols, r, parsed)
        return out  # type: ignore[return-value]

    def chunks(self, rows: np.ndarray, columns: Sequence[str] = COLUMNS) -> Iterator[tuple[np.ndarray, dict[str, list]]]:
        """Stream the given rows (ascending) a row group at a time: (their row numbers, their columns), without
        touching the cache, so a pass over the corpus holds one group at a time."""
        rows = np.asarray(rows, dtype=np.int64)
        if len(rows) > 1 and np.any(np.diff(rows) <= 0):
            raise ValueError("chunks() takes ascending, distinct rows")
        seg, local = self._locate(rows)
        bounds = np.flatnonzero(np.diff(seg)) + 1
        for at in np.split(np.arange(len(rows)), bounds):
            if not len(at):
                continue
            s = int(seg[at[0]])
            starts = self._groups(s)
            group = np.searchsorted(starts, local[at], side="right") - 1
            for g in np.unique(group):
                sel = at[group == g]
                table = self._read_group(s, int(g), columns)
                picked = table.take(local[sel] - starts[g])
                yield rows[sel], {c: picked.column(c).to_pylist() for c in columns}

    def document_chunks(self, rows: np.ndarray) -> Iterator[tuple[np.ndarray, list[Document]]]:
        """:meth:`chunks` as (row numbers, Documents)."""
        for at, cols in self.chunks(rows):
            yield at, [row_document(cols, r) for r in range(len(at))]

    def column(self, name: str) -> list[Any]:
        """One column over every row (e.g. the metadata, for filters), read without the others."""
        out: list[Any] = []
        for _, cols in self.chunks(np.arange(len(self)), (name,)):
            out.extend(cols[name])
        return out

    def mask(self, keep: Callable[[Document], bool], rows: np.ndarray) -> np.ndarray:
        """A boolean mask over every row: true where the row is in ``rows`` and ``keep(document)`` holds."""
        out = np.zeros(len(self), dtype=bool)
        for at, docs in self.document_chunks(rows):
            out[at] = [bool(keep(d)) for d in docs]
        return out


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
