"""Which corpus a choice was made on: a bottom-k sketch of a corpus's document ids, and how much two corpora share.

A stage weight chosen on dev (MaxSim's and the reranker's, :mod:`twostage.engine.knobs`) holds for the corpus its dev queries searched.
To tell later whether an engine serves that corpus or another one, the choice keeps a sketch of the corpus's ids:
the ``k`` smallest 64-bit hashes of them (Broder's bottom-k sketch, a few kB whatever the corpus's size). Two
sketches estimate the Jaccard similarity of the two id sets: of the ``k`` smallest hashes of their union, the share
found in both. Sets of fewer than ``k`` ids are held whole, so their similarity is exact.
"""

from __future__ import annotations

import hashlib
import heapq
import itertools
from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path
from typing import Any

SKETCH_SIZE = 256  # hashes kept: the similarity's standard error is at most about 1 / (2 sqrt(k)), 0.03


def _hash(doc_id: str) -> int:
    return int.from_bytes(hashlib.blake2b(doc_id.encode("utf-8", "surrogatepass"), digest_size=8).digest(), "big")


def corpus_sketch(ids: Iterable[str], k: int = SKETCH_SIZE) -> tuple[str, ...]:
    """The ``k`` smallest hashes of the distinct ``ids``, ascending, as 16-digit hex strings (JSON-safe)."""
    if k <= 0:
        raise ValueError(f"a sketch keeps a positive number of hashes, got {k}")
    smallest = heapq.nsmallest(k, {_hash(str(i)) for i in ids})
    return tuple(f"{h:016x}" for h in smallest)


def home_record(ids: Sequence[str]) -> dict[str, Any]:
    """How a model's training record names the corpus its dev queries searched: its number of documents and the
    sketch of their ids (JSON)."""
    return {"documents": len(ids), "sketch": list(corpus_sketch(ids))}


def is_sketch(value: object) -> bool:
    """Whether ``value`` (read from a file) is a sketch: a list of distinct, ascending 16-digit hex strings."""
    if not isinstance(value, (list, tuple)) or not all(
            isinstance(h, str) and len(h) == 16 and all(c in "0123456789abcdef" for c in h) for h in value):
        return False
    return all(a < b for a, b in itertools.pairwise(value))


def similarity(a: Sequence[str], b: Sequence[str]) -> float:
    """The estimated Jaccard similarity of the id sets sketched as ``a`` and ``b`` (1.0: the same documents, 0.0:
    none shared). Two sketches of different sizes are compared at the smaller one's; an empty one shares nothing."""
    k = min(len(a), len(b))
    if k == 0:
        return 0.0
    both = set(a) & set(b)
    union = heapq.nsmallest(k, set(a) | set(b))
    return sum(h in both for h in union) / len(union)


def corpus_ids(corpus: Any) -> Iterator[str]:
    """The document ids of a corpus source (:data:`twostage.indexer.corpus.CorpusSource`), lazily: a folder of files
    by its file names (its documents' ids) without reading them, any other source read through."""
    from twostage.indexer.corpus import Corpus, CorpusFields, iter_documents
    from twostage.indexer.files import FolderCorpus, is_folder_corpus

    source = corpus.source if isinstance(corpus, CorpusFields) else corpus
    if isinstance(source, (str, Path)) and is_folder_corpus(Path(source)):
        source = FolderCorpus(Path(source))
    if isinstance(source, FolderCorpus):  # listing the files reads none of them
        yield from (f.rel for f in source.files())
    elif isinstance(source, Corpus):
        yield from source.ids
    else:
        yield from (d.id for d in iter_documents(corpus))
