"""The BM25 index directory: JSON and ``.npy`` files only, checksummed, written atomically.

This module knows the files; :class:`twostage.retriever.bm25.BM25Retriever` (``save``, ``load``, ``write_files``)
turns them into a retriever, so the dependency points one way (bm25 -> bm25_store).

    BM25_DIR/
      manifest.json   format, version, BM25 and analyzer config, counts, size and sha256 of every file
      doc_ids.json    document ids in row order
      vocab.json      term -> column of the weight matrix
      weights.data.npy, weights.indices.npy, weights.indptr.npy   the bm25s CSC term x document weights
      postings.counts.npy   each weight's term count (int32), so an update need not analyse the kept documents
      doc_lengths.npy       each document's number of terms (int32)

The last two came with format version 3; an index without them (versions 1 and 2) still loads, and an update
rebuilds it from the stored documents.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np

from twostage.indexer.atomic import load_npy
from twostage.indexer.errors import IndexFormatError
from twostage.indexer.manifest import (
    check_file_entries,
    describe_files,
    manifest_text,
    read_manifest_json,
    verify_files,
)
from twostage.retriever.bm25_stats import Postings

FORMAT = "twostage.bm25"
FORMAT_VERSION = 4  # 4: each document's language (statistics per language); 3: the postings' counts and lengths;
# 2: files list sha256 and bytes; 1 listed sha256 only
ARRAYS = ("data", "indices", "indptr")
BASE_FILES = ("doc_ids.json", "vocab.json", *(f"weights.{a}.npy" for a in ARRAYS))
POSTINGS_FILES = ("postings.counts.npy", "doc_lengths.npy")
LANGUAGES_FILE = "doc_languages.npy"  # with the manifest's "languages": the codes its values are positions in


def write_bm25_files(tmp: Path, model: Any, doc_ids: Any, config: dict[str, Any], postings: Postings | None) -> None:
    """Write the weights (bm25s's layout: ``model.vocab_dict``, ``model.scores``), its postings (when kept) and the manifest into the existing directory ``tmp``
    (the caller makes it atomic). ``config`` is the retriever's BM25Config as a dict."""
    (tmp / "doc_ids.json").write_text(json.dumps([str(i) for i in doc_ids]), encoding="utf-8")
    (tmp / "vocab.json").write_text(json.dumps(model.vocab_dict, ensure_ascii=False), encoding="utf-8")
    for name in ARRAYS:
        np.save(tmp / f"weights.{name}.npy", np.asarray(model.scores[name]), allow_pickle=False)
    files = list(BASE_FILES)
    if postings is not None:
        np.save(tmp / "postings.counts.npy", np.asarray(postings.counts, dtype=np.int32), allow_pickle=False)
        np.save(tmp / "doc_lengths.npy", np.asarray(postings.lengths, dtype=np.int32), allow_pickle=False)
        files += POSTINGS_FILES
    extra: dict[str, Any] = {}
    if postings is not None and postings.languages is not None:
        np.save(tmp / LANGUAGES_FILE, np.asarray(postings.languages, dtype=np.uint8), allow_pickle=False)
        files.append(LANGUAGES_FILE)
        extra["languages"] = list(postings.language_codes)
    text = manifest_text(FORMAT, FORMAT_VERSION, describe_files(tmp, files), config=config, num_docs=len(doc_ids),
                         vocab_size=len(model.vocab_dict), **extra)
    (tmp / "manifest.json").write_text(text, encoding="utf-8")


def _read_manifest(root: Path) -> dict[str, Any]:
    return read_manifest_json(root, FORMAT, FORMAT_VERSION, "a BM25 index directory", "BM25Retriever.save")


def read_bm25_files(path: str | Path) -> tuple[dict[str, Any], list[str], dict[str, int], dict[str, np.ndarray],
                                               Postings | None]:
    """The config dict, document ids, vocabulary, weight arrays and postings (None when the index has none) of a
    BM25 directory, after checking the manifest and every file's checksum (before any array is read) and that arrays
    and counts agree. The postings' counts and lengths are memory-mapped: only an update reads them."""
    root = Path(path)
    if not root.is_dir():
        raise IndexFormatError(f"{root}: no such BM25 index directory")
    manifest = _read_manifest(root)
    files = manifest.get("files", {})
    has_languages = isinstance(files, dict) and set(files) == {*BASE_FILES, *POSTINGS_FILES, LANGUAGES_FILE}
    has_postings = has_languages or (isinstance(files, dict) and set(files) == {*BASE_FILES, *POSTINGS_FILES})
    if not isinstance(files, dict) or not (set(files) == set(BASE_FILES) or has_postings):
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
        arrays = {name: load_npy(root / f"weights.{name}.npy") for name in ARRAYS}
        extra = [load_npy(root / f, mmap=True) for f in POSTINGS_FILES] if has_postings else []
        languages = load_npy(root / LANGUAGES_FILE) if has_languages else None
    except (KeyError, ValueError, OSError) as exc:
        raise IndexFormatError(f"{root}: cannot read the index ({exc}); rebuild it") from None
    n = int(manifest["num_docs"])
    data, indices, indptr = arrays["data"], arrays["indices"], arrays["indptr"]
    columns = [v for term, v in vocab.items() if term]  # bm25s keeps "" as a term without a column
    consistent = (
        isinstance(doc_ids, list) and all(type(i) is str for i in doc_ids) and isinstance(vocab, dict)
        and len(doc_ids) == n
        and len(vocab) == int(manifest["vocab_size"])
        and (not columns or max(columns) < len(indptr) - 1)
        and len(data) == len(indices) == int(indptr[-1])
        and (len(indices) == 0 or int(indices.max()) < n)
    )
    if not consistent:
        raise IndexFormatError(f"{root}: arrays and counts disagree with manifest.json; rebuild the index")
    if not isinstance(config, dict):
        raise IndexFormatError(f"{root / 'manifest.json'}: config is not an object; rebuild the index")
    postings = None
    if has_postings:
        cols = sorted((c, t) for t, c in vocab.items() if t and type(c) is int)
        terms = [t for _, t in cols]
        if [c for c, _ in cols] != list(range(len(indptr) - 1)) or len(extra[0]) != len(indices) or \
                len(extra[1]) != n or not all(np.issubdtype(a.dtype, np.integer) for a in extra):
            raise IndexFormatError(f"{root}: the postings disagree with the vocabulary or the weights; rebuild it")
        codes = manifest.get("languages")
        if languages is not None and not (
                isinstance(codes, list) and all(isinstance(c, str) for c in codes) and len(set(codes)) == len(codes)
                and languages.dtype == np.uint8 and languages.shape == (n,)
                and (n == 0 or int(languages.max()) < len(codes))):
            raise IndexFormatError(f"{root}: {LANGUAGES_FILE} disagrees with the manifest's languages; rebuild it")
        postings = Postings(terms, indptr, indices, extra[0], extra[1], languages,
                            tuple(codes or ()) if languages is not None else ())
    return config, doc_ids, vocab, arrays, postings
