"""The service under a hostile client (#61): budgets bound each request's work before it starts, one client's bad
input or bulk call never fails or stalls another's search, metric labels stay bounded, page tokens and versions
cannot be abused, and a swap checks the new model's files before any heavy work."""

from __future__ import annotations

import json
import os
import random
import shutil
import threading
import time
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("fastapi")
from fastapi.testclient import TestClient

from twostage import Document, SearchEngine
from twostage.app.budgets import Budgets
from twostage.app.cli import main
from twostage.app.server import create_app
from twostage.engine.pages import KEY_FILE, PageToken, encode_page_token, page_key
from twostage.indexer.errors import ConfigError, DataError
from twostage.indexer.records import check_encodable, check_metadata

SAMPLE = Path(__file__).parent.parent / "data" / "sample"
KEY = "hostile-key"
SURROGATE = "\ud800"


@pytest.fixture(scope="module")
def served(tmp_path_factory, models):
    retriever, reranker = models
    path = tmp_path_factory.mktemp("hostile") / "eng"
    SearchEngine.build(SAMPLE, path, retriever=retriever, reranker=reranker, precision="fp32", backend="flat").close()
    return path


@pytest.fixture
def fresh(served, tmp_path):
    path = tmp_path / "eng"
    shutil.copytree(served, path, ignore=shutil.ignore_patterns("LOCK", KEY_FILE))
    return path


def client_of(path: Path, **options) -> TestClient:
    return TestClient(create_app(path, **options), raise_server_exceptions=False)


# ---- one client's bad input fails its own request only ---------------------------------------------------------
@pytest.mark.parametrize("route, body", [
    ("/v1/embeddings", {"input": ["fine", f"bad {SURROGATE} text"]}),
    ("/v1/embeddings", {"input": f"x{SURROGATE}", "input_type": "query"}),
    ("/search/batch", {"queries": ["cats", f"dogs {SURROGATE}"]}),
    ("/search", {"query": f"cats {SURROGATE}"}),
    ("/v1/rerank", {"query": "cats", "documents": ["ok", f"x{SURROGATE}y"]}),
    ("/v1/rerank", {"query": f"cats{SURROGATE}", "documents": ["ok"]}),
    ("/documents", {"documents": [{"id": "d1", "text": f"t{SURROGATE}"}]}),
    ("/documents", {"documents": [{"id": "d1", "text": "t", "metadata": {f"k{SURROGATE}": 1}}]}),
    ("/documents", {"documents": [{"id": "d1", "text": "t", "metadata": {"k": [f"v{SURROGATE}"]}}]}),
])
def test_a_lone_surrogate_is_a_4xx_naming_it(fresh, route, body):
    with client_of(fresh, api_key=KEY) as client:
        raw = json.dumps(body)  # json escapes the surrogate as \ud800, as a hostile client sends it
        r = client.post(route, content=raw, headers={"content-type": "application/json", "x-api-key": KEY})
        assert 400 <= r.status_code < 500, r.text
        assert "surrogate" in r.json()["error"]
        assert client.post("/search", json={"query": "cats purring"}).status_code == 200


def test_an_answer_holding_a_lone_surrogate_is_escaped_not_a_500(fresh, monkeypatch):
    """Inputs are checked for lone surrogates; should one still reach an answer (by any path), the answer is
    written with JSON escapes instead of failing serialisation as a 500 (once seen in the 10,000-request fuzz)."""
    from twostage.app import server

    real = server._search_out
    monkeypatch.setattr(server, "_search_out", lambda result, version, body:
                        real(result, version, body).model_copy(update={"query": f"cats{SURROGATE}"}))
    with client_of(fresh) as client:
        for route, body in (("/search", {"query": "cats purring"}), ("/search/batch", {"queries": ["cats"]})):
            r = client.post(route, json=body)
            assert r.status_code == 200, r.text
            got = r.json()
            assert (got.get("query") or got["results"][0]["query"]) == f"cats{SURROGATE}"
            assert r.content.isascii()


def test_a_metadata_integer_past_float64_is_a_4xx_not_a_500_at_the_next_filter(fresh):
    """Found by the 10,000-request fuzz: a document added with {"n": 10**400} made every later filtered search a 500
    (OverflowError building the metadata table). Now the add is refused naming the field; the engine is unchanged."""
    with client_of(fresh, api_key=KEY) as client:
        body = '{"documents": [{"id": "big", "text": "t", "metadata": {"n": 1' + "0" * 400 + '}}]}'
        r = client.post("/documents", content=body, headers={"content-type": "application/json", "x-api-key": KEY})
        assert r.status_code == 422 and "too large for a metadata number" in r.json()["error"], r.text
        assert client.post("/search", json={"query": "cats", "where": {"year": {"$gte": 1}}}).status_code != 500
    check_metadata({"n": 10**300, "m": [-(10**300)]}, "metadata")  # within range: fine
    with pytest.raises(DataError, match=r"metadata\.m: the number"):
        check_metadata({"m": [10**309]}, "metadata")


def test_poison_never_fails_concurrent_searches(served):
    """Searches batched with a poisoned embeddings or rerank call all succeed; the poison gets its 4xx."""
    failures: list[str] = []
    poison_status: list[int] = []
    stop = threading.Event()
    with client_of(served, max_wait_ms=20) as client:
        def search() -> None:
            while not stop.is_set():
                r = client.post("/search", json={"query": "why do cats purr", "k": 3})
                if r.status_code != 200:
                    failures.append(r.text)

        def poison() -> None:
            for i in range(30):
                body = {"input": [f"bad{SURROGATE}"], "input_type": "query"} if i % 2 else \
                    {"query": "cats", "documents": [f"x{SURROGATE}"]}
                r = client.post("/v1/embeddings" if i % 2 else "/v1/rerank", content=json.dumps(body),
                                headers={"content-type": "application/json"})
                poison_status.append(r.status_code)

        threads = [threading.Thread(target=search) for _ in range(3)]
        for t in threads:
            t.start()
        poison()
        stop.set()
        for t in threads:
            t.join()
    assert failures == [] and poison_status and all(400 <= s < 500 for s in poison_status)


def test_a_failed_shared_batch_is_retried_apart(served):
    """Past the route checks (a model that fails on one item): the batcher runs each caller alone."""
    from twostage.app.batching import BatchingReranker

    class Flaky:
        def predict(self, pairs, batch_size=32):
            if any("poison" in d for _, d in pairs):
                raise RuntimeError("the model failed")
            return np.full(len(pairs), 0.5, dtype=np.float32)

    wrapped = BatchingReranker(Flaky(), max_wait_s=0.2, expected=lambda: 2)
    out: dict[str, object] = {}

    def call(name: str, doc: str) -> None:
        try:
            out[name] = wrapped.predict([("q", doc)])
        except RuntimeError as exc:
            out[name] = exc

    threads = [threading.Thread(target=call, args=(n, d)) for n, d in (("good", "fine"), ("bad", "poison"))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    wrapped.batcher.close()
    assert isinstance(out["bad"], RuntimeError) and list(out["good"]) == [0.5]


# ---- budgets ---------------------------------------------------------------------------------------------------
def test_budgets_refuse_before_any_work_naming_the_flag(fresh):
    budgets = Budgets(request_tokens=200, rerank_documents=3, embedding_texts=2, document_chars=50,
                      metadata_keys=3, metadata_bytes=60)
    with client_of(fresh, budgets=budgets) as client:
        cases = [
            ("/v1/rerank", {"query": "cats", "documents": ["a", "b", "c", "d"]}, "--max-rerank-documents"),
            ("/v1/rerank", {"query": "cats purr " * 30, "documents": ["why cats purr " * 40] * 2},
             "--max-request-tokens"),
            ("/v1/embeddings", {"input": ["a", "b", "c"]}, "--max-embedding-texts"),
            ("/v1/embeddings", {"input": ["cats purr loudly " * 40, "dogs " * 100]}, "--max-request-tokens"),
            ("/documents", {"documents": [{"id": "x", "text": "y" * 51}]}, "--max-document-chars"),
            ("/documents", {"documents": [{"id": "x", "text": "y", "metadata": {"a": {"b": 1, "c": 2, "d": 3}}}]},
             "--max-metadata-keys"),
            ("/documents", {"documents": [{"id": "x", "text": "y", "metadata": {"a": "z" * 80}}]},
             "--max-metadata-bytes"),
        ]
        for route, body, flag in cases:
            r = client.post(route, json=body)
            assert r.status_code == 413, (route, r.text)
            assert flag in r.json()["error"] and "\n" not in r.json()["error"]
        ok = client.post("/v1/rerank", json={"query": "cats", "documents": ["a", "b", "c"]})
        assert ok.status_code == 200 and ok.json()["usage"]["total_tokens"] > 0
        assert client.get("/stats").json()["budgets"]["max_rerank_documents"] == 3
    assert len(SearchEngine.load(fresh)) == 205  # nothing over budget was written


def test_bad_budgets_are_one_line():
    with pytest.raises(ConfigError, match="--max-request-tokens"):
        Budgets(request_tokens=0)
    assert main(["serve", "nowhere", "--max-metadata-keys", "-1"]) == 2


def test_a_long_pair_is_cut_before_tokenising_and_scores_as_if_whole(models):
    """Both sides long (words, runs without spaces, many tokens a word): cut first (bounded memory), the tokens
    kept are those of the pair truncated longest_first in full; the counted lengths are the real ones."""
    from twostage.reranker.cross_encoder import CrossEncoder

    ce = CrossEncoder.load(models[1])
    rng = random.Random(0)
    vocab = ["cats", "purr", "when", "content", "and", "dogs", "bark", "at", "night", "while", "owls", "hunt"]
    spaced = " ".join(rng.choice(vocab) for _ in range(900))
    unspaced = "".join(rng.choice("abcdefghij") for _ in range(5000))  # one 5,000-character word
    han = "".join(chr(0x4E00 + rng.randrange(50)) for _ in range(3000))  # a token a character, no spaces
    queries = [spaced, "cats", unspaced, spaced, "why do cats purr", han, "cats " + han]
    docs = [" ".join(rng.choice(vocab) for _ in range(4000)), unspaced, spaced, "short one", "", han, spaced]
    cut = ce.features(queries, docs)["input_ids"]
    whole = ce.tokenizer(queries, docs, padding=True, truncation="longest_first", max_length=ce.max_length,
                         return_tensors="pt")["input_ids"]
    assert cut.shape == whole.shape and bool((cut == whole).all())
    real = [int(row.ne(ce.tokenizer.pad_token_id).sum()) for row in whole]
    assert ce.pair_tokens(queries, docs) == real and real[0] == ce.max_length


def test_a_bulk_call_does_not_hold_searches_behind_it(served):
    """A large embeddings call is computed a piece at a time behind searches: a search during it answers long
    before the bulk call ends."""
    with client_of(served, budgets=Budgets(piece=4)) as client:
        texts = [f"cats purr and dogs bark number {i} " * 20 for i in range(400)]
        done: dict[str, float] = {}

        def bulk() -> None:
            t = time.perf_counter()
            r = client.post("/v1/embeddings", json={"input": texts, "input_type": "query"})
            assert r.status_code == 200
            done["bulk"] = time.perf_counter() - t

        thread = threading.Thread(target=bulk)
        thread.start()
        time.sleep(0.05)
        t = time.perf_counter()
        assert client.post("/search", json={"query": "cats purring", "k": 3}).status_code == 200
        search_s = time.perf_counter() - t
        thread.join()
        assert "bulk" in done and search_s < done["bulk"]
        stats = client.get("/stats").json()["batching"]["encoder"]
        assert stats["model_calls"] >= 400 // 16  # pieces of 2 beside the search, of up to 16 with none running


# ---- metrics, logs and reads -----------------------------------------------------------------------------------
def test_made_up_methods_do_not_grow_the_metrics(served):
    with client_of(served) as client:
        before = len(client.get("/metrics").text)
        for i in range(200):
            assert client.request(f"M{i:04d}", "/search").status_code in (400, 404, 405)
        text = client.get("/metrics").text
        assert "M0001" not in text and 'method="other"' in text
        assert len(text) < before + 5000
        assert not any(k.startswith("M0") for k in client.get("/stats").json()["requests"])


def test_protect_reads_puts_stats_and_metrics_behind_the_key(served):
    with client_of(served, api_key=KEY, protect_reads=True) as client:
        for route in ("/stats", "/metrics"):
            assert client.get(route).status_code == 401
            assert client.get(route, headers={"Authorization": f"Bearer {KEY}"}).status_code == 200
        assert client.get("/health").status_code == 200 and client.post("/search", json={"query": "cats"}).is_success
    with pytest.raises(ConfigError, match="API key"):
        create_app(served, protect_reads=True)


def test_the_access_log_cuts_a_long_path(served, caplog):
    import logging

    with client_of(served) as client, caplog.at_level(logging.INFO, logger="twostage.access"):
        client.get("/" + "a" * 10_000)
    line = json.loads(caplog.records[-1].getMessage())
    assert len(line["path"]) <= 1004 and line["path"].endswith("...")


def test_health_reports_a_version_committed_elsewhere_without_a_search(fresh):
    with client_of(fresh) as client:
        before = client.get("/health").json()["version"]
        other = SearchEngine.load(fresh)
        new = other.add([Document("fresh-doc", "walruses on ice")])
        assert client.get("/health").json()["version"] == new.version != before
        new.close()
        other.close()


# ---- search options that said nothing ---------------------------------------------------------------------------
def test_rerank_true_without_a_reranker_and_min_relevance_with_rerank_off(fresh, models, tmp_path):
    bare = SearchEngine.build(SAMPLE, tmp_path / "bare", retriever=models[0], backend="flat")
    with pytest.raises(ConfigError, match="no reranker"):
        bare.search("cats", rerank=True)
    assert bare.search("cats", rerank=False).hits
    bare.close()
    engine = SearchEngine.load(fresh)
    engine = engine.configure(rerank_calibration=(1.0, 0.0))
    with pytest.raises(ConfigError, match="turns the reranker off"):
        engine.search("cats", rerank=False, min_relevance=0.5)
    engine.close()


# ---- page tokens and versions -----------------------------------------------------------------------------------
def test_a_token_pages_only_at_its_own_k_and_never_from_the_future(fresh):
    engine = SearchEngine.load(fresh)
    first = engine.search("cats purring", k=5)
    assert first.next_page
    with pytest.raises(ConfigError, match="k=5"):
        engine.search("cats purring", k=50, page_token=first.next_page)
    assert len(engine.search("cats purring", k=5, page_token=first.next_page).hits) == 5
    token = engine.read_page_token(first.next_page)
    future = PageToken(token.version, token.offset, token.k, token.fingerprint, int(time.time()) + 86_400)
    with pytest.raises(ConfigError, match="not a token"):
        engine.search("cats purring", k=5, page_token=encode_page_token(future, page_key(fresh)))
    with client_of(fresh) as client:  # over HTTP: a token without k pages at its own k
        body = client.post("/search", json={"query": "cats purring", "k": 5}).json()
        nxt = client.post("/search", json={"query": "cats purring", "page_token": body["next_page"]})
        assert nxt.status_code == 200 and len(nxt.json()["hits"]) == 5
        bad = client.post("/search", json={"query": "cats purring", "k": 7, "page_token": body["next_page"]})
        assert bad.status_code == 400 and "k=5" in bad.json()["error"]
    engine.close()


def test_a_copied_engine_makes_its_own_page_key(fresh, tmp_path):
    engine = SearchEngine.load(fresh)
    token = engine.search("cats purring", k=5).next_page
    engine.close()
    copy = tmp_path / "copy"
    shutil.copytree(fresh, copy, ignore=shutil.ignore_patterns("LOCK"))
    assert (copy / KEY_FILE).read_bytes() == (fresh / KEY_FILE).read_bytes()
    other = SearchEngine.load(copy)
    with pytest.raises(ConfigError, match="not a token"):
        other.search("cats purring", k=5, page_token=token)
    assert page_key(copy) != page_key(fresh) and oct((copy / KEY_FILE).stat().st_mode)[-3:] == "600"
    original = SearchEngine.load(fresh)
    assert original.search("cats purring", k=5, page_token=token).hits  # the original still pages
    original.close()
    other.close()
    moved = tmp_path / "moved"
    fresh.rename(moved)  # a move within the file system keeps the directory, and its tokens
    again = SearchEngine.load(moved)
    assert again.search("cats purring", k=5, page_token=token).hits
    again.close()


def test_a_token_from_before_a_model_swap_is_gone_not_reloaded(fresh, tmp_path, tiny_bert_dir):
    from twostage.engine.models import Models
    from twostage.indexer.errors import PageExpiredError

    engine = SearchEngine.load(fresh)
    token = engine.search("cats purring", k=5).next_page
    old_version = engine.version
    # a version naming other models, as a swap writes it: the same files, another reranker sha256 in the manifest
    manifest = json.loads((fresh / old_version / "manifest.json").read_text())
    engine2 = engine.add([Document("z-1", "walruses")])
    engine2._models = Models(requested_device="cpu", weights=("x", "y"))  # serves other models
    with pytest.raises(PageExpiredError, match="other models"):
        engine2.search("cats purring", k=5, page_token=token)
    assert manifest["format"]
    engine.close()
    engine2.close()


# ---- metadata memory -------------------------------------------------------------------------------------------
def test_passages_share_their_documents_metadata_entry(tmp_path, models):
    long_text = " ".join(f"word{i}" for i in range(3000))
    meta = {f"key{i}": i for i in range(300)}
    docs = [Document("long", long_text, metadata=meta), Document("short", "cats purr", metadata={"key1": 5})]
    engine = SearchEngine.build(docs, tmp_path / "m", retriever=models[0], backend="flat", passage_words=50,
                                passage_stride=25)
    table = engine.index.metadata_table()
    assert table.rows == 2 and len(table.index) == len(engine.index) > 100
    assert engine.search("word17", k=2, where={"key1": 1}, first_stage="bm25").ids == ["long"]
    assert engine.search("cats", k=2, where={"key1": {"$gte": 5}}, first_stage="bm25").ids == ["short"]
    engine.close()


# ---- swap as a careful loader ----------------------------------------------------------------------------------
def _broken_model(src: Path, dest: Path, how: str) -> Path:
    shutil.copytree(src, dest)
    if how == "config-link":
        (dest / "config.json").unlink()
        os.symlink("/etc/passwd", dest / "config.json")
    elif how == "weights-device":
        (dest / "model.safetensors").unlink()
        os.symlink("/dev/zero", dest / "model.safetensors")
    elif how == "weights-fifo":
        (dest / "model.safetensors").unlink()
        os.mkfifo(dest / "model.safetensors")
    elif how == "layers":
        config = json.loads((dest / "config.json").read_text())
        (dest / "config.json").write_text(json.dumps({**config, "num_hidden_layers": 100_000}))
    elif how == "huge-tokenizer":
        with open(dest / "tokenizer.json", "r+b") as fh:
            fh.truncate(201 << 20)  # sparse: 201 MB on paper
    elif how == "bad-json":
        (dest / "config.json").write_text("{not json")
    return dest


@pytest.mark.parametrize("how, words", [("config-link", "links outside"), ("weights-device", "links outside"),
                                        ("weights-fifo", "not a regular file"),
                                        ("layers", "num_hidden_layers"), ("huge-tokenizer", "bytes, over"),
                                        ("bad-json", "not valid JSON")])
def test_swap_checks_the_new_model_files_first(fresh, tiny_bert_dir, tmp_path, capsys, how, words):
    bad = _broken_model(tiny_bert_dir, tmp_path / "bad", how)
    before = sorted(p.name for p in fresh.iterdir())
    t = time.perf_counter()
    assert main(["swap", str(fresh), "--retriever", str(bad), "--qrels", str(SAMPLE), "--split", "train"]) == 2
    err = capsys.readouterr().err
    assert words in err and err.count("\n") == 1 and time.perf_counter() - t < 30
    assert sorted(p.name for p in fresh.iterdir()) == before
    assert not list(fresh.parent.glob(".eng.swap-*"))


@pytest.mark.parametrize("gain", ["nan", "inf", "-inf"])
def test_swap_refuses_a_min_gain_that_is_not_a_number(fresh, models, capsys, gain):
    assert main(["swap", str(fresh), "--retriever", str(models[0]), "--qrels", str(SAMPLE),
                 f"--min-gain={gain}"]) == 2
    assert "min_gain must be a finite number" in capsys.readouterr().err


def test_check_encodable_names_the_thing():
    assert check_encodable("héllo", "x") == "héllo"
    with pytest.raises(DataError, match="field 7 holds a lone surrogate"):
        check_encodable("ok\udc80", "field 7")
    with pytest.raises(DataError, match="metadata.a.*surrogate"):
        check_metadata({"a": {"b": ["\ud83d"]}}, "metadata")
    with pytest.raises(DataError, match="corpus line.*surrogate|surrogate"):
        SearchEngine.build([Document("d", "text", metadata={"k": "\udc00"})], Path("/nonexistent-never-written"))
