"""Files on disk, safely: atomic writes, checksums, and ``.npy`` reads from many threads at once.

Atomic writes: a directory or file is built aside, flushed to disk, then renamed into place. A crash at any moment
leaves either the old artifact or the new one, never a half-written mix.

``.npy`` reads: ``numpy.load`` parses each file's header with ``ast.literal_eval``. On CPython 3.11 the AST
constructor keeps one recursion counter per interpreter, so two threads parsing at the same time can fail with
``SystemError: AST constructor recursion depth mismatch`` (python/cpython#106905; it hit a reader of an engine while a
writer committed). Every ``.npy`` read in twostage goes through :func:`load_npy`, which parses headers one thread at a
time; memory-mapped arrays are read outside the lock, lazily, as before.

The one codec between settings dataclasses and JSON (what settings files and manifests hold).

Every settings record (engine settings, BM25 and analyzer settings, training recipes) is a frozen dataclass whose
fields all have defaults. :func:`to_json_dict` turns one into plain JSON values (nested records become objects,
tuples lists); :func:`from_json_dict` reads such an object back onto the defaults: a key left out keeps its
default, nested objects fill nested records, lists become tuples, and an unknown key is an error that names it
and lists the known ones. The record's own ``__post_init__`` checks the values.
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
from dataclasses import asdict, fields, is_dataclass, replace
from pathlib import Path
from typing import Any, TypeVar

import numpy as np

from twostage.indexer.errors import ConfigError


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


def write_parquet(path: str | Path, frame: Any) -> None:
    """Write a pandas DataFrame to parquet through a temporary file and a rename."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.parent / f".{path.name}.tmp-{uuid.uuid4().hex[:8]}"
    try:
        frame.to_parquet(tmp, index=False)
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


T = TypeVar("T")


def to_json_dict(record: Any) -> dict[str, Any]:
    """``record`` (a dataclass instance) as JSON values: nested records as objects, tuples and paths as lists and
    strings."""
    return json.loads(json.dumps(asdict(record), default=str))


def from_json_dict(kind: type[T], data: Any, where: str) -> T:
    """A ``kind`` record (a dataclass whose fields all have defaults) from a JSON object.

    ``where`` names the file or field in error messages, e.g. ``"manifest.json: settings"``.
    """
    return _onto(kind(), data, where)


def _onto(current: T, data: Any, where: str) -> T:
    """``current`` (a dataclass instance) with the values of the JSON object ``data``, nested records filled."""
    if not isinstance(data, dict):
        raise ConfigError(f"{where}: expected an object of settings, got {type(data).__name__}")
    known = [f.name for f in fields(current)]  # type: ignore[arg-type]  # T is a dataclass by contract
    unknown = sorted(set(data) - set(known))
    if unknown:
        raise ConfigError(f"{where}: unknown setting(s) {', '.join(unknown)}; known: {', '.join(known)}")
    values: dict[str, Any] = {}
    for name, value in data.items():
        default = getattr(current, name)
        if is_dataclass(default) and not isinstance(default, type):
            values[name] = _onto(default, value, f"{where}.{name}")
        else:
            values[name] = tuple(value) if isinstance(value, list) else value
    try:
        return replace(current, **values)  # type: ignore[type-var]
    except (TypeError, ValueError) as exc:  # a record's own check, or a value of the wrong shape
        raise ConfigError(f"{where}: {exc}") from None
