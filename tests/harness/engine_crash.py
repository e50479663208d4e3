"""Crash test of the search engine: add, upsert, delete and compact killed with SIGKILL at random moments.

Run small by tests/test_index_crash.py, at full size (and reported) by ``python benchmarks/concurrency.py --kind crash``.

Each round picks an operation, runs it to the end on a copy (in a subprocess, as the real one) to learn the
answers of the new state, then runs it on the real engine in a subprocess and kills it after a random delay
within the operation's duration. Afterwards the engine must load with every checksum verified, its document
store, BM25 index and dense index must hold the same documents, and it must answer a fixed set of BM25 and dense
queries exactly as the old state or exactly as the new state: never a mix. The encoder is a tiny random BERT
built on the spot (no download); the parts are what is tested, not the model. ``--passages WORDS`` builds a
passage engine that cuts documents into passages of that many words (a new one every half of it), so that an
update writes several rows per document and an upsert changes how many (0: whole documents, one row each).
``late``: the engine also stores token vectors (the tiny BERT read token by token), and the dense answers are
reordered by MaxSim over them, so a token part out of step with the rows shows.
"""

from __future__ import annotations

import random
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]  # the repository
QUERIES = ["rain and snow", "cats purr", "cook rice", "piano music", "garden roses", "the stars at night"]
WORDS = ("rain", "snow", "cat", "dog", "cook", "rice", "garden", "piano", "music", "star", "water", "sleep")


def answers(path: Path) -> list:
    """What the engine holds and answers: live ids, BM25 top 5 and dense top 5 (ids, rounded scores)."""
    from twostage.engine.search_engine import SearchEngine

    engine = SearchEngine.load(path, verify=True)  # checksums; the constructor checks the parts agree
    rows = sorted(str(i) for i in engine.index.doc_ids[~engine.index.deleted])
    live = live_documents(engine)
    out: list = [rows, [(d.id, d.text) for d in engine.documents(live)]]
    for first_stage in ("bm25", "dense"):
        for r in engine.search_batch(QUERIES, k=5, first_stage=first_stage, rerank=False):
            out.append([(h.id, round(h.score, 4)) for h in r.hits])
    engine.close()
    return out


def apply(path: Path, op: dict) -> None:
    from twostage.engine.search_engine import SearchEngine
    from twostage.indexer.records import Document

    engine = SearchEngine.load(path, verify=False)
    live = live_documents(engine)
    rng = random.Random(op["seed"])
    if op["kind"] == "add":
        engine.add([Document(f"{op['tag']}-{i}", t) for i, t in enumerate(op["texts"])])
    elif op["kind"] == "delete":
        engine.delete(rng.sample(live, op["n"]))
    elif op["kind"] == "upsert":
        ids = rng.sample(live, op["n"])
        engine.upsert([Document(i, t) for i, t in zip(ids, op["texts"])])
    elif op["kind"] == "compact":
        engine.compact()


def live_documents(engine: Any) -> list[str]:
    """The ids of the engine's live documents (of their first passages, in a passage engine), sorted."""
    from twostage.indexer.passages import split_id

    rows = [str(i) for i in engine.index.doc_ids[~engine.index.deleted]]
    if not engine.settings.passage_words:
        return sorted(rows)
    return sorted(d for d, n in map(split_id, rows) if n == 0)


def random_op(rng: random.Random, n: int) -> dict:
    kind = rng.choice(["add", "add", "delete", "upsert", "compact"])
    texts = [" ".join(rng.choice(WORDS) for _ in range(rng.randint(2, 8))) for _ in range(rng.randint(5, 80))]
    return {"kind": kind, "texts": texts, "tag": f"r{n}", "seed": n, "n": rng.randint(1, 5)}


def make_engine(workdir: Path, passages: int = 0, late: bool = False) -> Path:
    sys.path.insert(0, str(ROOT))
    from tests.conftest import build_tiny_bert
    from twostage.engine.search_engine import SearchEngine

    model = build_tiny_bert(workdir / "tiny-bert")
    SearchEngine.build(ROOT / "data" / "sample", workdir / "engine", retriever=model, precision="fp32",
                       passage_words=passages, passage_stride=max(1, passages // 2),
                       late_interaction=model if late else None, maxsim_blend=None).close()
    return workdir / "engine"


def run(rounds: int, seed: int, workdir: Path, passages: int = 0, late: bool = False) -> dict:
    sys.path.insert(0, str(ROOT))
    from tests.harness.crash import crash_rounds

    rng = random.Random(seed)
    engine = make_engine(workdir, passages, late)
    # answers() raises if the engine does not load, a checksum fails or the parts disagree
    return crash_rounds(engine, workdir, rounds, rng, __file__, random_op, answers)


def worker_entry() -> None:
    """``python tests/harness/engine_crash.py PATH OP``: the subprocess :func:`worker` starts (every import
    first, so that the kill lands inside the operation)."""
    import torch  # noqa: F401
    import transformers  # noqa: F401

    import twostage.engine.search_engine
    import twostage.retriever.biencoder  # noqa: F401
    import twostage.retriever.late  # noqa: F401

    sys.path.insert(0, str(ROOT))
    from tests.harness.crash import worker_main

    worker_main(apply)


if __name__ == "__main__":
    worker_entry()
