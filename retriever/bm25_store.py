"""The BM25 index directory: JSON and ``.npy`` files only, checksummed, written atomically.

    BM25_DIR/
      manifest.json   format, version, BM25 and analyzer config, counts, sha256 of every file
      doc_ids.json    document ids in row order
      vocab.json      term -> column of the weight matrix
      weights.data.npy, weights.indices.npy, weights.indptr.npy   the bm25s CSC term x document weights
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np

from twostage.indexer.atomic import atomic_directory, sha256_file
from twostage.indexer.errors import ConfigError, IndexFormatError
from twostage.indexer.manifest import read_manifest_json
from twostage.retriever.bm25 import BM25Config, BM25Retriever, Bm25sEngine

FORMAT = "twostage.bm25"
FORMAT_VERSION = 1
ARRAYS = ("data", "indices", "indptr")


def save_bm25(retriever: BM25Retriever, path: str | Path) -> None:
    """Write a BM25 directory at ``path`` atomically (built aside, then renamed into place)."""
    with atomic_directory(path) as tmp:
        write_bm25(retriever, tmp)


def write_bm25(retriever: BM25Retriever, tmp: Path) -> None:
    """Write the BM25 files into the existing directory ``tmp`` (the caller makes it atomic)."""
    engine = retriever._engine
    if not isinstance(engine, Bm25sEngine):
        raise ConfigError("only the bm25s engine can be saved; rank-bm25 is the in-memory reference engine")
    import bm25s

    model = engine.model
    (tmp / "doc_ids.json").write_text(json.dumps([str(i) for i in retriever.doc_ids]), encoding="utf-8")
    (tmp / "vocab.json").write_text(json.dumps(model.vocab_dict, ensure_ascii=False), encoding="utf-8")
    for name in ARRAYS:
        np.save(tmp / f"weights.{name}.npy", np.asarray(model.scores[name]), allow_pickle=False)
    files = ["doc_ids.json", "vocab.json", *(f"weights.{a}.npy" for a in ARRAYS)]
    manifest = {
        "format": FORMAT,
        "format_version": FORMAT_VERSION,
        "config": retriever.config.to_dict(),
        "num_docs": len(retriever),
        "vocab_size": len(model.vocab_dict),
        "versions": {"bm25s": bm25s.__version__},
        "files": {name: sha256_file(tmp / name) for name in files},
    }
    (tmp / "manifest.json").write_text(json.dumps(manifest, indent=2, sort_keys=True), encoding="utf-8")


def _read_manifest(root: Path) -> dict[str, Any]:
    return read_manifest_json(root, FORMAT, FORMAT_VERSION, "a BM25 index directory", "BM25Retriever.save")


def load_bm25(path: str | Path) -> BM25Retriever:
    """Load a BM25 directory, checking the manifest and every file's checksum before reading arrays."""
    import bm25s

    root = Path(path)
    if not root.is_dir():
        raise IndexFormatError(f"{root}: no such BM25 index directory")
    manifest = _read_manifest(root)
    files = manifest.get("files", {})
    if not isinstance(files, dict) or set(files) != {"doc_ids.json", "vocab.json", *(f"weights.{a}.npy" for a in ARRAYS)}:
        raise IndexFormatError(f"{root / 'manifest.json'}: lists other files than a BM25 index holds; rebuild it")
    for name, digest in files.items():
        file = root / name
        if not file.is_file():
            raise IndexFormatError(f"{file}: missing; the index is incomplete, rebuild it")
        if sha256_file(file) != digest:
            raise IndexFormatError(f"{file}: checksum mismatch (file corrupted or changed); rebuild the index")
    try:
        config = BM25Config.from_dict(manifest["config"])
        doc_ids = json.loads((root / "doc_ids.json").read_text(encoding="utf-8"))
        vocab = json.loads((root / "vocab.json").read_text(encoding="utf-8"))
        arrays = {name: np.load(root / f"weights.{name}.npy", allow_pickle=False) for name in ARRAYS}
    except (KeyError, ValueError, OSError) as exc:
        raise IndexFormatError(f"{root}: cannot read the index ({exc}); rebuild it") from None
    n = int(manifest["num_docs"])
    data, indices, indptr = arrays["data"], arrays["indices"], arrays["indptr"]
    columns = [v for term, v in vocab.items() if term]  # bm25s keeps "" as a term without a column
    consistent = (
        len(doc_ids) == n
        and len(vocab) == int(manifest["vocab_size"])
        and (not columns or max(columns) < len(indptr) - 1)
        and len(data) == len(indices) == int(indptr[-1])
        and (len(indices) == 0 or int(indices.max()) < n)
    )
    if not consistent:
        raise IndexFormatError(f"{root}: arrays and counts disagree with manifest.json; rebuild the index")
    model = bm25s.BM25(k1=config.k1, b=config.b, method="lucene")
    model.scores = {**arrays, "num_docs": n}
    model.vocab_dict = vocab
    model.unique_token_ids_set = set(vocab.values())
    model.nonoccurrence_array = None  # the Lucene variant has no non-occurrence term
    return BM25Retriever(config, doc_ids, Bm25sEngine(model))
