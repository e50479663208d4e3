"""Manifests: what a directory holds, how it was made, and a checksum of every file.

One shape for every directory twostage writes (the index, BM25, shards, the engine): ``format``,
``format_version``, ``files`` (each file's sha256 and size), ``versions`` (the libraries that wrote it), then the
directory's own fields. :func:`manifest_text` writes it, :func:`read_manifest_json` reads and checks the header,
:func:`check_file_entries` / :func:`verify_files` check the file list and the files. A manifest is read and
checked before any binary file is opened. This module also reads the index's own manifest (:class:`Manifest`).
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from twostage.indexer.atomic import sha256_file
from twostage.indexer.errors import IndexFormatError

FORMAT = "twostage.index"
FORMAT_VERSION = 1
_PLAIN = re.compile(r"^[A-Za-z0-9_.-]+$")
_SHA256 = re.compile(r"^[0-9a-f]{64}$")
LIBRARIES = ("twostage-search", "numpy", "pyarrow", "faiss-cpu", "hnswlib", "bm25s", "torch", "transformers")


def library_versions() -> dict[str, str]:
    """The installed versions of twostage and the libraries whose files it writes."""
    from importlib.metadata import PackageNotFoundError, version

    out = {}
    for pkg in LIBRARIES:
        try:
            out[pkg] = version(pkg)
        except PackageNotFoundError:
            pass
    return out


def manifest_text(fmt: str, format_version: int, files: Mapping[str, Mapping[str, Any]],
                  versions: Mapping[str, str] | None = None, **fields: Any) -> str:
    """The JSON text of a manifest: the common header (``versions`` defaults to :func:`library_versions`), then
    ``fields``."""
    data = {**fields, "format": fmt, "format_version": format_version, "files": dict(files),
            "versions": dict(library_versions() if versions is None else versions)}
    return json.dumps(data, indent=2, sort_keys=True) + "\n"


def check_file_name(rel: str, where: Path) -> str:
    """A file name from a manifest: relative, inside the directory (``a/b.npy`` at most), never ``..`` or absolute."""
    parts = rel.split("/") if isinstance(rel, str) else []
    if not parts or any(not _PLAIN.match(p) or p in (".", "..") for p in parts):
        raise IndexFormatError(f"{where}: file name {str(rel)[:80]!r} is not a plain name inside the directory; "
                               "the manifest is damaged or crafted: restore or rebuild")
    return rel


@dataclass(frozen=True)
class EncoderInfo:
    """Identity of the encoder whose vectors are in the index; queries must come from the same one."""

    name: str
    dim: int
    weights_sha256: str = ""
    pooling: str = ""
    normalize: bool = True
    max_length: int = 0


@dataclass(frozen=True)
class Segment:
    """A run of rows stored in ``segments/<name>.npy`` (vectors) and ``segments/<name>.parquet`` (documents)."""

    name: str
    start: int
    rows: int


@dataclass(frozen=True)
class Manifest:
    encoder: EncoderInfo
    metric: str
    backend: str
    params: dict[str, Any]
    segments: tuple[Segment, ...]
    deleted: int
    files: dict[str, dict[str, Any]] = field(default_factory=dict)  # relative path -> {"sha256", "bytes"}
    versions: dict[str, str] = field(default_factory=dict)

    @property
    def rows(self) -> int:
        return sum(s.rows for s in self.segments)

    @property
    def live(self) -> int:
        return self.rows - self.deleted

    def to_json(self) -> str:
        return manifest_text(
            FORMAT, FORMAT_VERSION, self.files, self.versions, encoder=self.encoder.__dict__, metric=self.metric,
            backend={"name": self.backend, "params": self.params}, segments=[s.__dict__ for s in self.segments],
            counts={"rows": self.rows, "deleted": self.deleted, "live": self.live, "dim": self.encoder.dim})


def read_manifest_json(root: Path, fmt: str, max_version: int, what: str, how_to_build: str,
                       name: str = "manifest.json") -> dict[str, Any]:
    """``root/name`` as a dict, after checking it is readable, of format ``fmt`` and not too new."""
    path = root / name
    if not path.is_file():
        raise IndexFormatError(f"{root}: no {name}; not {what} (build one with {how_to_build})")
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise IndexFormatError(f"{path}: unreadable manifest ({exc}); restore or rebuild it") from None
    if not isinstance(data, dict) or data.get("format") != fmt:
        raise IndexFormatError(f"{path}: not the manifest of {what}")
    version = data.get("format_version")
    if not isinstance(version, int) or version > max_version:
        raise IndexFormatError(f"{path}: format version {version!r} is newer than this library reads "
                               f"({max_version}); upgrade twostage")
    return data


def read_manifest(root: Path) -> Manifest:
    path = root / "manifest.json"
    data = read_manifest_json(root, FORMAT, FORMAT_VERSION, "an engine's dense part", "`twostage build`")
    try:
        manifest = Manifest(
            encoder=EncoderInfo(**data["encoder"]), metric=data["metric"], backend=data["backend"]["name"],
            params=dict(data["backend"]["params"]), segments=tuple(Segment(**s) for s in data["segments"]),
            deleted=int(data["counts"]["deleted"]), files=dict(data["files"]), versions=dict(data.get("versions", {})))
    except (KeyError, TypeError, ValueError) as exc:
        raise IndexFormatError(f"{path}: missing or malformed field ({exc}); restore or rebuild the index") from None
    for seg in manifest.segments:
        if not isinstance(seg.name, str) or not _PLAIN.match(seg.name) or not isinstance(seg.rows, int) \
                or not isinstance(seg.start, int) or seg.rows < 0 or seg.start < 0:
            raise IndexFormatError(f"{path}: malformed segment {seg!r}; restore or rebuild the index")
    check_file_entries(path, manifest.files)
    dim = manifest.encoder.dim  # 0: documents without vectors (an engine built without a retriever), flat only
    if not isinstance(dim, int) or dim < 0 or (dim == 0 and manifest.backend != "flat") \
            or not isinstance(manifest.deleted, int):
        raise IndexFormatError(f"{path}: malformed counts; restore or rebuild the index")
    if data["counts"].get("rows") != manifest.rows or data["counts"].get("dim") != manifest.encoder.dim:
        raise IndexFormatError(f"{path}: counts disagree with the segments listed; restore or rebuild the index")
    return manifest


def check_file_entries(where: Path, files: Any) -> dict[str, dict[str, Any]]:
    """The ``files`` of a manifest, checked: plain names inside the directory, each with integer bytes and a
    sha256 (what :func:`describe_files` writes)."""
    if not isinstance(files, dict):
        raise IndexFormatError(f"{where}: files must be an object; restore or rebuild")
    for rel, meta in files.items():
        check_file_name(rel, where)
        if not isinstance(meta, dict) or not isinstance(meta.get("bytes"), int) \
                or not isinstance(meta.get("sha256"), str) or not _SHA256.match(meta["sha256"]):
            raise IndexFormatError(f"{where}: entry of {rel!r} needs integer bytes and a sha256 (64 hex digits); "
                                   "restore or rebuild")
    return files


def verify_files(root: Path, files: Mapping[str, Mapping[str, Any]], *, checksums: bool = True) -> None:
    """Every file of a manifest's ``files`` exists with its size (and, with ``checksums``, its sha256)."""
    for rel, meta in files.items():
        path = root / rel
        if not path.is_file():
            raise IndexFormatError(f"{path}: missing; the index is incomplete (restore or rebuild it)")
        if path.stat().st_size != meta["bytes"]:
            raise IndexFormatError(f"{path}: {path.stat().st_size} bytes, the manifest says {meta['bytes']} "
                                   "(truncated or replaced); restore or rebuild the index")
        if checksums and sha256_file(path) != meta["sha256"]:
            raise IndexFormatError(f"{path}: checksum mismatch (corrupted); restore or rebuild the index")


def describe_files(root: Path, names: list[str]) -> dict[str, dict[str, Any]]:
    """The ``files`` entry of a manifest: each file's sha256 and size, by name."""
    return {n: {"sha256": sha256_file(root / n), "bytes": (root / n).stat().st_size} for n in sorted(names)}
