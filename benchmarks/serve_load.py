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

`python benchmarks/serve_load.py --hostile --engine DIR ...`: the hostile client of #79 instead (its own
`--help`): writes and batches that ask for more work than they look.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import random
import shutil
import signal
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


# ---- the hostile client (#79) ----------------------------------------------------------------------------------
HOSTILE_DOC = """A hostile client against `twostage serve`: writes and batches that ask for more work than they look (#79).

Usage (from the repository root, the serve extra installed):
    python benchmarks/serve_load.py --hostile --engine ENGINE_DIR --label after --out benchmarks/results/hostile_budget
    python benchmarks/serve_load.py --hostile --engine ENGINE_DIR --label before --server-pythonpath OLD_SITE ...

ENGINE_DIR is copied (the copy is served and written to): the issue's engine is the demo's sample engine with its
trained reranker and token vectors (`twostage demo`, then `twostage late ENGINE --model all-MiniLM-L6-v2 --dim 128
--bits 4`). Each case starts a fresh server on 127.0.0.1 (`python -m twostage serve`, the access log off), sends
its requests and reads the server process's peak resident memory (VmHWM, reset before the case), its CPU seconds
and the answers; a case whose server passes --rss-cap GB or --case-seconds is killed and reported so. Cases:
1 one document of 1,000,000 Han characters, 1e one of 999,000 English characters, 2 two of 500,000 Han
characters in one request, 3 a /search/batch query of 1 MB, 3b an in-budget batch whose client gives up after 3 s
(the server's CPU seconds in the 5 s after), 4 64 queries at rerank_depth 1000, 5 three searching clients alone and
beside one client sending the worst inputs that fit the budgets (giving up after 10 s), 6 NaN / Infinity / 1e999
metadata, 7 a foreign Host and a foreign Origin on a write, 8 diversity NaN; and a crash test: a write killed at
random moments, then the engine opened (leftover temporary versions, documents committed).
`--server-pythonpath DIR` puts DIR first on the server's PYTHONPATH (an older twostage installed there with
`pip install --no-deps --target DIR`), to measure "before" with the same script. Writes OUT-LABEL.md and .json.
"""


class HostileServer:
    """`twostage serve` on a copy of the engine, with its memory and CPU read from /proc."""

    def __init__(self, engine: Path, pythonpath: str | None, extra: list[str]) -> None:
        self.port = free_port()
        env = dict(os.environ)
        if pythonpath:
            env["PYTHONPATH"] = pythonpath + os.pathsep + env.get("PYTHONPATH", "")
        self.proc = subprocess.Popen([sys.executable, "-m", "twostage", "serve", str(engine), "--port",
                                      str(self.port), "--no-access-log", *extra], env=env,
                                     stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        self.url = f"http://127.0.0.1:{self.port}"
        import httpx

        deadline = time.time() + 180
        while time.time() < deadline:
            if self.proc.poll() is not None:
                raise SystemExit(f"the server exited: {self.proc.stderr.read()[-2000:] if self.proc.stderr else ''}")
            try:
                if httpx.get(self.url + "/health", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                time.sleep(0.3)
        # warm up every model the engine serves
        httpx.post(self.url + "/search", json={"query": "why does snow form", "rerank_blend": 0.5}, timeout=120)
        httpx.post(self.url + "/documents", json={"documents": [{"id": "warm-up", "text": "a warm up"}]}, timeout=120)

    def status(self, key: str) -> float:
        for line in Path(f"/proc/{self.proc.pid}/status").read_text().splitlines():
            if line.startswith(key + ":"):
                return int(line.split()[1]) / 1e6  # GB
        return float("nan")

    def reset_peak(self) -> None:
        try:
            Path(f"/proc/{self.proc.pid}/clear_refs").write_text("5")
        except OSError:
            pass

    def cpu_s(self) -> float:
        fields = Path(f"/proc/{self.proc.pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGINT)
            try:
                self.proc.wait(20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


def timed(server: HostileServer, method: str, path: str, body: Any = None, *, timeout: float, raw: str | None = None,
          headers: dict[str, str] | None = None, rss_cap: float = 99.0) -> dict[str, Any]:
    """One request, its answer and seconds, while the server's memory is watched (killed past ``rss_cap`` GB)."""
    import httpx

    out: dict[str, Any] = {}
    start = time.perf_counter()

    def send() -> None:
        try:
            kw: dict[str, Any] = {"timeout": timeout, "headers": headers or {}}
            if raw is not None:
                kw["content"], kw["headers"] = raw, {**(headers or {}), "content-type": "application/json"}
            elif body is not None:
                kw["json"] = body
            r = httpx.request(method, server.url + path, **kw)
            out["status"] = r.status_code
            try:
                out["error"] = str(r.json().get("error", ""))[:300]
            except (ValueError, AttributeError):
                out["error"] = ""
            out["retry_after"] = r.headers.get("retry-after")
        except httpx.TimeoutException:
            out["status"] = "client gave up"
        except httpx.HTTPError as exc:
            out["status"] = f"failed ({type(exc).__name__})"
        out["seconds"] = time.perf_counter() - start

    t = threading.Thread(target=send, daemon=True)
    t.start()
    peak = 0.0
    while t.is_alive():
        t.join(0.2)
        rss = server.status("VmRSS")
        peak = max(peak, rss)
        if rss > rss_cap:
            server.proc.kill()
            out["status"] = f"killed at {rss:.1f} GB RSS"
            out["seconds"] = time.perf_counter() - start
            break
    out["peak_rss_gb"] = max(peak, server.status("VmHWM") if server.proc.poll() is None else 0.0)
    return out


def han(n: int, seed: int = 0) -> str:
    rng = random.Random(seed)
    return "".join(chr(rng.randint(0x4E00, 0x9FFF)) for _ in range(n))


def english(n: int, seed: int = 0) -> str:
    rng = random.Random(seed)
    words = ("the snow falls on mountains while rivers freeze and bakers knead bread dough before sunrise in "
             "winter villages").split()
    out, size = [], 0
    while size < n:
        w = rng.choice(words)
        out.append(w)
        size += len(w) + 1
    return " ".join(out)[:n]


def queries() -> list[str]:
    lines = (ROOT / "data" / "sample" / "queries.jsonl").read_text(encoding="utf-8").splitlines()
    return [json.loads(line)["text"] for line in lines if line.strip()]


def search_load(server: HostileServer, clients: int, seconds: float, qs: list[str]) -> dict[str, Any]:
    """``clients`` threads sending /search back to back for ``seconds``: latencies and failures."""
    import httpx

    lat: list[float] = []
    failed = [0]
    lock = threading.Lock()
    stop = time.time() + seconds

    def loop(seed: int) -> None:
        rng = random.Random(seed)
        with httpx.Client(timeout=60) as c:
            while time.time() < stop:
                t = time.perf_counter()
                try:
                    ok = c.post(server.url + "/search", json={"query": rng.choice(qs)}).status_code == 200
                except httpx.HTTPError:
                    ok = False
                with lock:
                    if ok:
                        lat.append((time.perf_counter() - t) * 1000)
                    else:
                        failed[0] += 1

    threads = [threading.Thread(target=loop, args=(i,)) for i in range(clients)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    a = np.asarray(lat)
    return {"requests": len(lat) + failed[0], "failed": failed[0], "p50_ms": float(np.percentile(a, 50)),
            "p99_ms": float(np.percentile(a, 99))}


def hostile_loop(server: HostileServer, seconds: float, give_up: float) -> dict[str, Any]:
    """The worst inputs that fit the default budgets, one after another, each abandoned after ``give_up`` s."""
    import httpx

    long_q = english(9_900, 3)
    worst = [
        ("/search/batch", {"queries": [english(9_900, i) for i in range(256)], "rerank_depth": 20,
                           "rerank_blend": 0.5}),
        ("/documents", {"documents": [{"id": f"h-{i}", "text": english(60_000, i)} for i in range(10)],
                        "upsert": True}),  # ~4,000 passages
        ("/v1/rerank", {"query": long_q, "documents": [english(1_000, i) for i in range(500)]}),
        ("/search", {"query": long_q, "rerank_depth": 1000, "rerank_blend": 0.5, "maxsim_depth": 1000}),
        ("/v1/embeddings", {"input": [english(1_000, i) for i in range(512)]}),
    ]
    sent: dict[str, int] = {}
    stop = time.time() + seconds
    i = 0
    while time.time() < stop:
        path, body = worst[i % len(worst)]
        i += 1
        try:
            r = httpx.post(server.url + path, json=body, timeout=give_up)
            key = f"{path} {r.status_code}"
        except httpx.TimeoutException:
            key = f"{path} gave up"
        except httpx.HTTPError as exc:
            key = f"{path} {type(exc).__name__}"
        sent[key] = sent.get(key, 0) + 1
    return sent


def crash_test(engine: Path, pythonpath: str | None, tries: int, work: Path) -> dict[str, Any]:
    """Writes killed mid-way: every other one the moment its temporary version appears on disk (inside its commit),
    the others at a random moment of a write's duration; after each, the engine opened by the library (with the
    same code): leftovers before and after the open, and the version and documents against what was committed."""
    import httpx

    results = []
    rng = random.Random(0)
    path = work / "crash"
    shutil.rmtree(path, ignore_errors=True)
    shutil.copytree(engine, path)
    duration = None
    env = dict(os.environ)
    if pythonpath:
        env["PYTHONPATH"] = pythonpath + os.pathsep + env.get("PYTHONPATH", "")
    code = ("import sys, json; from pathlib import Path; from twostage import SearchEngine; "
            "e = SearchEngine.load(sys.argv[1]); p = Path(sys.argv[1]); "
            "print(json.dumps({'version': e.version, 'documents': len(e), "
            "'left': sorted(x.name for x in p.iterdir() if '.tmp-' in x.name)}))")
    for attempt in range(tries + 1):
        body = {"documents": [{"id": f"c-{attempt}-{i}", "text": english(6_000, 100 * attempt + i)}
                              for i in range(40)]}
        server = HostileServer(path, pythonpath, [])
        committed = httpx.get(server.url + "/health", timeout=10).json()
        t = time.perf_counter()
        if duration is None:  # the first write runs whole: how long one takes
            httpx.post(server.url + "/documents", json=body, timeout=600)
            duration = time.perf_counter() - t
            server.stop()
            continue

        def send() -> None:
            try:
                httpx.post(server.url + "/documents", json=body, timeout=600)
            except httpx.HTTPError:
                pass

        threading.Thread(target=send, daemon=True).start()
        in_commit = attempt % 2 == 1
        if in_commit:  # the moment a temporary version appears
            deadline = time.perf_counter() + 3 * duration
            while time.perf_counter() < deadline and not any(".tmp-" in x.name and x.name.startswith(".v")
                                                             for x in path.iterdir()):
                time.sleep(0.002)
        else:
            time.sleep(rng.uniform(0.3, 1.1) * duration)
        at = time.perf_counter() - t
        server.proc.kill()
        server.proc.wait()
        left = sorted(p.name for p in path.iterdir() if ".tmp-" in p.name)
        opened = json.loads(subprocess.run([sys.executable, "-c", code, str(path)], env=env, capture_output=True,
                                           text=True, check=True).stdout.strip().splitlines()[-1])
        results.append({"killed": "in its commit" if in_commit else "at random", "killed_at_s": round(at, 2),
                        "left_before_open": left, "left_after_open": opened["left"],
                        "version_before": committed["version"], "version_after": opened["version"],
                        "documents_before": committed["documents"], "documents_after": opened["documents"]})
    return {"write_s": duration, "tries": results}


def hostile_main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(prog="serve_load.py --hostile", description=HOSTILE_DOC)
    p.add_argument("--engine", type=Path, required=True, help="the engine to copy and serve")
    p.add_argument("--label", default="after", help="the row label (before / after)")
    p.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results" / "hostile_budget")
    p.add_argument("--server-pythonpath", default=None, help="put this first on the server's PYTHONPATH")
    p.add_argument("--work", type=Path, default=Path("runs/hostile_budget"))
    p.add_argument("--rss-cap", type=float, default=6.0, help="kill a case's server past this many GB")
    p.add_argument("--case-seconds", type=float, default=120.0, help="kill a case's request after this long")
    p.add_argument("--mixed-seconds", type=float, default=60.0)
    p.add_argument("--crash-tries", type=int, default=6)
    p.add_argument("--cases", default="1,1e,2,3,3b,4,5,6,7,8,crash")
    args = p.parse_args(argv)
    cases = set(args.cases.split(","))
    args.work.mkdir(parents=True, exist_ok=True)
    copy = args.work / f"engine-{args.label}"
    rows: dict[str, Any] = {}
    qs = queries()

    def fresh_server(extra: list[str] | None = None) -> HostileServer:
        shutil.rmtree(copy, ignore_errors=True)
        shutil.copytree(args.engine, copy)
        return HostileServer(copy, args.server_pythonpath, extra or [])

    def case(name: str, method: str, path: str, body: Any = None, **kw: Any) -> None:
        if name not in cases:
            return
        server = fresh_server()
        try:
            server.reset_peak()
            base = server.status("VmRSS")
            out = timed(server, method, path, body, timeout=kw.pop("timeout", args.case_seconds),
                        rss_cap=args.rss_cap, **kw)
            out["rss_before_gb"] = base
            out["tmp_left"] = sorted(x.name for x in copy.iterdir() if ".tmp-" in x.name)
            rows[name] = out
            print(name, json.dumps(out)[:400], flush=True)
        finally:
            server.stop()

    case("1", "POST", "/documents", {"documents": [{"id": "han-1m", "text": han(1_000_000)}]})
    case("1e", "POST", "/documents", {"documents": [{"id": "en-999k", "text": english(999_000)}]})
    case("2", "POST", "/documents", {"documents": [{"id": "han-a", "text": han(500_000, 1)},
                                                   {"id": "han-b", "text": han(500_000, 2)}]})
    case("3", "POST", "/search/batch", {"queries": [english(1_000_000)], "k": 200})
    case("4", "POST", "/search/batch", {"queries": qs[:64] * (64 // len(qs[:64])) + qs[:64 % len(qs[:64])],
                                        "rerank_depth": 1000, "rerank_blend": 0.5})
    case("6", "POST", "/documents", raw='{"documents": [{"id": "n", "text": "snow", "metadata": '
                                         '{"a": NaN, "b": Infinity, "c": 1e999}}]}')
    case("7", "POST", "/documents", {"documents": [{"id": "rebind", "text": "snow"}]},
         headers={"host": "attacker.example"})
    case("7o", "POST", "/documents", {"documents": [{"id": "csrf", "text": "snow"}]},
         headers={"origin": "http://attacker.example"})
    case("8", "POST", "/search", raw='{"query": "snow", "diversity": NaN}')
    if "3b" in cases:  # an in-budget batch whose client gives up: the server's CPU seconds afterwards
        server = fresh_server()
        try:
            body = {"queries": [english(9_900, i) for i in range(256)], "rerank_depth": 20, "rerank_blend": 0.5}
            out = timed(server, "POST", "/search/batch", body, timeout=3.0)
            cpu0 = server.cpu_s()
            time.sleep(5)
            out["cpu_s_in_5s_after"] = server.cpu_s() - cpu0
            rows["3b"] = out
            print("3b", json.dumps(out), flush=True)
        finally:
            server.stop()
    if "5" in cases:
        server = fresh_server()
        try:
            alone = search_load(server, 3, args.mixed_seconds / 2, qs)
            box: dict[str, Any] = {}
            h = threading.Thread(target=lambda: box.update(hostile_loop(server, args.mixed_seconds, 10.0)))
            h.start()
            mixed = search_load(server, 3, args.mixed_seconds, qs)
            h.join()
            rows["5"] = {"alone": alone, "mixed": mixed, "hostile": box,
                         "p50_ratio": mixed["p50_ms"] / alone["p50_ms"], "p99_ratio": mixed["p99_ms"] / alone["p99_ms"]}
            print("5", json.dumps(rows["5"]), flush=True)
        finally:
            server.stop()
    if "crash" in cases:
        rows["crash"] = crash_test(args.engine, args.server_pythonpath, args.crash_tries, args.work)
        print("crash", json.dumps(rows["crash"]), flush=True)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    target = Path(f"{args.out}-{args.label}.json")
    command = "python benchmarks/serve_load.py " + " ".join(sys.argv[1:])
    target.write_text(json.dumps({"label": args.label, "command": command, "rows": rows}, indent=1) + "\n")
    print(f"wrote {target}")
    runs = {label: Path(f"{args.out}-{label}.json") for label in ("before", "after")}
    if all(p.is_file() for p in runs.values()):
        md = Path(f"{args.out}.md")
        md.write_text(hostile_markdown({k: json.loads(p.read_text()) for k, p in runs.items()}), encoding="utf-8")
        print(f"wrote {md}")
    return 0


HOSTILE_CASES = {
    "1": "`POST /documents`, one document of 1,000,000 Han characters",
    "1e": "`POST /documents`, one document of 999,000 English characters",
    "2": "`POST /documents`, two documents of 500,000 Han characters",
    "3": "`/search/batch`, one query of 1 MB, k=200",
    "3b": "`/search/batch`, 256 queries of 9,900 characters at depth 20 (in budget), client gives up after 3 s",
    "4": "`/search/batch`, 64 queries at rerank_depth 1000",
    "6": "metadata `NaN`, `Infinity`, `1e999`",
    "7": "a write with `Host: attacker.example`",
    "7o": "a write with `Origin: http://attacker.example`",
    "8": "`diversity: NaN`",
}


def _cell(row: dict[str, Any] | None) -> str:
    if row is None:
        return "-"
    out = [str(row.get("status"))]
    if "seconds" in row:
        out.append(f"{row['seconds']:.1f} s")
    if "peak_rss_gb" in row:
        start = f" (from {row['rss_before_gb']:.2f})" if "rss_before_gb" in row else ""
        out.append(f"peak RSS {row['peak_rss_gb']:.2f} GB{start}")
    if "cpu_s_in_5s_after" in row:
        out.append(f"server CPU in the 5 s after: {row['cpu_s_in_5s_after']:.2f} s")
    if row.get("tmp_left"):
        out.append(f"left behind: {', '.join(row['tmp_left'])}")
    if row.get("error"):
        out.append(f"\"{row['error'][:160]}\"")
    return "; ".join(out).replace("|", "\\|")


def hostile_markdown(runs: dict[str, dict[str, Any]]) -> str:
    """The before/after table of the hostile client's cases."""
    before, after = runs["before"]["rows"], runs["after"]["rows"]
    lines = ["# A hostile client: writes and batches with a work budget (#79)", "",
             f"Before: `{runs['before']['command']}`", "", f"After: `{runs['after']['command']}`", "",
             "The engine: the demo's sample engine (205 documents, its trained reranker, token vectors of "
             "all-MiniLM-L6-v2 at 128 dims and 4 bits), served by `twostage serve` with its defaults on 127.0.0.1, "
             "a fresh server and engine copy per case; peak RSS is the server process's (VmHWM, reset before the "
             "case); 2 shared cores. Before: the code at the commit before #79 (installed with `pip install "
             "--no-deps --target`), the same script.", "",
             "| # | input | before | after |", "|---|---|---|---|"]
    for key, what in HOSTILE_CASES.items():
        lines.append(f"| {key} | {what} | {_cell(before.get(key))} | {_cell(after.get(key))} |")
    lines += ["", "## 5: three searching clients, alone and beside one client sending the worst inputs that fit "
              "the budgets (each given up after 10 s)", "",
              "| | alone p50 / p99 ms | mixed p50 / p99 ms | p50 ratio | p99 ratio | failed (searching) | "
              "the hostile client's requests |", "|---|---|---|---|---|---|---|"]
    for label, rows in (("before", before), ("after", after)):
        m = rows.get("5")
        if m:
            lines.append(f"| {label} | {m['alone']['p50_ms']:.0f} / {m['alone']['p99_ms']:.0f} | "
                         f"{m['mixed']['p50_ms']:.0f} / {m['mixed']['p99_ms']:.0f} | {m['p50_ratio']:.2f}x | "
                         f"**{m['p99_ratio']:.2f}x** | {m['alone']['failed'] + m['mixed']['failed']} of "
                         f"{m['alone']['requests'] + m['mixed']['requests']} | "
                         + ", ".join(f"{k}: {v}" for k, v in sorted(m["hostile"].items())) + " |")
    lines += ["", "## A write killed mid-way (SIGKILL), then the engine opened", "",
              "| | killed | at s | left before the open | left after | version before -> after | "
              "documents before -> after |", "|---|---|---|---|---|---|---|"]
    for label, rows in (("before", before), ("after", after)):
        for t in (rows.get("crash") or {}).get("tries", []):
            lines.append(f"| {label} | {t.get('killed', 'at random')} | {t['killed_at_s']} | "
                         f"{', '.join(t['left_before_open']) or 'nothing'} | "
                         f"{', '.join(t['left_after_open']) or 'nothing'} | {t['version_before']} -> "
                         f"{t['version_after']} | {t['documents_before']} -> {t['documents_after']} |")
    return "\n".join(lines) + "\n"


def machine() -> str:
    flags = Path("/proc/cpuinfo").read_text() if Path("/proc/cpuinfo").exists() else ""
    model = next((line.split(":", 1)[1].strip() for line in flags.splitlines() if line.startswith("model name")), "?")
    return f"{model}, {os.cpu_count()} cores, Python {platform.python_version()}"


def main() -> int:
    if sys.argv[1:2] == ["--hostile"]:
        return hostile_main(sys.argv[2:])
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
