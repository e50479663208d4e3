import numpy as np
import pytest

from twostage.indexer.errors import ConfigError
from twostage.indexer.topk import top_k


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
