"""The model frontier (#46): quality and p50 latency per collection for each base model, from suite runs, and one
training step of each model on this CPU.

    python benchmarks/experiments/frontier.py \
        --suite "all-MiniLM-L6-v2, openvino-fp32=benchmarks/results/suite-zeroshot" \
        --suite "all-MiniLM-L6-v2, openvino-int8=benchmarks/results/suite-minilm-int8" \
        --suite "all-mpnet-base-v2, openvino-int8=benchmarks/results/suite-mpnet-int8" \
        [--step-models all-MiniLM-L6-v2,all-mpnet-base-v2] [--one-path-report benchmarks/results/scifact-one-path/report.md]

Each ``--suite LABEL=DIR`` is the output of ``twostage bench --data ... --data ...`` (one folder per collection
with ``metrics.json``: nDCG@10, Recall@100, p50 per query, build seconds). The table puts every suite's dense and
hybrid rows side by side, with the p50 relative to the first suite. ``--step-models`` times forward + backward +
an AdamW step of each model in fp32 (32 texts of 221 tokens, the models alternating, ``--rounds`` times) and, from
the phase times of a MiniLM one-command report, says how long the same training would take with each model here.
Writes benchmarks/results/frontier.md (+ .json).
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(Path(__file__).resolve().parent))
SYSTEMS = ("dense", "hybrid")


def read_suite(path: Path) -> dict[str, dict[str, Any]]:
    """collection -> the suite's metrics.json of that collection (system -> metric -> value)."""
    out = {}
    for metrics in sorted(path.glob("*/metrics.json")):
        out[metrics.parent.name] = json.loads(metrics.read_text())
    if not out:
        raise SystemExit(f"{path}: no */metrics.json; pass the --out folder of a `twostage bench` suite run")
    return out


def step_times(models: list[str], rounds: int) -> dict[str, list[float]]:
    import torch
    from bf16_train_step import texts, train_step
    from transformers import AutoModel, AutoTokenizer

    from twostage.retriever.weights import resolve_model

    loaded = {}
    for name in models:
        path = resolve_model(name)
        tokenizer, model = AutoTokenizer.from_pretrained(path), AutoModel.from_pretrained(path)
        batch = tokenizer(texts(32, 200), padding=True, truncation=True, max_length=256, return_tensors="pt")
        loaded[name] = (model, batch, torch.optim.AdamW(model.parameters(), lr=1e-5))
    times: dict[str, list[float]] = {name: [] for name in models}
    for _ in range(rounds):
        for name, (model, batch, optimizer) in loaded.items():
            times[name].append(train_step(model, batch, optimizer))
            print(f"{name}: {times[name][-1]:.1f} s a step", flush=True)
    return times


def phase_seconds(report: Path) -> dict[str, float]:
    """The training phases of a bench report's 'Time of each phase' table."""
    rows = re.findall(r"^\| (train_\w+) \| (\d+) \|", report.read_text(), flags=re.MULTILINE)
    return {name: float(s) for name, s in rows}


def markdown(suites: dict[str, dict[str, dict[str, Any]]], steps: dict[str, list[float]] | None,
             phases: dict[str, float], args: argparse.Namespace) -> str:
    labels = list(suites)
    base = labels[0]
    collections = [c for c in suites[base] if all(c in s for s in suites.values())]
    command = "python benchmarks/experiments/frontier.py " + " ".join(
        f'"{a}"' if " " in a else a for a in sys.argv[1:])
    lines = ["# The model frontier: quality and latency per collection", "", f"Command: `{command}`", "",
             "From the suite runs below (each `twostage bench` over the collections' test splits, zero-shot: no "
             "training, engine defaults: 100-word passages, hybrid = RRF of BM25 and dense). p50: one query at a "
             "time (encoding the query, searching, fusing), milliseconds; ratio: against the first row's p50 on the "
             "same collection. Runs on this 2-core machine, one after another, nothing else running.", ""]
    for label, path in zip(labels, args.suite_dirs):
        lines.append(f"- {label}: [{path}]({Path(path).resolve().relative_to(args.out.resolve().parent)}/suite.md)")
    lines += ["", "| collection | model, precision | dense nDCG@10 | hybrid nDCG@10 | hybrid Recall@100 | dense p50 ms "
              "| hybrid p50 ms | p50 ratio | corpus encode s |", "|---|---|---:|---:|---:|---:|---:|---:|---:|"]
    means: dict[str, list[float]] = {label: [] for label in labels}
    for c in collections:
        for label in labels:
            m = suites[label][c]
            d, h = m["dense"], m["hybrid"]
            ratio = h["latency_ms_p50"] / suites[base][c]["hybrid"]["latency_ms_p50"]
            means[label].append(h["ndcg@10"])
            lines.append(f"| {c} | {label} | {d['ndcg@10']:.3f} | **{h['ndcg@10']:.3f}** | {h['recall@100']:.3f} | "
                         f"{d['latency_ms_p50']:.1f} | {h['latency_ms_p50']:.1f} | {ratio:.2f}x | "
                         f"{d['build_s']:.0f} |")
    lines += ["", "Mean hybrid nDCG@10 over " + ", ".join(collections) + ": "
              + "; ".join(f"{label} **{sum(v) / len(v):.3f}**" for label, v in means.items()) + ".", ""]
    if steps:
        best = {name: min(t) for name, t in steps.items()}
        first = next(iter(best))
        lines += ["## One training step on this CPU", "",
                  "Forward, backward and an AdamW step in fp32, 32 texts of 221 tokens (the models alternate): "
                  "seconds per step in each round.", "", "| model | seconds per step | best | / " + first + " |",
                  "|---|---|---:|---:|"]
        for name, t in steps.items():
            lines.append(f"| {name} | {', '.join(f'{x:.1f}' for x in t)} | {best[name]:.1f} | "
                         f"{best[name] / best[first]:.1f}x |")
        if phases:
            link = Path(args.one_path_report).resolve().relative_to(args.out.resolve().parent)
            lines += ["", f"The MiniLM one command on SciFact ([{link.parent}]({link})) trained for "
                      + ", ".join(f"{k} {v / 60:.0f} min" for k, v in phases.items()) + "; at the measured step "
                      "ratio the same training from each base would take here: "
                      + "; ".join(f"{name} **{sum(phases.values()) * best[name] / best[first] / 3600:.1f} h**"
                                  for name in best) + "."]
        lines.append("")
    return "\n".join(lines) + "\n"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--suite", action="append", required=True, metavar="LABEL=DIR")
    parser.add_argument("--step-models", default="", help="comma-separated models to time a training step of")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--one-path-report", type=Path, default=None,
                        help="a MiniLM one-command bench report.md whose training phase times are scaled")
    parser.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results" / "frontier.md")
    args = parser.parse_args()
    suites, args.suite_dirs = {}, []
    for item in args.suite:
        label, sep, path = item.rpartition("=")
        if not sep or not label:
            raise SystemExit(f"--suite {item!r}: expected LABEL=DIR")
        suites[label] = read_suite(Path(path))
        args.suite_dirs.append(path)
    models = [m for m in args.step_models.split(",") if m]
    steps = step_times(models, args.rounds) if models else None
    phases = phase_seconds(args.one_path_report) if args.one_path_report else {}
    text = markdown(suites, steps, phases, args)
    args.out.write_text(text, encoding="utf-8")
    args.out.with_suffix(".json").write_text(json.dumps({"suites": suites, "steps": steps, "phases": phases},
                                                        indent=1) + "\n")
    print(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
