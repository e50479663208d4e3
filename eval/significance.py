"""Is a system better than a baseline, or lucky on these queries? Paired tests over per-query scores.

Two tests, both over the same queries' scores of a system and the baseline:

- ``t``: the paired two-sided Student t-test (scipy's ``ttest_rel``, which ranx's ``student`` test also calls);
- ``fisher``: Fisher's randomization (permutation) test, the test Smucker et al. (CIKM 2007) recommend for IR:
  under the null hypothesis the two systems' scores of a query are exchangeable, so each of 10,000 random draws
  swaps each query's pair with probability 1/2; the p-value is the share of draws whose absolute difference of
  means is at least the observed one. The draws are ranx's: numpy's legacy generator (MT19937) seeded with 42, one
  32-bit draw per query per permutation, the pair swapped when it is even, which is what ranx's
  ``fisher_randomization_test`` draws when it runs as written (``NUMBA_DISABLE_JIT=1``). So our p-values equal
  ranx's given the same number of permutations, and a report is reproducible; compiled by numba (ranx's default),
  ranx seeds a generator per thread inside a parallel loop and its p-values change from call to call (eight calls on
  the same scores gave 0.074 to 0.121), which is why it is not called here.

Comparing several systems to one baseline tests several hypotheses at once; ``correction`` adjusts each metric's
p-values over the systems compared: ``bonferroni`` multiplies each by the number of systems, ``holm`` (Holm 1979,
uniformly more powerful) multiplies the i-th smallest by (m - i + 1) and keeps the adjusted values monotone. Each
row also carries the 95% confidence interval of the mean difference (paired t interval).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np
import pandas as pd

from twostage.indexer.errors import ConfigError

TESTS = ("t", "fisher")
CORRECTIONS = ("none", "holm", "bonferroni")
COLUMNS = ["system", "metric", "baseline", "system_mean", "delta", "ci_low", "ci_high", "p_value", "p_adjusted"]


def check_test(test: str, correction: str) -> None:
    if test not in TESTS:
        raise ConfigError(f"unknown significance test {test!r}; use one of {', '.join(TESTS)}")
    if correction not in CORRECTIONS:
        raise ConfigError(f"unknown correction {correction!r}; use one of {', '.join(CORRECTIONS)}")


def p_value(system: np.ndarray, baseline: np.ndarray, test: str = "t", *, permutations: int = 10_000,
            seed: int = 42) -> float:
    """The two-sided p-value of ``system`` against ``baseline`` (paired per-query scores, same order)."""
    system, baseline = np.asarray(system, dtype=np.float64), np.asarray(baseline, dtype=np.float64)
    if test == "t":
        if np.allclose(system, baseline):
            return 1.0
        from scipy.stats import ttest_rel

        return float(ttest_rel(system, baseline).pvalue)
    if test == "fisher":
        return randomization_p(system, baseline, permutations, seed)
    raise ConfigError(f"unknown significance test {test!r}; use one of {', '.join(TESTS)}")


def randomization_p(system: np.ndarray, baseline: np.ndarray, permutations: int = 10_000, seed: int = 42) -> float:
    """The paired randomization test's two-sided p-value of ``system`` against ``baseline`` (per-query scores, same
    order), drawn as ranx's ``fisher_randomization_test`` draws (see the module's docstring)."""
    a, b = np.asarray(system, dtype=np.float64), np.asarray(baseline, dtype=np.float64)
    if len(a) == 0:
        return 1.0
    observed = abs(a.mean() - b.mean())
    rng = np.random.RandomState(seed)  # the legacy generator, as ranx seeds it: the same stream of draws
    hits = 0
    for start in range(0, permutations, 1000):  # 1,000 permutations at a time: memory stays small for many queries
        rows = min(1000, permutations - start)
        swap = (rng.randint(0, 2 ** 32, size=(rows, len(a)), dtype=np.uint32) & 1) == 0
        first, second = np.where(swap, b, a), np.where(swap, a, b)
        hits += int(np.count_nonzero(np.abs(first.mean(axis=1) - second.mean(axis=1)) >= observed))
    return hits / permutations


def adjust(p_values: Sequence[float], correction: str) -> np.ndarray:
    """``p_values`` of one family of hypotheses adjusted for testing them together (capped at 1)."""
    p = np.asarray(p_values, dtype=np.float64)
    m = len(p)
    if correction == "none" or m == 0:
        return p.copy()
    if correction == "bonferroni":
        return np.minimum(1.0, p * m)
    if correction == "holm":
        order = np.argsort(p, kind="stable")
        stepped = np.maximum.accumulate(p[order] * (m - np.arange(m)))
        out = np.empty(m)
        out[order] = np.minimum(1.0, stepped)
        return out
    raise ConfigError(f"unknown correction {correction!r}; use one of {', '.join(CORRECTIONS)}")


def confidence_interval(diff: np.ndarray, level: float = 0.95) -> tuple[float, float]:
    """The paired t interval of the mean of per-query differences."""
    from scipy.stats import t

    n = len(diff)
    mean = float(np.mean(diff)) if n else 0.0
    if n < 2 or np.allclose(diff, mean):
        return mean, mean
    half = float(t.ppf(0.5 + level / 2, n - 1) * np.std(diff, ddof=1) / np.sqrt(n))
    return mean - half, mean + half


def compare(per_query: Mapping[str, pd.DataFrame], baseline: str, metrics: Sequence[str], *, test: str = "t",
            correction: str = "none") -> pd.DataFrame:
    """Every system of ``per_query`` (name -> one row per query, one column per metric, same queries) against
    ``baseline``: means, the difference with its 95% interval, the p-value and the adjusted p-value (per metric,
    over the systems compared). An unknown baseline is a ConfigError naming the systems there are."""
    check_test(test, correction)
    if baseline not in per_query:
        raise ConfigError(f"baseline {baseline!r} is not among the systems evaluated ({', '.join(per_query)}); "
                          "add it to --systems or pick one of those")
    base = per_query[baseline]
    base = base.loc[sorted(base.index)]  # a fixed query order (sorted ids, as ranx): the draws follow the rows
    rows = []
    for metric in metrics:
        family: list[dict[str, object]] = []
        p_values: list[float] = []
        for name, table in per_query.items():
            if name == baseline:
                continue
            a = table[metric].reindex(base.index).to_numpy(dtype=np.float64)
            b = base[metric].to_numpy(dtype=np.float64)
            low, high = confidence_interval(a - b)
            p_values.append(p_value(a, b, test))
            family.append({"system": name, "metric": metric, "baseline": float(b.mean()),
                           "system_mean": float(a.mean()), "delta": float(a.mean() - b.mean()), "ci_low": low, "ci_high": high,
                           "p_value": p_values[-1]})
        for row, adjusted in zip(family, adjust(p_values, correction)):
            row["p_adjusted"] = float(adjusted)
        rows += family
    return pd.DataFrame(rows, columns=COLUMNS)
