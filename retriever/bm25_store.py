"""The BM25 index directory: JSON and ``.npy`` files only, checksummed, written atomically.

This module knows the files; :class:`twostage.retriever.bm25.BM25Retriever` (``save``, ``load``, ``write_files``)
turns them into a retriever, so the dependency points one way (bm25 -> bm25_store).

    BM25_DIR/
      manifest.json   format, version, BM25 and analyzer config, counts, size and sha256 of every file
      doc_ids.json    document ids in row order
      vocab.json      term -> column of the weight matrix
      weights.data.npy, weights.indices.npy, weights.indptr.npy   the bm25s CSC term x document weights
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np

from twostage.indexer.errors import IndexFormatError
from twostage.indexer.manifest import (
    check_file_entries,
    describe_files,
    manifest_text,
    read_manifest_json,
    verify_files,
)

FORMAT = "twostage.bm25"
FORMAT_VERSION = 2  # 2: files list sha256 and bytes (the index's convention); 1 listed sha256 only
ARRAYS = ("data", "indices", "indptr")


def write_bm25_files(tmp: Path, model: Any, doc_ids: Any, config: dict[str, Any]) -> None:
    """Write a bm25s model's files and the manifest into the existing directory ``tmp`` (the caller makes it
    atomic). ``config`` is the retriever's BM25Config as a dict."""
    (tmp / "doc_ids.json").write_text(json.dumps([str(i) for i in doc_ids]), encoding="utf-8")
    (tmp / "vocab.json").write_text(json.dumps(model.vocab_dict, ensure_ascii=False), encoding="utf-8")
    for name in ARRAYS:
        np.save(tmp / f"weights.{name}.npy", np.asarray(model.scores[name]), allow_pickle=False)
    files = ["doc_ids.json", "vocab.json", *(f"weights.{a}.npy" for a in ARRAYS)]
    text = manifest_text(FORMAT, FORMAT_VERSION, describe_files(tmp, files), config=config, num_docs=len(doc_ids),
                         vocab_size=len(model.vocab_dict))
    (tmp / "manifest.json").write_text(text, encoding="utf-8")


def _read_manifest(root: Path) -> dict[str, Any]:
    return read_manifest_json(root, FORMAT, FORMAT_VERSION, "a BM25 index directory", "BM25Retriever.save")


def read_bm25_files(path: str | Path) -> tuple[dict[str, Any], list[str], dict[str, int], dict[str, np.ndarray]]:
    """The config dict, document ids, vocabulary and weight arrays of a BM25 directory, after checking the manifest
    and every file's checksum (before any array is read) and that arrays and counts agree."""
    root = Path(path)
    if not root.is_dir():
        raise IndexFormatError(f"{root}: no such BM25 index directory")
    manifest = _read_manifest(root)
    files = manifest.get("files", {})
    if not isinstance(files, dict) or set(files) != {"doc_ids.json", "vocab.json", *(f"weights.{a}.npy" for a in ARRAYS)}:
        raise IndexFormatError(f"{root / 'manifest.json'}: lists other files than a BM25 index holds; rebuild it")
    if manifest.get("format_version") == 1:  # v1 listed sha256 only: take the sizes as found, the sha256 decides
        if not all(isinstance(digest, str) for digest in files.values()):
            raise IndexFormatError(f"{root / 'manifest.json'}: malformed file list; rebuild the index")
        files = {name: {"sha256": digest, "bytes": (root / name).stat().st_size if (root / name).is_file() else 0}
                 for name, digest in files.items()}
    verify_files(root, check_file_entries(root / "manifest.json", files))
    try:
        config = manifest["config"]
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
    if not isinstance(config, dict):
        raise IndexFormatError(f"{root / 'manifest.json'}: config is not an object; rebuild the index")
    return config, doc_ids, vocab, arrays
