"""Files on disk, safely: atomic writes, checksums, and ``.npy`` reads from many threads at once.

Atomic writes: a directory or file is built aside, flushed to disk, then renamed into place. A crash at any moment
leaves either the old artifact or the new one, never a half-written mix.

``.npy`` reads: ``numpy.load`` parses each file's header with ``ast.literal_eval``. On CPython 3.11 the AST
constructor keeps one recursion counter per interpreter, so two threads parsing at the same time can fail with
``SystemError: AST constructor recursion depth mismatch`` (python/cpython#106905; it hit a reader of an engine while a
writer committed). Every ``.npy`` read in twostage goes through :func:`load_npy`, which parses headers one thread at a
time; memory-mapped arrays are read outside the lock, lazily, as before.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import threading
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import numpy as np


def fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def fsync_tree(root: Path) -> None:
    """fsync every file and directory under ``root``."""
    for dirpath, _, files in os.walk(root):
        for name in files:
            with open(os.path.join(dirpath, name), "rb") as fh:
                os.fsync(fh.fileno())
        fsync_dir(Path(dirpath))


@contextmanager
def atomic_directory(target: str | Path) -> Iterator[Path]:
    """Yield a fresh temporary directory beside ``target``; on success it replaces ``target``.

    On an exception the temporary directory is removed and ``target`` is untouched. An existing
    ``target`` is moved aside and deleted only after the new one is in place.
    """
    target = Path(target)
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = target.parent / f".{target.name}.tmp-{uuid.uuid4().hex[:8]}"
    tmp.mkdir()
    try:
        yield tmp
        fsync_tree(tmp)
        old = None
        if target.exists():
            old = target.parent / f".{target.name}.old-{uuid.uuid4().hex[:8]}"
            os.rename(target, old)
        os.rename(tmp, target)
        fsync_dir(target.parent)
        if old is not None:
            shutil.rmtree(old, ignore_errors=True)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


def atomic_write_text(path: str | Path, text: str) -> None:
    """Write a text file through a temporary file and a rename."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.parent / f".{path.name}.tmp-{uuid.uuid4().hex[:8]}"
    try:
        with open(tmp, "w", encoding="utf-8") as fh:
            fh.write(text)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def write_json(path: str | Path, obj: Any) -> None:
    atomic_write_text(path, json.dumps(obj, indent=2, sort_keys=True, ensure_ascii=False) + "\n")


def sha256_file(path: str | Path, chunk: int = 1 << 20) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        while block := fh.read(chunk):
            h.update(block)
    return h.hexdigest()


_HEADER_LOCK = threading.Lock()


def load_npy(path: str | Path, mmap: bool = False) -> np.ndarray:
    """The array in ``path`` (memory-mapped read-only when ``mmap``); never unpickles."""
    with _HEADER_LOCK:
        return np.load(path, mmap_mode="r" if mmap else None, allow_pickle=False)
