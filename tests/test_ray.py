"""Ray encoding, on a local Ray instance (skipped when Ray is not installed)."""

import sys

import numpy as np
import pytest

from twostage.indexer.build import build_index
from twostage.indexer.errors import MissingDependencyError
from twostage.indexer.index import Index


@pytest.fixture(scope="module")
def ray_local():
    ray = pytest.importorskip("ray")
    ray.init(address="local", num_cpus=2, include_dashboard=False, log_to_driver=False)
    yield ray
    ray.shutdown()


def test_ray_encoding_equals_serial_encoding(ray_local, tmp_path, tiny_bert_dir, sample_dir):
    from twostage.retriever.biencoder import BiEncoder
    from twostage.retriever.distributed import build_index_ray

    serial = build_index(sample_dir, BiEncoder.load(tiny_bert_dir), tmp_path / "serial", backend="hnswlib")
    build_index_ray(sample_dir, tiny_bert_dir, tmp_path / "ray", backend="hnswlib", num_actors=2, chunk_size=37)
    loaded = Index.load(tmp_path / "ray")  # the normal loader, checksums verified
    assert list(loaded.doc_ids) == list(serial.doc_ids)  # corpus order kept across actors and chunks
    every = np.arange(serial.manifest.rows)
    np.testing.assert_allclose(loaded.rows(every), serial.rows(every), atol=1e-5)
    assert loaded.manifest.encoder == serial.manifest.encoder and loaded.manifest.backend == "hnswlib"
    ids = list(serial.doc_ids[:5])
    assert loaded.documents(ids) == serial.documents(ids)


def test_ray_build_reads_parquet_and_names_bad_records(ray_local, tmp_path, tiny_bert_dir, sample_dir):
    import pandas as pd

    from twostage.indexer.corpus import load_corpus
    from twostage.indexer.errors import DataError
    from twostage.retriever.distributed import build_index_ray

    frame = load_corpus(sample_dir).to_frame()
    frame.to_parquet(tmp_path / "corpus.parquet")
    index = build_index_ray(tmp_path / "corpus.parquet", tiny_bert_dir, tmp_path / "idx", backend="flat", num_actors=1)
    assert len(index) == len(frame)
    (tmp_path / "bad.jsonl").write_text('{"_id": "a", "text": "fine"}\n{"text": "no id here"}\n')
    with pytest.raises(Exception, match="_id"):  # Ray wraps worker errors; the message names what is missing
        build_index_ray(tmp_path / "bad.jsonl", tiny_bert_dir, tmp_path / "bad", backend="flat", num_actors=1)
    assert not (tmp_path / "bad").exists()
    del pd, DataError


def test_without_ray_the_error_says_how_to_install(monkeypatch):
    from twostage.indexer.ray_util import require_ray

    monkeypatch.setitem(sys.modules, "ray", None)  # import ray -> ImportError
    with pytest.raises(MissingDependencyError, match=r"pip install 'twostage-search\[ray\]'"):
        require_ray()
