"""BM25 on the real SciFact test split (the shared data beside the repository)."""

import pytest

from tests.conftest import shared_dataset
from twostage.eval.harness import run_bench


@pytest.mark.slow
def test_bm25_scifact_reaches_the_published_lucene_numbers():
    result = run_bench(shared_dataset("scifact"), "test", "bm25")
    assert len(result.split.queries) == 300
    row = result.table().loc["bm25"]
    assert row["ndcg@10"] >= 0.68 and row["recall@100"] >= 0.90
