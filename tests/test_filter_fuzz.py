"""Random filters through Python, HTTP and the command line: a FilterError (a 4xx over HTTP, exit 2 on the command
line), or an answer, never any other exception or a 5xx.

``TWOSTAGE_FUZZ_N`` sets how many filters go through Python and through HTTP (the command line gets a fiftieth);
``TWOSTAGE_FUZZ_N=10000 pytest -n 0 -s tests/test_filter_fuzz.py`` is the run the note of #44 reports (``-s`` shows
the counts).
"""

from __future__ import annotations

import json
import os
import random
from typing import Any

import pytest

from twostage import Document, SearchEngine
from twostage.app.cli import main
from twostage.indexer.errors import FilterError

N = int(os.environ.get("TWOSTAGE_FUZZ_N", "1500"))
FIELDS = ["year", "lang", "d", "tags", "score", "ok", "mixed", "nope", "", "yéar", "\u202e", "x" * 300, "$and",
          "$or", "$not", "$in", "$gt", "$bogus", "a.b", "\ud800", "🐱"]
OPS = ["$eq", "$ne", "$in", "$nin", "$gt", "$gte", "$lt", "$lte", "$exists", "$and", "$or", "$not", "$regex", "gt",
       "", "$", "$EQ"]


def corpus() -> list[Document]:
    rng = random.Random(3)
    docs = []
    for i in range(60):
        meta: dict[str, Any] = {"year": 1990 + i % 35, "lang": rng.choice(["en", "fr", "ünï"]),
                                "d": f"{rng.randint(1, 9999):04d}-0{rng.randint(1, 9)}-1{rng.randint(0, 9)}",
                                "tags": rng.sample(["a", "b", "c", "🐱"], rng.randint(0, 3)), "score": rng.random(),
                                "ok": bool(i % 2), "mixed": rng.choice([1, "one", True])}
        docs.append(Document(f"d{i}", " ".join(rng.choice(["cat", "dog", "rain", "snow"]) for _ in range(6)),
                             metadata=meta))
    return docs


def scalar(rng: random.Random) -> Any:
    pick = rng.randrange(14)
    if pick == 0:
        return rng.choice([0, -1, 1, 2 ** 53 + 1, -(2 ** 63), 10 ** rng.randint(1, 500), -(10 ** rng.randint(300, 400))])
    if pick == 1:
        return rng.choice([0.0, -0.0, 1e308, -1e308, 5e-324, float("nan"), float("inf"), -float("inf")])
    if pick == 2:
        return rng.choice([True, False, None])
    if pick == 3:  # dates, good and bad
        return rng.choice(["2020-01-05", "9999-12-31T23:59:59-23:59", "0001-01-01T00:00:00+23:59", "2020-13-45",
                           "2020-02-30", "2020-01-01T25:00", "0000-01-01", "2020-01-05T10:00:00.1234567Z",
                           "2020-01-05 10:00+0530", f"{rng.randint(0, 9999):04d}-{rng.randint(0, 99):02d}-"
                                                  f"{rng.randint(0, 99):02d}"])
    if pick == 4:
        return "".join(chr(rng.randint(0, 0x10FFFF)) for _ in range(rng.randint(0, 12)))
    if pick == 5:
        return "x" * rng.choice([1000, 100_000])
    if pick == 6:
        return rng.choice(["en", "fr", "ünï", "a", "🐱", "", " "])
    if pick == 7:
        return rng.randint(-10 ** 6, 10 ** 6)
    if pick == 8:
        return rng.uniform(-1e6, 1e6)
    return rng.choice([1990, 2000, 2010, "en", "a", 0.5])


def value(rng: random.Random, depth: int) -> Any:
    if depth <= 0 or rng.random() < 0.5:
        return scalar(rng)
    if rng.random() < 0.3:
        return [value(rng, depth - 1) for _ in range(rng.randint(0, 4))]
    return spec(rng, depth - 1)


def spec(rng: random.Random, depth: int) -> Any:
    """A random filter-like JSON value: mostly objects of fields and operators, nested up to ``depth``."""
    roll = rng.random()
    if roll < 0.03:
        return scalar(rng)
    if roll < 0.06:  # very deep
        f: Any = {"year": 1}
        for _ in range(rng.choice([30, 33, 100, 900])):
            f = {rng.choice(["$not", "$and", "$or"]): f} if rng.random() < 0.5 else {"$not": f}
            if "$and" in f or "$or" in f:
                f = {next(iter(f)): [next(iter(f.values()))]}
        return f
    if roll < 0.08:  # very wide
        return {"$or": [{"year": i} for i in range(rng.choice([100, 5000, 12_000]))]}
    out: dict[Any, Any] = {}
    for _ in range(rng.randint(0, 3)):
        key = rng.choice(FIELDS + ["$and", "$or", "$not"] * 2)
        if key in ("$and", "$or"):
            out[key] = [spec(rng, depth - 1) for _ in range(rng.randint(0, 3))] if depth > 0 and rng.random() < 0.9 \
                else value(rng, depth)
        elif key == "$not":
            out[key] = spec(rng, depth - 1) if depth > 0 else scalar(rng)
        elif rng.random() < 0.6:
            out[key] = {rng.choice(OPS): (value(rng, depth) if rng.random() < 0.3 else
                                          [scalar(rng) for _ in range(rng.randint(0, 5))] if rng.random() < 0.4
                                          else scalar(rng)) for _ in range(rng.randint(1, 3))}
        else:
            out[key] = value(rng, depth)
    return out


def filters(n: int, seed: int) -> list[Any]:
    rng = random.Random(seed)
    return [spec(rng, rng.randint(0, 6)) for _ in range(n)]


def as_json(f: Any) -> str:
    """JSON as a client sends it: lone surrogates escaped, NaN and Infinity as Python writes them."""
    try:
        return json.dumps(f, ensure_ascii=True)
    except RecursionError:  # deeper than json can write: the same shape, written by hand
        return '{"$not": ' * 900 + '{"year": 1}' + "}" * 900


@pytest.fixture(scope="module")
def engine(tmp_path_factory, models):
    root = tmp_path_factory.mktemp("fuzz")
    eng = SearchEngine.build(corpus(), root / "e", retriever=models[0], backend="flat")
    yield eng
    eng.close()


def test_python_filters_are_an_answer_or_a_filter_error(engine):
    answered = refused = 0
    for i, f in enumerate(filters(N, seed=1)):
        try:
            result = engine.search("cat rain", 5, where=f, first_stage="bm25" if i % 4 else "hybrid")
        except FilterError as exc:
            assert len(str(exc)) < 600, str(exc)[:200]
            refused += 1
        else:
            assert len(result.hits) <= 5
            answered += 1
    print(f"\npython: {N} filters, {answered} answered, {refused} FilterError, 0 other exceptions")
    assert answered > N // 20 and refused > N // 4  # both paths were exercised


def test_http_filters_are_a_4xx_or_an_answer(engine):
    pytest.importorskip("fastapi")
    from fastapi.testclient import TestClient

    from twostage.app.server import create_app

    statuses: dict[int, int] = {}
    with TestClient(create_app(engine, batching=False), raise_server_exceptions=False) as client:
        for i, f in enumerate(filters(N, seed=2)):
            route, body = ("/search", '{"query": "cat", "k": 5, "first_stage": "bm25", "where": %s}') if i % 2 else \
                ("/search/batch", '{"queries": ["cat", "snow"], "k": 5, "rerank": false, "where": %s}')
            r = client.post(route, content=body % as_json(f), headers={"content-type": "application/json"})
            statuses[r.status_code] = statuses.get(r.status_code, 0) + 1
            assert r.status_code in (200, 400, 413, 422), (r.status_code, r.text[:300])
            assert len(r.content) < 2000 or r.status_code == 200, r.text[:300]
    print(f"\nhttp: {N} filters, responses by status {dict(sorted(statuses.items()))}")
    assert statuses.get(200, 0) and statuses.get(400, 0)


def test_cli_filters_are_one_line_or_an_answer(engine, capsys):
    codes = {0: 0, 2: 0}
    for f in filters(max(N // 50, 20), seed=4):
        code = main(["search", str(engine.root), "cat", "--fast", "--k", "3", "--no-rerank", "--where", as_json(f)])
        captured = capsys.readouterr()
        assert code in (0, 2), captured.err[-500:]
        codes[code] += 1
        if code == 2:
            assert captured.err.count("\n") == 1 and "Traceback" not in captured.err and len(captured.err) < 700
    print(f"\ncli: {sum(codes.values())} filters, exit status 0: {codes[0]}, 2 (one line): {codes[2]}")
