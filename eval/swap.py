"""Replace an engine's models only when the new ones are not worse: ``twostage swap``.

>>> decision = swap("engines/docs", retriever="models/bi-v2", qrels="data/mine", split="dev")
>>> decision.promoted, decision.delta, decision.p_value

The engine keeps serving its current version throughout. A candidate is built beside it (a staging directory next
to the engine, from the engine's own documents and settings, with the new model(s)); both answer the same
judged queries through their default search (``qrels``: a BEIR directory's queries and a split's judgments; or
``pseudo_queries`` made from the engine's documents, each judging its source document relevant); the per-query
metric of the two is compared with the harness's paired test. The candidate becomes the engine's next version (one
atomic commit) only if its mean is at least the current one's plus ``min_gain`` (a finite number; 0: not worse), or
with ``force``; it is refused when the engine changed while the candidate was built (run again). The new models'
files are checked before anything is built (:func:`~twostage.models.weights.check_model_files`: plain files of
sane sizes, a sane config). A server on the engine moves to the new version by itself. A swap that fails removes
its staging directory; one killed midway leaves the engine as it was (the staging directory ``.NAME.swap-*``
beside it may be left; delete it). ``twostage swap`` exits 0 when it promoted, 1 when the comparison refused the
candidate, 2 on bad input or when the engine changed meanwhile.
"""

from __future__ import annotations

import logging
import math
import shutil
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from twostage.engine.settings import with_changes
from twostage.indexer.errors import ConfigError
from twostage.models.weights import ModelNotFoundError, resolve_model

if TYPE_CHECKING:
    from twostage.engine.search_engine import SearchEngine

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class SwapDecision:
    """What a swap measured and did."""

    promoted: bool
    forced: bool
    metric: str
    queries: int
    current: float  # the metric's mean over the queries, current engine
    candidate: float  # the same for the candidate
    delta: float  # candidate - current
    ci: tuple[float, float]  # 95% paired confidence interval of the delta
    p_value: float  # paired test (the harness's: t or fisher)
    test: str
    judged_by: str  # "qrels DIR (split)" or "N pseudo-queries"
    version_before: str
    version_after: str  # the version the engine serves now (the same as before when refused)

    def line(self) -> str:
        verb = "promoted" + (" (forced)" if self.forced else "") if self.promoted else "refused"
        return (f"{verb}: {self.metric} {self.current:.4f} -> {self.candidate:.4f} ({self.delta:+.4f}, 95% CI "
                f"[{self.ci[0]:+.4f}, {self.ci[1]:+.4f}], {self.test} p={self.p_value:.3g}) on {self.queries} queries "
                f"judged by {self.judged_by}; the engine serves {self.version_after}")


def swap(path: str | Path, *, retriever: str | Path | None = None, reranker: str | Path | None = None,
         qrels: str | Path | None = None, split: str = "dev", pseudo_queries: int = 0, metric: str = "ndcg@10",
         min_gain: float = 0.0, force: bool = False, test: str = "t", seed: int = 42,
         show_progress: bool = False) -> SwapDecision:
    """Build the engine at ``path`` again with ``retriever`` and/or ``reranker``, compare, and promote or refuse."""
    from twostage.engine.search_engine import SearchEngine
    from twostage.eval.significance import check_test, confidence_interval, p_value

    if retriever is None and reranker is None:
        raise ConfigError("swap needs a new --retriever, a new --reranker, or both")
    if (qrels is None) == (not pseudo_queries):
        raise ConfigError("judge the swap with --qrels DIR (queries with judgments) or --pseudo-queries N, one of "
                          "them")
    check_test(test, "none")
    if isinstance(min_gain, bool) or not isinstance(min_gain, (int, float)) or not math.isfinite(min_gain):
        raise ConfigError(f"min_gain must be a finite number (the least gain that promotes), got {min_gain!r}")
    for role, given in (("retriever", retriever), ("reranker", reranker)):
        if given is not None:  # its files checked before any heavy work (or a staging directory) starts
            try:
                resolve_model(given)
            except ModelNotFoundError as exc:
                raise ConfigError(f"--{role}: {exc}") from None
    root = Path(path)
    current = SearchEngine.load(root, verify=False)
    staging = Path(tempfile.mkdtemp(prefix=f".{root.name}.swap-", dir=root.resolve().parent))
    try:
        queries, judged, judged_by = _judgments(current, qrels, split, pseudo_queries, seed)
        keep = current.manifest
        if keep.retriever is None and retriever is not None:
            raise ConfigError(f"{root}: a BM25-only engine; give it a retriever with a new build (twostage build "
                              "--retriever), then swap models")
        # a new reranker brings its own dev-chosen blends (resolved into the candidate's manifest by the build)
        settings = with_changes(current.settings, {"rerank_blend": "auto", "rerank_calibration": None}) \
            if reranker else current.settings
        candidate = SearchEngine.build(current.iter_documents(), staging / "engine",
                                       retriever=retriever or (keep.retriever.path if keep.retriever else None),
                                       reranker=reranker or (keep.reranker.path if keep.reranker else None),
                                       settings=settings, show_progress=show_progress,
                                       device=current.device)
        before = _per_query(current, queries, judged, metric)
        after = _per_query(candidate, queries, judged, metric)
        diff = after - before
        delta = float(diff.mean())
        promote = force or delta >= min_gain
        p = p_value(after, before, test) if len(diff) > 1 else 1.0
        version_after = current.version
        if promote:
            version_after = _promote(root, current.version, candidate)
        candidate.close()
        decision = SwapDecision(promote, force and delta < min_gain, metric, len(queries), float(before.mean()),
                                float(after.mean()), delta, confidence_interval(diff), float(p), test, judged_by,
                                current.version, version_after)
        logger.info("swap %s", decision.line())
        return decision
    finally:
        current.close()
        shutil.rmtree(staging, ignore_errors=True)


def _judgments(engine: SearchEngine, qrels: str | Path | None, split: str, n: int, seed: int) -> tuple[list[Any], Any, str]:
    """The queries and judgments the two engines are compared on."""
    if qrels is not None:
        from twostage.indexer.beir import BeirDataset

        data = BeirDataset(qrels).split(split)
        return list(data.queries), data.qrels, f"{qrels} ({split})"
    from twostage.retriever.pseudo_queries import PseudoQueryConfig, as_queries_and_qrels, make_pseudo_queries

    rng = np.random.default_rng(seed)
    ids = engine.document_ids()
    pick = sorted(rng.choice(len(ids), size=min(n, len(ids)), replace=False).tolist())
    docs = engine.documents([ids[i] for i in pick])
    pseudo = make_pseudo_queries(docs, PseudoQueryConfig(seed=seed))
    if not pseudo:
        raise ConfigError("no pseudo-query could be made from the engine's documents; give --qrels DIR")
    queries, judged = as_queries_and_qrels(pseudo)
    return queries, judged, f"{len(queries)} pseudo-queries from {len(docs)} of its documents"


def _per_query(engine: SearchEngine, queries: Sequence[Any], judged: Any, metric: str) -> np.ndarray:
    """``metric`` of each query (in order) when ``engine`` answers it with its default search."""
    from twostage.eval.metrics import evaluate
    from twostage.eval.run import Run

    lists = {}
    texts = [q.text for q in queries]
    for start in range(0, len(texts), 32):
        for q, ranked in zip(queries[start:start + 32], engine.as_retriever().search_batch(texts[start:start + 32],
                                                                                            100)):
            lists[q.id] = ranked
    table = evaluate(judged, Run("swap", lists), [metric])
    return np.asarray([float(table.loc[q.id, metric]) if q.id in table.index else 0.0 for q in queries])


def _promote(root: Path, base_version: str, candidate: Any) -> str:
    """Commit the candidate's files as the engine's next version, unless the engine changed since ``base_version``."""
    from twostage.indexer.index import link_or_copy
    from twostage.indexer.versions import LEASE, commit, current_version, writer_lock

    with writer_lock(root):
        now = current_version(root).name
        if now != base_version:
            raise ConfigError(f"{root}: the engine changed while the candidate was built ({base_version} -> {now}); "
                              "run the swap again")
        with commit(root) as version:
            source = candidate.version_dir
            for f in sorted(source.rglob("*")):
                rel = f.relative_to(source)
                if f.is_dir():
                    (version.tmp / rel).mkdir(parents=True, exist_ok=True)
                elif f.name != LEASE:
                    (version.tmp / rel).parent.mkdir(parents=True, exist_ok=True)
                    link_or_copy(f, version.tmp / rel)
        return version.name
