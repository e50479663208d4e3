"""Model swaps under load (#47): a served engine gets a new retriever through the quality gate while clients search.

    python benchmarks/experiments/swap_under_load.py --a all-MiniLM-L6-v2 --b runs/models/demo/retriever \
        [--data ../shared/data/scifact] [--split train] [--held-out 0.1 --seed 42]

``--held-out F`` judges on the train queries that training held out as its dev part (``hold_out(train, F, seed)``,
as ``bench --train-split`` and ``twostage train`` do): a model trained on the rest is judged on queries it never saw.

Builds a whole-document engine over the collection with retriever A (hybrid first stage, no reranker), serves it
(`twostage serve`), and while 2 clients keep searching: swaps to B judged by the ``--split`` qrels (never test),
then back to A; then starts a third swap as a child process and kills it (SIGKILL) while it builds. Reports every
decision (the measured difference and p-value), the requests and failures the clients saw, the versions they were
answered from, and what the killed swap left. Writes benchmarks/results/swap_under_load.md.
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "benchmarks"))


def clients(url: str, queries: list[str], stop: threading.Event, n: int = 2) -> dict[str, Any]:
    import httpx

    seen: dict[str, Any] = {"requests": 0, "failed": 0, "errors": [], "versions": [], "latency_ms": []}
    lock = threading.Lock()

    def run(offset: int) -> None:
        i = offset
        with httpx.Client(timeout=120) as http:
            while not stop.is_set():
                t = time.perf_counter()
                try:
                    r = http.post(f"{url}/search", json={"query": queries[i % len(queries)], "k": 10})
                    ok, version = r.status_code == 200, r.json().get("version") if r.status_code == 200 else None
                    error = None if ok else f"{r.status_code} {r.text[:120]}"
                except httpx.HTTPError as exc:
                    ok, version, error = False, None, repr(exc)
                with lock:
                    seen["requests"] += 1
                    seen["latency_ms"].append((time.perf_counter() - t) * 1000)
                    if ok:
                        if not seen["versions"] or seen["versions"][-1][0] != version:
                            seen["versions"].append((version, time.strftime("%H:%M:%S")))
                    else:
                        seen["failed"] += 1
                        seen["errors"].append(error)
                i += n

    threads = [threading.Thread(target=run, args=(k,)) for k in range(n)]
    for t in threads:
        t.start()
    seen["threads"] = threads
    return seen


def held_out_split(data: Path, split: str, fraction: float, seed: int, out: Path) -> Path:
    """A BEIR directory beside ``data`` (its corpus and queries linked) whose ``qrels/dev.tsv`` holds only the queries
    that training held out of ``split`` as its dev part."""
    from twostage.indexer.beir import BeirDataset
    from twostage.retriever.training_data import hold_out

    _, dev = hold_out(list(BeirDataset(data).split(split).queries), fraction, seed)
    keep = {q.id for q in dev}
    (out / "qrels").mkdir(parents=True)
    for name in ("corpus.jsonl", "queries.jsonl"):
        (out / name).symlink_to((data / name).resolve())
    lines = (data / "qrels" / f"{split}.tsv").read_text().splitlines()
    (out / "qrels" / "dev.tsv").write_text("\n".join([lines[0]] + [x for x in lines[1:] if x.split("\t")[0] in keep])
                                         + "\n")
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--a", default="all-MiniLM-L6-v2")
    parser.add_argument("--b", required=True)
    parser.add_argument("--data", type=Path, default=ROOT.parent / "shared" / "data" / "scifact")
    parser.add_argument("--split", default="train")
    parser.add_argument("--held-out", type=float, default=0.0,
                        help="judge on the dev part training held out of --split (this fraction, --seed)")
    parser.add_argument("--seed", type=int, default=42)
    parser.add_argument("--work", type=Path, default=ROOT / "runs" / "swap-load")
    parser.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results" / "swap_under_load.md")
    args = parser.parse_args()

    import shutil

    import numpy as np
    from serve_load import Server, machine

    from twostage.app.swap import swap
    from twostage.engine.search_engine import SearchEngine
    from twostage.indexer.beir import load_qrels, load_queries
    from twostage.indexer.versions import current_version

    test = set(load_qrels(args.data / "qrels" / "test.tsv").query_ids)
    queries = [q.text for q in load_queries(args.data / "queries.jsonl") if q.id in test]
    engine = args.work / "engine"
    shutil.rmtree(args.work, ignore_errors=True)
    args.work.mkdir(parents=True)
    judged, split = args.data, args.split
    if args.held_out:
        judged, split = held_out_split(args.data, args.split, args.held_out, args.seed, args.work / "judged"), "dev"
    t = time.perf_counter()
    SearchEngine.build(args.data, engine, retriever=args.a, passage_words=0, show_progress=True).close()
    build_s = time.perf_counter() - t
    server = Server(engine)
    stop = threading.Event()
    seen = clients(server.url, queries, stop)
    decisions = []
    try:
        time.sleep(5)
        for new in (args.b, args.a):
            t = time.perf_counter()
            d = swap(engine, retriever=new, qrels=judged, split=split, show_progress=False)
            decisions.append((new, d, time.perf_counter() - t))
            print(f"swap to {new}: {d.line()} ({decisions[-1][2]:.0f} s)", flush=True)
            time.sleep(3)
        before = current_version(engine).name
        child = subprocess.Popen([sys.executable, "-m", "twostage", "-q", "swap", str(engine), "--retriever",
                                  args.b, "--qrels", str(judged), "--split", split, "--force"],
                                 stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        time.sleep(30)  # well inside the candidate's build
        os.kill(child.pid, signal.SIGKILL)
        child.wait()
        time.sleep(3)
        after = current_version(engine).name
        left = sorted(p.name for p in engine.parent.glob(f".{engine.name}.swap-*"))
        loaded = SearchEngine.load(engine, verify=True)
        killed = {"before": before, "after": after, "left": left, "loads": len(loaded)}
        loaded.close()
        print(f"killed swap: CURRENT {before} -> {after}, staging left: {left}", flush=True)
    finally:
        stop.set()
        for th in seen.pop("threads"):
            th.join()
        server.stop()
    lat = np.array(seen["latency_ms"])
    lines = ["# Model swaps under load", "",
             f"Command: `python benchmarks/experiments/swap_under_load.py {' '.join(sys.argv[1:])}`", "",
             f"Machine: {machine()}. Engine: {args.data.name} corpus, whole documents, hybrid first stage, no "
             f"reranker, retriever A = `{args.a}` (built in {build_s:.0f} s); served by `twostage serve` while 2 "
             f"clients sent the test queries without pause (the swaps are judged on the "
             + (f"{len(load_qrels(judged / 'qrels' / 'dev.tsv').query_ids)} `{args.split}` queries training held "
                f"out as dev (fraction {args.held_out}, seed {args.seed})" if args.held_out else
                f"`{args.split}` qrels") + ", never test).", "",
             "| swap to | decision | nDCG@10 current -> candidate | delta [95% CI] | p (paired t) | queries | "
             "seconds | version after |", "|---|---|---|---|---|---:|---:|---|"]
    for new, d, secs in decisions:
        lines.append(f"| `{new}` | {'promoted' if d.promoted else 'refused'} | {d.current:.4f} -> {d.candidate:.4f} | "
                     f"{d.delta:+.4f} [{d.ci[0]:+.4f}, {d.ci[1]:+.4f}] | {d.p_value:.3g} | {d.queries} | {secs:.0f} | "
                     f"{d.version_after} |")
    lines += ["", f"The clients: **{seen['requests']} requests, {seen['failed']} failed**"
              + (f" ({'; '.join(seen['errors'][:3])})" if seen["failed"] else "")
              + f"; p50 {np.percentile(lat, 50):.0f} ms, p99 {np.percentile(lat, 99):.0f} ms, max {lat.max():.0f} ms;"
              " answered from versions " + ", ".join(f"{v} (from {t})" for v, t in seen["versions"]) + ".", "",
              f"A third swap (`twostage swap ... --force`) killed with SIGKILL 30 s into its build: CURRENT "
              f"{killed['before']} -> {killed['after']}; the engine loads with every checksum verified "
              f"({killed['loads']} documents); staging left beside the engine: {killed['left'] or 'none'} (delete "
              "it; the next swap makes its own).", ""]
    args.out.write_text("\n".join(lines))
    print(f"wrote {args.out}")
    return 0 if seen["failed"] == 0 and killed["before"] == killed["after"] else 1


if __name__ == "__main__":
    sys.exit(main())
