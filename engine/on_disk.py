"""What an engine directory is on disk, as both its reader and its writer need it: its name in error messages, the
format a version's manifest declares, and how many documents and passages a version's BM25 rows are."""

from __future__ import annotations

import json
from pathlib import Path

from twostage.indexer.passages import group_starts
from twostage.retriever.bm25 import BM25Retriever

WHAT = "a search engine directory (build one with `twostage build`)"


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
