"""Reading ``.npy`` files from many threads at once.

``numpy.load`` parses each file's header with ``ast.literal_eval``. On CPython 3.11 the AST constructor keeps one
recursion counter per interpreter, so two threads parsing at the same time can fail with ``SystemError: AST
constructor recursion depth mismatch`` (python/cpython#106905; it hit a reader of an engine while a writer
committed). Every ``.npy`` read in twostage goes through :func:`load_npy`, which parses headers one thread at a time;
memory-mapped arrays are read outside the lock, lazily, as before.
"""

from __future__ import annotations

import threading
from pathlib import Path

import numpy as np

_HEADER_LOCK = threading.Lock()


def load_npy(path: str | Path, mmap: bool = False) -> np.ndarray:
    """The array in ``path`` (memory-mapped read-only when ``mmap``); never unpickles."""
    with _HEADER_LOCK:
        return np.load(path, mmap_mode="r" if mmap else None, allow_pickle=False)
