"""A hostile client against `twostage serve`: writes and batches that ask for more work than they look (#79).

Usage (from the repository root, the serve extra installed):
    python benchmarks/hostile_budget.py --engine ENGINE_DIR --label after --out benchmarks/results/hostile_budget
    python benchmarks/hostile_budget.py --engine ENGINE_DIR --label before --server-pythonpath OLD_SITE ...

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
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parent.parent


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Server:
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


def timed(server: Server, method: str, path: str, body: Any = None, *, timeout: float, raw: str | None = None,
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


def search_load(server: Server, clients: int, seconds: float, qs: list[str]) -> dict[str, Any]:
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


def hostile_loop(server: Server, seconds: float, give_up: float) -> dict[str, Any]:
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
    """Writes killed at random moments: after each, the engine opened by the library (with the same code)."""
    import httpx

    results = []
    rng = random.Random(0)
    body = {"documents": [{"id": f"c-{i}", "text": english(6_000, i)} for i in range(40)], "upsert": True}
    path = work / "crash"
    shutil.rmtree(path, ignore_errors=True)
    shutil.copytree(engine, path)
    duration = None
    for attempt in range(tries + 1):
        server = Server(path, pythonpath, [])
        committed = httpx.get(server.url + "/health", timeout=10).json()
        t = time.perf_counter()
        if duration is None:  # the first write runs whole: how long one takes
            httpx.post(server.url + "/documents", json=body, timeout=600)
            duration = time.perf_counter() - t
            server.stop()
            continue
        at = rng.uniform(0.3, 1.1) * duration

        def send() -> None:
            try:
                httpx.post(server.url + "/documents", json=body, timeout=600)
            except httpx.HTTPError:
                pass

        threading.Thread(target=send, daemon=True).start()
        time.sleep(at)
        server.proc.kill()
        server.proc.wait()
        left = sorted(p.name for p in path.iterdir() if ".tmp-" in p.name)
        env = dict(os.environ)
        if pythonpath:
            env["PYTHONPATH"] = pythonpath + os.pathsep + env.get("PYTHONPATH", "")
        code = ("import sys, json; from pathlib import Path; from twostage import SearchEngine; "
                "e = SearchEngine.load(sys.argv[1]); p = Path(sys.argv[1]); "
                "print(json.dumps({'version': e.version, 'documents': len(e), "
                "'left': sorted(x.name for x in p.iterdir() if '.tmp-' in x.name)}))")
        opened = json.loads(subprocess.run([sys.executable, "-c", code, str(path)], env=env, capture_output=True,
                                           text=True, check=True).stdout.strip().splitlines()[-1])
        results.append({"killed_at_s": round(at, 2), "left_before_open": left, "left_after_open": opened["left"],
                        "version_before": committed["version"], "version_after": opened["version"],
                        "documents_before": committed["documents"], "documents_after": opened["documents"]})
    return {"write_s": duration, "tries": results}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
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
    args = p.parse_args()
    cases = set(args.cases.split(","))
    args.work.mkdir(parents=True, exist_ok=True)
    copy = args.work / f"engine-{args.label}"
    rows: dict[str, Any] = {}
    qs = queries()

    def fresh_server(extra: list[str] | None = None) -> Server:
        shutil.rmtree(copy, ignore_errors=True)
        shutil.copytree(args.engine, copy)
        return Server(copy, args.server_pythonpath, extra or [])

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
    target.write_text(json.dumps({"label": args.label, "command": " ".join(sys.argv), "rows": rows}, indent=1) + "\n")
    print(f"wrote {target}")


if __name__ == "__main__":
    main()
