"""`twostage serve`: every endpoint, every bad request, the API key and read-only modes, batching across requests."""

from __future__ import annotations

import json
import logging
import os
import shutil
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

pytest.importorskip("fastapi")
from fastapi.testclient import TestClient

from twostage import Document, SearchEngine
from twostage.app.batching import MicroBatcher
from twostage.app.cli import main
from twostage.app.server import create_app

SAMPLE = Path(__file__).parent.parent / "data" / "sample"
KEY = "s3cret-key"


@pytest.fixture(scope="module")
def engine_dir(tmp_path_factory, models):
    retriever, reranker = models
    path = tmp_path_factory.mktemp("served") / "eng"
    SearchEngine.build(SAMPLE, path, retriever=retriever, reranker=reranker, precision="fp32").close()
    return path


@pytest.fixture
def fresh(engine_dir, tmp_path):
    """A copy of the engine that a test may change."""
    path = tmp_path / "eng"
    shutil.copytree(engine_dir, path)
    return path


def client_of(path: Path, **options) -> TestClient:
    return TestClient(create_app(path, **options), raise_server_exceptions=False)


def test_search_returns_hits_with_stage_scores_and_timings(engine_dir):
    direct = SearchEngine.load(engine_dir).search("cats purring", k=5)
    with client_of(engine_dir) as client:
        r = client.post("/search", json={"query": "cats purring", "k": 5})
        assert r.status_code == 200, r.text
        body = r.json()
        assert [h["id"] for h in body["hits"]] == direct.ids
        hit = body["hits"][0]
        assert set(hit) >= {"id", "rank", "score", "title", "passage", "metadata", "stage_scores"}
        assert hit["text"] is None and set(hit["passage"]) == {"text", "start", "end", "spans"}
        assert {"first_stage", "rerank"} <= set(hit["stage_scores"])
        assert {"encode", "bm25", "dense", "rerank", "fetch", "total"} <= set(body["timings_ms"])
        assert body["version"] == SearchEngine.load(engine_dir).version
        full = client.post("/search", json={"query": "cats purring", "k": 2, "full_text": True}).json()
        p = full["hits"][0]["passage"]
        assert full["hits"][0]["text"][p["start"]:p["end"]] == p["text"]
        assert all(0 <= a < b <= len(p["text"]) for a, b in p["spans"])
        first = client.post("/search", json={"query": "cats purring", "k": 3, "rerank": False,
                                             "first_stage": "bm25"}).json()
        assert "rerank" not in first["hits"][0]["stage_scores"]
        assert "encode" not in first["timings_ms"]


def test_batch_equals_one_at_a_time(engine_dir):
    queries = ["cats purring", "ocean tides and the moon", "how do vaccines work"]
    with client_of(engine_dir) as client:
        single = [client.post("/search", json={"query": q, "k": 4}).json() for q in queries]
        batch = client.post("/search/batch", json={"queries": queries, "k": 4})
        assert batch.status_code == 200, batch.text
        results = batch.json()["results"]
        assert [[h["id"] for h in r["hits"]] for r in results] == [[h["id"] for h in r["hits"]] for r in single]
        assert [r["query"] for r in results] == queries


@pytest.mark.parametrize(("body", "status", "words"), [
    ({"query": ""}, 422, "query"),
    ({"query": "   "}, 422, "blank"),
    ({"query": "cats", "k": 0}, 422, "k"),
    ({"query": "cats", "k": 1001}, 422, "k"),
    ({"query": "cats", "k": "many"}, 422, "k"),
    ({"query": "cats", "rerank_depth": 0}, 422, "rerank_depth"),
    ({"query": "cats", "colour": "red"}, 422, "colour"),
    ({"query": "cats", "first_stage": "magic"}, 422, "first_stage"),
    ({"query": "cats", "where": {"topic": {"gt": 3}}}, 400, "where.topic: takes a number"),
    ({"query": "cats", "where": {"topic": {"$gt": 3}}}, 400, "$gt does not apply to a string field"),
    ({"query": "cats", "where": {"topic": {"$regex": "a"}}}, 400, "unknown operator '$regex'"),
    ({"query": "cats", "where": {"no_such_field": 1}}, 400, "no_such_field"),
    ({"query": "cats", "where": [1]}, 422, "where"),
    ({"query": "cats", "offset": -1}, 422, "offset"),
    ({"query": "cats", "offset": 500}, 400, "offset 500 is past"),
    ({"query": "cats", "dense_weight": 2}, 422, "dense_weight"),
    ({"query": "cats", "fusion": "max"}, 422, "fusion"),
    ({"query": "cats", "page_token": "garbage"}, 400, "page_token"),
    ({"k": 3}, 422, "query"),
    ([1, 2], 422, "body"),
])
def test_bad_search_requests_get_a_4xx_naming_the_problem(engine_dir, body, status, words):
    with client_of(engine_dir) as client:
        r = client.post("/search", json=body)
    assert r.status_code == status, r.text
    assert words in r.json()["error"]
    assert "Traceback" not in r.text


def test_malformed_missing_and_oversized_bodies(engine_dir):
    with client_of(engine_dir, max_body_bytes=2000) as client:
        r = client.post("/search", content=b'{"query": "cats",', headers={"content-type": "application/json"})
        assert r.status_code == 400 and "malformed JSON" in r.json()["error"]
        r = client.post("/search")
        assert r.status_code == 400 and "JSON body" in r.json()["error"]
        r = client.post("/search", json={"query": "cats " * 1000})
        assert r.status_code == 413 and "2000 bytes" in r.json()["error"]

        def chunks():  # no content-length: the limit holds for a streamed body too
            for _ in range(10):
                yield b" " * 500

        r = client.post("/search", content=chunks(), headers={"content-type": "application/json"})
        assert r.status_code == 413
        r = client.post("/search/batch", json={"queries": []})
        assert r.status_code == 422 and "queries" in r.json()["error"]
        r = client.post("/search/batch", json={"queries": ["cats", " "]})
        assert r.status_code == 422 and "query #2" in r.json()["error"]
        r = client.get("/nowhere")
        assert r.status_code == 404 and r.json() == {"error": "Not Found"}
        r = client.put("/search", json={"query": "cats"})
        assert r.status_code == 405 and "error" in r.json()


def test_add_upsert_delete_through_the_api(fresh):
    with client_of(fresh) as client:
        before = client.get("/health").json()
        new = {"id": "new-1", "title": "Zebra migration", "text": "zebras cross the serengeti plains every year",
               "metadata": {"year": 2024}}
        r = client.post("/documents", json={"documents": [new]})
        assert r.status_code == 200, r.text
        assert r.json()["documents"] == before["documents"] + 1 and r.json()["version"] != before["version"]
        hits = client.post("/search", json={"query": "zebras serengeti", "k": 3, "where": {"year": 2024}}).json()
        assert [h["id"] for h in hits["hits"]] == ["new-1"] and hits["version"] == r.json()["version"]
        r = client.post("/documents", json={"documents": [new]})
        assert r.status_code == 400 and "new-1" in r.json()["error"]
        r = client.post("/documents", json={"documents": [new, new], "upsert": True})
        assert r.status_code == 422 and "appears twice" in r.json()["error"]
        r = client.post("/documents", json={"documents": [{**new, "text": "giraffes"}], "upsert": True})
        assert r.status_code == 200 and r.json()["documents"] == before["documents"] + 1
        r = client.post("/documents", json={"documents": [{"id": "x", "body": "typo"}]})
        assert r.status_code == 422 and "body" in r.json()["error"]
        r = client.request("DELETE", "/documents", json={"ids": ["new-1", "ghost"]})
        assert r.status_code == 400 and "ghost" in r.json()["error"]
        r = client.request("DELETE", "/documents", json={"ids": ["new-1"]})
        assert r.status_code == 200 and r.json()["documents"] == before["documents"]
        assert "new-1" not in SearchEngine.load(fresh, verify=True)


def test_api_key_guards_writes_only(fresh, monkeypatch):
    doc = {"documents": [{"id": "k-1", "text": "keyed document"}]}
    with client_of(fresh, api_key=KEY) as client:
        assert client.post("/search", json={"query": "cats"}).status_code == 200
        r = client.post("/documents", json=doc)
        assert r.status_code == 401 and "API key" in r.json()["error"]
        assert r.headers["www-authenticate"] == "Bearer"
        assert client.post("/documents", json=doc, headers={"Authorization": "Bearer wrong"}).status_code == 401
        assert client.request("DELETE", "/documents", json={"ids": ["k-1"]}).status_code == 401
        assert client.post("/documents", json=doc, headers={"Authorization": f"Bearer {KEY}"}).status_code == 200
        r = client.request("DELETE", "/documents", json={"ids": ["k-1"]}, headers={"X-API-Key": KEY})
        assert r.status_code == 200
        assert client.get("/stats").json()["api_key"] is True
    with pytest.raises(ValueError, match="empty"):
        create_app(fresh, api_key="")


def test_read_only_refuses_writes(fresh):
    version = SearchEngine.load(fresh).version
    with client_of(fresh, read_only=True) as client:
        assert client.post("/search", json={"query": "cats"}).status_code == 200
        r = client.post("/documents", json={"documents": [{"id": "r-1", "text": "x"}]})
        assert r.status_code == 403 and "read-only" in r.json()["error"]
        assert client.request("DELETE", "/documents", json={"ids": ["d1"]}).status_code == 403
    assert SearchEngine.load(fresh).version == version


def test_server_error_is_logged_and_leaks_nothing(engine_dir, caplog, monkeypatch):
    app = create_app(engine_dir)

    def broken(*args, **kwargs):
        raise RuntimeError("secret detail /etc/internal/path")

    monkeypatch.setattr(app.state.holder.engine, "search_batch", broken)
    with TestClient(app, raise_server_exceptions=False) as client, caplog.at_level(logging.ERROR):
        r = client.post("/search", json={"query": "cats"})
    assert r.status_code == 500
    assert "secret" not in r.text and "internal server error" in r.json()["error"]
    assert any("secret detail" in (rec.exc_text or "") or rec.exc_info for rec in caplog.records)


def test_health_stats_and_page(engine_dir):
    with client_of(engine_dir) as client:
        for q in ("cats", "dogs", "moon"):
            client.post("/search", json={"query": q})
        client.post("/search", json={"query": ""})
        health = client.get("/health").json()
        assert health["status"] == "ok" and health["documents"] == 205
        stats = client.get("/stats").json()
        assert stats["engine"]["documents"] == 205 and stats["engine"]["version"] == health["version"]
        assert stats["requests"]["POST /search"] == 4 and stats["responses"]["422"] == 1
        assert stats["latency_ms"]["total"]["count"] == 3
        assert stats["latency_ms"]["rerank"]["p50"] <= stats["latency_ms"]["rerank"]["p99"]
        assert stats["batching"]["reranker"]["requests"] == 3
        page = client.get("/")
        assert page.status_code == 200 and 'id="search"' in page.text and "/search" in page.text
        assert "/search" in client.get("/openapi.json").json()["paths"]


def test_concurrent_searches_share_batches_and_survive_commits(fresh):
    queries = [f"cats and dogs {i}" for i in range(8)] + ["ocean tides", "vaccines"]
    expected = {q: SearchEngine.load(fresh).search(q, k=5).ids for q in queries}
    failures: list[str] = []
    with client_of(fresh, max_wait_ms=50) as client:
        start = threading.Barrier(len(queries) + 1)

        def reader(q: str) -> None:
            start.wait()
            for _ in range(3):
                r = client.post("/search", json={"query": q, "k": 5})
                if r.status_code != 200:
                    failures.append(r.text)
                elif r.json()["version"] == "v000001" and [h["id"] for h in r.json()["hits"]] != expected[q]:
                    failures.append(f"{q}: {r.json()['hits']}")

        threads = [threading.Thread(target=reader, args=(q,)) for q in queries]
        for t in threads:
            t.start()
        start.wait()
        w = client.post("/documents", json={"documents": [{"id": f"c-{i}", "text": f"concurrent doc {i}"}
                                                           for i in range(5)]})
        for t in threads:
            t.join()
        assert w.status_code == 200, w.text
        assert failures == []
        stats = client.get("/stats").json()["batching"]
        assert stats["encoder"]["requests"] == 3 * len(queries) + 1  # the write's documents go through it too (#79)
        assert stats["encoder"]["largest_call_requests"] > 1, stats
        assert stats["encoder"]["model_calls"] < stats["encoder"]["requests"]


def test_a_version_committed_by_another_process_is_picked_up(fresh):
    with client_of(fresh) as client:
        app_engine = client.app.state.holder
        old = app_engine.engine.version
        SearchEngine.load(fresh).add([Document("ext-1", "walruses on the ice floe", "Walrus")])
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline:
            body = client.post("/search", json={"query": "walruses ice floe", "k": 1, "first_stage": "bm25",
                                                "rerank": False}).json()
            if body["version"] != old:
                break
            time.sleep(0.1)
        assert body["version"] != old and body["hits"][0]["id"] == "ext-1"


def test_micro_batcher_splits_results_and_errors():
    calls: list[int] = []

    def double(items, group):
        calls.append(len(items))
        if "boom" in items:
            raise ValueError("boom")
        return [x * 2 for x in items]

    b = MicroBatcher(double, name="t", max_wait_s=0.05, expected=lambda: 4)
    out: dict[int, list] = {}
    threads = [threading.Thread(target=lambda i=i: out.__setitem__(i, b([f"{i}a", f"{i}b"][: i % 2 + 1])))
               for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert out == {i: [f"{i}a" * 2, f"{i}b" * 2][: i % 2 + 1] for i in range(4)}
    assert sum(calls) == 6 and b.stats.requests == 4
    with pytest.raises(ValueError, match="boom"):
        b(["boom"])
    assert b(["ok"]) == ["okok"]  # the worker lives on after an error
    b.close()
    with pytest.raises(RuntimeError, match="closed"):
        b(["late"])


def test_micro_batcher_a_bad_item_fails_its_own_caller_only():
    calls: list[list[str]] = []

    def upper(items, group):
        calls.append(list(items))
        if "boom" in items:
            raise ValueError("boom")
        return [x.upper() for x in items]

    b = MicroBatcher(upper, name="t", max_wait_s=0.2, expected=lambda: 3)
    out: dict[int, object] = {}

    def call(i: int, items: list[str]) -> None:
        try:
            out[i] = b(items)
        except ValueError as exc:
            out[i] = exc

    threads = [threading.Thread(target=call, args=(i, items)) for i, items in
               enumerate([["a"], ["boom"], ["c", "d"]])]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    b.close()
    assert out[0] == ["A"] and out[2] == ["C", "D"] and isinstance(out[1], ValueError)
    assert any(len(c) > 2 for c in calls), "the three callers shared one batch first"


def test_micro_batcher_puts_small_calls_before_the_pieces_of_a_bulk_call():
    order: list[tuple[str, ...]] = []
    gate, running = threading.Event(), threading.Event()

    def record(items, group):
        if items[0] == "bulk-0":
            running.set()
            gate.wait(5)  # the bulk call's first piece runs while a search arrives
        order.append(tuple(items))
        return list(items)

    b = MicroBatcher(record, name="t", max_wait_s=0, piece=2, bulk_over=2)
    bulk = threading.Thread(target=lambda: b([f"bulk-{i}" for i in range(6)]))
    bulk.start()
    assert running.wait(5)
    small: list = []
    search = threading.Thread(target=lambda: small.append(b(["search"], "query")))
    search.start()
    time.sleep(0.1)
    gate.set()
    bulk.join()
    search.join()
    b.close()
    assert small == [["search"]]
    assert order[0] == ("bulk-0", "bulk-1") and order[1] == ("search",), order
    assert [x for piece in order if piece != ("search",) for x in piece] == [f"bulk-{i}" for i in range(6)]


def test_cli_serve_bad_inputs(engine_dir, tmp_path, capsys, monkeypatch):
    monkeypatch.delenv("TWOSTAGE_TEST_KEY", raising=False)
    assert main(["serve", str(engine_dir), "--api-key-env", "TWOSTAGE_TEST_KEY"]) == 2
    assert "TWOSTAGE_TEST_KEY" in capsys.readouterr().err
    assert main(["serve", str(tmp_path / "nothing")]) == 2
    assert "no such engine directory" in capsys.readouterr().err
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        assert main(["serve", str(engine_dir), "--port", str(taken.getsockname()[1])]) == 2
        err = capsys.readouterr().err
        assert "--port" in err and err.count("\n") == 1


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_cli_serve_answers_over_http(engine_dir):
    import httpx

    port = _free_port()
    env = {**os.environ, "TWOSTAGE_TEST_KEY": KEY}
    proc = subprocess.Popen([sys.executable, "-m", "twostage", "serve", str(engine_dir), "--port", str(port),
                             "--api-key-env", "TWOSTAGE_TEST_KEY", "--fast"], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        url = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            try:
                if httpx.get(f"{url}/health", timeout=1).status_code == 200:
                    break
            except httpx.HTTPError:
                assert proc.poll() is None, proc.stderr.read()
                time.sleep(0.3)
        r = httpx.post(f"{url}/search", json={"query": "cats purring", "k": 3}, timeout=30)
        assert r.status_code == 200 and len(r.json()["hits"]) == 3
        r = httpx.post(f"{url}/documents", json={"documents": [{"id": "z", "text": "z"}]}, timeout=30)
        assert r.status_code == 401
    finally:
        proc.terminate()
        out, err = proc.communicate(timeout=30)
    assert "serving" in out and f":{port}/" in out
    assert "Traceback" not in err, err
    assert json.loads(json.dumps(r.json()))["error"]


def test_bulk_pieces_wait_while_searches_run_but_a_search_never_waits_for_itself():
    from twostage.app.batching import serving_search

    busy, order = [1], []

    def record(items, group):
        order.append(tuple(items))
        return list(items)

    b = MicroBatcher(record, name="t", max_wait_s=0, piece=2, bulk_over=2, busy=lambda: busy[0], max_defer_s=5)
    bulk = threading.Thread(target=lambda: b(["x1", "x2", "x3"]))
    bulk.start()
    time.sleep(0.3)
    assert order == []  # held while a search runs
    assert b(["s"]) == ["s"] and order == [("s",)]  # a small call goes first, the piece waits on
    busy[0] = 0
    bulk.join(5)
    assert order == [("s",), ("x1", "x2", "x3")]  # no search running: its pieces computed together (#79)
    busy[0] = 1
    t = time.perf_counter()
    with serving_search():  # a search's own bulk call (a deep rerank, a batch of queries) is never held back
        assert b(["y1", "y2", "y3"]) == ["y1", "y2", "y3"]
    assert time.perf_counter() - t < 1
    b.close()


def test_the_search_options_are_named_once():
    """The HTTP request's fields and the `twostage search` flags are made from the one description of the search
    options: every option is both, with its range and help, and the Python keywords are its names."""
    from twostage.app.cli import build_parser
    from twostage.app.server import SearchOptions
    from twostage.engine.knobs import KNOBS
    from twostage.engine.options import SEARCH_OPTIONS

    assert KNOBS == tuple(o.name for o in SEARCH_OPTIONS)
    fields = SearchOptions.model_fields
    search = next(a for a in build_parser()._actions if getattr(a, "choices", None) and "search" in a.choices)
    flags = {f: action for action in search.choices["search"]._actions for f in action.option_strings}
    for o in SEARCH_OPTIONS:
        assert fields[o.name].description == o.help == flags[o.flag].help, o.name
        assert (flags[o.flag].choices or ()) == o.choices
    with pytest.raises(Exception, match="less than or equal to 1"):
        SearchOptions(dense_weight=2)
    assert SearchOptions(rerank_blend="none").rerank_blend == "none"
