"""The cluster check: a sharded engine on a 3-node Ray cluster answers as one engine, survives a node killed under
load and a write committed under load, and R=1 against R=2 (#48; back among the scripts a user runs: #84).

    python benchmarks/cluster.py [--data ../shared/data/scifact] [--shards 2] [--seconds 60] [--http-requests 1000]

Needs the ray extra (`pip install "twostage-search[ray]"`). Builds (once, in ``--work``; again when the library
that built them is not this one) SciFact as one engine and as a sharded engine (whole documents, exact search, hybrid,
no reranker, all-MiniLM-L6-v2), starts a local cluster of three nodes (a head and two workers, each its own raylet
with 1 CPU: :class:`twostage.indexer.ray_util.LocalCluster`) and opens the sharded engine on it with R replicas a
shard. Then:

1. **Exactness**: every test query through the cluster (R=2) against the one engine: ids and scores.
2. **R=1 vs R=2**: 2 client threads searching for ``--seconds`` each: throughput and p50.
3. **A node lost**: R=2, 2 clients; after a third of the time one worker node's raylet and its processes get SIGKILL
   (by pid); every request's outcome and latency is recorded, and the time until every shard has 2 live replicas
   again. Latency over time: ``cluster_failover.png``.
4. **A write under load**: R=2, 2 clients, one of which searches for a new document's text; halfway a document is
   added (a new version; the clients move to the engine it returns). Every response is checked: answered by the
   old version, the new document is absent; by the new one, it is the first hit.
5. **Over HTTP**: ``twostage serve`` on the cluster address (R=2): every test query's ``/search`` against the one
   engine, then ``--http-requests`` requests from 4 concurrent clients.

The nodes start as ``ray start`` processes (``--launcher ray-start``, the default) or through Ray's cluster_utils.

Writes benchmarks/results/cluster_failover.md (+ .json, .png).
"""

from __future__ import annotations

import argparse
import json
import sys
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))
NEW_TEXT = "Zebrafish lanterns hum quietly beneath glaciers of marmalade"


def build(args: argparse.Namespace) -> tuple[Path, Path]:
    from twostage.engine.search_engine import SearchEngine
    from twostage.engine.sharded import ShardedEngine
    from twostage.indexer.beir import BeirDataset

    import shutil

    from twostage.indexer.manifest import library_versions

    single, sharded = args.work / "single", args.work / f"sharded-{args.shards}"
    stamp = args.work / "built-by.json"  # builds of another library version are built again (they may differ)
    built_by = json.dumps({"versions": library_versions(), "source": _source_digest(), "model": args.model})
    if not stamp.is_file() or stamp.read_text() != built_by:
        shutil.rmtree(single, ignore_errors=True)
        shutil.rmtree(sharded, ignore_errors=True)
    corpus = None
    settings = {"backend": "flat", "passage_words": 0}
    if not (single / "CURRENT").is_file():
        corpus = BeirDataset(args.data).corpus
        SearchEngine.build(corpus, single, retriever=args.model, show_progress=True, **settings).close()
    if not (sharded / "CURRENT").is_file():
        corpus = corpus or BeirDataset(args.data).corpus
        ShardedEngine.build(corpus, sharded, shards=args.shards, retriever=args.model, show_progress=True,
                            **settings).close()
    stamp.write_text(built_by)
    return single, sharded


def _source_digest() -> str:
    """The sha256 of the installed package's Python files: a build from other code is not reused."""
    import hashlib

    import twostage

    digest = hashlib.sha256()
    for path in sorted(Path(twostage.__file__).parent.rglob("*.py")):
        digest.update(path.read_bytes())
    return digest.hexdigest()


class Load:
    """Client threads searching an engine (``self.engine``, swapped by the caller) until stopped; every request's
    start time, latency, outcome and version."""

    def __init__(self, engine: Any, queries: list[str], threads: int = 2, check: Any = None) -> None:
        self.engine, self.queries, self.check = engine, queries, check
        self.records: list[tuple[float, float, str, str]] = []  # (start, ms, outcome, version)
        self.stop = threading.Event()
        self.lock = threading.Lock()
        self.threads = [threading.Thread(target=self.run, args=(i, threads), daemon=True) for i in range(threads)]

    def run(self, offset: int, step: int) -> None:
        i = offset
        while not self.stop.is_set():
            query = self.queries[i % len(self.queries)]
            engine = self.engine
            t = time.time()
            try:
                result = engine.search(query, k=10, first_stage="hybrid", rerank=False)
                outcome = self.check(engine, query, result) if self.check else "ok"
            except Exception as exc:  # noqa: BLE001 - every failure is counted and named in the report
                outcome = f"error: {type(exc).__name__}: {str(exc)[:120]}"
            with self.lock:
                self.records.append((t, (time.time() - t) * 1000, outcome, engine.version))
            i += step

    def __enter__(self) -> Load:
        for th in self.threads:
            th.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        for th in self.threads:
            th.join()

    def summary(self, since: float | None = None) -> dict[str, Any]:
        rows = [r for r in self.records if since is None or r[0] >= since]
        lat = np.array([r[1] for r in rows if r[2] == "ok"])
        span = (max(r[0] + r[1] / 1000 for r in rows) - min(r[0] for r in rows)) if rows else 0.0
        errors = [r[2] for r in rows if r[2] != "ok"]
        return {"requests": len(rows), "failed": len(errors), "errors": sorted(set(errors))[:5],
                "per_s": len(rows) / span if span else 0.0,
                "p50_ms": float(np.percentile(lat, 50)) if len(lat) else None,
                "p95_ms": float(np.percentile(lat, 95)) if len(lat) else None,
                "max_ms": float(lat.max()) if len(lat) else None}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", type=Path, default=ROOT.parent / "shared" / "data" / "scifact")
    parser.add_argument("--model", default="all-MiniLM-L6-v2")
    parser.add_argument("--shards", type=int, default=2)
    parser.add_argument("--seconds", type=float, default=60.0)
    parser.add_argument("--work", type=Path, default=ROOT / "runs" / "cluster")
    parser.add_argument("--build-only", action="store_true")
    parser.add_argument("--launcher", default="ray-start", choices=("ray-start", "cluster_utils"),
                        help="how the three nodes start: `ray start` processes (default) or Ray's cluster_utils")
    parser.add_argument("--http-requests", type=int, default=1000, help="requests of the HTTP load (phase 5)")
    parser.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results" / "cluster_failover.md")
    args = parser.parse_args()
    single_dir, sharded_dir = build(args)
    if args.build_only:
        return 0

    import ray
    from serve_load import machine

    from twostage.engine.search_engine import SearchEngine
    from twostage.engine.sharded import ShardedEngine
    from twostage.indexer.beir import BeirDataset
    from twostage.indexer.ray_util import LocalCluster

    split = BeirDataset(args.data).split("test")
    queries = [q.text for q in split.queries]
    out: dict[str, Any] = {}
    single = SearchEngine.load(single_dir)
    work_copy = args.work / "sharded-written"  # the write goes to a copy: the built engine stays as it was
    import shutil

    shutil.rmtree(work_copy, ignore_errors=True)
    shutil.copytree(sharded_dir, work_copy, symlinks=True)
    with LocalCluster(workers=2, cpus_per_node=1, launcher=args.launcher) as cluster:
        ray.init(address=cluster.address, log_to_driver=False)
        out["nodes"] = len([n for n in ray.nodes() if n["Alive"]])

        # 1. exactness, R=2
        engine = ShardedEngine.load(sharded_dir, ray=True, replicas=2)
        t = time.time()
        same_ids = same_scores = 0
        for q in queries:
            a = engine.ranked(q, 10, first_stage="hybrid", rerank=False)
            b = single.ranked(q, 10, first_stage="hybrid", rerank=False)
            same_ids += list(a.ids) == list(b.ids)
            same_scores += a.scores.tolist() == b.scores.tolist()
        out["exact"] = {"queries": len(queries), "same_ids": same_ids, "same_scores": same_scores,
                        "placement": engine.replicas.placement(), "seconds": time.time() - t}
        print("exact:", {k: v for k, v in out["exact"].items() if k != "placement"}, flush=True)

        # 2. R=2 then R=1 (the R=2 engine first: it is open)
        for r in (2, 1):
            if r == 1:
                engine.close()
                engine = ShardedEngine.load(sharded_dir, ray=True, replicas=1)
            engine.search(queries[0], k=10)  # warm
            with Load(engine, queries) as load:
                time.sleep(args.seconds)
            out[f"R={r}"] = load.summary()
            print(f"R={r}:", out[f"R={r}"], flush=True)
        engine.close()

        # 3. a node lost under load, R=2
        engine = ShardedEngine.load(sharded_dir, ray=True, replicas=2)
        engine.search(queries[0], k=10)
        healthy = None
        with Load(engine, queries) as load:
            time.sleep(args.seconds / 3)
            killed_at = time.time()
            pids = cluster.kill_worker(0)
            while time.time() - killed_at < args.seconds * 2 / 3:
                if healthy is None and engine.replicas.health() == [2] * args.shards and any(
                        "replaced" in e for _, e in engine.replicas.events):
                    healthy = time.time() - killed_at
                time.sleep(0.2)
        out["node_lost"] = {"killed_pids": len(pids), "summary": load.summary(),
                            "after_kill": load.summary(since=killed_at), "recovered_s": healthy,
                            "events": [(round(t - killed_at, 2), e) for t, e in engine.replicas.events],
                            "placement_after": engine.replicas.placement(), "dead_node": cluster.worker_node_id(0)}
        print("node lost:", {k: v for k, v in out["node_lost"].items() if k != "placement_after"}, flush=True)
        plot(load.records, killed_at, healthy, args.out.with_suffix(".png"))
        engine.close()

        # 4. a write under load (on the copy), R=2 on the two live nodes
        engine = ShardedEngine.load(work_copy, ray=True, replicas=2)
        old_version = engine.version

        def check(used: Any, query: str, result: Any) -> str:
            if query != NEW_TEXT:
                return "ok"
            present = any(h.id == "new-doc" for h in result.hits)
            if used.version == old_version:
                return "ok" if not present else "mixed: the new document from the old version"
            return "ok" if result.hits and result.hits[0].id == "new-doc" else "mixed: the new version without it"

        from twostage import Document

        with Load(engine, [NEW_TEXT, *queries[:20]], check=check) as load:
            time.sleep(args.seconds / 2)
            t = time.time()
            new = engine.add([Document("new-doc", NEW_TEXT, "Marmalade glaciers")])
            commit_s = time.time() - t
            load.engine = new
            committed_at = time.time()
            time.sleep(args.seconds / 2)
        later = [r for r in load.records if r[0] >= committed_at]
        out["write"] = {"old": old_version, "new": new.version, "commit_s": commit_s, "summary": load.summary(),
                        "later_requests": len(later), "later_on_new": sum(r[3] == new.version for r in later),
                        "mixed": sum(r[2].startswith("mixed") for r in load.records)}
        print("write:", out["write"], flush=True)
        new.close()
        engine.close()
        ray.shutdown()

        # 5. `twostage serve` on the cluster address (R=2): /search equal to the one engine, then an HTTP load
        out["http"] = http_phase(sharded_dir, cluster.address, single, queries, args.http_requests)
        print("http:", out["http"], flush=True)
    single.close()
    args.out.with_suffix(".json").write_text(json.dumps(out, indent=1, default=str) + "\n")
    args.out.write_text(report(out, args, machine()), encoding="utf-8")
    print(args.out.read_text())
    return 0


def http_phase(sharded_dir: Path, address: str, single: Any, queries: list[str], requests: int) -> dict[str, Any]:
    """`twostage serve ENGINE --ray-address ADDR --replicas 2` in a child process: every test query's /search
    against the one engine (ids; scores within 1e-6 after JSON), then ``requests`` requests from 4 clients."""
    import asyncio

    import httpx
    from serve_load import Server, load

    t = time.time()
    server = Server(sharded_dir, "--ray-address", address, "--replicas", "2")
    started_s = time.time() - t
    try:
        same_ids = close_scores = failed = 0
        for q in queries:
            r = httpx.post(f"{server.url}/search", json={"query": q, "k": 10}, timeout=120)
            if r.status_code != 200:
                failed += 1
                continue
            hits = r.json()["hits"]
            b = single.ranked(q, 10, first_stage="hybrid", rerank=False)
            same_ids += [h["id"] for h in hits] == list(b.ids)
            close_scores += len(hits) == len(b.scores) and bool(
                np.allclose([h["score"] for h in hits], b.scores, rtol=0, atol=1e-6))
        result = asyncio.run(load(server.url, queries, 4, requests, 600))
        result.pop("latencies")
    finally:
        server.stop()
    return {"start_s": started_s, "queries": len(queries), "same_ids": same_ids, "close_scores": close_scores,
            "failed": failed, "load": result}


def plot(records: list[tuple[float, float, str, str]], killed_at: float, healthy: float | None, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    t0 = min(r[0] for r in records)
    fig, ax = plt.subplots(figsize=(8, 3.5))
    ok = [(r[0] - t0, r[1]) for r in records if r[2] == "ok"]
    bad = [(r[0] - t0, r[1]) for r in records if r[2] != "ok"]
    ax.scatter(*zip(*ok), s=4, label="answered")
    if bad:
        ax.scatter(*zip(*bad), s=12, color="red", label="failed")
    ax.axvline(killed_at - t0, color="black", linestyle="--", label="worker node killed")
    if healthy is not None:
        ax.axvline(killed_at - t0 + healthy, color="green", linestyle=":", label="every shard has 2 replicas again")
    ax.set_xlabel("seconds")
    ax.set_ylabel("latency (ms)")
    ax.set_yscale("log")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=100)


def report(out: dict[str, Any], args: argparse.Namespace, where: str) -> str:
    e, lost, w = out["exact"], out["node_lost"], out["write"]
    r1, r2 = out["R=1"], out["R=2"]
    lines = ["# A sharded engine on a 3-node Ray cluster: exactness, a node lost, a write, R=1 vs R=2", "",
             f"Command: `python benchmarks/cluster.py {' '.join(sys.argv[1:])}`", "",
             f"Machine: {where}. Cluster: {out['nodes']} nodes on this machine (a head and 2 workers, each its own "
             "raylet and object store, 1 CPU each: `LocalCluster`, "
             + ("`ray start --head` and two `ray start --address` processes" if args.launcher == "ray-start"
                else "Ray's cluster_utils") + "); SciFact corpus, "
             f"{args.shards} shards, whole documents, exact search, hybrid, no reranker, {args.model}; "
             "2 client threads in this process calling `search`.", "",
             "## Exactness (R=2)", "",
             f"Every test query through the cluster against one engine: ids equal on **{e['same_ids']} / "
             f"{e['queries']}**, scores equal on **{e['same_scores']} / {e['queries']}**. Each shard's two replicas "
             f"on two different nodes: {e['placement']}.", "",
             "## R=1 against R=2 (2 clients, no failure)", "",
             "| replicas | requests | requests/s | p50 ms | p95 ms |", "|---|---:|---:|---:|---:|"]
    for name, s in (("R=1", r1), ("R=2", r2)):
        lines.append(f"| {name} | {s['requests']} | {s['per_s']:.1f} | {s['p50_ms']:.1f} | {s['p95_ms']:.1f} |")
    lines += ["", f"R=2 / R=1: throughput {r2['per_s'] / r1['per_s']:.2f}x, p50 {r2['p50_ms'] / r1['p50_ms']:.2f}x. "
              "The three nodes share this machine's 2 cores (and the driver encodes every query), so a second "
              "replica adds no CPU: it buys availability here, not speed.", "",
              "## A worker node killed under load (R=2)", "",
              f"SIGKILL to worker node 1's {lost['killed_pids']} processes (its raylet, its Ray workers and, with "
              f"`ray start`, the command that started it), a third of the way in. Requests: **{lost['summary']['requests']}, {lost['summary']['failed']} failed**"
              + (f" ({'; '.join(lost['summary']['errors'])})" if lost['summary']['failed'] else "")
              + f"; after the kill {lost['after_kill']['requests']} requests, p50 {lost['after_kill']['p50_ms']:.1f} "
              f"ms, max {lost['after_kill']['max_ms']:.0f} ms. Every shard had 2 live replicas again "
              + (f"**{lost['recovered_s']:.1f} s** after the kill" if lost["recovered_s"] is not None
                 else "**not within the run**")
              + f"; none on the dead node afterwards: {lost['placement_after']}. Events (seconds after the kill): "
              + "; ".join(f"{t} {what}" for t, what in lost["events"]) + ".", "",
              "![latency over time](cluster_failover.png)", "",
              "## A write committed under load (R=2)", "",
              f"`add` of one document committed {w['old']} -> {w['new']} in {w['commit_s']:.1f} s (every shard's next "
              "version, then new replicas opening it) while the clients searched; requests: "
              f"{w['summary']['requests']}, {w['summary']['failed']} failed. Of the {w['later_requests']} requests "
              f"started after the commit, {w['later_on_new']} were answered by the new version; responses mixing "
              f"versions (the new document seen by the old version, or missing from the new one): **{w['mixed']}**.",
              ""]
    if "http" in out:
        h, hl = out["http"], out["http"]["load"]
        lines += ["## Served over HTTP from the cluster (R=2)", "",
                  "`twostage serve ENGINE --ray-address ADDR --replicas 2` in a child process (it joins the cluster as "
                  f"a driver; up in {h['start_s']:.0f} s). Every test query's `POST /search` against the one engine: "
                  f"ids equal on **{h['same_ids']} / {h['queries']}**, scores within 1e-6 on **{h['close_scores']} / "
                  f"{h['queries']}**, {h['failed']} failed. Then {hl['requests']} requests from {hl['concurrency']} "
                  f"concurrent clients (httpx): **{hl['errors']} errors**, {hl['rps']:.1f} requests/s, p50 "
                  f"{hl['p50_ms']:.1f} ms, p95 {hl['p95_ms']:.1f} ms.", ""]
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    raise SystemExit(main())
