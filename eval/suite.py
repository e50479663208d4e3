"""A benchmark suite: several collections, one matrix report.

``twostage bench --data A --data B ...`` runs the harness on each collection (each written to ``OUT/<name>/`` as a
single bench writes it) and then :func:`suite_report` puts them side by side: collections x systems, nDCG@10 and
Recall@100, the mean over the collections, each value marked when it differs from BM25's on that collection
(paired test over its queries, p < 0.05), and the published numbers of other systems beside ours (anchors: a
tab-separated file of ``collection, system, ndcg@10, recall@100, source``; the package's own,
``twostage/data/anchors.tsv``, or the user's with ``--anchors``).
"""

from __future__ import annotations

import csv
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from twostage.indexer.errors import ConfigError

METRICS = ("ndcg@10", "recall@100")


@dataclass(frozen=True)
class Anchor:
    """A published number: a system's nDCG@10 (and Recall@100 when known) on a collection, and where it is from."""

    collection: str
    system: str
    ndcg10: float | None
    recall100: float | None
    source: str


def read_anchors(path: str | Path | None = None) -> list[Anchor]:
    """The anchors in ``path`` (default: the package's ``data/anchors.tsv``); each row checked."""
    if path is None:
        from importlib.resources import files

        text = files("twostage.data").joinpath("anchors.tsv").read_text(encoding="utf-8")
        where = "twostage/data/anchors.tsv"
    else:
        try:
            text = Path(path).read_text(encoding="utf-8")
        except OSError as exc:
            raise ConfigError(f"--anchors {path}: cannot read it ({exc.strerror})") from None
        where = str(path)
    rows = list(csv.reader(text.splitlines(), delimiter="\t"))
    if not rows or [c.strip() for c in rows[0][:5]] != ["collection", "system", "ndcg@10", "recall@100", "source"]:
        raise ConfigError(f"{where}: the first line must be the header collection, system, ndcg@10, recall@100, "
                          "source (tab-separated)")
    out = []
    for n, row in enumerate(rows[1:], 2):
        if not row or not "".join(row).strip():
            continue
        if len(row) != 5:
            raise ConfigError(f"{where}:{n}: expected 5 tab-separated fields, got {len(row)}")
        out.append(Anchor(row[0].strip(), row[1].strip(), _number(row[2], where, n), _number(row[3], where, n),
                          row[4].strip()))
    return out


def _number(text: str, where: str, line: int) -> float | None:
    if not text.strip():
        return None
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not 0 <= value <= 1:
        raise ConfigError(f"{where}:{line}: {text!r} is not a metric value in [0, 1]")
    return value


@dataclass(frozen=True)
class CollectionScores:
    """One collection of a suite: its name, query count, each system's mean of each metric, and for each (system,
    metric) the difference from the baseline and its p-value."""

    name: str
    queries: int
    means: Mapping[str, Mapping[str, float]]
    against_baseline: Mapping[tuple[str, str], tuple[float, float]]
    notes: tuple[str, ...] = ()  # what the models cut (BenchResult.notes)


def suite_report(collections: Sequence[CollectionScores], anchors: Sequence[Anchor], *, command: str,
                 baseline: str = "bm25", alpha: float = 0.05) -> str:
    """The suite's markdown: a table per metric (systems x collections + mean), then the anchors beside ours."""
    if not collections:
        raise ConfigError("a suite needs at least one collection")
    systems = list(dict.fromkeys(s for c in collections for s in c.means))
    names = [c.name for c in collections]
    lines = [f"# Benchmark suite: {', '.join(names)}", "", f"Command: `{command}`", "",
             f"Test queries: {', '.join(f'{c.name} {c.queries}' for c in collections)}. `*`: differs from "
             f"{baseline} on that collection (paired t-test over its queries, p < {alpha}); the mean is over the "
             "collections (each weighs the same); each collection's own report is in its folder.", ""]
    for metric in METRICS:
        lines += [f"## {metric}", "", "| system | " + " | ".join(names) + " | mean |",
                  "|---|" + "---|" * (len(names) + 1)]
        for system in systems:
            cells, values = [], []
            for c in collections:
                value = c.means.get(system, {}).get(metric)
                if value is None:
                    cells.append("")
                    continue
                values.append(value)
                delta_p = c.against_baseline.get((system, metric))
                mark = "*" if delta_p is not None and delta_p[1] < alpha else ""
                cells.append(f"{value:.3f}{mark}")
            mean = f"{sum(values) / len(values):.3f}" if len(values) == len(collections) else ""
            lines.append(f"| {system} | " + " | ".join(cells) + f" | {mean} |")
        lines.append("")
    lines += ["## Published numbers beside ours (nDCG@10)", "",
              "| collection | system | nDCG@10 | Recall@100 | source |", "|---|---|---|---|---|"]
    for c in collections:
        best = max(c.means, key=lambda s: c.means[s].get("ndcg@10", -1.0))
        ours = c.means[best]
        lines.append(f"| {c.name} | **ours: {best}** | **{ours['ndcg@10']:.3f}** | "
                     f"{ours.get('recall@100', math.nan):.3f} | this run |")
        for a in anchors:
            if a.collection == c.name:
                lines.append(f"| {c.name} | {a.system} | {_cell(a.ndcg10)} | {_cell(a.recall100)} | {a.source} |")
    if any(c.notes for c in collections):
        lines += ["", "## What the models cut", ""]
        lines += [f"- {c.name}: {n}" for c in collections for n in c.notes]
    return "\n".join(lines) + "\n"


def _cell(value: float | None) -> str:
    return "" if value is None else f"{value:.3f}"
