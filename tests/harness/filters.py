"""Random metadata and filters, and a brute force in pandas to check filtered search against: the harness
tests/test_filters.py runs small and ``python benchmarks/filters.py`` runs at full size (and reports).

The filters use every operator of the filter language (nested $and/$or/$not, several keys in an object); pandas
evaluates them by its own reading of the JSON, not the library's.
"""

from __future__ import annotations

import json
import random
from pathlib import Path
from typing import Any

SOURCES = ("arxiv", "pubmed", "nature", "cell", "lancet", "bmj", "plos", "science")
TAGS = tuple(f"t{i}" for i in range(12))
SELECTIVITY = {"1%": 10, "10%": 100, "50%": 500}  # sel < N


# ---- the corpus ------------------------------------------------------------------------------------
def metadata(rng: random.Random) -> dict[str, Any]:
    day = rng.randrange(0, 9000)
    year, rest = divmod(day, 365)
    month, dom = rest // 31 + 1, rest % 28 + 1
    published = f"{2000 + year:04d}-{min(month, 12):02d}-{dom:02d}"
    if rng.random() < 0.3:
        published += f"T{rng.randrange(24):02d}:{rng.randrange(60):02d}:00" + rng.choice(["Z", "+02:00", "-05:00", ""])
    m: dict[str, Any] = {"year": rng.randrange(1990, 2024), "score": round(rng.random(), 3), "published": published,
                         "sel": rng.randrange(1000)}
    if rng.random() > 0.05:
        m["source"] = rng.choice(SOURCES)
    if rng.random() > 0.10:
        m["tags"] = rng.sample(TAGS, rng.randrange(0, 4))
    return m


def make_corpus(data: Path, n: int, seed: int = 0) -> list[Any]:
    from twostage.indexer.corpus import load_corpus
    from twostage.indexer.records import Document

    rng = random.Random(seed)
    docs = []
    for d in load_corpus(data / "corpus.jsonl"):
        words = d.text.split()
        half = max(1, len(words) // 2)
        for part, chunk in enumerate((words[:half], words[half:])):
            if chunk and len(docs) < n:
                docs.append(Document(f"{d.id}-{part}", " ".join(chunk), d.title, metadata(rng)))
    return docs


# ---- random filters --------------------------------------------------------------------------------
def random_leaf(rng: random.Random) -> dict[str, Any]:
    name = rng.choice(["year", "score", "published", "source", "tags", "sel"])
    if name in ("year", "sel"):
        lo, hi = (1990, 2024) if name == "year" else (0, 1000)
        op = rng.choice(["$eq", "$ne", "$in", "$nin", "$gt", "$gte", "$lt", "$lte", "$exists"])
        value: Any = [rng.randrange(lo, hi) for _ in range(rng.randrange(1, 6))] if op in ("$in", "$nin") \
            else rng.random() < 0.5 if op == "$exists" else rng.randrange(lo, hi)
    elif name == "score":
        op = rng.choice(["$gt", "$gte", "$lt", "$lte", "$ne"])
        value = round(rng.random(), 3)
    elif name == "published":
        op = rng.choice(["$gt", "$gte", "$lt", "$lte", "$eq", "$ne"])
        value = f"{rng.randrange(2000, 2025)}-{rng.randrange(1, 13):02d}-{rng.randrange(1, 29):02d}"
        if rng.random() < 0.3:
            value += "T12:00:00+01:00"
    else:
        pool = SOURCES if name == "source" else TAGS
        op = rng.choice(["$eq", "$ne", "$in", "$nin", "$exists"])
        value = rng.sample(pool, rng.randrange(1, 4)) if op in ("$in", "$nin") \
            else rng.random() < 0.5 if op == "$exists" else rng.choice(pool)
        if op == "$eq" and rng.random() < 0.1:
            value = None  # the field is absent
    return {name: value} if op == "$eq" and rng.random() < 0.5 else {name: {op: value}}


def random_filter(rng: random.Random, depth: int = 0) -> dict[str, Any]:
    roll = rng.random()
    if depth >= 3 or roll < 0.35:
        return random_leaf(rng)
    if roll < 0.55:
        return {"$and": [random_filter(rng, depth + 1) for _ in range(rng.randrange(2, 4))]}
    if roll < 0.75:
        return {"$or": [random_filter(rng, depth + 1) for _ in range(rng.randrange(2, 4))]}
    if roll < 0.87:
        return {"$not": random_filter(rng, depth + 1)}
    merged: dict[str, Any] = {}  # several keys in one object
    for _ in range(3):
        merged.update(random_leaf(rng))
    return merged


# ---- the brute force: pandas reads the JSON filter on its own ------------------------------------------
def frame(docs: list[Any]) -> Any:
    import pandas as pd

    df = pd.DataFrame([{"id": d.id, **d.metadata} for d in docs]).set_index("id")
    df["published"] = pd.to_datetime(df["published"], utc=True, format="ISO8601")
    return df


def pandas_mask(f: dict[str, Any], df: Any) -> Any:
    import pandas as pd

    out = pd.Series(True, index=df.index)
    for key, value in f.items():
        if key == "$and":
            for part in value:
                out &= pandas_mask(part, df)
        elif key == "$or":
            any_ = pd.Series(False, index=df.index)
            for part in value:
                any_ |= pandas_mask(part, df)
            out &= any_
        elif key == "$not":
            out &= ~pandas_mask(value, df)
        elif isinstance(value, dict):
            for op, operand in value.items():
                out &= _pandas_op(df[key], key, op, operand)
        else:
            out &= _pandas_op(df[key], key, "$eq", value)
    return out


def _pandas_op(col: Any, name: str, op: str, v: Any) -> Any:
    import pandas as pd

    present = col.notna()
    if op == "$exists":
        return present if v else ~present
    if op in ("$ne", "$nin"):
        return ~_pandas_op(col, name, {"$ne": "$eq", "$nin": "$in"}[op], v)
    if v is None:
        return ~present
    if name == "tags":
        wanted = set(v) if op == "$in" else {v}
        return col.apply(lambda tags: isinstance(tags, list) and bool(wanted & set(tags)))
    if name == "published":
        v = [pd.Timestamp(x) for x in v] if op == "$in" else pd.Timestamp(v)
        v = [x.tz_localize("UTC") if x.tzinfo is None else x for x in v] if op == "$in" else \
            (v.tz_localize("UTC") if v.tzinfo is None else v)
    if op == "$in":
        return col.isin(v) & present
    compare = {"$eq": col.__eq__, "$gt": col.__gt__, "$gte": col.__ge__, "$lt": col.__lt__, "$lte": col.__le__}[op]
    return compare(v).fillna(False).astype(bool) & present


def brute_lists(engine: Any, query: str, keep: Any, n: int) -> dict[str, list[str]]:
    """BM25 and dense top ``n`` among the documents ``keep`` (a boolean Series by id), from every document's
    score (the engine's own scorers), ties in corpus order."""
    import numpy as np

    from twostage.indexer.passages import doc_id_of
    from twostage.indexer.vectors import similarity

    def owner(ids: Any) -> list[str]:  # a passage engine's rows are passages: score a document by its best
        return [doc_id_of(str(i)) for i in ids] if engine.settings.passage_words else [str(i) for i in ids]

    def best_first(rows: Any, ids: list[str]) -> Any:
        seen: set[str] = set()
        return np.array([r for r in rows if not (ids[r] in seen or seen.add(ids[r]))][:n], dtype=np.int64)

    bm25_ids = owner(engine.bm25.doc_ids)
    bm25 = np.asarray(engine.bm25.scores(query))
    kb = keep.reindex(bm25_ids).to_numpy(dtype=bool) & (bm25 > 0)
    rows = np.flatnonzero(kb)
    order = best_first(rows[np.lexsort((rows, -bm25[rows]))], bm25_ids)
    index = engine.index
    all_rows = np.flatnonzero(~index.deleted)
    dense_ids = owner(index.doc_ids[all_rows])
    q = engine.encoder.encode([query], kind="query")
    dense = similarity(q, index.rows(all_rows), index.manifest.metric)[0]
    kd = np.flatnonzero(keep.reindex(dense_ids).to_numpy(dtype=bool))
    dorder = best_first(kd[np.lexsort((kd, -dense[kd]))], dense_ids)
    return {"bm25": [bm25_ids[i] for i in order], "bm25_scores": bm25[order].tolist(),
            "dense": [dense_ids[i] for i in dorder], "dense_scores": dense[dorder].tolist()}


def brute_hybrid(engine: Any, lists: dict[str, list[Any]], n: int, k: int) -> list[str]:
    import numpy as np

    from twostage.engine.fusion import dense_weights, fuse
    from twostage.indexer.records import RankedList

    s = engine.settings
    b = RankedList(np.array(lists["bm25"], dtype=object), np.array(lists["bm25_scores"], dtype=np.float32))
    d = RankedList(np.array(lists["dense"], dtype=object), np.array(lists["dense_scores"], dtype=np.float32))
    fused = fuse([b, d], s.fusion, k_rrf=s.k_rrf, weights=dense_weights(s.dense_weight)).truncate(n)
    return [str(i) for i in fused.ids[:k]]


def check_filters(engine: Any, docs: list[Any], queries: list[str], count: int, seed: int = 1,
                  k: int = 10) -> dict[str, Any]:
    """``count`` random filters (each matching >= 1 document): the engine's filtered BM25, dense and hybrid top
    ``k`` against the brute force. Returns counts of agreements and the first disagreement."""
    df = frame(docs)
    rng = random.Random(seed)
    n = engine.settings.first_stage_depth
    agree = {"bm25": 0, "dense": 0, "hybrid": 0}
    ops: dict[str, int] = {}
    first_bad = None
    selectivity = []
    tried = 0
    while len(selectivity) < count:
        f = random_filter(rng)
        tried += 1
        keep = pandas_mask(f, df)
        if not keep.any():
            continue
        selectivity.append(float(keep.mean()))
        for op in ("$eq", "$ne", "$in", "$nin", "$gt", "$gte", "$lt", "$lte", "$exists", "$and", "$or", "$not"):
            ops[op] = ops.get(op, 0) + (f'"{op}"' in json.dumps(f))
        query = queries[len(selectivity) % len(queries)]
        lists = brute_lists(engine, query, keep, n)
        want = {"bm25": lists["bm25"][:k], "dense": lists["dense"][:k], "hybrid": brute_hybrid(engine, lists, n, k)}
        for stage in agree:
            got = [str(i) for i in engine.ranked(query, k, where=f, first_stage=stage, rerank=False).ids]
            if got == want[stage]:
                agree[stage] += 1
            elif first_bad is None:
                first_bad = {"stage": stage, "filter": f, "query": query, "got": got, "want": want[stage]}
    return {"filters": count, "tried": tried, "agree": agree, "ops": ops, "first_bad": first_bad,
            "selectivity": selectivity}
