"""Writing a benchmark's outputs: metrics.json, report.md, per_query.csv, significance.csv, runs/*.trec,
recall_at_k.png."""

from __future__ import annotations

import json
import platform
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from twostage.eval.harness import BenchResult
from twostage.indexer.atomic import atomic_directory
from twostage.indexer.errors import ConfigError

HIGHER_IS_BETTER = {"latency_ms_p50": False, "latency_ms_p95": False, "build_s": False}
SIGNIFICANCE_METRICS = ("ndcg@10", "mrr@10", "recall@100")
_OUR_FILES = {"metrics.json", "report.md", "per_query.csv", "config.json", "recall_at_k.png", "runs",
              "significance.csv"}


def versions() -> dict[str, str]:
    from importlib.metadata import PackageNotFoundError, version

    out = {"python": platform.python_version()}
    for pkg in ("twostage-search", "bm25s", "rank-bm25", "ranx", "numpy", "torch", "transformers"):
        try:
            out[pkg] = version(pkg)
        except PackageNotFoundError:
            pass
    return out


def markdown_table(table: pd.DataFrame, *, digits: int = 3, mark_best: bool = True) -> str:
    """A markdown table of a DataFrame (index levels first), the best value of each numeric column in bold."""
    cols = list(table.columns)
    names = [n or "" for n in table.index.names]
    lines = ["| " + " | ".join([*names, *cols]) + " |", "|" + "---|" * (len(cols) + len(names))]
    best = {}
    if mark_best and len(table) > 1:
        for c in cols:
            values = pd.to_numeric(table[c], errors="coerce")
            if values.notna().any():
                best[c] = values.max() if HIGHER_IS_BETTER.get(c, True) else values.min()
    counts = {c for c in cols if pd.api.types.is_integer_dtype(table[c])}  # a row Series would make them floats
    for name, row in table.iterrows():
        cells = []
        for c in cols:
            if c in counts:
                cells.append(str(int(row[c])))
                continue
            if isinstance(row[c], (str, bool, np.bool_, int, np.integer)):  # text and counts as they are
                cells.append(str(row[c]))
                continue
            try:
                v = float(row[c])
            except (TypeError, ValueError):
                cells.append(str(row[c]))
                continue
            text = f"{v:.{digits}f}" if abs(v) < 1000 else f"{v:.0f}"
            cells.append(f"**{text}**" if c in best and np.isclose(v, best[c]) else text)
        keys = [str(k) for k in name] if isinstance(name, tuple) else [str(name)]
        lines.append("| " + " | ".join([*keys, *cells]) + " |")
    return "\n".join(lines) + "\n"


def significance_of(result: BenchResult, config: Mapping[str, Any]) -> pd.DataFrame:
    """The significance table the config asks for (baseline, test, correction; defaults bm25, t, none)."""
    return result.significance(str(config.get("baseline", "bm25")),
                               [m for m in SIGNIFICANCE_METRICS if m in result.table().columns],
                               test=str(config.get("test", "t")), correction=str(config.get("correction", "none")))


def render_report(result: BenchResult, config: Mapping[str, Any], sig: pd.DataFrame | None = None) -> str:
    table = result.table()
    parts = [
        f"# {result.dataset} / {result.split.name}: {len(result.split.queries)} queries\n",
        f"Command: `{config.get('command', '')}`\n",
        "Metrics are means over queries (trec_eval semantics, computed by ranx); latency is per query, "
        "one query at a time, in milliseconds; build_s is the time to build the system. "
        "The best value of each column is in bold.\n",
        markdown_table(table),
    ]
    baseline = str(config.get("baseline", "bm25"))
    test, correction = str(config.get("test", "t")), str(config.get("correction", "none"))
    sig = significance_of(result, config) if sig is None else sig
    if len(sig):
        names = {"t": "paired two-sided t-test", "fisher": "Fisher's randomization test, 10,000 permutations, seed 42"}
        adjusted = f", p-values adjusted by {correction} over the systems of each metric" if correction != "none" else ""
        parts.append(f"\n## Against {baseline} ({names[test]} over queries{adjusted})\n")
        parts.append("`*` marks p < 0.05" + (" after adjustment" if adjusted else "") +
                     "; the interval is the 95% confidence interval of the mean difference (paired t).\n")
        head = f"| system | metric | {baseline} | system | delta | 95% CI | p-value |"
        head += " adjusted |" if adjusted else ""
        lines = [head, "|---|---|---|---|---|---|---|" + ("---|" if adjusted else "")]
        for r in sig.itertuples():
            p = r.p_adjusted if adjusted else r.p_value
            star = " *" if p < 0.05 else ""
            line = (f"| {r.system} | {r.metric} | {r.baseline:.3f} | {r.system_mean:.3f} | {r.delta:+.3f} | "
                    f"[{r.ci_low:+.3f}, {r.ci_high:+.3f}] | {r.p_value:.3g}{'' if adjusted else star} |")
            lines.append(line + (f" {r.p_adjusted:.3g}{star} |" if adjusted else ""))
        parts.append("\n".join(lines) + "\n")
    elif len(result.systems) > 1:
        parts.append(f"\nNo significance test: `{baseline}` is not among the systems.\n")
    if result.rel_level != 1:
        parts.append(f"\nRelevant means a grade of at least {result.rel_level} (trec_eval -l {result.rel_level}); "
                     "nDCG keeps every positive grade as its gain.\n")
    if config.get("phase_seconds"):
        parts.append(phase_section(config["phase_seconds"]))
    if config.get("stages"):
        parts.append("\n## Stages chosen on dev\n")
        parts.append("\n".join(f"- {line}" for line in config["stages"]) + "\n")
    if result.notes:
        parts.append("\n## What the models cut\n")
        parts.append("\n".join(f"- {n}" for n in result.notes) + "\n")
    notes = result.check.lines()
    parts.append("\n## Data check\n")
    parts.append("\n".join(f"- {n}" for n in notes) + "\n" if notes else "Qrels, queries and corpus agree.\n")
    parts.append("\n## Versions\n")
    parts.append(", ".join(f"{k} {v}" for k, v in config.get("versions", {}).items()) + "\n")
    return "\n".join(parts)


def phase_section(phase_seconds: Mapping[str, float]) -> str:
    """The wall time of each phase of a run (training, evaluation) as a markdown section."""
    total = sum(phase_seconds.values())
    lines = ["| phase | seconds | minutes |", "|---|---|---|"]
    lines += [f"| {name.removesuffix('_s')} | {sec:.0f} | {sec / 60:.1f} |" for name, sec in phase_seconds.items()]
    lines.append(f"| total | {total:.0f} | {total / 60:.1f} |")
    return "\n## Time of each phase (wall clock)\n\n" + "\n".join(lines) + "\n"


def plot_recall(result: BenchResult, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    ks = np.arange(1, 101)
    fig, ax = plt.subplots(figsize=(7, 4.5), dpi=100)
    for name, curve in result.recall_curves(ks).items():
        ax.plot(ks, curve, label=name)
    ax.set_xscale("log")
    ax.set_xlabel("k")
    ax.set_ylabel("mean recall@k")
    ax.set_ylim(0, 1)
    ax.grid(True, which="both", alpha=0.3)
    ax.set_title(f"{result.dataset} / {result.split.name}: recall@k")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)


def _check_out_dir(out: Path) -> None:
    if out.exists():
        if not out.is_dir():
            raise ConfigError(f"{out}: exists and is not a directory; choose another --out")
        foreign = [p.name for p in out.iterdir() if p.name not in _OUR_FILES]
        if foreign:
            raise ConfigError(f"{out}: holds files that are not benchmark outputs ({', '.join(sorted(foreign)[:3])}); "
                              "choose an empty or new --out directory")


def write_outputs(result: BenchResult, out: str | Path, config: Mapping[str, Any] | None = None) -> Path:
    """Write every output into ``out``, replacing an earlier benchmark there in one atomic step."""
    out = Path(out)
    _check_out_dir(out)
    config = {**(config or {}), "versions": versions()}
    table = result.table()
    metrics = {name: {c: float(v) for c, v in row.items()} for name, row in table.iterrows()}
    sig = significance_of(result, config)
    with atomic_directory(out) as tmp:
        if len(sig):
            sig.to_csv(tmp / "significance.csv", index=False, float_format="%.8g")
        (tmp / "metrics.json").write_text(json.dumps(metrics, indent=2) + "\n", encoding="utf-8")
        (tmp / "config.json").write_text(json.dumps(config, indent=2, default=str) + "\n", encoding="utf-8")
        result.per_query().to_csv(tmp / "per_query.csv", index=False, float_format="%.6f")
        (tmp / "runs").mkdir()
        for s in result.systems:
            s.run.to_trec(tmp / "runs" / f"{s.name}.trec")
        plot_recall(result, tmp / "recall_at_k.png")
        (tmp / "report.md").write_text(render_report(result, config, sig), encoding="utf-8")
    return out
