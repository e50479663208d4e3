"""The reranker's score as a probability of relevance, and "nothing relevant".

The cross-encoder's score ranks well but means little on its own: 0.7 on one collection is not 0.7 on another.
Calibration maps it to the probability that the document is judged relevant, by Platt scaling on held-out pairs:

    p(relevant | s) = 1 / (1 + exp(-(a * logit(s) + b)))

where ``s`` is the score the engine's reranker gives (a sigmoid output in (0, 1)) and ``a``, ``b`` minimise the
log loss over (score, label) pairs: every dev query's reranked top ``rerank_depth`` as the engine serves it, the
label 1 when the qrels judge the document relevant (grade > 0), else 0. The fit never sees a test query. With the
pair ``(a, b)`` in the engine's settings (``rerank_calibration``), each hit carries ``stage_scores["relevance"]``,
and ``min_relevance`` drops the hits below it: a query may get no hit at all.

The expected calibration error (:func:`expected_calibration_error`) is the mean gap between predicted and observed
relevance over equal-width probability bins, weighted by how many pairs each bin holds.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from twostage.indexer.errors import ConfigError
from twostage.indexer.records import Qrels, Query

EPS = 1e-6

if TYPE_CHECKING:
    from twostage.engine.search_engine import SearchEngine


def logit(scores: np.ndarray) -> np.ndarray:
    s = np.clip(np.asarray(scores, dtype=np.float64), EPS, 1 - EPS)
    return np.log(s / (1 - s))


def probability(scores: np.ndarray, calibration: Sequence[float]) -> np.ndarray:
    """The calibrated probability of relevance of reranker ``scores`` (Platt: ``calibration`` = (a, b))."""
    from scipy.special import expit

    a, b = calibration
    return np.asarray(expit(a * logit(scores) + b), dtype=np.float64)


@dataclass(frozen=True)
class Calibration:
    """A fitted calibration: Platt's ``a`` and ``b``, and the pairs it was fitted on."""

    a: float
    b: float
    pairs: int
    positives: int
    log_loss: float

    @property
    def params(self) -> tuple[float, float]:
        return (self.a, self.b)


def fit_platt(scores: np.ndarray, labels: np.ndarray) -> Calibration:
    """Platt scaling of reranker ``scores`` to 0/1 ``labels``: (a, b) of least log loss (scipy's L-BFGS), with the
    targets smoothed as Platt proposed ((n+ + 1) / (n+ + 2) and 1 / (n- + 2)) so that a separable dev set does not
    send the slope to infinity."""
    from scipy.optimize import minimize
    from scipy.special import expit

    x, y = logit(scores), np.asarray(labels, dtype=np.float64)
    if len(x) != len(y) or not len(x):
        raise ConfigError("calibration needs as many labels as scores, and at least one pair")
    pos, neg = int(y.sum()), int(len(y) - y.sum())
    if pos == 0 or neg == 0:
        raise ConfigError(f"calibration needs relevant and non-relevant pairs; the dev pairs hold {pos} relevant and "
                          f"{neg} other: give more dev queries, or a deeper rerank_depth")
    target = np.where(y > 0, (pos + 1) / (pos + 2), 1 / (neg + 2))

    def loss(w: np.ndarray) -> tuple[float, np.ndarray]:
        z = w[0] * x + w[1]
        p = expit(z)
        value = float(np.sum(np.logaddexp(0, z) - target * z))
        grad = p - target
        return value, np.array([float(grad @ x), float(grad.sum())])

    fit = minimize(loss, np.array([1.0, 0.0]), jac=True, method="L-BFGS-B")
    a, b = (float(v) for v in fit.x)
    p = np.clip(expit(a * x + b), EPS, 1 - EPS)
    log_loss = float(-np.mean(y * np.log(p) + (1 - y) * np.log(1 - p)))
    return Calibration(a, b, len(y), pos, log_loss)


def reranked_pairs(engine: SearchEngine, queries: Sequence[Query], qrels: Qrels,
                   first_stage: str | None = None) -> tuple[np.ndarray, np.ndarray]:
    """(reranker scores, 0/1 labels) of every query's reranked top ``rerank_depth`` as ``engine`` serves it (its
    first stage unless one is given; its blend, its reader), the labels from ``qrels``."""
    view = engine.with_settings(rerank=True, min_relevance=0.0, **({"first_stage": first_stage} if first_stage
                                                                    else {}))
    results = view.search_batch([q.text for q in queries], view.settings.rerank_depth)
    scores, labels = [], []
    for q, result in zip(queries, results):
        relevant = qrels.relevant(q.id)
        for hit in result.hits:
            if "rerank" in hit.stage_scores:
                scores.append(hit.stage_scores["rerank"])
                labels.append(1.0 if hit.doc_id in relevant else 0.0)
    if not scores:
        raise ConfigError("no reranked pair to calibrate on: the engine needs a reranker that reorders (a blend "
                          "above 0) and queries with candidates")
    return np.asarray(scores, dtype=np.float64), np.asarray(labels, dtype=np.float64)


def fit_calibration(engine: SearchEngine, queries: Sequence[Query], qrels: Qrels) -> Calibration:
    """Platt scaling fitted on ``engine``'s reranked top ``rerank_depth`` of held-out ``queries`` (never test)."""
    if not queries:
        raise ConfigError("calibration needs held-out queries with judgments")
    return fit_platt(*reranked_pairs(engine, queries, qrels))


def expected_calibration_error(probabilities: np.ndarray, labels: np.ndarray, bins: int = 10) -> float:
    """Mean |observed - predicted| over ``bins`` equal-width probability bins, weighted by the pairs in each."""
    p, y = np.asarray(probabilities, dtype=np.float64), np.asarray(labels, dtype=np.float64)
    which = np.minimum((p * bins).astype(int), bins - 1)
    total = 0.0
    for b in range(bins):
        inside = which == b
        if inside.any():
            total += inside.sum() * abs(float(y[inside].mean()) - float(p[inside].mean()))
    return total / max(len(p), 1)


def reliability(probabilities: np.ndarray, labels: np.ndarray, bins: int = 10) -> list[tuple[float, float, int]]:
    """(mean predicted, observed rate, pairs) of each non-empty bin, for a reliability plot."""
    p, y = np.asarray(probabilities, dtype=np.float64), np.asarray(labels, dtype=np.float64)
    which = np.minimum((p * bins).astype(int), bins - 1)
    return [(float(p[which == b].mean()), float(y[which == b].mean()), int((which == b).sum()))
            for b in range(bins) if (which == b).any()]


def calibration_queries(engine: SearchEngine, data: Any, split: str) -> tuple[list[Query], Qrels, str]:
    """The judged queries of ``split`` in the BEIR directory ``data`` to calibrate ``engine`` on, their qrels, and a
    line saying which: when the engine's reranker was trained on that split, only the queries it held out as dev
    (the others it was trained on would make its scores look better calibrated than they are)."""
    from pathlib import Path

    from twostage.indexer.beir import BeirDataset
    from twostage.models.model_meta import read_model_meta

    ds = data if isinstance(data, BeirDataset) else BeirDataset(data)
    sp = ds.split(split)
    judged = {j.query_id for j in sp.qrels}
    queries = [q for q in sp.queries if q.id in judged]
    ref = engine.manifest.reranker
    meta = read_model_meta(Path(ref.path)) if ref is not None and Path(ref.path).is_dir() else None
    training = meta[2] if meta is not None else {}
    said = f"{len(queries)} judged {split} queries"
    if training.get("split") == split and Path(str(training.get("data", ""))).name == Path(ds.root).name:
        held = set(training.get("dev_queries") or ())
        if not held:
            raise ConfigError(f"the reranker was trained on {split} with no held-out queries: calibrate on another "
                              "split (e.g. dev)")
        queries = [q for q in queries if q.id in held]
        said = f"the {len(queries)} {split} queries the reranker held out as dev (it was trained on the others)"
    return queries, sp.qrels.subset(q.id for q in queries), said


def calibrate(engine: SearchEngine, data: Any, split: str) -> tuple[Any, Calibration, str]:
    """Fit the calibration on judged queries of ``split`` (:func:`calibration_queries`) and write it into a new
    version of ``engine`` (its settings' ``rerank_calibration``); returns the new engine, the fit and which
    queries."""
    if engine.manifest.reranker is None:
        raise ConfigError("the engine has no reranker: there is no score to calibrate")
    queries, qrels, said = calibration_queries(engine, data, split)
    fitted = fit_calibration(engine, queries, qrels)
    return engine.configure(rerank_calibration=fitted.params), fitted, said
