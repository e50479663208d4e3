"""Writes and batches with a work budget (#79): the rows a write makes and the pairs a batch asks for are counted
before the work, a write's token vectors are held as codes a piece at a time, a stopped request (client gone, past
its deadline) ends at the next stage boundary and leaves the shared batches, expensive requests wait behind the
searches, non-finite metadata, foreign hosts and origins are refused, and a write killed mid-way leaves nothing
after the next open."""

from __future__ import annotations

import json
import shutil
import threading
import time
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("fastapi")
from fastapi.testclient import TestClient

from twostage import Document, SearchEngine
from twostage.app.batching import MicroBatcher
from twostage.app.budgets import Budgets
from twostage.app.server import allowed_hosts_for, create_app
from twostage.engine.pages import KEY_FILE
from twostage.indexer.errors import DataError, WorkStopped
from twostage.indexer.passages import PassageShape, rows_of, split_all
from twostage.indexer.records import check_metadata
from twostage.indexer.versions import current_version, writer_lock
from twostage.indexer.work import WorkScope, checkpoint

SAMPLE = Path(__file__).parent.parent / "data" / "sample"


@pytest.fixture(scope="module")
def served(tmp_path_factory, models):
    retriever, reranker = models
    path = tmp_path_factory.mktemp("budget") / "eng"
    SearchEngine.build(SAMPLE, path, retriever=retriever, reranker=reranker, precision="fp32", backend="flat",
                       rerank_blend=0.5, late_interaction=retriever, device="cpu").close()
    return path


@pytest.fixture
def fresh(served, tmp_path):
    path = tmp_path / "eng"
    shutil.copytree(served, path, ignore=shutil.ignore_patterns("LOCK", KEY_FILE))
    return path


def client_of(path: Path, **options) -> TestClient:
    return TestClient(create_app(path, **options), raise_server_exceptions=False)


# ---- the scope a request's work runs in --------------------------------------------------------------------------
def test_a_scope_stops_its_work_at_the_next_checkpoint_and_only_its_own():
    checkpoint()  # outside any scope: never raises
    scope = WorkScope()
    with scope:
        checkpoint()
        scope.cancel("its client disconnected")
        with pytest.raises(WorkStopped, match="client disconnected") as info:
            checkpoint()
        assert not info.value.timed_out
    checkpoint()
    late = WorkScope(deadline_s=0.01)
    time.sleep(0.02)
    with late, pytest.raises(WorkStopped, match="time limit of 0.01 s") as info:
        checkpoint()
    assert info.value.timed_out
    with pytest.raises(ValueError):
        WorkScope(deadline_s=0)


def test_a_stopped_search_ends_at_a_stage_boundary(served):
    engine = SearchEngine.load(served)
    scope = WorkScope()
    scope.cancel("gone")
    with scope, pytest.raises(WorkStopped):
        engine.search("why does snow form", 5)
    assert engine.search("why does snow form", 5).hits  # the engine is as it was


def test_a_batcher_drops_the_calls_of_a_stopped_request():
    seen: list[int] = []

    def fn(items, _):
        seen.extend(items)
        return list(items)

    batcher = MicroBatcher(fn, name="t", piece=2, bulk_over=2)
    try:
        assert batcher([1, 2, 3, 4, 5]) == [1, 2, 3, 4, 5]
        scope = WorkScope()
        scope.cancel("gone")
        seen.clear()
        with scope, pytest.raises(WorkStopped):
            batcher([1, 2, 3, 4, 5])
        assert seen == []  # none of its pieces ran
        assert batcher([7]) == [7]  # the others go on
    finally:
        batcher.close()


# ---- budgets counted before the work ---------------------------------------------------------------------------
def test_rows_are_counted_as_the_engine_cuts_them():
    shape = PassageShape(20, 10)
    docs = [Document("a", "word " * 95), Document("b", "短" * 57), Document("c", "")]
    assert rows_of(docs, shape) == len(split_all(docs, shape))
    assert rows_of(docs, PassageShape(0, 0)) == 3


def test_a_write_over_the_row_budget_is_refused_before_any_work(fresh):
    client = client_of(fresh, budgets=Budgets(write_rows=50))
    before = current_version(fresh).name
    text = "雪" * 5000  # a CJK character is a word: 5,000 words make ~99 passages of 100 words
    r = client.post("/documents", json={"documents": [{"id": "big", "text": text}]})
    assert r.status_code == 413, r.text
    assert "--max-write-rows" in r.json()["error"] and "rows (passages)" in r.json()["error"]
    assert current_version(fresh).name == before
    ok = client.post("/documents", json={"documents": [{"id": "small", "text": "雪" * 300}]})
    assert ok.status_code == 200, ok.text


def test_the_pair_and_query_budgets_cover_batches(fresh):
    client = client_of(fresh, budgets=Budgets(search_pairs=100, maxsim_candidates=10_000))
    r = client.post("/search/batch", json={"queries": ["snow", "rain", "bread"], "rerank_depth": 40})
    assert r.status_code == 413 and "--max-search-pairs" in r.json()["error"] and "3 queries" in r.json()["error"]
    assert client.post("/search/batch", json={"queries": ["snow", "rain"], "rerank_depth": 40}).status_code == 200
    assert client.post("/search", json={"query": "snow", "rerank_depth": 101}).status_code == 413
    r = client.post("/search/batch", json={"queries": ["snow", "x" * 10_001]})
    assert r.status_code == 422 and "queries.1" in r.json()["error"]
    r = client.post("/search/batch", json={"queries": ["snow"] * 300, "maxsim_depth": 50})
    assert r.status_code == 422  # more queries than a batch holds
    many = client_of(fresh, budgets=Budgets(maxsim_candidates=100))
    r = many.post("/search/batch", json={"queries": ["snow", "rain", "bread"], "maxsim_depth": 50})
    assert r.status_code == 413 and "--max-maxsim-candidates" in r.json()["error"]


def test_a_request_past_its_deadline_is_a_503_and_changes_nothing(fresh):
    client = client_of(fresh, request_timeout=1e-6)
    before = current_version(fresh).name
    r = client.post("/search", json={"query": "why does snow form"})
    assert r.status_code == 503 and "--request-timeout" in r.json()["error"]
    r = client.post("/documents", json={"documents": [{"id": "late-1", "text": "snow"}]})
    assert r.status_code == 503
    assert current_version(fresh).name == before


def test_expensive_requests_wait_behind_the_searches(fresh):
    app = create_app(fresh, expensive_wait_s=0.2)
    client = TestClient(app, raise_server_exceptions=False)
    held, release = threading.Event(), threading.Event()

    def hold():
        with app.state.admission.expensive("the test"):
            held.set()
            release.wait(10)

    t = threading.Thread(target=hold)
    t.start()
    held.wait(5)
    try:
        r = client.post("/search/batch", json={"queries": ["snow", "rain"]})
        assert r.status_code == 503 and r.headers["retry-after"] and "--max-expensive" in r.json()["error"]
        assert client.post("/search", json={"query": "snow"}).status_code == 200  # a search never waits
    finally:
        release.set()
        t.join()
    assert client.post("/search/batch", json={"queries": ["snow", "rain"]}).status_code == 200


# ---- writes: streamed token vectors, refused input, leftovers --------------------------------------------------
def test_a_write_codes_its_token_vectors_a_piece_at_a_time(served, tmp_path, monkeypatch):
    from twostage.engine import writes
    from twostage.indexer.tokens import maxsim

    shutil.copytree(served, tmp_path / "e", ignore=shutil.ignore_patterns("LOCK"))
    monkeypatch.setattr(writes, "WRITE_PIECE", 3)
    engine = SearchEngine.load(tmp_path / "e")
    docs = [Document(f"n-{i}", f"snow {i} falls on the hills and the river freezes " * (1 + i % 3)) for i in range(8)]
    engine = engine.add(docs)
    late = engine.late
    q = late.encode_tokens(["snow on the hills"], kind="query")[0]
    ids = engine.passage_ids([d.id for d in docs])
    texts = [p.full_text for p in engine.passages(ids)]
    want = [maxsim(q, t, np.array([0, len(t)]))[0] for t in late.encode_tokens(texts, kind="document")]
    np.testing.assert_allclose(engine.token_scores(q, ids), want, atol=0.03)


@pytest.mark.parametrize("body", ['{"x": NaN}', '{"x": Infinity}', '{"x": -Infinity}', '{"x": 1e999}',
                                  '{"x": [1, {"y": NaN}]}'])
def test_non_finite_metadata_is_refused(fresh, body):
    client = client_of(fresh)
    raw = '{"documents": [{"id": "n", "text": "snow", "metadata": ' + body + '}]}'
    r = client.post("/documents", content=raw, headers={"content-type": "application/json"})
    assert r.status_code == 422 and "not a finite number" in r.json()["error"], r.text
    with pytest.raises(DataError, match="finite"):
        check_metadata(json.loads(body), "metadata")


def test_a_dataframe_s_missing_values_are_missing_fields(tmp_path):
    import pandas as pd

    from twostage.indexer.corpus import iter_documents

    frame = pd.DataFrame({"id": ["a", "b"], "text": ["x", "y"], "year": [2020.0, float("nan")]})
    docs = list(iter_documents(frame))
    assert docs[0].metadata == {"year": 2020.0} and docs[1].metadata == {}


def test_hosts_and_origins_outside_the_allowed_are_refused(fresh):
    client = client_of(fresh, allowed_hosts=["localhost", "127.0.0.1"])
    write = {"documents": [{"id": "o-1", "text": "snow"}]}
    assert client.post("/search", json={"query": "snow"}, headers={"host": "attacker.example"}).status_code == 421
    assert client.get("/health", headers={"host": "localhost:8000"}).status_code == 200
    r = client.post("/documents", json=write, headers={"host": "localhost:8000", "origin": "http://attacker.example"})
    assert r.status_code == 403 and "Origin" in r.json()["error"]
    r = client.post("/documents", json=write, headers={"host": "localhost:8000", "origin": "http://localhost:8000"})
    assert r.status_code == 200, r.text
    assert allowed_hosts_for("127.0.0.1") == ("localhost", "127.0.0.1", "::1")
    assert allowed_hosts_for("0.0.0.0") is None
    assert set(allowed_hosts_for("0.0.0.0", "a.example,B.example:80") or ()) == {"a.example", "b.example"}
    open_client = client_of(fresh)  # no host list: any Host, but still no foreign origin on writes
    r = open_client.post("/documents", json={"documents": [{"id": "o-2", "text": "x"}]},
                         headers={"origin": "http://attacker.example"})
    assert r.status_code == 403


@pytest.mark.parametrize("value", ["NaN", '"0.5"', "2", "-0.1"])
def test_a_bad_diversity_names_its_field(fresh, value):
    client = client_of(fresh)
    r = client.post("/search", content='{"query": "snow", "diversity": ' + value + "}",
                    headers={"content-type": "application/json"})
    assert r.status_code == 422
    error = r.json()["error"]
    assert error.startswith("diversity:") and "bool" not in error and "number from 0 to 1" in error


def test_a_write_killed_mid_way_leaves_nothing_after_the_next_open(fresh):
    before = current_version(fresh).name
    leftover = fresh / ".v000009.tmp-deadbeef"
    (leftover / "dense").mkdir(parents=True)
    (leftover / "dense" / "vectors.npy").write_bytes(b"x" * 1000)
    (fresh / ".CURRENT.tmp-deadbeef").write_text("v000009\n")
    with writer_lock(fresh):  # a writer at work: its temporary version is left alone
        SearchEngine.load(fresh).close()
        assert leftover.exists()
    engine = SearchEngine.load(fresh)
    assert not leftover.exists() and not (fresh / ".CURRENT.tmp-deadbeef").exists()
    assert engine.version == before and len(engine) == 205
