"""The id map of an index version: row <-> id through an Arrow array and sorted 64-bit hashes."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pytest

from twostage.indexer import docstore as ids_module
from twostage.indexer.docstore import IdMap


def test_indexing_like_an_object_array():
    ids = [f"doc-{i}" for i in range(50)] + ["é-ü", ""]
    m = IdMap(pa.chunked_array([pa.array(ids[:20]), pa.array(ids[20:])]))
    want = np.asarray(ids, dtype=object)
    rows = np.array([51, 3, 3, 50, 0])
    assert len(m) == 52 and m[rows].dtype == object and m[rows].tolist() == want[rows].tolist()
    mask = np.arange(52) % 3 == 0
    assert m[mask].tolist() == want[mask].tolist() and m[5:9].tolist() == ids[5:9] and m[7] == "doc-7"
    assert list(m) == ids and m[np.array([], dtype=np.int64)].tolist() == [] and m[-1] == ""
    assert m[np.arange(52)].tolist() == ids  # more rows than the buffer path reads: one Arrow take
    with pytest.raises(IndexError, match="row 52 is outside"):
        m[np.array([52])]
    with pytest.raises(IndexError, match="mask of 3 rows"):
        m[np.array([True, False, True])]


def test_an_id_on_several_rows_and_the_live_one():
    m = IdMap.of(["a", "b", "a", "c", "a"])  # "a" upserted twice: rows 0 and 2 tombstoned, 4 live
    assert m.rows_of("a") == [0, 2, 4] and m.rows_of("zz") == []
    deleted = np.array([True, False, True, False, False])
    assert m.live_rows(["a", "c", "zz", "b"], deleted) == [4, 3, None, 1]
    assert m.live_rows([], deleted) == []


def test_equal_hashes_are_told_apart_by_the_ids(monkeypatch):
    monkeypatch.setattr(ids_module, "hash_ids", lambda ids: np.zeros(len(ids), dtype=np.uint64))
    m = IdMap.of(["x", "y", "z", "y"])
    assert m.rows_of("y") == [1, 3] and m.rows_of("q") == []
    assert m.live_rows(["z", "y", "q"], np.array([False, True, False, False])) == [2, 3, None]
