"""Concurrent writers and readers on one engine directory, from several processes.

Run small by tests/test_concurrency.py, at full size by ``python benchmarks/concurrency.py``.

Writers: two long-lived worker processes get one update each, to start at the same instant (add+add,
add+compact, delete+compact, upsert+delete); afterwards every committed change must be present (0 lost updates)
and any refused writer must have failed with a clear message. Readers: 8 threads here and 2 other processes
search and fetch documents in a loop (refreshing to the newest version each time) while a writer commits 20
times; every read must succeed and every answer must equal the answer of some committed version.
"""

from __future__ import annotations

import multiprocessing as mp
import random
import sys
import threading
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]  # the repository
WORDS = ("cat", "dog", "rain", "snow", "cook", "garden", "music", "history", "money", "star", "water", "sleep")
QUERIES = ["rain snow", "cat dog", "cook garden", "music star"]
PAIRS = (("add", "add"), ("add", "compact"), ("delete", "compact"), ("upsert", "delete"))


def _open(kind: str, path: Path) -> Any:
    from twostage.engine.search_engine import SearchEngine

    return SearchEngine.load(path, verify=False)


def _apply(kind: str, path: Path, op: dict[str, Any]) -> None:
    from twostage.indexer.records import Document

    target = _open(kind, path)
    if op["kind"] == "add":
        target.add([Document(i, t) for i, t in zip(op["ids"], op["texts"])])
    elif op["kind"] == "upsert":
        target.upsert([Document(i, t) for i, t in zip(op["ids"], op["texts"])])
    elif op["kind"] == "delete":
        target.delete(op["ids"])
    elif op["kind"] == "compact":
        target.compact()
    target.close()


def writer(kind: str, path: str, inbox: Any, outbox: Any) -> None:
    """A worker process: run each op at its start time, answer ("ok", "") or ("error", the message)."""
    _open(kind, Path(path)).close()  # every import done before the first op
    outbox.put(("ready", ""))
    while (op := inbox.get()) is not None:
        time.sleep(max(0.0, op["at"] - time.time()))
        try:
            _apply(kind, Path(path), op)
            outbox.put(("ok", ""))
        except Exception as exc:
            outbox.put(("error", f"{type(exc).__name__}: {exc}"))


def live(kind: str, path: Path) -> dict[str, str]:
    """Every live document's text (a passage engine's put back together from its passages), the parts checked to
    hold the same rows."""
    from twostage.indexer.passages import doc_id_of

    target = _open(kind, path)
    index = target.index
    rows = [str(i) for i in index.doc_ids[~index.deleted]]
    assert [str(i) for i in target.bm25.doc_ids] == rows, "BM25 and the documents disagree"
    ids = list(dict.fromkeys(doc_id_of(r) for r in rows)) if kind == "passages" else rows
    out = {d.id: d.text for d in target.documents(ids)}
    assert len(out) == len(target), "the manifest's count and the parts disagree"
    target.close()
    return out


def make(kind: str, workdir: Path) -> Path:
    from twostage.indexer.records import Document

    docs = [Document(f"d{i}", " ".join(random.Random(i).choice(WORDS) for _ in range(5))) for i in range(120)]
    sys.path.insert(0, str(ROOT))
    from tests.conftest import build_tiny_bert
    from twostage.engine.search_engine import SearchEngine

    model = workdir / "tiny-bert"
    if not model.is_dir():
        build_tiny_bert(model)
    # "passages": passages of 3 words every 2, so that each document is several rows and an upsert changes how many
    shape = {"passage_words": 3, "passage_stride": 2} if kind == "passages" else {"passage_words": 0}
    SearchEngine.build(docs, workdir / kind, retriever=model, precision="fp32", **shape).close()
    return workdir / kind


def writers(kind: str, trials: int, workdir: Path) -> dict[str, Any]:
    path = make(kind, workdir)
    ctx = mp.get_context("spawn")
    boxes = [(ctx.Queue(), ctx.Queue()) for _ in range(2)]
    procs = [ctx.Process(target=writer, args=(kind, str(path), i, o), daemon=True) for i, o in boxes]
    for p in procs:
        p.start()
    for _, o in boxes:
        assert o.get(timeout=300)[0] == "ready"
    lost = refused = 0
    messages: list[str] = []
    rng = random.Random(0)
    n = 0
    for _ in range(trials):
        for a, b in PAIRS:
            n += 1
            before = live(kind, path)
            ids = sorted(before)
            victims = rng.sample(ids, 4)
            ops = []
            for j, name in enumerate((a, b)):
                tag = f"t{n}-{j}"
                op: dict[str, Any] = {"kind": name, "at": time.time() + 0.3}
                if name == "add":
                    op.update(ids=[f"{tag}-{i}" for i in range(3)], texts=[f"{tag} rain snow"] * 3)
                elif name == "upsert":
                    op.update(ids=victims[:2], texts=[f"{tag} upserted cat"] * 2)
                elif name == "delete":
                    op.update(ids=victims[2:] if a == "upsert" else victims[:2])
                ops.append(op)
            for (inbox, _), op in zip(boxes, ops):
                inbox.put(op)
            answers = [o.get(timeout=600) for _, o in boxes]
            after = live(kind, path)
            for op, (status, message) in zip(ops, answers):
                if status != "ok":
                    refused += 1
                    messages.append(message)
                    continue
                if op["kind"] == "add" and not all(after.get(i) == t for i, t in zip(op["ids"], op["texts"])):
                    lost += 1
                if op["kind"] == "upsert" and not all(after.get(i) == t for i, t in zip(op["ids"], op["texts"])):
                    lost += 1
                if op["kind"] == "delete" and any(i in after for i in op["ids"]):
                    lost += 1
    for inbox, _ in boxes:
        inbox.put(None)
    for p in procs:
        p.join(timeout=60)
    return {"kind": kind, "runs": n, "lost": lost, "refused": refused, "messages": messages}


def reader_process(kind: str, path: str, stop: str, outbox: Any, started: str = "") -> None:
    outbox.put(read_loop(kind, Path(path), Path(stop), Path(started) if started else None))


def read_loop(kind: str, path: Path, stop: Path, started: Path | None = None) -> tuple[int, int, list[tuple[str, Any]]]:
    """Search and fetch until the file ``stop`` exists (or 10 minutes); (reads, failures, (version, answer) seen).
    ``started``: a file touched after the first read, for the writer to wait on."""
    reads = failures = 0
    seen: list[tuple[str, Any]] = []
    target = _open(kind, path)
    deadline = time.time() + 600
    while not stop.exists() and time.time() < deadline:
        try:
            target = target.refresh()
            version = target.version
            answer = _answer(kind, target)
            seen.append((version, answer))
            reads += 1
            if started is not None and reads == 1:
                started.touch()
        except Exception:
            failures += 1
    return reads, failures, seen


def _answer(kind: str, target: Any) -> Any:
    results = [target.search(q, 3, rerank=False).ids for q in QUERIES]
    docs = [d.text for d in target.documents([results[0][0]])]
    return [results, docs]


def readers(kind: str, commits: int, workdir: Path, threads: int = 8) -> dict[str, Any]:
    from twostage.indexer.records import Document

    path = make(kind, workdir / "readers")
    truth: dict[str, Any] = {}
    first = _open(kind, path)
    truth[first.version] = _answer(kind, first)
    stop = workdir / "STOP"
    ctx = mp.get_context("spawn")
    out = ctx.Queue()
    results: list[Any] = []
    workers = [threading.Thread(target=lambda: results.append(read_loop(kind, path, stop))) for _ in range(threads)]
    marks = [workdir / f"STARTED-{i}" for i in range(2)]
    procs = [ctx.Process(target=reader_process, args=(kind, str(path), str(stop), out, str(m)), daemon=True)
             for m in marks]
    for p in procs:
        p.start()
    for t in workers:
        t.start()
    deadline = time.monotonic() + 300  # the reader processes have read once (a spawned process imports torch)
    while not all(m.exists() for m in marks) and time.monotonic() < deadline:
        time.sleep(0.05)
    target = first
    for c in range(commits):
        op = c % 3
        if op == 0:
            target = target.add([Document(f"w{c}", "rain snow cat " * (c + 1))])
        elif op == 1:
            target = target.delete([f"d{c}"])
        else:
            target = target.compact()
        truth[target.version] = _answer(kind, target)
    stop.touch()
    for t in workers:
        t.join()
    results += [out.get(timeout=300) for _ in procs]  # before join: a child exits only once its queue is read
    for p in procs:
        p.join(timeout=120)
    reads = sum(r[0] for r in results)
    failures = sum(r[1] for r in results)
    wrong = sum(1 for r in results for version, answer in r[2] if truth.get(version) != answer)
    return {"kind": kind, "commits": commits, "reads": reads, "failures": failures, "wrong": wrong,
            "versions_seen": len({v for r in results for v, _ in r[2]})}
