"""Concurrent writers lose nothing; readers never fail while writers commit (whole documents and passages, processes)."""

import pytest

from tests.harness import concurrency


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["engine", "passages"])
def test_concurrent_writers_lose_no_update(tmp_path, kind):
    result = concurrency.writers(kind, trials=3, workdir=tmp_path)  # >= 10 trials: benchmarks/concurrency.py
    assert result["runs"] >= 12
    assert result["lost"] == 0 and result["refused"] == 0, result


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["engine", "passages"])
def test_readers_never_fail_while_a_writer_commits(tmp_path, kind):
    # 8 threads and 20 commits: benchmarks/concurrency.py (8 threads starve the index's writer for minutes here)
    result = concurrency.readers(kind, commits=6, workdir=tmp_path, threads=2)
    assert result["reads"] > 0 and result["failures"] == 0 and result["wrong"] == 0, result
    assert result["versions_seen"] >= 2
