"""Versioned directories (an index or an engine): one writer at a time, readers that survive a commit.

    ROOT/
      LOCK         advisory lock (flock) held by the one writer for its whole read-modify-commit
      CURRENT      the name of the live version, replaced atomically (os.replace)
      vNNNNNN/     one complete version; READERS inside it is the lease file of the processes reading it

Writers take :func:`writer_lock`, re-open the version CURRENT names at that moment (so no committed change
is ever computed away), write version N+1 beside it (:func:`commit`), fsync it and switch CURRENT. Old
versions are removed only when no reader holds a lease on them: a reader takes a shared ``flock`` on
``vN/READERS`` while it has the version open, the garbage collector an exclusive one without waiting.
Locks die with their process, so a killed reader or writer never leaves a stale lock behind.
"""

from __future__ import annotations

import os
import re
import shutil
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TypeVar

from twostage.indexer.atomic import fsync_dir, fsync_tree
from twostage.indexer.errors import IndexFormatError, WriterBusyError

try:  # POSIX; elsewhere versions are never shared between processes safely, and locks are no-ops
    import fcntl
except ImportError:  # pragma: no cover - Windows
    fcntl = None  # type: ignore[assignment]

VERSION = re.compile(r"^v(\d{6})$")
LEASE = "READERS"
T = TypeVar("T")


def current_version(root: Path, what: str = "an index directory") -> Path:
    """The version directory CURRENT names (checked: a plain ``vNNNNNN`` name that exists)."""
    pointer = root / "CURRENT"
    if not pointer.is_file():
        raise IndexFormatError(f"{root}: no CURRENT file; not {what}")
    try:
        name = pointer.read_bytes().decode("utf-8").strip()
    except UnicodeDecodeError:
        raise IndexFormatError(f"{pointer}: not UTF-8 text; restore it (it names the live version, e.g. v000001)") from None
    if not VERSION.match(name) or not (root / name).is_dir():
        raise IndexFormatError(f"{pointer}: names {name[:40]!r}, which is not a version directory here; restore it")
    return root / name


class Lease:
    """A shared lock on one version: while it is held, garbage collection leaves the version on disk."""

    def __init__(self, version_dir: Path) -> None:
        self.version_dir = version_dir
        self._fd: int | None = None
        if fcntl is None:
            return
        try:
            fd = os.open(version_dir / LEASE, os.O_RDWR | os.O_CREAT, 0o644)
        except OSError:  # read-only media: nobody can collect it either
            return
        fcntl.flock(fd, fcntl.LOCK_SH)
        self._fd = fd

    def release(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None

    def __del__(self) -> None:
        self.release()


def open_current(root: Path, opener: Callable[[Path, Lease], T], what: str = "an index directory") -> T:
    """Lease the current version and open it with ``opener(version_dir, lease)``.

    A writer may switch CURRENT and collect the version between our reading CURRENT and taking the lease:
    then we read CURRENT again (a few times) instead of failing.
    """
    last: Exception | None = None
    for _ in range(20):
        version_dir = current_version(root, what)
        try:
            lease = Lease(version_dir)
        except OSError as exc:  # the version was removed under us
            last = exc
            continue
        if not (version_dir / "manifest.json").is_file():  # collected while we waited for the lease
            lease.release()
            last = IndexFormatError(f"{version_dir}: removed while opening")
            continue
        try:
            return opener(version_dir, lease)
        except IndexFormatError as exc:
            lease.release()
            if current_version(root, what) == version_dir:
                raise
            last = exc
    raise IndexFormatError(f"{root}: the live version kept changing while it was being opened ({last}); try again")


@contextmanager
def writer_lock(root: Path, timeout: float = 600.0) -> Iterator[None]:
    """Hold ``ROOT/LOCK`` exclusively; wait up to ``timeout`` seconds for another writer to finish."""
    root.mkdir(parents=True, exist_ok=True)
    if fcntl is None:  # pragma: no cover
        yield
        return
    fd = os.open(root / "LOCK", os.O_RDWR | os.O_CREAT, 0o644)
    try:
        deadline = time.monotonic() + timeout
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() >= deadline:
                    holder = _read_holder(root)
                    raise WriterBusyError(f"{root}: another writer ({holder}) has held the lock for over {timeout:.0f} s; "
                                          "wait for it to finish or stop it, then retry") from None
                time.sleep(0.05)
        os.ftruncate(fd, 0)
        os.write(fd, f"pid {os.getpid()} since {time.strftime('%Y-%m-%d %H:%M:%S')}\n".encode())
        yield
    finally:
        os.close(fd)


def _read_holder(root: Path) -> str:
    try:
        return (root / "LOCK").read_text(encoding="utf-8").strip() or "unknown process"
    except OSError:
        return "unknown process"


class NewVersion:
    """The directory a writer fills; :func:`commit` names it and switches CURRENT."""

    def __init__(self, root: Path) -> None:
        numbers = [int(m.group(1)) for p in root.iterdir() if (m := VERSION.match(p.name))]
        self.root = root
        self.name = f"v{max(numbers, default=0) + 1:06d}"
        self.tmp = root / f".{self.name}.tmp-{uuid.uuid4().hex[:8]}"
        self.path = root / self.name


@contextmanager
def commit(root: Path) -> Iterator[NewVersion]:
    """Yield a fresh version to fill; on success fsync it, rename it to ``vN`` and point CURRENT at it.

    Call it with :func:`writer_lock` held. On an exception nothing changes on disk (the half-written version
    is removed). Old versions that no reader holds are removed afterwards.
    """
    root.mkdir(parents=True, exist_ok=True)
    version = NewVersion(root)
    version.tmp.mkdir()
    try:
        yield version
        (version.tmp / LEASE).touch()
        fsync_tree(version.tmp)
        os.rename(version.tmp, version.path)
        fsync_dir(root)
        pointer = root / f".CURRENT.tmp-{uuid.uuid4().hex[:8]}"
        with open(pointer, "w", encoding="utf-8") as fh:
            fh.write(version.name + "\n")
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(pointer, root / "CURRENT")
        fsync_dir(root)
    except BaseException:
        shutil.rmtree(version.tmp, ignore_errors=True)
        if version.path.exists() and _points_elsewhere(root, version.name):
            shutil.rmtree(version.path, ignore_errors=True)
        raise
    collect_garbage(root, keep=version.name)


def _points_elsewhere(root: Path, name: str) -> bool:
    try:
        return current_version(root).name != name
    except IndexFormatError:
        return True


def collect_garbage(root: Path, keep: str) -> list[str]:
    """Remove old versions no reader holds and leftovers of interrupted writes; never ``keep`` (CURRENT's)."""
    removed = []
    for p in root.iterdir():
        if p.name in (keep, "CURRENT", "LOCK"):
            continue
        if VERSION.match(p.name) and p.is_dir():
            if _try_remove_version(p):
                removed.append(p.name)
        elif p.name.startswith((".v", ".CURRENT.tmp", ".ann-copy")):
            shutil.rmtree(p, ignore_errors=True) if p.is_dir() else p.unlink(missing_ok=True)
    return removed


def sweep_leftovers(root: Path) -> list[str]:
    """Remove what writes killed mid-way left behind (half-written ``.vNNNNNN.tmp-*`` versions, ``CURRENT``
    pointers never switched), when no writer holds the lock: every write fills its temporary version with the
    lock held, so with the lock free nothing of the kind is still being written. Returns the names removed;
    a directory that cannot be locked (read-only media) is left as it is."""
    if fcntl is None or not any(p.name.startswith((".v", ".CURRENT.tmp")) for p in root.iterdir()):
        return []
    try:
        fd = os.open(root / "LOCK", os.O_RDWR | os.O_CREAT, 0o644)
    except OSError:
        return []
    removed = []
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return []  # a writer is at work: its temporary version is its own
        for p in root.iterdir():
            if (p.name.startswith(".v") and ".tmp-" in p.name) or p.name.startswith(".CURRENT.tmp"):
                shutil.rmtree(p, ignore_errors=True) if p.is_dir() else p.unlink(missing_ok=True)
                removed.append(p.name)
    finally:
        os.close(fd)
    return removed


def _try_remove_version(path: Path) -> bool:
    if fcntl is None:  # pragma: no cover
        shutil.rmtree(path, ignore_errors=True)
        return True
    try:
        fd = os.open(path / LEASE, os.O_RDWR | os.O_CREAT, 0o644)
    except OSError:
        shutil.rmtree(path, ignore_errors=True)
        return True
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return False  # a reader holds it; a later commit collects it
        # removing the manifest first tells a reader that waited for this lock that the version is gone
        (path / "manifest.json").unlink(missing_ok=True)
        shutil.rmtree(path, ignore_errors=True)
        return True
    finally:
        os.close(fd)
