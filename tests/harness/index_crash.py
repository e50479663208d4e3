"""Crash test: builds and updates of an index directory killed with SIGKILL at random moments.

Run small by tests/test_index_crash.py, at full size (and reported) by
``python benchmarks/experiments/index_crash.py`` (at commit 31faba8).

Each round picks an operation (add, delete, upsert, compact, or a full rebuild), runs it once on a copy to
learn the answers of the new state, then runs it on the real index in a subprocess and kills that process
after a random delay within the operation's duration. Afterwards the index must load (checksums verified)
and answer a fixed query set exactly as the old state or exactly as the new state: nothing in between.
"""

from __future__ import annotations

import random
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[2]  # the repository
sys.path.insert(0, str(ROOT))

QUERIES = ["rain snow", "cat dog", "cook garden", "music history", "money star", "water sleep", "cat", "snow"]


class KeywordEncoder:
    words = ("cat", "dog", "rain", "snow", "cook", "garden", "music", "history", "money", "star", "water", "sleep")

    def encode(self, texts, kind="document", batch_size=32, **kw):
        return np.array([[t.lower().count(w) for w in self.words] + [0.05] for t in texts], dtype=np.float32)

    def info(self):
        from twostage.indexer.manifest import EncoderInfo

        return EncoderInfo("kw", len(self.words) + 1, weights_sha256="kw")


def answers(path: Path) -> list:
    from twostage.indexer.index import Index

    index = Index.load(path, encoder=KeywordEncoder(), verify=True)
    return [(list(r.ids), [round(float(s), 5) for s in r.scores]) for r in index.search_batch(QUERIES, 5)]


def apply(path: Path, op: dict) -> None:
    from twostage.indexer.build import build_index
    from twostage.indexer.corpus import load_corpus
    from twostage.indexer.index import Index
    from twostage.indexer.records import Document

    if op["kind"] == "rebuild":
        docs = list(load_corpus(ROOT / "data" / "sample"))[: op["n"]]
        build_index(docs, KeywordEncoder(), path, backend=op["backend"], chunk_size=40, resume=False)
        return
    index = Index.load(path, encoder=KeywordEncoder())
    if op["kind"] == "add":
        index.add([Document(f"{op['tag']}-{i}", t) for i, t in enumerate(op["texts"])])
    elif op["kind"] == "delete":
        live = sorted(set(index.doc_ids[~index.deleted]))
        index.delete(random.Random(op["seed"]).sample(live, op["n"]))
    elif op["kind"] == "upsert":
        live = sorted(set(index.doc_ids[~index.deleted]))
        ids = random.Random(op["seed"]).sample(live, op["n"])
        index.upsert([Document(i, t) for i, t in zip(ids, op["texts"])])
    elif op["kind"] == "compact":
        index.compact()


def random_op(rng: random.Random, n: int) -> dict:
    kind = rng.choice(["add", "add", "delete", "upsert", "compact", "rebuild"])
    words = KeywordEncoder.words
    texts = [" ".join(rng.choice(words) for _ in range(rng.randint(1, 6))) for _ in range(rng.randint(5, 60))]
    return {"kind": kind, "texts": texts, "tag": f"r{n}", "seed": n, "n": rng.randint(1, 5) if kind != "rebuild"
            else rng.randint(100, 205), "backend": rng.choice(["hnswlib", "faiss-hnsw", "flat", "faiss-ivf"])}


def run(rounds: int, seed: int, workdir: Path) -> dict:
    sys.path.insert(0, str(ROOT))
    from tests.harness.crash import crash_rounds

    rng = random.Random(seed)
    index = workdir / "index"
    apply(index, {"kind": "rebuild", "n": 205, "backend": "hnswlib"})
    # answers() raises if the index does not load or a checksum fails
    return crash_rounds(index, workdir, rounds, rng, __file__, random_op, answers)


def worker_entry() -> None:
    """``python tests/harness/index_crash.py PATH OP``: the subprocess :func:`worker` starts (every import
    first, so that the kill lands inside the operation)."""
    import faiss  # noqa: F401
    import hnswlib  # noqa: F401
    import pandas  # noqa: F401
    import pyarrow.parquet  # noqa: F401

    import twostage.indexer.build
    import twostage.indexer.corpus
    import twostage.indexer.index  # noqa: F401

    sys.path.insert(0, str(ROOT))
    from tests.harness.crash import worker_main

    worker_main(apply)


if __name__ == "__main__":
    worker_entry()
