"""`twostage serve` under a hostile client (#61): every case of the issue's table, a mixed load, and a fuzz.

Usage (from the repository root, the serve extra installed, an engine with a trained reranker: `twostage demo`
leaves one in out/demo.models/engine):

    # the cases, against the code before the fix (installed into a separate directory) and after it
    git worktree add /tmp/old-src BEFORE && pip install --no-deps --target /tmp/old-site /tmp/old-src
    PYTHONPATH=/tmp/old-site python benchmarks/experiments/hostile_client.py cases --label before --json /tmp/b.json
    python benchmarks/experiments/hostile_client.py cases --label after --json /tmp/a.json
    python benchmarks/experiments/hostile_client.py table /tmp/b.json /tmp/a.json > benchmarks/results/hostile_client.md
    # 60 s of 4 searching clients beside a poisoning and a bulk client, against 60 s of the 4 alone
    python benchmarks/experiments/hostile_client.py mixed --seconds 60 --json /tmp/mixed.json
    # 10,000 random request bodies across every endpoint
    python benchmarks/experiments/hostile_client.py fuzz --requests 10000 --json /tmp/fuzz.json

Every server runs in a child process (`python -m twostage serve`, with this process's PYTHONPATH) on a fresh copy
of the engine whose reranker blend is set to 0.5, so that every search runs the reranker; a watchdog kills a
server whose resident memory passes --kill-gb (the issue's first case grew one to 23 GB on a 24 GB machine). Only
127.0.0.1 is ever contacted; every loop is bounded in count and time.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[2]
SAMPLE = ROOT / "data" / "sample"
KEY = "hostile-bench-key"
SURROGATE = "\\ud800"  # as JSON text: a lone surrogate escaped, the way a hostile client sends it


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def rss_gb(pid: int, field: str = "VmRSS") -> float:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith(field + ":"):
                return int(line.split()[1]) / 1024 / 1024
    except OSError:
        pass
    return 0.0


class Server:
    """`twostage serve ENGINE` in a child process; a watchdog kills it past ``kill_gb`` of resident memory."""

    def __init__(self, engine: Path, *flags: str, kill_gb: float = 6.0) -> None:
        import httpx

        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log_path = engine.parent / f"serve-{self.port}.log"
        self.log = open(self.log_path, "w")  # noqa: SIM115
        env = {**os.environ, "TWOSTAGE_BENCH_KEY": KEY}
        self.proc = subprocess.Popen([sys.executable, "-m", "twostage", "serve", str(engine), "--port",
                                      str(self.port), "--fast", "--api-key-env", "TWOSTAGE_BENCH_KEY", *flags],
                                     stdout=self.log, stderr=subprocess.STDOUT, env=env)
        self.killed_at: float | None = None
        self.peak = 0.0
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise SystemExit(f"the server exited: {self.log_path.read_text()[-2000:]}")
            try:
                if httpx.get(f"{self.url}/health", timeout=1).status_code == 200:
                    break
            except httpx.HTTPError:
                time.sleep(0.3)
        self.client = httpx.Client(base_url=self.url, timeout=180, headers={"x-api-key": KEY})
        self.client.post("/search", json={"query": "warm up the models", "k": 3})
        self._watch = threading.Thread(target=self._watchdog, args=(kill_gb,), daemon=True)
        self._watch.start()

    def _watchdog(self, kill_gb: float) -> None:
        while self.proc.poll() is None:
            gb = rss_gb(self.proc.pid)
            self.peak = max(self.peak, gb)
            if gb > kill_gb:
                self.killed_at = gb
                self.proc.kill()
                return
            time.sleep(0.05)

    def reset_peak(self) -> float:
        self.peak = rss_gb(self.proc.pid)
        return self.peak

    @property
    def alive(self) -> bool:
        return self.proc.poll() is None

    def post(self, path: str, body: Any = None, raw: str | None = None, timeout: float = 180) -> tuple[int, str, float]:
        """(status, first 160 characters of the body, seconds); status 0: no answer (the server died or timed out)."""
        import httpx

        t = time.perf_counter()
        try:
            if raw is not None:
                r = self.client.post(path, content=raw, headers={"content-type": "application/json"}, timeout=timeout)
            else:
                r = self.client.post(path, json=body, timeout=timeout)
            return r.status_code, r.text[:160], time.perf_counter() - t
        except httpx.HTTPError as exc:
            return 0, f"no answer ({type(exc).__name__})", time.perf_counter() - t

    def stop(self) -> None:
        self.client.close()
        if self.alive:
            self.proc.send_signal(signal.SIGINT)
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
        self.log.close()


def fresh_engine(source: Path, work: Path, name: str) -> Path:
    """A copy of ``source`` (its PAGE_KEY not copied) whose searches run the reranker (blend 0.5)."""
    from twostage import SearchEngine

    dest = work / name
    shutil.copytree(source, dest, ignore=shutil.ignore_patterns("LOCK", "PAGE_KEY"))
    SearchEngine.load(dest).configure(rerank_blend=0.5).close()
    return dest


def words(rng: random.Random, n: int) -> str:
    return " ".join("".join(rng.choice("abcdefghijklmnopqrstuvwxyz") for _ in range(rng.randint(3, 10)))
                    for _ in range(n))


def queries() -> list[str]:
    return [json.loads(line)["text"] for line in (SAMPLE / "queries.jsonl").read_text().splitlines()]


class Searchers:
    """``n`` threads searching the server until stopped; latencies and failures recorded."""

    def __init__(self, server: Server, n: int = 4) -> None:
        import httpx

        self.latency: list[float] = []
        self.failures: list[str] = []
        self.stop_event = threading.Event()
        qs = queries()

        def run(i: int) -> None:
            rng = random.Random(i)
            with httpx.Client(base_url=server.url, timeout=300) as client:
                while not self.stop_event.is_set():
                    t = time.perf_counter()
                    try:
                        r = client.post("/search", json={"query": rng.choice(qs), "k": 10})
                        if r.status_code != 200:
                            self.failures.append(f"{r.status_code} {r.text[:100]}")
                    except httpx.HTTPError as exc:
                        self.failures.append(type(exc).__name__)
                        time.sleep(0.2)
                        continue
                    self.latency.append(time.perf_counter() - t)

        self.threads = [threading.Thread(target=run, args=(i,), daemon=True) for i in range(n)]
        for t in self.threads:
            t.start()

    def stop(self) -> dict[str, Any]:
        self.stop_event.set()
        for t in self.threads:
            t.join(320)
        lat = np.asarray(self.latency) * 1000
        return {"searches": len(self.latency), "failed": len(self.failures),
                "p50_ms": round(float(np.percentile(lat, 50)), 1) if len(lat) else None,
                "p99_ms": round(float(np.percentile(lat, 99)), 1) if len(lat) else None,
                "max_ms": round(float(lat.max()), 1) if len(lat) else None,
                "failures": sorted(set(self.failures))[:3]}


# ---- the cases of the table -----------------------------------------------------------------------------
def case_rerank_memory(source: Path, work: Path, kill_gb: float) -> list[dict[str, Any]]:
    rng = random.Random(1)
    query = words(rng, 600)[:3400]
    out = []
    for n in (20, 1000):
        docs = [words(rng, 2600)[:16_000] for _ in range(n)]
        server = Server(fresh_engine(source, work, f"rerank-{n}"), kill_gb=kill_gb)
        base = server.reset_peak()
        status, text, seconds = server.post("/v1/rerank", {"query": query, "documents": docs}, timeout=240)
        out.append({"case": f"1. /v1/rerank, a 3,400-character query and {n:,} documents of 16 kB",
                    "status": status, "answer": text, "seconds": round(seconds, 2),
                    "rss_gb_before": round(base, 2), "rss_gb_peak": round(server.peak, 2),
                    "killed_at_gb": server.killed_at, "alive": server.alive})
        server.stop()
    return out


def case_surrogates(source: Path, work: Path, kill_gb: float) -> list[dict[str, Any]]:
    server = Server(fresh_engine(source, work, "surrogates"), kill_gb=kill_gb)
    bodies = {
        "/v1/embeddings": '{"input": ["fine", "bad %s text"], "input_type": "query"}' % SURROGATE,
        "/search/batch": '{"queries": ["cats", "dogs %s"]}' % SURROGATE,
        "/v1/rerank": '{"query": "cats", "documents": ["ok", "x%sy"]}' % SURROGATE,
        "/documents": '{"documents": [{"id": "s-1", "text": "t%s"}]}' % SURROGATE,
    }
    out = []
    for route, raw in bodies.items():
        searchers = Searchers(server, 4)
        statuses = []
        deadline = time.monotonic() + 8
        while time.monotonic() < deadline and server.alive:
            status, text, _ = server.post(route, raw=raw)
            statuses.append(status)
        got = searchers.stop()
        out.append({"case": f"2. a lone surrogate in {route}, 4 clients searching", "status": sorted(set(statuses)),
                    "answer": text, "sent": len(statuses), "other_searches": got["searches"],
                    "other_failed": got["failed"], "rss_gb_peak": round(server.peak, 2), "alive": server.alive})
    server.stop()
    return out


def case_bulk_embeddings(source: Path, work: Path, kill_gb: float) -> list[dict[str, Any]]:
    rng = random.Random(3)
    texts = [words(rng, 1300)[:7800] for _ in range(2048)]
    out = []
    for kind in ("query", "document"):
        server = Server(fresh_engine(source, work, f"bulk-{kind}"), kill_gb=kill_gb)
        base = server.reset_peak()
        quiet = Searchers(server, 2)
        time.sleep(5)
        alone = quiet.stop()
        searchers = Searchers(server, 2)
        status, text, seconds = server.post("/v1/embeddings", {"input": texts, "input_type": kind}, timeout=240)
        during = searchers.stop()
        out.append({"case": f"3. /v1/embeddings, 2,048 texts of 7,800 characters, input_type {kind}",
                    "status": status, "answer": text, "seconds": round(seconds, 2),
                    "search_p50_ms_alone": alone["p50_ms"], "search_p50_ms_during": during["p50_ms"],
                    "search_max_ms_during": during["max_ms"], "other_failed": during["failed"],
                    "rss_gb_before": round(base, 2), "rss_gb_after": round(rss_gb(server.proc.pid), 2),
                    "rss_gb_peak": round(server.peak, 2), "alive": server.alive})
        server.stop()
    return out


def case_methods(source: Path, work: Path, kill_gb: float) -> list[dict[str, Any]]:
    server = Server(fresh_engine(source, work, "methods"), kill_gb=kill_gb)
    before = len(server.client.get("/metrics").content)
    statuses = set()
    for i in range(5000):
        statuses.add(server.client.request(f"X{i:05d}", "/search").status_code)
    t = time.perf_counter()
    after = len(server.client.get("/metrics").content)
    scrape = time.perf_counter() - t
    stats_keys = len(server.client.get("/stats").json().get("requests", {}))
    out = [{"case": "4. 5,000 requests with made-up HTTP methods", "status": sorted(statuses),
            "metrics_bytes_before": before, "metrics_bytes_after": after, "scrape_s": round(scrape, 3),
            "stats_request_keys": stats_keys, "alive": server.alive}]
    server.stop()
    return out


def has_budgets() -> bool:
    done = subprocess.run([sys.executable, "-m", "twostage", "serve", "--help"], capture_output=True, text=True)
    return "--max-metadata-keys" in done.stdout


def case_documents(source: Path, work: Path, kill_gb: float) -> list[dict[str, Any]]:
    out = documents_within(source, work, kill_gb, (), 15_000_000, "")
    if has_budgets():  # the same inputs with the budgets raised past them: what the memory and lock fixes do
        raised = ("--max-metadata-keys", "20000", "--max-metadata-bytes", "1000000", "--max-document-chars",
                  "3000000")
        out += documents_within(source, work, kill_gb, raised, 1_000_000, " (budgets raised past the input)")
    return out


def documents_within(source: Path, work: Path, kill_gb: float, flags: tuple[str, ...], big_chars: int,
                     note: str) -> list[dict[str, Any]]:
    rng = random.Random(5)
    out = []
    server = Server(fresh_engine(source, work, f"documents{len(flags)}"), *flags, kill_gb=kill_gb)
    base = server.reset_peak()
    meta = {f"field_{i}": i for i in range(10_000)}
    status, text, seconds = server.post("/documents", {"documents": [{"id": "many-keys", "text": "cats purr",
                                                                       "metadata": meta}]})
    s2, t2, sec2 = server.post("/search", {"query": "cats", "where": {"field_3": {"$gte": 0}}})
    out.append({"case": f"5a. a document with 10,000 metadata keys, then a filtered search{note}", "status": status,
                "answer": text, "seconds": round(seconds, 2), "search_status": s2, "search_s": round(sec2, 2),
                "rss_gb_before": round(base, 2), "rss_gb_peak": round(server.peak, 2),
                "killed_at_gb": server.killed_at, "alive": server.alive})
    if server.alive:
        big = words(rng, big_chars // 6)[:big_chars]
        small: dict[str, Any] = {}

        def small_write() -> None:
            time.sleep(3)
            small["status"], _, small["seconds"] = server.post("/documents", {"documents": [
                {"id": "small-during-big", "text": "a small document written meanwhile"}]}, timeout=300)

        thread = threading.Thread(target=small_write)
        thread.start()
        status, text, seconds = server.post("/documents", {"documents": [{"id": "big", "text": big}]}, timeout=300)
        thread.join()
        out.append({"case": f"5b. one {big_chars / 1e6:.0f} MB document through POST /documents, a small write 3 s "
                            f"later{note}",
                    "status": status, "answer": text, "seconds": round(seconds, 2),
                    "small_write_status": small.get("status"), "small_write_s": round(small.get("seconds", 0), 2),
                    "rss_gb_peak": round(server.peak, 2), "killed_at_gb": server.killed_at, "alive": server.alive})
    server.stop()
    return out


def case_metadata(source: Path, work: Path, kill_gb: float) -> list[dict[str, Any]]:
    """Memory that grows with metadata fields x passage rows: one long document with 10,000 fields."""
    out = []
    variants = [((), "")]
    if has_budgets():
        variants.append((("--max-metadata-keys", "20000", "--max-metadata-bytes", "1000000"),
                         " (budgets raised past the input)"))
    rng = random.Random(7)
    text = words(rng, 20_000)
    meta = {f"field_{i}": i for i in range(10_000)}
    for flags, note in variants:
        server = Server(fresh_engine(source, work, f"metadata{len(flags)}"), *flags, kill_gb=kill_gb)
        base = server.reset_peak()
        status, answer, seconds = server.post("/documents", {"documents": [{"id": "many-keys-long", "text": text,
                                                                          "metadata": meta}]}, timeout=300)
        s2, a2, sec2 = server.post("/search", {"query": "cats", "where": {"field_3": {"$gte": 0}}}, timeout=300)
        out.append({"case": f"5c. a document of 20,000 words (400 passages) with 10,000 metadata keys, then a "
                            f"filtered search{note}", "status": status, "answer": answer, "seconds": round(seconds, 2),
                    "search_status": s2, "search_s": round(sec2, 2), "rss_gb_before": round(base, 2),
                    "rss_gb_peak": round(server.peak, 2), "killed_at_gb": server.killed_at, "alive": server.alive})
        server.stop()
    return out


def run_cli(*args: str, timeout: float = 120) -> dict[str, Any]:
    t = time.perf_counter()
    proc = subprocess.Popen([sys.executable, "-m", "twostage", *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True)
    try:
        out, err = proc.communicate(timeout=timeout)
        rc = proc.returncode
    except subprocess.TimeoutExpired:
        proc.kill()
        out, err = proc.communicate()
        rc = None
    lines = [ln for ln in (err or "").splitlines() if ln.strip() and "Loading weights" not in ln]
    return {"rc": rc, "seconds": round(time.perf_counter() - t, 1), "stderr_lines": len(lines),
            "last_line": lines[-1][:200] if lines else (out or "").strip().splitlines()[-1:][0][:200] if out else ""}


def broken_models(work: Path) -> dict[str, Path]:
    from twostage.retriever.weights import resolve_model

    src = resolve_model("all-MiniLM-L6-v2")
    made = {}
    for how in ("huge-tokenizer", "config-passwd", "weights-dev-zero", "layers"):
        dest = work / f"model-{how}"
        shutil.copytree(src, dest, ignore=shutil.ignore_patterns("twostage-openvino*"))
        if how == "huge-tokenizer":
            with open(dest / "tokenizer.json", "r+b") as fh:
                fh.truncate(1 << 30)  # sparse: 1 GB on paper
        elif how == "config-passwd":
            (dest / "config.json").unlink()
            os.symlink("/etc/passwd", dest / "config.json")
        elif how == "weights-dev-zero":
            (dest / "model.safetensors").unlink()
            os.symlink("/dev/zero", dest / "model.safetensors")
        else:
            config = json.loads((dest / "config.json").read_text())
            (dest / "config.json").write_text(json.dumps({**config, "num_hidden_layers": 100_000}))
        made[how] = dest
    return made


def case_swap(source: Path, work: Path, kill_gb: float) -> list[dict[str, Any]]:
    out = []
    engine = fresh_engine(source, work, "swap-files")
    before = sorted(p.name for p in engine.iterdir())
    judged = ("--qrels", str(SAMPLE), "--split", "train")
    for how, model in broken_models(work).items():
        timeout = 90 if how in ("weights-dev-zero", "layers") else 120
        r = run_cli("swap", str(engine), "--retriever", str(model), *judged, timeout=timeout)
        staging = [p.name for p in engine.parent.glob(f".{engine.name}.swap-*")]
        for p in engine.parent.glob(f".{engine.name}.swap-*"):
            shutil.rmtree(p, ignore_errors=True)
        out.append({"case": f"7/8. twostage swap --retriever with {how}", **r, "staging_left": len(staging),
                    "engine_unchanged": sorted(p.name for p in engine.iterdir()) == before})
    r = run_cli("swap", str(engine), "--retriever", "all-MiniLM-L6-v2", *judged, "--min-gain", "nan")
    out.append({"case": "7. twostage swap --min-gain nan (MiniLM against the trained retriever)", **r,
                "engine_unchanged": sorted(p.name for p in engine.iterdir()) == before})
    return out


def case_tokens(source: Path, work: Path, kill_gb: float) -> list[dict[str, Any]]:
    """6 (a token after a swap), 9 (a copied engine), 10 (/health), and the small ones of 11."""
    from twostage import SearchEngine
    from twostage.engine.pages import PageToken, encode_page_token, page_key

    out = []
    engine = fresh_engine(source, work, "tokens")
    server = Server(engine, kill_gb=kill_gb)
    q = "why does bread dough rise"
    first = server.client.post("/search", json={"query": q, "k": 5}).json()
    token = first["next_page"]
    # 11: the token's k; a token dated tomorrow; a 100 kB path in the access log
    r = server.client.post("/search", json={"query": q, "k": 50, "page_token": token})
    out.append({"case": "11. a k=5 token replayed with k=50", "status": r.status_code,
                "answer": f"{len(r.json().get('hits', []))} hits" if r.status_code == 200 else r.text[:160]})
    e = SearchEngine.load(engine)
    decoded = e.read_page_token(token)
    future = encode_page_token(PageToken(decoded.version, decoded.offset, decoded.k, decoded.fingerprint,
                                         int(time.time()) + 10 * 365 * 86_400), page_key(engine))
    e.close()
    r = server.client.post("/search", json={"query": q, "k": 5, "page_token": future})
    out.append({"case": "11. a signed token dated ten years ahead", "status": r.status_code, "answer": r.text[:160]})
    with socket.create_connection(("127.0.0.1", server.port)) as s:
        s.sendall(b"GET /" + b"a" * 100_000 + b" HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        status_line = s.recv(200).split(b"\r\n")[0].decode("ascii", "replace")
    time.sleep(0.3)
    longest = max((len(line) for line in server.log_path.read_text(errors="replace").splitlines()), default=0)
    out.append({"case": "11. a 100 kB path", "status": status_line, "longest_log_line": longest})
    r = server.client.post("/search", json={"query": q, "min_relevance": 0.5, "rerank": False})
    out.append({"case": "11. min_relevance with rerank false (engine with a reranker)", "status": r.status_code,
                "answer": r.text[:200]})
    # 9: a copy of the engine and the original's token
    copy = work / "tokens-copy"
    subprocess.run(["cp", "-a", str(engine), str(copy)], check=True)
    (copy / "LOCK").unlink(missing_ok=True)
    c = SearchEngine.load(copy)
    try:
        res = c.search(q, 5, page_token=token)
        answer, ok = f"paged the copy: {len(res.hits)} hits", True
    except Exception as exc:  # noqa: BLE001 - the outcome is what is reported
        answer, ok = f"{type(exc).__name__}: {str(exc)[:120]}", False
    c.close()
    out.append({"case": "9. the original's token used on a cp -a copy", "status": "served" if ok else "refused",
                "answer": answer})
    # 10: /health after another process commits
    from twostage import Document

    e = SearchEngine.load(engine)
    new = e.add([Document("health-check", "a document another process adds")])
    new_version = new.version
    new.close()
    e.close()
    health = server.client.get("/health").json()["version"]
    out.append({"case": "10. /health right after another process committed", "status": health,
                "answer": f"committed {new_version}; /health says {health}"})
    # 6: a token issued before a model swap, replayed
    token2 = server.client.post("/search", json={"query": q, "k": 5}).json()["next_page"]
    swap = run_cli("swap", str(engine), "--retriever", "all-MiniLM-L6-v2", "--qrels", str(SAMPLE), "--split",
                   "train", "--force", timeout=300)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and server.client.get("/health").json()["version"] == health:
        time.sleep(0.5)
    times, statuses = [], []
    for _ in range(5):
        t = time.perf_counter()
        r = server.client.post("/search", json={"query": q, "k": 5, "page_token": token2})
        times.append(time.perf_counter() - t)
        statuses.append(r.status_code)
    out.append({"case": "6. a page token from before a model swap, replayed 5 times", "status": sorted(set(statuses)),
                "answer": r.text[:160], "median_s": round(float(np.median(times)), 3), "swap_rc": swap["rc"]})
    server.stop()
    # 11: rerank true on an engine without a reranker
    bare = work / "bare"
    SearchEngine.build(SAMPLE, bare, retriever=None).close()
    server = Server(bare, kill_gb=kill_gb)
    r = server.client.post("/search", json={"query": q, "rerank": True})
    out.append({"case": "11. rerank true on an engine without a reranker", "status": r.status_code,
                "answer": r.text[:160]})
    server.stop()
    return out


CASES = {"rerank": case_rerank_memory, "surrogates": case_surrogates, "bulk": case_bulk_embeddings,
         "methods": case_methods, "documents": case_documents, "metadata": case_metadata, "swap": case_swap, "tokens": case_tokens}


# ---- the mixed load and the fuzz --------------------------------------------------------------------------------
def mixed(source: Path, work: Path, seconds: float, kill_gb: float) -> dict[str, Any]:
    import httpx

    server = Server(fresh_engine(source, work, "mixed"), kill_gb=kill_gb)
    stats = server.client.get("/stats").json()
    budget = stats.get("budgets", {}).get("max_request_tokens", 131_072)
    calm = Searchers(server, 4)
    time.sleep(seconds)
    alone = calm.stop()
    stop = threading.Event()
    counts: dict[str, Any] = {"poison": {}, "bulk": {}}
    rng = random.Random(9)
    # the largest calls the default budget allows: texts of ~250 tokens each (MiniLM reads 256)
    n_texts = max(1, budget // 260)
    emb_texts = [words(rng, 200) for _ in range(min(n_texts, 2048))]
    rerank_docs = [words(rng, 100) for _ in range(min(1000, max(1, budget // 190)))]

    long_text = words(rng, 300)  # more words than the retriever reads: counted as 256 tokens without tokenising

    def poison() -> None:
        with httpx.Client(base_url=server.url, timeout=60) as client:
            i = 0
            while not stop.is_set():
                i += 1
                kind = i % 4
                try:
                    if kind == 0:
                        r = client.post("/v1/embeddings", content='{"input": ["x%s"], "input_type": "query"}'
                                        % SURROGATE, headers={"content-type": "application/json"})
                    elif kind == 1:
                        r = client.post("/v1/rerank", content='{"query": "q", "documents": ["%s"]}' % SURROGATE,
                                        headers={"content-type": "application/json"})
                    elif kind == 2:  # over a budget or a limit: 524,288 tokens; 1,001 documents; a 17 MB body
                        r = [lambda: client.post("/v1/embeddings", json={"input": [long_text] * 2048}),
                             lambda: client.post("/v1/rerank", json={"query": "q", "documents": ["d"] * 1001}),
                             lambda: client.post("/v1/rerank", content=b"{" + b" " * 17_000_000 + b"}",
                                                 headers={"content-type": "application/json"})][(i // 4) % 3]()
                    else:
                        r = client.request(f"Z{i}", "/search")
                    counts["poison"][r.status_code] = counts["poison"].get(r.status_code, 0) + 1
                except httpx.HTTPError as exc:
                    counts["poison"][type(exc).__name__] = counts["poison"].get(type(exc).__name__, 0) + 1
                time.sleep(0.02)

    def bulk() -> None:
        with httpx.Client(base_url=server.url, timeout=600) as client:
            i = 0
            while not stop.is_set():
                i += 1
                try:
                    if i % 2:
                        r = client.post("/v1/embeddings", json={"input": emb_texts, "input_type": "query"})
                    else:
                        r = client.post("/v1/rerank", json={"query": "what makes dough rise",
                                                            "documents": rerank_docs})
                    counts["bulk"][r.status_code] = counts["bulk"].get(r.status_code, 0) + 1
                except httpx.HTTPError as exc:
                    counts["bulk"][type(exc).__name__] = counts["bulk"].get(type(exc).__name__, 0) + 1

    hostile = [threading.Thread(target=poison, daemon=True), threading.Thread(target=bulk, daemon=True)]
    searchers = Searchers(server, 4)
    for t in hostile:
        t.start()
    time.sleep(seconds)
    during = searchers.stop()
    stop.set()
    for t in hostile:
        t.join(600)
    metrics_bytes = len(server.client.get("/metrics").content) if server.alive else None
    out = {"seconds": seconds, "alone": alone, "with_hostile": during, "hostile_counts": {
        k: {str(s): n for s, n in v.items()} for k, v in counts.items()},
        "bulk_embedding_texts": len(emb_texts), "bulk_rerank_documents": len(rerank_docs),
        "p99_ratio": round(during["p99_ms"] / alone["p99_ms"], 2) if during["p99_ms"] and alone["p99_ms"] else None,
        "metrics_bytes_after": metrics_bytes, "rss_gb_peak": round(server.peak, 2), "alive": server.alive}
    server.stop()
    return out


def hostile_value(rng: random.Random, depth: int = 0) -> Any:
    pick = rng.randrange(14)
    if pick == 0:
        return None
    if pick == 1:
        return rng.choice([True, False])
    if pick == 2:
        return rng.choice([0, -1, 1, 2**63, -(2**63), 10**400 if rng.random() < 0.3 else 7, 10**6])
    if pick == 3:
        return rng.choice([0.5, -0.0, 1e308, -1e308, 1e-320, float("nan"), float("inf")])
    if pick in (4, 5, 6):
        return random_text(rng)
    if pick == 7 and depth < 4:
        return [hostile_value(rng, depth + 1) for _ in range(rng.randint(0, 5))]
    if pick == 8 and depth < 4:
        return {random_text(rng, 12): hostile_value(rng, depth + 1) for _ in range(rng.randint(0, 4))}
    if pick == 9:
        return "x" * rng.choice([0, 1, 10_001, 100_001])
    if pick == 10:
        return {"$gt": hostile_value(rng, depth + 1)} if depth < 4 else "y"
    return random_text(rng, 30)


def random_text(rng: random.Random, n: int = 60, surrogates: bool | None = None) -> str:
    ranges = [(0x20, 0x7E), (0x00, 0x1F), (0x300, 0x36F), (0x590, 0x6FF), (0x4E00, 0x9FFF), (0x1F300, 0x1FAFF),
              (0x200B, 0x202E), (0xFFF0, 0xFFFF), (0x10000, 0x10FFFF), (0x0E00, 0x0E7F)]
    if surrogates if surrogates is not None else rng.random() < 0.3:
        ranges.append((0xD800, 0xDFFF))
    out = []
    for _ in range(rng.randint(0, n)):
        lo, hi = rng.choice(ranges)
        out.append(chr(rng.randint(lo, hi)))
    return "".join(out)


def fuzz_body(rng: random.Random, route: str) -> Any:
    """A body of the route's shape, valid more often than not, with some of its values hostile (random Unicode,
    huge or odd numbers, wrong types, deep objects)."""
    def text(n: int = 60) -> str:
        return random_text(rng, n) or "x"

    base = {
        "/search": lambda: {"query": text(), "k": rng.choice([1, 5, 10])},
        "/search/batch": lambda: {"queries": [text() for _ in range(rng.randint(1, 4))], "k": 3},
        "/v1/embeddings": lambda: {"input": [text() for _ in range(rng.randint(1, 4))],
                                   "input_type": rng.choice(["query", "document"])},
        "/v1/rerank": lambda: {"query": text(), "documents": [text(200) for _ in range(rng.randint(1, 5))]},
        "/documents": lambda: {"documents": [{"id": text(12), "text": text(300), "title": text(20),
                                              "metadata": {text(8): hostile_value(rng)}}], "upsert": True},
        "DELETE /documents": lambda: {"ids": [text(12) for _ in range(rng.randint(1, 3))]},
    }[route]()
    fields = {
        "/search": ["where", "offset", "rerank_depth", "rerank_blend", "first_stage", "rerank", "fusion",
                    "dense_weight", "k_rrf", "first_stage_depth", "min_relevance", "page_token", "full_text", "k"],
        "/search/batch": ["where", "offset", "rerank", "min_relevance", "first_stage", "queries"],
        "/v1/embeddings": ["model", "encoding_format", "dimensions", "input_type", "input"],
        "/v1/rerank": ["top_n", "return_documents", "model", "documents"],
        "/documents": ["upsert", "documents"],
        "DELETE /documents": ["ids"],
    }[route]
    for name in rng.sample(fields, rng.randint(0, min(3, len(fields)))):
        base[name] = hostile_value(rng)
    return base


def fuzz(source: Path, work: Path, requests: int, kill_gb: float) -> dict[str, Any]:
    import httpx

    server = Server(fresh_engine(source, work, "fuzz"), kill_gb=kill_gb)
    rng = random.Random(61)
    routes = ["/search", "/search/batch", "/v1/embeddings", "/v1/rerank", "/documents", "DELETE /documents"]
    statuses: dict[str, dict[str, int]] = {r: {} for r in routes}
    five: list[str] = []
    t0 = time.perf_counter()
    for i in range(requests):
        route = routes[i % len(routes)]
        body = fuzz_body(rng, route)
        raw = json.dumps(body, allow_nan=True, ensure_ascii=rng.random() < 0.5)
        try:
            data = raw.encode("utf-8", "surrogatepass") if rng.random() < 0.5 else raw.encode("utf-8", "replace")
        except UnicodeEncodeError:
            data = raw.encode("utf-8", "replace")
        method, path = ("DELETE", "/documents") if route.startswith("DELETE") else ("POST", route)
        try:
            r = server.client.request(method, path, content=data, headers={"content-type": "application/json"},
                                      timeout=120)
            code = r.status_code
            if code >= 500:
                five.append(f"{route} {code} {r.text[:120]} <- {raw[:200]}")
        except httpx.HTTPError as exc:
            code = 0
            five.append(f"{route} no answer ({type(exc).__name__}) <- {raw[:200]}")
        statuses[route][str(code)] = statuses[route].get(str(code), 0) + 1
        if not server.alive:
            break
    health = server.client.get("/health").status_code if server.alive else None
    shutil.copy(server.log_path, work.parent / "hostile-fuzz-server.log")  # the tracebacks of any 5xx
    out = {"requests": sum(sum(v.values()) for v in statuses.values()), "seconds": round(time.perf_counter() - t0, 1),
           "5xx_or_no_answer": len(five), "examples": five[:5], "statuses": statuses, "alive": server.alive,
           "health_after": health, "rss_gb_peak": round(server.peak, 2)}
    server.stop()
    return out


# ---- the report -------------------------------------------------------------------------------------------------
def table(before: dict[str, Any], after: dict[str, Any]) -> str:
    def brief(row: dict[str, Any]) -> str:
        skip = {"case"}
        parts = []
        for k, v in row.items():
            if k in skip or v is None or v == "":
                continue
            parts.append(f"{k} {v}")
        return "; ".join(parts).replace("|", "\\|").replace("\n", " ")

    lines = [f"| case | before ({before['label']}) | after ({after['label']}) |", "|---|---|---|"]
    after_rows = {r["case"]: r for r in after["rows"]}
    for row in before["rows"]:
        lines.append(f"| {row['case']} | {brief(row)} | {brief(after_rows.get(row['case'], {}))} |")
    seen = {row["case"] for row in before["rows"]}
    for row in after["rows"]:
        if row["case"] not in seen:  # a case only the code after can run (a flag the code before lacks)
            lines.append(f"| {row['case']} | (no such flag) | {brief(row)} |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    sub = parser.add_subparsers(dest="what", required=True)
    for name in ("cases", "mixed", "fuzz"):
        p = sub.add_parser(name)
        p.add_argument("--engine", type=Path, default=ROOT / "out" / "demo.models" / "engine",
                       help="an engine with a trained reranker (default: the demo's)")
        p.add_argument("--json", type=Path, required=True, help="where the measurements go")
        p.add_argument("--kill-gb", type=float, default=6.0, help="kill a server past this resident memory")
        if name == "cases":
            p.add_argument("--label", required=True)
            p.add_argument("--only", default=",".join(CASES), help=f"cases to run (default all: {','.join(CASES)})")
        if name == "mixed":
            p.add_argument("--seconds", type=float, default=60)
        if name == "fuzz":
            p.add_argument("--requests", type=int, default=10_000)
    t = sub.add_parser("table")
    t.add_argument("before", type=Path)
    t.add_argument("after", type=Path)
    args = parser.parse_args()
    if args.what == "table":
        print(table(json.loads(args.before.read_text()), json.loads(args.after.read_text())))
        return
    import twostage

    work = Path(tempfile.mkdtemp(prefix="hostile-"))
    try:
        if args.what == "cases":
            rows = []
            for name in args.only.split(","):
                t0 = time.perf_counter()
                got = CASES[name](args.engine, work, args.kill_gb)
                rows += got
                print(f"{name}: {time.perf_counter() - t0:.0f} s", json.dumps(got)[:600], flush=True)
            result: Any = {"label": args.label, "code": str(Path(twostage.__file__).parent), "rows": rows}
        elif args.what == "mixed":
            result = mixed(args.engine, work, args.seconds, args.kill_gb)
        else:
            result = fuzz(args.engine, work, args.requests, args.kill_gb)
        args.json.write_text(json.dumps(result, indent=1, default=str))
        print(json.dumps(result, default=str)[:3000])
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
