"""load_npy reads .npy headers one thread at a time (CPython 3.11's AST constructor is not thread-safe)."""

import gc
import sys
import threading
import time

import numpy as np
import pytest

from twostage.indexer.atomic import load_npy


def _hammer(path, load, rounds=300):
    """Four threads at two stack depths load ``path`` while the garbage collector switches threads: the errors."""
    errors: list[BaseException] = []

    def deep(n, f):
        return f() if n == 0 else deep(n - 1, f)

    def work(depth):
        for _ in range(rounds):
            try:
                deep(depth, lambda: load(path))
            except SystemError as exc:
                errors.append(exc)

    def switch(*_):
        time.sleep(0)  # lets another thread run in the middle of whatever allocated

    threshold = gc.get_threshold()
    gc.callbacks.append(switch)
    gc.set_threshold(1, 1, 1)
    try:
        threads = [threading.Thread(target=work, args=(d,)) for d in (0, 100, 0, 100)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    finally:
        gc.callbacks.remove(switch)
        gc.set_threshold(*threshold)
    return errors


@pytest.fixture
def npy(tmp_path):
    path = tmp_path / "v.npy"
    np.save(path, np.arange(13, dtype=np.float32)[None], allow_pickle=False)
    return path


def test_load_npy_survives_threads(npy):
    assert _hammer(npy, lambda p: load_npy(p, mmap=True)) == []
    assert load_npy(npy).tolist() == [list(range(13))]


@pytest.mark.skipif(sys.version_info >= (3, 12), reason="the race is CPython 3.11's (python/cpython#106905)")
def test_the_harness_reproduces_the_race_without_the_lock(npy):
    # without this, the test above could pass because the harness never races; on a loaded machine the threads may
    # not interleave in one run (CI's once, with a benchmark beside it), so up to five runs
    for _ in range(5):
        errors = _hammer(npy, lambda p: np.load(p, mmap_mode="r", allow_pickle=False))
        if errors:
            break
    assert errors and "recursion depth mismatch" in str(errors[0])


def test_load_npy_refuses_pickles(tmp_path):
    path = tmp_path / "o.npy"
    np.save(path, np.array([{"a": 1}], dtype=object), allow_pickle=True)
    with pytest.raises(ValueError):
        load_npy(path)
