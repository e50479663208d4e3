"""The engine directory's format: search settings, model references and the engine manifest.

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

from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from twostage.indexer.codec import from_json_dict, to_json_dict
from twostage.indexer.errors import ConfigError, IndexFormatError
from twostage.indexer.manifest import check_file_entries, describe_files, manifest_text, read_manifest_json
from twostage.indexer.passages import PassageShape

FORMAT = "twostage.engine"
FORMAT_VERSION = 1
FIRST_STAGES = ("hybrid", "dense", "bm25")
FUSIONS = ("rrf", "blend")
PRECISIONS = ("auto", "fp32", "bf16", "int8", "openvino-fp32", "openvino-int8")


@dataclass(frozen=True)
class EngineSettings:
    """How an engine searches; saved in its manifest, each overridable per call.

    The defaults are the measured best of the one-command SciFact run (benchmarks/results/scifact-e2e and
    rerank-scifact): hybrid first stage (RRF of BM25 and dense top 100), the reranker reads the top 20 and is
    blended with the first stage by the weight chosen on dev data when it was trained.
    """

    first_stage: str = "hybrid"
    fusion: str = "rrf"  # "rrf" (reciprocal rank) or "blend" (min-max normalised scores, dense_weight for dense)
    k_rrf: float = 60.0
    dense_weight: float = 0.5  # blend only: dense's weight, BM25's is 1 - dense_weight
    depth: int = 100  # candidates each first stage gives the fusion
    k_retrieve: int = 20  # candidates the reranker reads
    rerank: bool = True  # rerank when the engine has a reranker (False: the first stage's order)
    interpolation: float | str | None = "auto"  # "auto": the reranker's dev-chosen blend; None: reranker alone
    precision: str = "auto"  # "auto": per model, see resolve_precision
    batch_size: int = 32
    backend: str = "hnswlib"
    metric: str = "cosine"
    passage_words: int = 100  # documents are searched as passages of this many words (0: whole documents)
    passage_stride: int = 50  # a new passage every this many words (passages overlap by words - stride)
    passage_title: bool = True  # the title in front of every passage (False: the first passage only)
    passage_whole_up_to: int = 0  # a document of at most this many words stays one passage (0: passage_words)
    rerank_whole_up_to: int = 300  # the reranker reads a document of at most this many words whole, a longer one by
    # its best passage (0: every document by its best passage); a search-time choice (benchmarks/results/rerank_reads)

    @property
    def passages(self) -> PassageShape:
        return PassageShape(self.passage_words, self.passage_stride, self.passage_title, self.passage_whole_up_to)

    def __post_init__(self) -> None:
        if self.first_stage not in FIRST_STAGES:
            raise ConfigError(f"first_stage must be one of {', '.join(FIRST_STAGES)}, got {self.first_stage!r}")
        if self.fusion not in FUSIONS:
            raise ConfigError(f"fusion must be one of {', '.join(FUSIONS)}, got {self.fusion!r}")
        for name in ("depth", "k_retrieve", "batch_size"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
                raise ConfigError(f"{name} must be a positive integer, got {value!r}")
        if (isinstance(self.dense_weight, bool) or not isinstance(self.dense_weight, (int, float))
                or not 0 <= self.dense_weight <= 1):
            raise ConfigError(f"dense_weight must be a number in [0, 1], got {self.dense_weight!r}")
        if not isinstance(self.k_rrf, (int, float)) or self.k_rrf < 0:
            raise ConfigError(f"k_rrf must be a number >= 0, got {self.k_rrf!r}")
        if self.interpolation not in ("auto", None) and not (
                isinstance(self.interpolation, (int, float)) and not isinstance(self.interpolation, bool)
                and 0 <= self.interpolation <= 1):
            raise ConfigError(f"interpolation must be 'auto', None or a number in [0, 1], got {self.interpolation!r}")
        if not isinstance(self.rerank, bool):
            raise ConfigError(f"rerank must be true or false, got {self.rerank!r}")
        if self.precision not in PRECISIONS:
            raise ConfigError(f"precision must be one of {', '.join(PRECISIONS)}, got {self.precision!r}")
        if isinstance(self.rerank_whole_up_to, bool) or not isinstance(self.rerank_whole_up_to, int) \
                or self.rerank_whole_up_to < 0:
            raise ConfigError(f"rerank_whole_up_to must be an integer >= 0, got {self.rerank_whole_up_to!r}")
        if not isinstance(self.passage_title, bool):
            raise ConfigError(f"passage_title must be true or false, got {self.passage_title!r}")
        self.passages  # noqa: B018 - checks passage_words and passage_stride


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
    retriever: ModelRef
    reranker: ModelRef | None
    documents: int
    files: dict[str, dict[str, Any]] = field(default_factory=dict)
    versions: dict[str, str] = field(default_factory=dict)
    passages: int = 0  # rows of the dense index and BM25: the documents' passages (0: whole documents, one row each)
    truncated: int = 0  # whole-document engines: documents added that were longer than the retriever reads

    def to_json(self) -> str:
        counts = {"documents": self.documents, "passages": self.passages, "truncated": self.truncated}
        return manifest_text(
            FORMAT, FORMAT_VERSION, self.files, self.versions, settings=to_json_dict(self.settings),
            retriever=asdict(self.retriever), reranker=asdict(self.reranker) if self.reranker else None,
            counts=counts)


def read_engine_manifest(version_dir: Path) -> EngineManifest:
    """The engine manifest of a version directory, every field checked (types, ranges, plain file names)."""
    path = version_dir / "manifest.json"
    data = read_manifest_json(version_dir, FORMAT, FORMAT_VERSION, "a search engine directory", "`twostage build`")
    try:
        saved = data["settings"]
        if isinstance(saved, dict) and "passage_words" not in saved:  # an engine from before passages
            saved = {**saved, "passage_words": 0}
        if isinstance(saved, dict) and "passage_whole_up_to" not in saved:  # cut at passage_words, as it was built
            saved = {**saved, "passage_whole_up_to": 0}
        if isinstance(saved, dict) and "rerank_whole_up_to" not in saved:  # read by best passages, as it searched
            saved = {**saved, "rerank_whole_up_to": 0}
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
    reranker = data.get("reranker")
    versions: dict[str, str] = data["versions"] if isinstance(data.get("versions"), dict) else {}
    return EngineManifest(settings, ModelRef.from_dict(data.get("retriever"), f"{path}: retriever"),
                          None if reranker is None else ModelRef.from_dict(reranker, f"{path}: reranker"),
                          counts["documents"], dict(files or {}), dict(versions), counts.get("passages", 0),
                          counts.get("truncated", 0))


def engine_files(version_dir: Path) -> dict[str, dict[str, Any]]:
    """Size and sha256 of the two part manifests (dense/ and bm25/); each of them checksums its own files."""
    return describe_files(version_dir, ["dense/manifest.json", "bm25/manifest.json"])
