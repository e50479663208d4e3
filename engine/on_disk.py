"""What an engine directory is on disk, as both its reader and its writer need it: the version manifest (settings,
model references, counts, files), its name in error messages, the format a version's manifest declares, and how many
documents and passages a version's BM25 rows are.

    ENGINE_DIR/
      LOCK, CURRENT          as every versioned directory (twostage.indexer.versions)
      vNNNNNN/
        manifest.json        format twostage.engine: settings, retriever and reranker (name, path, sha256),
                             document count, and size + sha256 of every file below
        dense/               an index version: documents (segments/*.parquet), vectors (.npy), ANN, tombstones
        bm25/                the BM25 index over the same live documents, in the same order

The documents, BM25 and the dense index of one version always hold the same documents: they are written
together and switched together. Everything here is validated before any library reads the files.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from twostage.engine.settings import RENAMED, EngineSettings, old_values
from twostage.indexer.atomic import from_json_dict, to_json_dict
from twostage.indexer.errors import ConfigError, IndexFormatError
from twostage.indexer.manifest import check_file_entries, describe_files, manifest_text, read_manifest_json
from twostage.indexer.passages import group_starts
from twostage.retriever.bm25 import BM25Retriever

WHAT = "a search engine directory (build one with `twostage build`)"
FORMAT = "twostage.engine"
SHARDED_FORMAT = "twostage.sharded-engine"  # the manifest of a sharded engine's version (twostage.engine.sharded)
FORMAT_VERSION = 2  # 2: first_stage_depth, rerank_depth, rerank_blend (format 1: depth, k_retrieve, interpolation)


def counts(bm25: BM25Retriever, passages: bool) -> tuple[int, int]:
    """How many documents and passages (0 in a whole-document engine) a version's BM25 rows are."""
    if not passages:
        return len(bm25), 0
    return len(group_starts(bm25.doc_ids.arrow)), len(bm25)


def format_of(version_dir: Path) -> str | None:
    try:
        data = json.loads((version_dir / "manifest.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return data.get("format") if isinstance(data, dict) else None


@dataclass(frozen=True)
class ModelRef:
    """A model an engine uses: the name it was given, the directory it resolved to, its weights' sha256, and the
    Hugging Face hub revision (commit) it came from when it was resolved from the hub cache ("" otherwise)."""

    name: str
    path: str
    sha256: str
    revision: str = ""
    trust_remote_code: bool = False  # the user allowed the model's own Python code to run (twostage build flag)

    @classmethod
    def from_dict(cls, data: Any, where: str) -> ModelRef:
        if not isinstance(data, dict) or not all(isinstance(data.get(k), str) for k in ("name", "path", "sha256")) \
                or not isinstance(data.get("revision", ""), str) \
                or not isinstance(data.get("trust_remote_code", False), bool):
            raise IndexFormatError(f"{where}: a model entry needs string name, path and sha256 (and a string revision, "
                                   "a boolean trust_remote_code); restore or rebuild")
        return cls(data["name"], data["path"], data["sha256"], data.get("revision", ""),
                   data.get("trust_remote_code", False))


@dataclass(frozen=True)
class EngineManifest:
    settings: EngineSettings
    retriever: ModelRef | None  # None: an engine built without one (BM25 only; first_stage bm25)
    reranker: ModelRef | None
    documents: int
    files: dict[str, dict[str, Any]] = field(default_factory=dict)
    versions: dict[str, str] = field(default_factory=dict)
    passages: int = 0  # rows of the dense index and BM25: the documents' passages (0: whole documents, one row each)
    truncated: int = 0  # whole-document engines: documents added that were longer than the retriever reads
    late: ModelRef | None = None  # the late-interaction model whose token vectors late/ holds (None: none)

    def to_json(self) -> str:
        counts = {"documents": self.documents, "passages": self.passages, "truncated": self.truncated}
        return manifest_text(
            FORMAT, FORMAT_VERSION, self.files, self.versions, settings=to_json_dict(self.settings),
            retriever=asdict(self.retriever) if self.retriever else None,
            reranker=asdict(self.reranker) if self.reranker else None, counts=counts,
            **({"late_interaction": asdict(self.late)} if self.late else {}))


def read_engine_manifest(version_dir: Path) -> EngineManifest:
    """The engine manifest of a version directory, every field checked (types, ranges, plain file names)."""
    path = version_dir / "manifest.json"
    data = read_manifest_json(version_dir, FORMAT, FORMAT_VERSION, "a search engine directory", "`twostage build`")
    try:
        saved = data["settings"]
        if data.get("format_version") == 1 and isinstance(saved, dict):  # format 1's names
            saved = {RENAMED.get(k, k): v for k, v in saved.items()}
        if isinstance(saved, dict) and "passage_words" not in saved:  # an engine from before passages
            saved = {**saved, "passage_words": 0}
        if isinstance(saved, dict) and "passage_whole_up_to" not in saved:  # cut at passage_words, as it was built
            saved = {**saved, "passage_whole_up_to": 0}
        if isinstance(saved, dict) and "rerank_whole_up_to" not in saved:  # read by best passages, as it searched
            saved = {**saved, "rerank_whole_up_to": 0}
        if isinstance(saved, dict) and "language" not in saved:  # analysed in English, as it was built
            saved = {**saved, "language": None}
        if isinstance(saved, dict):  # values renamed since (fusion "blend" -> "wsum"), mapped without a notice
            saved = {**saved, **old_values(saved)}
        settings = from_json_dict(EngineSettings, saved, f"{path}: settings")
    except ConfigError as exc:
        raise IndexFormatError(f"{exc}; restore or rebuild the engine") from None
    except KeyError:
        raise IndexFormatError(f"{path}: no settings; restore or rebuild the engine") from None
    counts, files = data.get("counts"), data.get("files")
    if not isinstance(counts, dict) or isinstance(counts.get("documents"), bool) \
            or not isinstance(counts.get("documents"), int) or counts["documents"] < 0:
        raise IndexFormatError(f"{path}: counts.documents must be a non-negative integer; restore or rebuild the engine")
    for name in ("passages", "truncated"):
        value = counts.get(name, 0)
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            raise IndexFormatError(f"{path}: counts.{name} must be a non-negative integer; restore or rebuild the engine")
    check_file_entries(path, files)
    reranker, retriever = data.get("reranker"), data.get("retriever", "missing")  # null: built without one
    if retriever is None and settings.first_stage != "bm25":
        raise IndexFormatError(f"{path}: an engine without a retriever must search with first_stage bm25, the "
                               f"settings say {settings.first_stage}; restore or rebuild the engine")
    versions: dict[str, str] = data["versions"] if isinstance(data.get("versions"), dict) else {}
    return EngineManifest(settings, None if retriever is None else ModelRef.from_dict(retriever, f"{path}: retriever"),
                          None if reranker is None else ModelRef.from_dict(reranker, f"{path}: reranker"),
                          counts["documents"], dict(files or {}), dict(versions), counts.get("passages", 0),
                          counts.get("truncated", 0),
                          None if data.get("late_interaction") is None
                          else ModelRef.from_dict(data["late_interaction"], f"{path}: late_interaction"))


def engine_files(version_dir: Path) -> dict[str, dict[str, Any]]:
    """Size and sha256 of the part manifests (dense/, bm25/, and late/ when the engine has token vectors); each of
    them checksums its own files."""
    late = ["late/manifest.json"] if (version_dir / "late" / "manifest.json").is_file() else []
    return describe_files(version_dir, ["dense/manifest.json", "bm25/manifest.json", *late])
