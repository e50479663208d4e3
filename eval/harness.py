"""The evaluation harness: run named systems over one split of a BEIR directory and measure them."""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd

from twostage.eval.metrics import DEFAULT_METRICS, check_rel_level, evaluate, recall_curve
from twostage.eval.run import Run
from twostage.eval.systems import SYSTEMS, SearchSystem, SystemOptions, resolve_systems
from twostage.indexer.beir import BeirDataset, QrelsCheck, Split
from twostage.indexer.errors import ConfigError
from twostage.indexer.records import check_k

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class SystemResult:
    """One system measured on one split."""

    name: str
    run: Run
    per_query: pd.DataFrame  # index query_id, one column per metric
    latency_ms: np.ndarray  # one entry per query, in query order
    build_seconds: float

    def summary(self) -> dict[str, float]:
        out = {m: float(self.per_query[m].mean()) for m in self.per_query.columns}
        out["latency_ms_p50"] = float(np.percentile(self.latency_ms, 50))
        out["latency_ms_p95"] = float(np.percentile(self.latency_ms, 95))
        out["build_s"] = self.build_seconds
        return out


@dataclass(frozen=True)
class BenchResult:
    """Every system of a benchmark run, with what the data check found."""

    dataset: str
    split: Split
    k: int
    systems: tuple[SystemResult, ...]
    rel_level: int = 1
    notes: tuple[str, ...] = ()  # what the systems' models cut (documents, queries longer than they read)

    @property
    def check(self) -> QrelsCheck:
        return self.split.check

    def table(self) -> pd.DataFrame:
        """Mean metrics, latency percentiles and build time: one row per system."""
        return pd.DataFrame({s.name: s.summary() for s in self.systems}).T.rename_axis("system")

    def per_query(self) -> pd.DataFrame:
        """Long table: one row per (system, query) with every metric."""
        frames = [s.per_query.assign(system=s.name).reset_index() for s in self.systems]
        cols = ["system", "query_id", *self.systems[0].per_query.columns]
        return pd.concat(frames, ignore_index=True)[cols]

    def recall_curves(self, ks: Sequence[int] = range(1, 101)) -> dict[str, np.ndarray]:
        return {s.name: recall_curve(self.split.qrels, s.run, ks, rel_level=self.rel_level) for s in self.systems}

    def significance(self, baseline: str = "bm25", metrics: Sequence[str] | None = None, *, test: str = "t",
                     correction: str = "none") -> pd.DataFrame:
        """Every system against ``baseline`` over the same queries, per metric
        (:func:`twostage.eval.significance.compare`: ``test`` t or fisher, ``correction`` none, holm or bonferroni;
        the mean difference with its 95% interval). Empty when ``baseline`` was not run."""
        from twostage.eval.significance import COLUMNS, compare

        by_name = {s.name: s.per_query for s in self.systems}
        if baseline not in by_name:
            return pd.DataFrame(columns=COLUMNS)
        return compare(by_name, baseline, list(metrics or by_name[baseline].columns), test=test, correction=correction)


def measure_system(
    name: str,
    system: SearchSystem,
    split: Split,
    *,
    k: int = 100,
    metrics: Sequence[str] = DEFAULT_METRICS,
    build_seconds: float = 0.0,
    ignore_identical_ids: bool = False,
    rel_level: int = 1,
    show_progress: bool = False,
) -> SystemResult:
    """Run every query of ``split`` through ``system`` one at a time (timing each) and score the run."""
    from tqdm.auto import tqdm

    lists = {}
    latency = np.empty(len(split.queries))
    for i, query in enumerate(tqdm(split.queries, desc=name, unit="q", disable=not show_progress)):
        t0 = time.perf_counter()
        lists[query.id] = system.search(query.text, k)
        latency[i] = (time.perf_counter() - t0) * 1000.0
    run = Run(name, lists)
    per_query = evaluate(split.qrels, run, metrics, ignore_identical_ids=ignore_identical_ids, rel_level=rel_level)
    return SystemResult(name, run, per_query, latency, build_seconds)


def run_bench(
    data: str | Path | BeirDataset,
    split: str = "test",
    systems: str | Sequence[str] | Mapping[str, SearchSystem] = "bm25",
    *,
    k: int = 100,
    metrics: Sequence[str] = DEFAULT_METRICS,
    ignore_identical_ids: bool = False,
    options: SystemOptions | None = None,
    rel_level: int = 1,
    show_progress: bool = False,
) -> BenchResult:
    """Build (or take) each system, run the split's queries, and measure.

    ``systems`` is a comma list or sequence of registered names (see :data:`twostage.eval.systems.SYSTEMS`), or a
    mapping of name -> ready :class:`SearchSystem` for systems built elsewhere. ``rel_level``: the lowest relevant
    grade (:func:`twostage.eval.metrics.evaluate`).
    """
    check_rel_level(rel_level)
    k = check_k(k)
    if k < 100 and any(m.endswith("@100") for m in metrics):
        raise ConfigError(f"k={k} is below the depth of a @100 metric; use k >= 100")
    dataset = data if isinstance(data, BeirDataset) else BeirDataset(data)
    the_split = dataset.split(split)
    corpus = dataset.corpus
    logger.info("%s/%s: %d documents, %d queries", dataset.name, split, len(corpus), len(the_split.queries))
    ready: dict[str, SearchSystem | None]
    if isinstance(systems, Mapping):
        ready = dict(systems)
    else:
        ready = {name: None for name in resolve_systems(systems, options)}
    options = options or SystemOptions(show_progress=show_progress)
    results, notes = [], []
    for name, system in ready.items():
        t0 = time.perf_counter()
        if system is None:
            logger.info("building %s", name)
            system = SYSTEMS[name](corpus, options)
        build = time.perf_counter() - t0
        results.append(measure_system(name, system, the_split, k=k, metrics=metrics, build_seconds=build,
                                      ignore_identical_ids=ignore_identical_ids, rel_level=rel_level,
                                      show_progress=show_progress))
        logger.info("%s: %s", name, {m: round(v, 4) for m, v in results[-1].summary().items()})
        reading = getattr(system, "reading_notes", None)
        if reading is not None:
            notes += [n for n in reading([q.text for q in the_split.queries]) if n not in notes]
    return BenchResult(dataset.name, the_split, k, tuple(results), rel_level, tuple(notes))
