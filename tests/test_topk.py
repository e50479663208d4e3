import itertools

import numpy as np
import pytest

from twostage.indexer.errors import ConfigError
from twostage.indexer.records import RankedList, contiguous_bounds, merge_topk, top_k


def test_top_k_matches_a_full_stable_sort():
    rng = np.random.default_rng(0)
    for _ in range(50):
        scores = rng.integers(0, 5, size=int(rng.integers(1, 60))).astype(np.float32)  # many ties
        k = int(rng.integers(1, 70))
        rows, values = top_k(scores, k)
        expected = np.lexsort((np.arange(len(scores)), -scores))[:k]
        np.testing.assert_array_equal(rows, expected)
        np.testing.assert_array_equal(values, scores[expected])


def test_positive_only():
    rows, _ = top_k(np.array([0.0, 2.0, -1.0, 1.0]), 10, positive_only=True)
    assert list(rows) == [1, 3]


@pytest.mark.parametrize("k", [0, -3, 2.5, True])
def test_bad_k(k):
    with pytest.raises(ConfigError):
        top_k(np.ones(3), k)


def rl(ids, scores):
    return RankedList(np.array(ids, dtype=object), np.array(scores, dtype=np.float32))


def test_merge_topk_by_hand():
    a, b, c = rl(["a1", "a2", "a3"], [0.9, 0.5, 0.1]), rl(["b1", "b2"], [0.7, 0.5]), rl([], [])
    merged = merge_topk([a, b, c], 4)
    assert list(merged.ids) == ["a1", "b1", "a2", "b2"]  # 0.5 tie: the earlier shard first
    np.testing.assert_allclose(merged.scores, [0.9, 0.7, 0.5, 0.5])
    assert list(merge_topk([b, a], 3).ids) == ["a1", "b1", "b2"]
    assert list(merge_topk([a, b], 99).ids) == ["a1", "b1", "a2", "b2", "a3"]  # fewer than k: all of them
    assert len(merge_topk([c, c], 5)) == 0
    with pytest.raises(ConfigError):
        merge_topk([a], 0)


def test_contiguous_bounds():
    bounds = contiguous_bounds(205, 3)
    assert bounds[0][0] == 0 and bounds[-1][1] == 205 and all(a[1] == b[0] for a, b in itertools.pairwise(bounds))
    assert max(b - a for a, b in bounds) - min(b - a for a, b in bounds) <= 1
    with pytest.raises(ConfigError, match="at most one shard per document"):
        contiguous_bounds(2, 3)
    with pytest.raises(ConfigError, match="must be positive"):
        contiguous_bounds(2, 0)
