"""GPU against CPU on one machine, same weights, same process: encode and rerank throughput (ours and
sentence-transformers' on each device), and SciFact test nDCG@10 of dense, hybrid and hybrid+rerank.

Usage (on a machine with a CUDA GPU, from the repository root):
    python benchmarks/experiments/gpu.py --retriever MODEL_DIR --reranker MODEL_DIR [--data ../shared/data/scifact] --out DIR
    python benchmarks/experiments/gpu.py --report DIR [DIR ...] --md benchmarks/results/gpu.md

What runs, for each device in --devices (default cpu,cuda) and precision (fp32; bf16 too on a GPU):
- encode: every SciFact document (title and text, as one string) with our BiEncoder and with
  sentence-transformers' SentenceTransformer on the same directory, batch --batch-size; rounds alternate between the
  two and the median is kept (documents/s).
- quality, first stage: ``twostage bench --systems bm25,dense,hybrid --backend flat --precision P --device D``
  (the passage engine as ``twostage build`` makes it; exact search so only the models differ).
- rerank: the CPU fp32 hybrid run's top --depth per test query, one call per query as the engine does, with our
  CrossEncoder and sentence-transformers' CrossEncoder (pairs/s, ms/query); quality: ``twostage rerank --run
  HYBRID --device D --precision P`` then ``twostage eval``.
``--stage retriever`` or ``--stage reranker`` runs one half (the reranker half needs --run, the retriever half's
hybrid-cpu-fp32.trec), for machines that can receive one model at a time. Each half writes DIR/gpu-STAGE.json;
``--report`` (with ``--notes``, a markdown file of how the runs were made) turns them into markdown whose last line is PASS when every GPU fp32 nDCG@10 is within 0.002 of the CPU
fp32 one, else FAIL.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
DATA = ROOT.parent / "shared" / "data" / "scifact"
TOLERANCE = 0.002
METRICS = ("ndcg@10", "recall@100")


def twostage(*args: str) -> tuple[str, float]:
    start = time.perf_counter()
    out = subprocess.run([sys.executable, "-m", "twostage", "-q", *args], capture_output=True, text=True)
    if out.returncode:
        raise SystemExit(f"twostage {' '.join(args)} failed:\n{out.stderr[-3000:]}")
    return out.stdout, time.perf_counter() - start


def say(line: str) -> None:
    print(line, flush=True)


def machine() -> dict[str, Any]:
    import torch
    import transformers

    gpu = torch.cuda.get_device_name(0) if torch.cuda.is_available() else None
    return {"gpu": gpu, "torch": torch.__version__, "cuda": torch.version.cuda, "transformers": transformers.__version__,
            "cpu_cores": os.cpu_count(), "torch_threads": torch.get_num_threads()}


def settings(devices: list[str]) -> list[tuple[str, str]]:
    """(device, precision) pairs: fp32 everywhere, bf16 on GPUs."""
    return [(d, p) for d in devices for p in (("fp32", "bf16") if d.startswith("cuda") else ("fp32",))]


def timed(rounds: int, fns: dict[str, Callable[[], Any]]) -> dict[str, float]:
    """Median seconds of each function over ``rounds`` rounds after one warm-up each; the first of each round
    rotates."""
    import torch

    names = list(fns)
    for name in names:
        fns[name]()
    times: dict[str, list[float]] = {n: [] for n in names}
    for r in range(rounds):
        for name in names[r % len(names):] + names[:r % len(names)]:
            if torch.cuda.is_available():
                torch.cuda.synchronize()
            start = time.perf_counter()
            fns[name]()
            if torch.cuda.is_available():
                torch.cuda.synchronize()
            times[name].append(time.perf_counter() - start)
    return {n: statistics.median(t) for n, t in times.items()}


def st_dtype(model: Any, precision: str) -> Any:
    import torch

    return model.to(torch.bfloat16) if precision == "bf16" else model


def encode_speed(retriever: str, texts: list[str], devices: list[str], rounds: int, batch: int) -> list[dict[str, Any]]:
    import numpy as np
    from sentence_transformers import SentenceTransformer

    from twostage.retriever.biencoder import BiEncoder

    rows, reference = [], None
    for device, precision in settings(devices):
        ours = BiEncoder.load(retriever, precision=precision, device=device)
        peer = st_dtype(SentenceTransformer(retriever, device=device), precision)
        peer.max_seq_length = ours.config.max_length
        seconds = timed(rounds, {
            "twostage": lambda: ours.encode(texts, batch_size=batch),
            "sentence-transformers": lambda: peer.encode(texts, batch_size=batch, convert_to_numpy=True)})
        sample = ours.encode(texts[:256], batch_size=batch)
        reference = sample if reference is None else reference
        peer_sample = np.asarray(peer.encode(texts[:256], batch_size=batch, convert_to_numpy=True), dtype=np.float32)
        for who, s in seconds.items():
            rows.append({"stage": "encode", "who": who, "device": device, "precision": precision,
                         "per_s": len(texts) / s, "seconds": s})
        rows[-2]["max_diff_vs_first"] = float(np.abs(sample - reference).max())
        rows[-1]["max_diff_vs_ours"] = float(np.abs(peer_sample - sample).max())
        say(f"encode {device} {precision}: " + ", ".join(f"{w} {len(texts) / s:.0f}/s" for w, s in seconds.items()))
        del ours, peer
    return rows


def rerank_speed(reranker: str, pairs: list[list[tuple[str, str]]], devices: list[str], rounds: int,
                 batch: int) -> list[dict[str, Any]]:
    import numpy as np
    from sentence_transformers import CrossEncoder as STCrossEncoder

    from twostage.reranker.cross_encoder import CrossEncoder

    rows, reference = [], None
    n = sum(len(p) for p in pairs)
    for device, precision in settings(devices):
        ours = CrossEncoder.load(reranker, precision=precision, device=device)
        peer = STCrossEncoder(reranker, device=device, max_length=ours.max_length)
        st_dtype(peer.model, precision)
        seconds = timed(rounds, {
            "twostage": lambda: [ours.predict(p, batch_size=batch) for p in pairs],
            "sentence-transformers": lambda: [peer.predict(p, batch_size=batch, show_progress_bar=False)
                                              for p in pairs]})
        sample = np.concatenate([ours.predict(p, batch_size=batch) for p in pairs[:20]])
        reference = sample if reference is None else reference
        peer_sample = np.concatenate([np.asarray(peer.predict(p, batch_size=batch, show_progress_bar=False),
                                                 dtype=np.float32) for p in pairs[:20]])
        for who, s in seconds.items():
            rows.append({"stage": "rerank", "who": who, "device": device, "precision": precision, "per_s": n / s,
                         "ms_per_query": 1000 * s / len(pairs), "seconds": s})
        rows[-2]["max_diff_vs_first"] = float(np.abs(sample - reference).max())
        rows[-1]["max_diff_vs_ours"] = float(np.abs(peer_sample - sample).max())
        say(f"rerank {device} {precision}: " + ", ".join(f"{w} {n / s:.0f}/s" for w, s in seconds.items()))
        del ours, peer
    return rows


def retriever_half(args: argparse.Namespace, texts: list[str]) -> dict[str, Any]:
    rows = [] if args.no_speed else encode_speed(args.retriever, texts, args.devices, args.rounds, args.batch_size)
    quality = []
    with tempfile.TemporaryDirectory() as tmp:
        for device, precision in settings(args.devices):
            out = Path(tmp) / f"bench-{device}-{precision}"
            _, seconds = twostage("bench", "--data", str(args.data), "--systems", "bm25,dense,hybrid",
                                  "--retriever-model", args.retriever, "--backend", "flat", "--precision", precision,
                                  "--device", device, "--batch-size", str(args.batch_size), "--out", str(out))
            metrics = json.loads((out / "metrics.json").read_text())
            for system in ("dense", "hybrid"):
                quality.append({"system": system, "device": device, "precision": precision,
                                **{m: metrics[system][m] for m in METRICS}})
            quality.append({"system": "bench (build + search, 3 systems)", "device": device,
                            "precision": precision, "seconds": seconds})
            say(f"bench {device} {precision}: {seconds:.0f} s, " + ", ".join(
                f"{s} {metrics[s]['ndcg@10']:.4f}" for s in ("bm25", "dense", "hybrid")))
            if precision == "fp32":
                args.out.mkdir(parents=True, exist_ok=True)
                (args.out / f"hybrid-{device}-fp32.trec").write_text((out / "runs" / "hybrid.trec").read_text())
    return {"speed": rows, "quality": quality}


def reranker_half(args: argparse.Namespace) -> dict[str, Any]:
    from twostage.eval.run import Run
    from twostage.indexer.beir import BeirDataset

    data = BeirDataset(args.data)
    split = data.split("test")
    run = Run.from_trec(args.run)
    docs = data.corpus
    pairs = []
    for query in split.queries:
        ids = run[query.id].ids[:args.depth]
        pairs.append([(query.text, f"{docs.get(i).title} {docs.get(i).text}".strip()) for i in ids])
    rows = [] if args.no_speed else rerank_speed(args.reranker, pairs, args.devices, args.rounds, args.batch_size)
    quality = []
    base, _ = twostage("eval", "--run", str(args.run), "--data", str(args.data), "--json")
    quality.append({"system": f"hybrid: the reranked run, {args.run.name}", "device": "-", "precision": "-",
                    **{m: next(iter(json.loads(base).values()))[m] for m in METRICS}})
    with tempfile.TemporaryDirectory() as tmp:
        for device, precision in settings(args.devices):
            out = Path(tmp) / f"rerank-{device}-{precision}.trec"
            _, seconds = twostage("rerank", "--run", str(args.run), "--data", str(args.data), "--reranker",
                                  args.reranker, "--depth", str(args.depth), "--precision", precision, "--device",
                                  device, "--batch-size", str(args.batch_size), "--out", str(out))
            got, _ = twostage("eval", "--run", str(out), "--data", str(args.data), "--json")
            means = next(iter(json.loads(got).values()))
            quality.append({"system": "hybrid+rerank", "device": device, "precision": precision,
                            "seconds": seconds, **{m: means[m] for m in METRICS}})
            say(f"rerank --run {device} {precision}: {seconds:.0f} s, nDCG@10 {means['ndcg@10']:.4f}")
    return {"speed": rows, "quality": quality}


def report(dirs: list[Path], md: Path, notes: Path | None = None) -> bool:
    """Markdown of every gpu-*.json under ``dirs``: speed rows, ours against sentence-transformers per setting, and
    nDCG@10 of every GPU setting against the CPU fp32 row of the same system."""
    parts = [json.loads(p.read_text()) for d in dirs for p in d.glob("gpu-*.json")]
    parts.sort(key=lambda part: (part["stage"] != "retriever", part["stage"], part["machine"]["gpu"] is None))
    if not parts:
        raise SystemExit(f"{', '.join(map(str, dirs))}: no gpu-*.json to report")
    lines = ["# GPU and CPU, same weights: speed and SciFact test quality", "", "Runs (each line one command, "
             "its half and its machine):", ""]
    for part in parts:
        m = part["machine"]
        lines.append(f"- `{part['command']}` ({part['stage']}): {m['gpu'] or 'no GPU'}, {m['cpu_cores']} CPU cores, "
                     f"torch {m['torch']}, transformers {m['transformers']}")
    if notes is not None:
        lines += ["", notes.read_text().strip()]
    speed = [r for part in parts for r in part["speed"]]
    if speed:
        lines += ["", "| stage | who | device | precision | per s | ms/query | max diff |", "| --- | --- | --- | --- | --- | --- | --- |"]
        for r in speed:
            diff = (f"{r['max_diff_vs_first']:.1e} vs this run's first setting" if "max_diff_vs_first" in r
                    else f"{r['max_diff_vs_ours']:.1e} vs ours, same setting")
            ms = f"{r['ms_per_query']:.1f}" if "ms_per_query" in r else ""
            lines.append(f"| {r['stage']} | {r['who']} | {r['device']} | {r['precision']} | {r['per_s']:.0f} | {ms} | "
                         f"{diff} |")
        lines += ["", "encode: documents/s; rerank: (query, document) pairs/s, one call per query. Ours against "
                  "sentence-transformers in the same round-robin (same process, same device and precision):", ""]
        for part in parts:
            by = {(r["stage"], r["device"], r["precision"], r["who"]): r["per_s"] for r in part["speed"]}
            for (stage, device, precision, who), per_s in by.items():
                peer = by.get((stage, device, precision, "sentence-transformers"))
                if who == "twostage" and peer:
                    lines.append(f"- {stage} on {device} {precision} ({part['stage']} run): {per_s / peer:.2f}x "
                                 "sentence-transformers")
    quality = [r for part in parts for r in part["quality"]]
    ref = {r["system"]: r for r in quality if r["device"] == "cpu" and r["precision"] == "fp32" and "ndcg@10" in r}
    lines += ["", "| system | device | precision | nDCG@10 | Recall@100 | seconds |", "| --- | --- | --- | --- | --- | --- |"]
    ok, checks = True, []
    for r in quality:
        nd, rc = r.get("ndcg@10"), r.get("recall@100")
        lines.append(f"| {r['system']} | {r['device']} | {r['precision']} | {'' if nd is None else f'{nd:.4f}'} | "
                     f"{'' if rc is None else f'{rc:.4f}'} | {r['seconds']:.0f} |" if "seconds" in r else
                     f"| {r['system']} | {r['device']} | {r['precision']} | {nd:.4f} | {rc:.4f} | |")
        if r["device"].startswith("cuda") and r["system"] in ref:
            delta = r["ndcg@10"] - ref[r["system"]]["ndcg@10"]
            good = abs(delta) <= TOLERANCE
            ok = ok and (good or r["precision"] != "fp32")
            checks.append(f"- {r['system']}, {r['device']} {r['precision']} against CPU fp32: {delta:+.4f} nDCG@10 "
                          f"({'within' if good else 'outside'} {TOLERANCE}"
                          f"{'' if r['precision'] == 'fp32' else '; reported, not checked'})")
    lines += ["", *checks, "", "PASS" if ok and checks else "FAIL"]
    md.write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    return ok and bool(checks)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--retriever", help="bi-encoder directory")
    ap.add_argument("--reranker", help="cross-encoder directory")
    ap.add_argument("--data", type=Path, default=DATA)
    ap.add_argument("--out", type=Path, help="where gpu-STAGE.json (and the hybrid run) go")
    ap.add_argument("--stage", choices=["all", "retriever", "reranker"], default="all")
    ap.add_argument("--run", type=Path, help="the hybrid run the reranker half reranks (default: the retriever "
                    "half's)")
    ap.add_argument("--devices", default="cpu,cuda")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--no-speed", action="store_true", help="quality only (e.g. the CPU reference on a small CPU)")
    ap.add_argument("--batch-size", type=int, default=32)
    ap.add_argument("--depth", type=int, default=20, help="candidates reranked per query (the engine's k_retrieve)")
    ap.add_argument("--report", type=Path, nargs="+", help="directories of gpu-*.json to turn into markdown")
    ap.add_argument("--md", type=Path, default=ROOT / "benchmarks" / "results" / "gpu.md")
    ap.add_argument("--notes", type=Path, help="markdown put under the list of runs (how the runs were made)")
    args = ap.parse_args()
    if args.report:
        return 0 if report(args.report, args.md, args.notes) else 1

    from twostage.indexer.beir import BeirDataset
    from twostage.indexer.errors import ConfigError
    from twostage.models.device import resolve_device

    try:
        args.devices = [resolve_device(d) for d in args.devices.split(",")]
    except ConfigError as exc:
        print(f"gpu.py: {exc}", file=sys.stderr)
        return 2
    if args.out is None:
        ap.error("--out is required")
    command = "python benchmarks/experiments/gpu.py " + " ".join(sys.argv[1:])
    halves = ["retriever", "reranker"] if args.stage == "all" else [args.stage]
    for half in halves:
        if half == "retriever":
            if not args.retriever:
                ap.error("the retriever half needs --retriever")
            texts = [f"{d.title} {d.text}".strip() for d in BeirDataset(args.data).corpus]
            result = retriever_half(args, texts)
            args.run = args.run or args.out / f"hybrid-{args.devices[0]}-fp32.trec"
        else:
            if not args.reranker or not args.run:
                ap.error("the reranker half needs --reranker and --run (or the retriever half first)")
            result = reranker_half(args)
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / f"gpu-{half}.json").write_text(json.dumps(
            {"stage": half, "command": command, "machine": machine(), **result}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
