"""Matrix products of one query run on the calling thread: no BLAS worker threads left spinning.

OpenBLAS (numpy's BLAS) splits a large enough product over its worker threads, and those threads keep spinning for
a while after it returns. On a 2-core machine they then take the cores from whatever runs next: in a search, the
next model's forward pass in OpenVINO's own threads. Measured on SciFact's MaxSim stage
(``benchmarks/results/maxsim_blas_thread.md``): a query encoding that takes 6-7 ms took 10-11 ms after MaxSim's product
ran on two BLAS threads, and the product itself gained under 1 ms from the second thread.

:func:`one_blas_thread` is threadpoolctl's limit as a ``with`` block. OpenBLAS's limit is process-wide, so
threadpoolctl (3.8 and later) lets one thread at a time hold it: a search in another thread meanwhile runs its
product as the process is set, and each block gives back the limit it found, so concurrent searches never leave
the user's numpy on one thread.
"""

from __future__ import annotations

from typing import Any


def one_blas_thread() -> Any:
    """A context manager: every loaded BLAS on one thread within the block, the limit found given back after
    (threadpoolctl's cached controller, made again only when new modules were imported)."""
    from threadpoolctl import get_cached_controller

    return get_cached_controller().limit(limits=1, user_api="blas")
