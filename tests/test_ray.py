"""Ray encoding of an engine's corpus, on a local Ray instance (skipped when Ray is not installed)."""

import sys

import numpy as np
import pytest

from twostage.indexer.errors import MissingDependencyError


@pytest.fixture(scope="module")
def ray_local():
    ray = pytest.importorskip("ray")
    ray.init(address="local", num_cpus=2, include_dashboard=False, log_to_driver=False)
    yield ray
    ray.shutdown()


@pytest.mark.parametrize("passages", [0, 8])
def test_ray_encoding_writes_the_engine_one_process_writes(ray_local, tmp_path, tiny_bert_dir, sample_dir, passages):
    from twostage.engine.search_engine import SearchEngine

    shape = {"passage_words": passages, "passage_stride": passages // 2} if passages else {"passage_words": 0}
    common = {"retriever": str(tiny_bert_dir), "backend": "flat", "precision": "fp32", "chunk_size": 37, **shape}
    serial = SearchEngine.build(sample_dir, tmp_path / "serial", **common)
    ray = SearchEngine.build(sample_dir, tmp_path / "ray", ray_actors=2, **common)  # a chunk cut in two slices
    loaded = SearchEngine.load(tmp_path / "ray")  # the normal loader, checksums verified
    assert list(loaded.index.doc_ids) == list(serial.index.doc_ids)  # row order kept across actors and chunks
    every = np.arange(serial.index.manifest.rows)
    np.testing.assert_allclose(loaded.index.rows(every), serial.index.rows(every), atol=1e-5)
    assert loaded.manifest.retriever == serial.manifest.retriever
    queries = ["why do cats purr", "how to bake bread"]
    for a, b in zip(loaded.search_batch(queries, k=5), serial.search_batch(queries, k=5)):
        assert [h.doc_id for h in a.hits] == [h.doc_id for h in b.hits]
    del ray


def test_without_ray_the_error_says_how_to_install(monkeypatch):
    from twostage.indexer.ray_util import require_ray

    monkeypatch.setitem(sys.modules, "ray", None)  # import ray -> ImportError
    with pytest.raises(MissingDependencyError, match=r"pip install 'twostage-search\[ray\]'"):
        require_ray()
