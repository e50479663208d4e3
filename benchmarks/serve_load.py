"""Load test of `twostage serve` on localhost: throughput and latency with and without cross-request batching,
and a writer adding documents during the load.

Usage (from the repository root, the serve extra installed):
    python benchmarks/serve_load.py --retriever runs/models/scifact-e2e/retriever \
        --reranker runs/models/scifact-e2e/reranker [--data ../shared/data/scifact] [--requests 160]

Builds a search engine over the SciFact corpus with the two models (engine defaults: hybrid first stage, the
reranker on the top rerank_depth, precision auto), starts two servers on 127.0.0.1 (one with batching, one with
`--no-batching`), and for concurrency 1, 4 and 16 sends SciFact test queries (`POST /search`, default depth) to
each in turn: bounded by --requests per level and --max-seconds per level. Then, against a fresh copy of the
engine, a writer adds --add documents in batches of 100 through `POST /documents` while 4 clients keep searching;
afterwards every added document must be found, and the engine directory must load with its checksums verified.
Writes benchmarks/results/serve_load.md and .json.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import shutil
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parent.parent


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Server:
    """`twostage serve` in a child process, waited for until /health answers."""

    def __init__(self, engine: Path, *flags: str) -> None:
        import httpx

        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log = open(engine.parent / f"serve-{self.port}.log", "w")  # noqa: SIM115
        self.proc = subprocess.Popen([sys.executable, "-m", "twostage", "serve", str(engine), "--port", str(self.port),
                                      "--fast", *flags], stdout=self.log, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise SystemExit(f"the server exited: {Path(self.log.name).read_text()}")
            try:
                if httpx.get(f"{self.url}/health", timeout=1).status_code == 200:
                    return
            except httpx.HTTPError:
                time.sleep(0.5)
        raise SystemExit("the server did not answer in 300 s")

    def stats(self) -> dict[str, Any]:
        import httpx

        return httpx.get(f"{self.url}/stats", timeout=30).json()

    def stop(self) -> None:
        self.proc.terminate()
        self.proc.wait(timeout=60)
        self.log.close()


async def load(url: str, queries: list[str], concurrency: int, requests: int, max_seconds: float,
               stop: threading.Event | None = None) -> dict[str, Any]:
    """``concurrency`` clients send queries in turn until ``requests`` are done, time is up, or ``stop`` is set."""
    import httpx

    latencies: list[float] = []
    errors: list[str] = []
    versions: set[str] = set()
    sent = 0
    t0 = time.perf_counter()

    async def client(http: httpx.AsyncClient) -> None:
        nonlocal sent
        while (sent < requests and time.perf_counter() - t0 < max_seconds) if stop is None else not stop.is_set():
            query = queries[sent % len(queries)]
            sent += 1
            t = time.perf_counter()
            try:
                r = await http.post(f"{url}/search", json={"query": query, "k": 10})
                if r.status_code != 200:
                    errors.append(f"{r.status_code} {r.text[:200]}")
                else:
                    versions.add(r.json()["version"])
            except httpx.HTTPError as exc:
                errors.append(repr(exc))
            latencies.append((time.perf_counter() - t) * 1000)

    limits = httpx.Limits(max_connections=concurrency, max_keepalive_connections=concurrency)
    async with httpx.AsyncClient(timeout=300, limits=limits) as http:
        await asyncio.gather(*(client(http) for _ in range(concurrency)))
    wall = time.perf_counter() - t0
    lat = np.array(latencies)
    return {"concurrency": concurrency, "requests": len(latencies), "errors": len(errors), "error_samples": errors[:3],
            "seconds": wall, "rps": len(latencies) / wall, "p50_ms": float(np.percentile(lat, 50)),
            "p95_ms": float(np.percentile(lat, 95)), "p99_ms": float(np.percentile(lat, 99)),
            "versions": sorted(versions), "latencies": lat}


def measure(server: Server, queries: list[str], c: int, n: int, max_seconds: float) -> dict[str, Any]:
    """One load run, with the mean number of requests that shared a reranker call (batching servers)."""
    before = server.stats().get("batching") or {}
    result = asyncio.run(load(server.url, queries, c, n, max_seconds))
    after = server.stats().get("batching") or {}
    if after:
        calls = after["reranker"]["model_calls"] - before["reranker"]["model_calls"]
        reqs = after["reranker"]["requests"] - before["reranker"]["requests"]
        result["mean_batch_requests"] = reqs / calls if calls else 0.0
    return result


def combine(results: list[dict[str, Any]]) -> dict[str, Any]:
    """Rounds of one mode and level: requests/s is total requests over total seconds, percentiles over all."""
    lat = np.concatenate([r["latencies"] for r in results])
    out = {"concurrency": results[0]["concurrency"], "requests": sum(r["requests"] for r in results),
           "errors": sum(r["errors"] for r in results), "seconds": sum(r["seconds"] for r in results),
           "rps_rounds": [r["rps"] for r in results],
           "p50_ms": float(np.percentile(lat, 50)), "p95_ms": float(np.percentile(lat, 95)),
           "p99_ms": float(np.percentile(lat, 99))}
    out["rps"] = out["requests"] / out["seconds"]
    if "mean_batch_requests" in results[0]:
        out["mean_batch_requests"] = float(np.mean([r["mean_batch_requests"] for r in results]))
    return out


def synthetic_documents(n: int) -> list[dict[str, Any]]:
    """Documents with a unique made-up code word each, so that each one has a query that must find it."""
    letters = "bcdfghjklmnprstvz"
    topics = ["protein folding", "tumour growth", "vaccine response", "gut bacteria", "insulin signalling"]
    docs = []
    for i in range(n):
        code, x = "", i + 1000
        while x:
            code, x = letters[x % len(letters)] + code, x // len(letters)
        code = f"quo{code}ex"
        docs.append({"id": f"added-{i:05d}", "title": f"Field report {code}",
                     "text": f"{code}: new observations on {topics[i % len(topics)]} in cohort {i}."})
    return docs


def writer_phase(engine: Path, queries: list[str], n_add: int) -> dict[str, Any]:
    import httpx

    from twostage.engine.search_engine import SearchEngine

    before = len(SearchEngine.load(engine, verify=False))
    server = Server(engine)
    docs = synthetic_documents(n_add)
    stop = threading.Event()
    writes: list[dict[str, Any]] = []

    def write() -> None:
        try:
            for start in range(0, len(docs), 100):
                t = time.perf_counter()
                r = httpx.post(f"{server.url}/documents", json={"documents": docs[start:start + 100]}, timeout=600)
                writes.append({"status": r.status_code, "seconds": time.perf_counter() - t,
                               "version": r.json().get("version")})
        finally:
            stop.set()

    writer = threading.Thread(target=write)
    writer.start()
    searched = asyncio.run(load(server.url, queries, 4, 0, 0, stop=stop))
    searched.pop("latencies")
    writer.join()
    # every added document: its code word through BM25 alone (exact), and a sample through the default pipeline
    found_bm25 = found_default = 0
    for start in range(0, len(docs), 100):
        chunk = docs[start:start + 100]
        r = httpx.post(f"{server.url}/search/batch", json={"queries": [d["title"].split()[-1] for d in chunk],
                                                           "k": 10, "first_stage": "bm25", "rerank": False},
                       timeout=600).json()
        found_bm25 += sum(d["id"] in [h["id"] for h in res["hits"]] for d, res in zip(chunk, r["results"]))
    sample = docs[:: max(1, len(docs) // 50)]
    r = httpx.post(f"{server.url}/search/batch", json={"queries": [d["title"] for d in sample], "k": 10},
                   timeout=600).json()
    found_default = sum(d["id"] in [h["id"] for h in res["hits"]] for d, res in zip(sample, r["results"]))
    stats = server.stats()
    server.stop()
    loaded = SearchEngine.load(engine, verify=True)
    return {"added": n_add, "writes": writes, "search": searched, "documents_before": before,
            "documents_after": len(loaded), "version_after": loaded.version, "found_bm25": found_bm25,
            "found_default": found_default, "default_sample": len(sample), "server_stats": stats}


def batch_curve(reranker: str, precision: str, data: Path, queries: list[str]) -> dict[int, float]:
    """Pairs/s of the reranker alone at several batch sizes (SciFact query, document pairs): whether a bigger
    batch is cheaper per pair on this machine, i.e. whether batching across requests can raise throughput."""
    from twostage.indexer.corpus import iter_documents
    from twostage.reranker.cross_encoder import CrossEncoder

    ce = CrossEncoder.load(reranker, precision=precision)
    docs = [d.full_text for _, d in zip(range(640), iter_documents(data))]
    pairs = [(queries[i % len(queries)], docs[i]) for i in range(len(docs))]
    ce.predict(pairs[:64], batch_size=32)
    curve = {}
    for size in (10, 20, 32, 64, 128):
        t = time.perf_counter()
        ce.predict(pairs, batch_size=size)
        curve[size] = len(pairs) / (time.perf_counter() - t)
    return curve


def scrape(url: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """Every sample of ``GET /metrics``, by (name, labels)."""
    import httpx
    from prometheus_client.parser import text_string_to_metric_families

    text = httpx.get(f"{url}/metrics", timeout=60).text
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for family in text_string_to_metric_families(text) for s in family.samples}


def delta(after: dict, before: dict, name: str, **labels: str) -> float:
    key = (name, tuple(sorted(labels.items())))
    return after.get(key, 0.0) - before.get(key, 0.0)


def metrics_phase(built: Path, queries: list[str], requests: int, rounds: int, max_seconds: float) -> dict[str, Any]:
    """#47: a server with /metrics and one without (--no-metrics), each fed the same load in alternating rounds.
    Checks that the counters equal the requests sent, that the stage histograms add up to the request time, and
    compares p50 with metrics on and off."""
    servers = {"on": Server(built), "off": Server(built, "--no-metrics")}
    out: dict[str, Any] = {"levels": []}
    try:
        for server in servers.values():
            asyncio.run(load(server.url, queries[-8:], 2, 8, 60))
        for c in (1, 4):
            runs: dict[str, list[dict[str, Any]]] = {name: [] for name in servers}
            check = {"sent": 0, "ok": 0, "errors": 0, "counted_ok": 0.0, "counted_errors": 0.0, "client_s": 0.0,
                     "server_request_s": 0.0, "stage_total_s": 0.0, "stage_parts_s": 0.0, "stage_count": 0.0}
            for round_ in range(rounds):
                for name in (list(servers) if round_ % 2 == 0 else list(reversed(servers))):
                    server = servers[name]
                    before = scrape(server.url) if name == "on" else {}
                    result = asyncio.run(load(server.url, queries, c, requests // (2 * rounds), max_seconds))
                    runs[name].append(result)
                    if name == "on":
                        after = scrape(server.url)
                        check["sent"] += result["requests"]
                        check["errors"] += result["errors"]
                        check["ok"] += result["requests"] - result["errors"]
                        check["counted_ok"] += delta(after, before, "twostage_requests_total", method="POST",
                                                     route="/search", status="200")
                        check["counted_errors"] += sum(v for (n, lab), v in after.items()
                                                       if n == "twostage_request_errors_total") - \
                            sum(v for (n, lab), v in before.items() if n == "twostage_request_errors_total")
                        check["client_s"] += float(np.sum(result["latencies"])) / 1000
                        check["server_request_s"] += delta(after, before, "twostage_request_seconds_sum",
                                                           method="POST", route="/search")
                        check["stage_total_s"] += delta(after, before, "twostage_stage_seconds_sum", stage="total")
                        check["stage_count"] += delta(after, before, "twostage_stage_seconds_count", stage="total")
                        check["stage_parts_s"] += sum(
                            delta(after, before, "twostage_stage_seconds_sum", stage=st)
                            for st in ("encode", "bm25", "dense", "fuse", "rerank", "fetch"))
            level = {"concurrency": c, **check}
            for name, results in runs.items():
                combined = combine(results)
                level[f"{name}_p50_ms"], level[f"{name}_rps"] = combined["p50_ms"], combined["rps"]
                level[f"{name}_requests"] = combined["requests"]
                level[f"{name}_p50_rounds"] = [float(np.percentile(r["latencies"], 50)) for r in results]
            out["levels"].append(level)
            print(f"metrics c={c}: sent {check['sent']} ({check['errors']} errors), counted 200s "
                  f"{check['counted_ok']:.0f}, errors {check['counted_errors']:.0f}; stage total "
                  f"{check['stage_total_s']:.2f} s vs server request time {check['server_request_s']:.2f} s vs client "
                  f"{check['client_s']:.2f} s; p50 on {level['on_p50_ms']:.1f} ms / off {level['off_p50_ms']:.1f} ms",
                  flush=True)
    finally:
        for server in servers.values():
            server.stop()
    return out


def metrics_markdown(report: dict[str, Any]) -> str:
    lines = ["# `/metrics` under load (localhost)", "", f"Command: `{report['command']}`", "",
             f"Machine: {report['machine']}; the load generator shares the 2 cores with the server. Engine: "
             f"{report['engine']}. Two servers of the same engine, one with `GET /metrics` (and the access log) "
             "and one started with `--no-metrics`, fed the same SciFact test queries (`POST /search`, k 10) in "
             f"alternating rounds ({report['rounds']} per server and level); `/metrics` scraped before and after each "
             "round of the server that has it.", "",
             "| concurrency | requests sent (with metrics) | errors | `requests_total{status=200}` counted | "
             "`request_errors_total` counted | stage `total` / server request time | stage `total` / client latency | "
             "sum of the stages / `total` | p50 with / without metrics (ms) | rounds' p50 with; without |",
             "|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|"]
    for lv in report["metrics"]["levels"]:
        lines.append(
            f"| {lv['concurrency']} | {lv['sent']} | {lv['errors']} | {lv['counted_ok']:.0f} | "
            f"{lv['counted_errors']:.0f} | {lv['stage_total_s'] / lv['server_request_s']:.3f} | "
            f"{lv['stage_total_s'] / lv['client_s']:.3f} | {lv['stage_parts_s'] / lv['stage_total_s']:.3f} | "
            f"{lv['on_p50_ms']:.1f} / {lv['off_p50_ms']:.1f} ({lv['on_p50_ms'] / lv['off_p50_ms']:.3f}x) | "
            f"{', '.join(f'{x:.0f}' for x in lv['on_p50_rounds'])}; "
            f"{', '.join(f'{x:.0f}' for x in lv['off_p50_rounds'])} |")
    lines += ["", "Stage `total` is the sum of the engine's own stage timings (encode, BM25, dense, fusion, rerank, "
              "document fetch) per query; the server's request time adds routing, validation and JSON; the client's "
              "adds the loopback and, at concurrency 4, the time a request waits for a worker.", ""]
    return "\n".join(lines)


def machine() -> str:
    flags = Path("/proc/cpuinfo").read_text() if Path("/proc/cpuinfo").exists() else ""
    model = next((line.split(":", 1)[1].strip() for line in flags.splitlines() if line.startswith("model name")), "?")
    return f"{model}, {os.cpu_count()} cores, Python {platform.python_version()}"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--retriever", required=True)
    parser.add_argument("--reranker", required=True)
    parser.add_argument("--data", type=Path, default=ROOT.parent / "shared" / "data" / "scifact")
    parser.add_argument("--work", type=Path, default=ROOT / "runs" / "serve-load")
    parser.add_argument("--concurrency", default="1,4,16")
    parser.add_argument("--requests", type=int, default=160, help="requests per level (c=1 sends a quarter)")
    parser.add_argument("--max-seconds", type=float, default=90, help="time limit per level and round")
    parser.add_argument("--rounds", type=int, default=2, help="runs per level and mode, alternating their order")
    parser.add_argument("--add", type=int, default=1000, help="documents the writer adds during a load run")
    parser.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results" / "serve_load")
    parser.add_argument("--metrics", action="store_true", help="only the /metrics check (#47): a server with metrics "
                        "against one without; writes --out's folder/serve_metrics.md")
    args = parser.parse_args()

    from twostage.engine.search_engine import SearchEngine
    from twostage.indexer.beir import load_qrels, load_queries

    test = set(load_qrels(args.data / "qrels" / "test.tsv").query_ids)
    queries = [q.text for q in load_queries(args.data / "queries.jsonl") if q.id in test]
    built = args.work / "engine"
    if not (built / "CURRENT").exists():
        args.work.mkdir(parents=True, exist_ok=True)
        print(f"building the engine over {args.data} ...", flush=True)
        SearchEngine.build(args.data, built, retriever=args.retriever, reranker=args.reranker,
                           show_progress=True).close()
    engine = SearchEngine.load(built, verify=True)
    settings = engine.settings
    precision = engine.precision
    print(f"engine: {len(engine)} documents, first stage {settings.first_stage}, rerank top {settings.rerank_depth}, "
          f"precision {engine.precision}", flush=True)
    engine.close()
    if args.metrics:
        m = metrics_phase(built, queries, args.requests, args.rounds, args.max_seconds)
        report = {"command": "python benchmarks/serve_load.py " + " ".join(sys.argv[1:]), "machine": machine(),
                  "engine": f"SciFact corpus, first stage {settings.first_stage}, reranker on the top "
                            f"{settings.rerank_depth} blended at {settings.rerank_blend}, precision {precision}",
                  "rounds": args.rounds,
                  "metrics": m}
        out = args.out.parent / "serve_metrics"
        out.with_suffix(".json").write_text(json.dumps(report, indent=2, default=float) + "\n")
        out.with_suffix(".md").write_text(metrics_markdown(report))
        print(f"wrote {out.with_suffix('.md')}")
        return 0 if all(lv["errors"] == 0 and lv["counted_ok"] == lv["ok"] for lv in m["levels"]) else 1

    servers = {"batching": Server(built), "no batching": Server(built, "--no-batching")}
    rows = []
    try:
        for name, server in servers.items():  # warm-up: the first requests load and verify the models
            asyncio.run(load(server.url, queries[-8:], 2, 8, 60))
        for c in (int(x) for x in args.concurrency.split(",")):
            n = args.requests // 4 if c == 1 else args.requests
            runs: dict[str, list[dict[str, Any]]] = {name: [] for name in servers}
            for round_ in range(args.rounds):  # alternate the order: on, off, off, on, ...
                order = list(servers) if round_ % 2 == 0 else list(reversed(servers))
                for name in order:
                    runs[name].append(measure(servers[name], queries, c, n, args.max_seconds))
            for name, results in runs.items():
                result = combine(results)
                rows.append({"mode": name, **result})
                print(f"{name:12s} c={c:2d}: {result['requests']} requests, {result['errors']} errors, "
                      f"{result['rps']:.2f} req/s (rounds {', '.join(f'{r:.2f}' for r in result['rps_rounds'])}), "
                      f"p50 {result['p50_ms']:.0f} ms, p95 {result['p95_ms']:.0f} ms, p99 {result['p99_ms']:.0f} ms",
                      flush=True)
    finally:
        for server in servers.values():
            server.stop()

    curve = batch_curve(args.reranker, precision, args.data, queries)
    print("reranker alone, pairs/s by batch size: " + ", ".join(f"{b}: {v:.0f}" for b, v in curve.items()), flush=True)

    copy = args.work / "engine-writer"
    shutil.rmtree(copy, ignore_errors=True)
    shutil.copytree(built, copy, ignore=shutil.ignore_patterns("LOCK"))
    print(f"writer phase: adding {args.add} documents while 4 clients search ...", flush=True)
    w = writer_phase(copy, queries, args.add)
    print(f"writer: {len(w['writes'])} commits, searches during: {w['search']['requests']} "
          f"({w['search']['errors']} failed), documents {w['documents_before']} -> {w['documents_after']}, "
          f"found {w['found_bm25']}/{w['added']} by code word, {w['found_default']}/{w['default_sample']} by title "
          "through the default pipeline", flush=True)

    report = {"command": "python benchmarks/serve_load.py " + " ".join(sys.argv[1:]), "machine": machine(),
              "engine": {"documents": w["documents_before"], "first_stage": settings.first_stage,
                         "rerank_depth": settings.rerank_depth, "precision": f"{precision} ({settings.precision})"},
              "rounds": args.rounds, "levels": rows, "reranker_pairs_per_s": curve, "writer": w}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.with_suffix(".json").write_text(json.dumps(report, indent=2) + "\n")
    args.out.with_suffix(".md").write_text(markdown(report))
    ratios = [f"c={r['concurrency']} {r['rps'] / o['rps']:.2f}x" for r in rows if r["mode"] == "batching"
              for o in rows if o["mode"] == "no batching" and o["concurrency"] == r["concurrency"]]
    print("batching vs none, requests/s: " + ", ".join(ratios))
    print(f"wrote {args.out.with_suffix('.md')}")
    ok = all(r["errors"] == 0 for r in rows) and w["search"]["errors"] == 0 and w["found_bm25"] == w["added"] \
        and w["documents_after"] == w["documents_before"] + w["added"]
    return 0 if ok else 1


def markdown(report: dict[str, Any]) -> str:
    e, w = report["engine"], report["writer"]
    lines = ["# `twostage serve` under load (localhost)", "",
             f"Command: `{report['command']}`", "", f"Machine: {report['machine']}. The load generator (httpx, "
             "asyncio) runs on the same 2 cores as the server.", "",
             f"Engine: SciFact corpus, {e['documents']} documents, first stage {e['first_stage']}, reranker on the top "
             f"{e['rerank_depth']} (default depth), precision {e['precision']}. Each request: `POST /search` "
             "`{query, k: 10}` with a SciFact test query. Each level runs "
             f"{report['rounds']} rounds per mode in alternating order (on, off, off, on); requests/s is all requests "
             "over all seconds, percentiles over all requests.", "",
             "| mode | concurrency | requests | errors | requests/s | p50 ms | p95 ms | p99 ms | mean requests per "
             "reranker call |", "|---|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for r in report["levels"]:
        batch = f"{r['mean_batch_requests']:.2f}" if "mean_batch_requests" in r else "1 (no batching)"
        lines.append(f"| {r['mode']} | {r['concurrency']} | {r['requests']} | {r['errors']} | {r['rps']:.2f} | "
                     f"{r['p50_ms']:.0f} | {r['p95_ms']:.0f} | {r['p99_ms']:.0f} | {batch} |")
    lines += ["", "Batching vs none (requests/s ratio): " + ", ".join(
        f"c={r['concurrency']} **{r['rps'] / o['rps']:.2f}x**" for r in report["levels"] if r["mode"] == "batching"
        for o in report["levels"] if o["mode"] == "no batching" and o["concurrency"] == r["concurrency"]), ""]
    curve = report["reranker_pairs_per_s"]
    lines += ["The reranker alone on this machine (same model and precision, 640 SciFact pairs), pairs/s by batch "
              "size: " + ", ".join(f"{b}: {v:.0f}" for b, v in curve.items()) + ". One request reranks "
              f"{e['rerank_depth']} pairs, so the cores cap throughput near "
              f"{max(curve.values()) / e['rerank_depth']:.1f} requests/s whatever the batching.", ""]
    s = w["search"]
    lines += ["## A writer during the load", "",
              f"{w['added']} documents added through `POST /documents` in {len(w['writes'])} commits of 100 "
              f"(statuses {sorted({x['status'] for x in w['writes']})}, "
              f"{np.median([x['seconds'] for x in w['writes']]):.1f} s median per commit) while 4 clients searched: "
              f"**{s['requests']} searches, {s['errors']} failed**, p50 {s['p50_ms']:.0f} ms / p95 "
              f"{s['p95_ms']:.0f} ms, answered from {len(s['versions'])} engine versions.", "",
              f"Afterwards: documents {w['documents_before']} -> {w['documents_after']}; "
              f"**{w['found_bm25']} / {w['added']}** added documents found in the top 10 by their code word "
              f"(BM25 first stage), {w['found_default']} / {w['default_sample']} sampled ones by their title through "
              f"the default pipeline; the directory loaded with every checksum verified (version "
              f"{w['version_after']}).", ""]
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
