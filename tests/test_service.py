"""The engine as a service (#47): Prometheus metrics, the access log, and the OpenAI / Cohere endpoints checked
with the official clients."""

from __future__ import annotations

import base64
import json
import logging

import numpy as np
import pytest

pytest.importorskip("fastapi")
from fastapi.testclient import TestClient  # noqa: E402

from twostage import Document, SearchEngine  # noqa: E402
from twostage.app.server import create_app  # noqa: E402

WORDS = "cat dog rain snow cook garden music history money star river stone".split()


@pytest.fixture(scope="module")
def engine(tmp_path_factory, models):
    retriever, reranker = models
    docs = [Document(f"d{i}", " ".join(WORDS[(i * j + i) % len(WORDS)] for j in range(1, 9))) for i in range(60)]
    eng = SearchEngine.build(docs, tmp_path_factory.mktemp("svc") / "e", retriever=retriever, reranker=reranker,
                             backend="flat", passage_words=0)
    yield eng
    eng.close()


def metric(text: str, name: str, **labels: str) -> float:
    """The value of one sample in a Prometheus exposition (0 when absent)."""
    want = ",".join(f'{k}="{v}"' for k, v in labels.items())
    for line in text.splitlines():
        if line.startswith(name + ("{" + want + "}" if want else " ")) or (want and line.startswith(name + "{")
                                                                         and all(f'{k}="{v}"' in line
                                                                                 for k, v in labels.items())):
            return float(line.rsplit(" ", 1)[1])
    return 0.0


def test_metrics_count_every_request_and_stage(engine, caplog):
    caplog.set_level(logging.INFO, logger="twostage.access")
    with TestClient(create_app(engine.root, verify=False), raise_server_exceptions=False) as client:
        for i in range(7):
            r = client.post("/search", json={"query": f"cat rain {WORDS[i]}", "k": 5},
                            headers={"X-Request-ID": f"req-{i}"})
            assert r.status_code == 200 and r.headers["X-Request-ID"] == f"req-{i}"
        for _ in range(3):
            assert client.post("/search", json={"query": "cat", "k": 0}).status_code == 422
        r = client.post("/search/batch", json={"queries": ["dog", "snow"], "k": 3})
        assert r.status_code == 200 and len(r.headers["X-Request-ID"]) == 32  # made here: no id was sent
        text = client.get("/metrics").text
    assert metric(text, "twostage_requests_total", method="POST", route="/search", status="200") == 7
    assert metric(text, "twostage_requests_total", method="POST", route="/search", status="422") == 3
    assert metric(text, "twostage_request_errors_total", method="POST", route="/search", status="422") == 3
    assert metric(text, "twostage_request_errors_total", method="POST", route="/search", status="200") == 0
    assert metric(text, "twostage_request_seconds_count", method="POST", route="/search/batch") == 1
    assert metric(text, "twostage_stage_seconds_count", stage="rerank") == 9  # 7 searches + 2 batch queries
    assert metric(text, "twostage_stage_seconds_count", stage="total") == 9
    assert metric(text, "twostage_stage_seconds_sum", stage="total") > 0
    assert metric(text, "twostage_engine_documents") == 60
    assert metric(text, "twostage_engine_info", version=engine.version) == 1
    assert metric(text, "twostage_model_load_seconds", model="retriever") > 0
    assert metric(text, "twostage_model_calls_total", model="reranker") >= 1
    lines = [json.loads(r.getMessage()) for r in caplog.records if r.name == "twostage.access"]
    assert len(lines) == 12 and [x["request_id"] for x in lines[:7]] == [f"req-{i}" for i in range(7)]
    assert {x["status"] for x in lines} == {200, 422} and all(x["ms"] > 0 for x in lines)


def test_metrics_off_and_a_hostile_request_id(engine):
    with TestClient(create_app(engine, metrics=False, batching=False), raise_server_exceptions=False) as client:
        assert client.get("/metrics").status_code == 404
        r = client.get("/health", headers={"X-Request-ID": "x;" * 200})
        assert r.status_code == 200 and len(r.headers["X-Request-ID"]) == 32  # not echoed: replaced


def test_openai_client_embeddings_equal_the_bi_encoder(engine):
    openai = pytest.importorskip("openai")
    texts = ["why do cats purr", "rain and snow in the garden", "a"]
    with TestClient(create_app(engine, batching=False), raise_server_exceptions=False) as http:
        client = openai.OpenAI(base_url="http://testserver/v1", api_key="unused", http_client=http)
        want = engine.encoder.encode(texts, kind="document")
        for fmt in ("float", None, "base64"):  # None: the client asks for base64 itself and decodes it
            got = client.embeddings.create(model="twostage", input=texts,
                                           **({"encoding_format": fmt} if fmt else {}))
            vectors = [np.frombuffer(base64.b64decode(d.embedding), dtype="<f4") if fmt == "base64" else d.embedding
                       for d in got.data]
            np.testing.assert_allclose(np.array(vectors), want, rtol=0, atol=1e-5)
            assert [d.index for d in got.data] == [0, 1, 2] and got.usage.prompt_tokens > 0
        one = client.embeddings.create(model="twostage", input="why do cats purr",
                                       extra_body={"input_type": "query"})
        np.testing.assert_allclose(one.data[0].embedding, engine.encoder.encode(["why do cats purr"],
                                                                                kind="query")[0], atol=1e-5)
        with pytest.raises(openai.UnprocessableEntityError):
            client.embeddings.create(model="twostage", input=[])
        for bad in ({"input": [[1, 2, 3]]}, {"input": ""}, {"input": ["ok"], "dimensions": 7},
                    {"input": ["ok"], "encoding_format": "int8"}, {}):
            r = http.post("/v1/embeddings", json=bad)
            assert r.status_code == 422 and "error" in r.json(), (bad, r.text)


def test_cohere_client_rerank_equals_the_engine(engine):
    cohere = pytest.importorskip("cohere")
    query = "cat rain garden"
    hits = engine.search(query, k=8).hits
    texts = [h.text for h in hits]
    want = {h.id: h.stage_scores["rerank"] for h in hits}
    with TestClient(create_app(engine.root, verify=False), raise_server_exceptions=False) as http:
        # a number for timeout: without one cohere passes httpx's own "client default" marker, which the TestClient's
        # httpx2 (2.17) refuses
        client = cohere.ClientV2(api_key="unused", base_url="http://testserver", httpx_client=http, timeout=60)
        got = client.rerank(model="twostage", query=query, documents=texts, top_n=5)
        assert len(got.results) == 5
        scores = [r.relevance_score for r in got.results]
        assert scores == sorted(scores, reverse=True)
        for r in got.results:
            assert abs(r.relevance_score - want[hits[r.index].id]) < 1e-5
        v1 = http.post("/v1/rerank", json={"query": query, "documents": [{"text": t} for t in texts],
                                            "return_documents": True}).json()
        assert len(v1["results"]) == 8 and v1["results"][0]["document"]["text"] in texts
        for bad in ({"query": "", "documents": ["a"]}, {"query": "q", "documents": []}, {"query": "q"},
                    {"query": "q", "documents": ["a"], "top_n": 0}, {"query": "q", "documents": [{"txt": "a"}]}):
            r = http.post("/v1/rerank", json=bad)
            assert r.status_code == 422 and "error" in r.json(), (bad, r.text)


def test_rerank_without_a_reranker_is_a_409(tmp_path, models):
    eng = SearchEngine.build([Document("a", "cat"), Document("b", "dog")], tmp_path / "e", retriever=models[0],
                             backend="flat")
    with TestClient(create_app(eng, batching=False), raise_server_exceptions=False) as http:
        r = http.post("/v1/rerank", json={"query": "cat", "documents": ["cat", "dog"]})
        assert r.status_code == 409 and "no reranker" in r.json()["error"]
    eng.close()
