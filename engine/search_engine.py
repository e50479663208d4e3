"""The search engine: one directory, one object, from a query to reranked hits.

>>> engine = SearchEngine.build("corpus.jsonl", "engines/docs", retriever="all-MiniLM-L6-v2", reranker="models/ce")
>>> result = engine.search("why do cats purr", k=10)
>>> result.hits[0].id, result.hits[0].title, result.hits[0].stage_scores, result.timings
>>> engine = SearchEngine.load("engines/docs").add(new_docs).delete(["doc-17"])

A version of the directory (:mod:`twostage.engine.on_disk`) holds the documents, the dense ANN index and the
BM25 index over the same live documents, and names the two models by path and weights sha256. Every change
(add, upsert, delete, compact) writes the next version beside the current one under the writer lock and switches
to it atomically: a crash leaves all three parts old or all three new. An open engine keeps reading its version
while others commit; :meth:`SearchEngine.refresh` moves to the newest. This module reads; the build and the changes
are :class:`twostage.engine.writes.EngineWriter`'s.

Memory: nothing an engine does holds the corpus's texts. The build encodes and indexes a chunk at a time; a search
reads only the parquet row groups of the documents it returns or reranks (:mod:`twostage.indexer.docstore`); an
update copies BM25's stored postings of the documents it keeps and analyses only the new ones (a BM25 saved without
postings is rebuilt from the documents streamed a row group at a time), and a compaction copies the live rows one
bounded segment at a time.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from dataclasses import asdict
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from twostage.engine.models import Models
from twostage.engine.on_disk import WHAT, EngineManifest, format_of, read_engine_manifest
from twostage.engine.search import SearchMethods
from twostage.engine.settings import EngineSettings
from twostage.engine.steer import Expansion
from twostage.indexer.atomic import to_json_dict
from twostage.indexer.errors import ConfigError, DataError, IndexFormatError, PageExpiredError
from twostage.indexer.filters import Where
from twostage.indexer.index import Index, IndexChange
from twostage.indexer.manifest import verify_files
from twostage.indexer.passages import best_per_document, group_starts, join, passage_id, split_id
from twostage.indexer.records import Document, RankedList, top_k
from twostage.indexer.versions import VERSION, Lease, current_version, open_current, sweep_leftovers
from twostage.models.device import requested_device
from twostage.retriever.bm25 import BM25Retriever

if TYPE_CHECKING:
    from twostage.indexer.corpus import CorpusSource
    from twostage.indexer.tokens import TokenPart

logger = logging.getLogger(__name__)
_SLICE = 1 << 20  # ids compared at a time when an engine opens


class SearchEngine(SearchMethods):
    """A saved two-stage search engine. Build with :meth:`build`, open with :meth:`load`."""

    def __init__(self, root: Path, version_dir: Path, manifest: EngineManifest, index: Index, bm25: BM25Retriever,
                 lease: Lease | None = None, models: Models | None = None, tokens: TokenPart | None = None) -> None:
        self.root, self.version_dir, self.manifest = root, version_dir, manifest
        self.index, self.bm25, self.tokens = index, bm25, tokens
        self._lease = lease
        self._models = (models or Models()).for_manifest(manifest)
        live_rows = np.flatnonzero(~index.deleted)
        if len(bm25.doc_ids) != len(live_rows) or not all(  # compared a slice at a time: no second copy of every id
                np.array_equal(bm25.doc_ids[s:s + _SLICE], index.doc_ids[live_rows[s:s + _SLICE]])
                for s in range(0, len(live_rows), _SLICE)):
            raise IndexFormatError(f"{version_dir}: the BM25 index and the dense index hold different documents; "
                                   "restore or rebuild the engine")
        self.shape = manifest.settings.passages
        # a passage engine: BM25 row groups[j] is the first passage of the j-th live document (its passages follow)
        self._groups = group_starts(bm25.doc_ids.arrow) if self.shape.enabled else np.zeros(0, dtype=np.int64)
        documents, rows = (len(self._groups), manifest.passages) if self.shape.enabled else (len(live_rows), None)
        if manifest.documents != documents or (rows is not None and (rows != len(live_rows) or (
                len(live_rows) and (not len(self._groups) or self._groups[0] != 0)))):
            raise IndexFormatError(f"{version_dir / 'manifest.json'}: counts {manifest.documents} documents, the parts "
                                   f"hold {documents}{'' if rows is None else f' in {len(live_rows)} passages'}; "
                                   "restore or rebuild the engine")
        self.bm25_rows = live_rows  # BM25 row i is index row live_rows[i]

    # ---- opening -------------------------------------------------------------------------------
    @classmethod
    def load(cls, path: str | Path, *, verify: bool = True, device: str = "auto") -> SearchEngine:
        """Open an engine directory: manifests first, then every file's size and sha256 (``verify``).

        The models load on first search, on ``device`` (cpu, cuda, cuda:N or auto: a CUDA GPU when there is one);
        their weights are checked against the recorded sha256 then.

        Raises:
            IndexFormatError: ``path`` is not an engine, or a file is missing, altered (size, sha256) or of a newer
                format.
        """
        root = Path(path)
        if not root.is_dir():
            raise IndexFormatError(f"{root}: no such engine directory (build one with `twostage build`)")
        models = Models(requested_device=requested_device(device))
        removed = sweep_leftovers(root)
        if removed:
            logger.info("%s: removed %d leftover(s) of a write that was killed mid-way: %s", root, len(removed),
                        ", ".join(removed))
        return open_current(root, lambda version_dir, lease: cls.open_version(root, version_dir, lease, verify, models),
                            WHAT)

    @classmethod
    def open_version(cls, root: Path, version_dir: Path, lease: Lease | None, verify: bool,
                     models: Models | None = None) -> SearchEngine:
        """The engine at one version directory of ``root`` (held by ``lease``), its manifest and parts checked (every
        file's sha256 with ``verify``), searching with ``models`` (shared with the engine they came from) or new ones.
        :meth:`load` opens the current version; the writer opens each version it commits."""
        if format_of(version_dir) == "twostage.index":
            raise IndexFormatError(f"{root}: a bare dense index directory (the `twostage index` commands are "
                                   "gone), not a search engine; build an engine from its corpus with `twostage build`")
        manifest = read_engine_manifest(version_dir)
        for part in ("dense", "bm25"):
            if not (version_dir / part).is_dir():
                raise IndexFormatError(f"{version_dir / part}: missing; restore or rebuild the engine")
        verify_files(version_dir, manifest.files, checksums=verify)
        index = Index.open_version(root, version_dir / "dense", verify=verify)
        if (manifest.retriever is None) != (index.manifest.encoder.dim == 0):
            raise IndexFormatError(f"{version_dir / 'manifest.json'}: names "
                                   f"{'no retriever' if manifest.retriever is None else 'a retriever'} but the dense "
                                   f"part holds {index.manifest.encoder.dim}-d vectors; restore or rebuild the engine")
        bm25 = BM25Retriever.load(version_dir / "bm25")
        tokens = None
        if manifest.late is not None:  # token vectors aligned with the dense part's segments
            from twostage.indexer.tokens import TokenPart

            tokens = TokenPart.open(version_dir / "late", [(seg.name, seg.start, seg.rows)
                                                           for seg in index.manifest.segments], verify=verify)
        elif (version_dir / "late").exists():
            raise IndexFormatError(f"{version_dir / 'late'}: token vectors, but the manifest names no late-interaction "
                                   "model; restore or rebuild the engine")
        return cls(root, version_dir, manifest, index, bm25, lease, models, tokens)

    def refresh(self, *, verify: bool = False) -> SearchEngine:
        """This engine at the newest committed version (``self`` when nothing changed); models are kept."""
        if current_version(self.root, WHAT) == self.version_dir:
            return self
        return open_current(self.root, lambda v, lease: SearchEngine.open_version(self.root, v, lease, verify,
                                                                                  self._models),
                            WHAT)

    @contextmanager
    def at_version(self, version: str) -> Iterator[SearchEngine]:
        """This engine as it was at ``version``, while that version is still on disk (page tokens pin one)."""
        if version == self.version:
            yield self
            return
        gone = PageExpiredError(f"page_token: it belongs to version {version}, which is no longer on disk (the "
                                f"engine is at {self.version}); search again for the first page")
        version_dir = self.root / version
        if not VERSION.match(version) or not (version_dir / "manifest.json").is_file():
            raise gone
        try:
            lease = Lease(version_dir)
            engine = SearchEngine.open_version(self.root, version_dir, lease, False, self._models)
        except (OSError, IndexFormatError):
            raise gone from None
        if not engine.shares_models(self):  # a swap since: paging would load and verify the old models per page
            engine.close()
            raise PageExpiredError(f"page_token: it belongs to version {version}, which searched with other models "
                                   f"(the engine is at {self.version} since a model swap); search again for the "
                                   "first page")
        try:
            yield engine
        finally:
            engine.close()

    def with_new_models(self) -> SearchEngine:
        """This engine with its models to be loaded again (on the same device), e.g. in a new precision."""
        self._models = Models(requested_device=self._models.device_as_known).for_manifest(self.manifest)
        return self

    def close(self) -> None:
        """Release this version (a later commit may then remove it from disk); a view releases nothing."""
        if self._lease is not None and not self.read_only:
            self._lease.release()

    # ---- properties (settings, version, precision, reranker: SearchMethods) -----------------------
    def __len__(self) -> int:
        return self.manifest.documents

    def __contains__(self, doc_id: object) -> bool:
        if self.shape.enabled:
            return isinstance(doc_id, str) and passage_id(doc_id, 0) in self.index
        return doc_id in self.index

    @property
    def encoder(self) -> Any:
        """The bi-encoder, loaded (and its weights verified) on first use, attached to the dense index."""
        encoder = self.loaded_encoder()
        if self.index.encoder is not encoder:
            self.index.attach_encoder(encoder)
        return encoder

    def analyzer(self) -> Any:
        return self.bm25.analyzer

    def reading(self) -> dict[str, Any]:
        """How the engine reads long documents: in passages (how many, how many documents were cut), or whole, with
        how many documents were longer than the retriever reads (counted as they were added)."""
        m, s = self.manifest, self.settings
        reads = self.index.manifest.encoder.max_length
        if self.shape.enabled:
            sizes = np.diff(np.append(self._groups, len(self.bm25_rows)))
            cut = int((sizes > 1).sum())
            return {"passages": m.passages, "passage_words": s.passage_words, "passage_stride": s.passage_stride,
                    "passage_title": s.passage_title, "documents_cut": cut,
                    "most_passages": int(sizes.max()) if len(sizes) else 0,
                    "passage_whole_up_to": s.passage_whole_up_to, "rerank_whole_up_to": s.rerank_whole_up_to,
                    "summary": f"{cut} of {m.documents} documents are longer than "
                               f"{max(s.passage_words, s.passage_whole_up_to)} words and are searched as overlapping "
                               f"passages ({m.passages} in all; every word is searched)"
                               + (("; the reranker reads " + (f"a document of at most {s.rerank_whole_up_to} words "
                                                              "whole, a longer one" if s.rerank_whole_up_to
                                                              else "each document")
                                   + " by its best passage in each first stage, the higher score counting")
                                  if m.reranker is not None else "")}
        if m.retriever is None:
            return {"passages": 0, "documents_truncated": 0,
                    "summary": f"{m.documents} documents, searched whole by BM25 (no retriever)"}
        return {"passages": 0, "documents_truncated": m.truncated,
                "summary": f"{m.truncated} of {m.documents} documents were longer than the retriever reads "
                           f"({reads} tokens) when added: only their beginning is searched by the dense stage; "
                           "build with passage_words > 0 to search all of them"}

    def info(self) -> dict[str, Any]:
        m = self.manifest
        from twostage.engine.knobs import second_stage

        return {"path": str(self.root), "version": self.version, "documents": m.documents,
                "reading": self.reading(), "language": self.language,
                "second_stage": second_stage(m.settings, m.reranker.name if m.reranker else None,
                                             self._models.reranker),
                "settings": {**to_json_dict(m.settings), "rerank": self.reranks},
                "retriever": asdict(m.retriever) if m.retriever else None,
                "reranker": asdict(m.reranker) if m.reranker else None, "dense": self.index.info(),
                "late_interaction": None if m.late is None or self.tokens is None else {
                    **asdict(m.late), "dim": self.tokens.dim, "tokens": sum(s.tokens for s in self.tokens.segments),
                    "bytes": self.tokens.bytes},
                "bm25": {"documents": len(self.bm25), "config": to_json_dict(self.bm25.config)},
                "metadata_fields": sorted(self.index.metadata_fields()), "metadata_kinds": self.index.metadata_kinds(),
                "versions": m.versions}

    def document_ids(self) -> list[str]:
        """The ids of the live documents, in the order they are stored."""
        if not self.shape.enabled:
            return list(self.bm25.doc_ids)
        return [split_id(str(pid))[0] for pid in self.bm25.doc_ids[self._groups]] if len(self._groups) else []

    def iter_documents(self, chunk: int = 1024) -> Iterator[Document]:
        """Every live document as it was added (whole, not in passages), ``chunk`` read at a time."""
        ids = self.document_ids()
        for start in range(0, len(ids), chunk):
            yield from self.documents(ids[start:start + chunk])

    def documents(self, ids: Iterable[str]) -> list[Document]:
        """The stored documents with these ids (a KeyError names an unknown one)."""
        if not self.shape.enabled:
            return self.index.documents(ids)
        return [doc for doc, _, _ in self.documents_with_passages(ids)]

    def documents_with_passages(self, ids: Iterable[str]) -> list[tuple[Document, list[Document], list[int]]]:
        """Each document with its passages and where each starts in its text (a whole-document engine: the document
        as its one passage)."""
        ids = list(ids)
        if not self.shape.enabled:
            return [(d, [d], [0]) for d in self.index.documents(ids)]
        groups = self._passage_rows(ids)
        stored = self.index.store.documents_at(np.concatenate(groups)) if groups else []
        out, at = [], 0
        for rows in groups:
            passages = stored[at:at + len(rows)]
            at += len(rows)
            doc, starts = join(passages, self.shape)
            out.append((doc, passages, starts))
        return out

    def passages(self, pids: Iterable[str]) -> list[Document]:
        """Stored passages by passage id (``doc_id + SEP + n``, :mod:`twostage.indexer.passages`)."""
        return self.index.documents(pids)

    def _passage_rows(self, ids: list[str]) -> list[np.ndarray]:
        """The index rows of each document's passages (a KeyError names an unknown document)."""
        firsts = self.index.doc_ids.live_rows([passage_id(d, 0) for d in ids], self.index.deleted)
        out = []
        for doc_id, row in zip(ids, firsts):
            if row is None:
                raise KeyError(f"document id {doc_id!r} is not in the engine")
            out.append(self._group_rows(row))
        return out

    def _group_rows(self, first: int) -> np.ndarray:
        """The index rows of the passages of the document whose first passage is at index row ``first``."""
        b = int(np.searchsorted(self.bm25_rows, first))
        g = int(np.searchsorted(self._groups, b))
        end = int(self._groups[g + 1]) if g + 1 < len(self._groups) else len(self.bm25_rows)
        return self.bm25_rows[b:end]

    def passage_ids(self, ids: list[str]) -> list[str]:
        """Every passage id of these documents (an unknown document is a DataError naming it)."""
        try:
            rows = self._passage_rows(ids)
        except KeyError as exc:
            raise DataError(f"cannot delete unknown id: {exc.args[0]}; nothing was changed") from None
        return [str(p) for r in rows for p in self.index.doc_ids[r]]

    def metadata_fields(self) -> set[str]:
        return self.index.metadata_fields()

    def metadata_kinds(self) -> dict[str, str]:
        """Each metadata field's type (number, date, string, ...: :mod:`twostage.indexer.filters`)."""
        return self.index.metadata_kinds()

    # ---- the candidate source (twostage.engine.source.CandidateSource; the search path is SearchMethods') ------
    def candidates(self, queries: list[str], vectors: np.ndarray | None, first_stage: str, n: int, where: Where,
                   timings: dict[str, float], expansion: Expansion | None = None) -> dict[str, list[RankedList]]:
        """Each first stage's top ``n`` for every query ("dense" from the query vectors, "bm25": the query's terms,
        and the ``expansion``'s weighted terms when given)."""
        allowed = self.index.allowed(where)
        lists: dict[str, list[RankedList]] = {}
        if first_stage in ("dense", "hybrid"):
            t = time.perf_counter()
            lists["dense"] = self._dense_search(vectors, n, where, int(allowed.sum()))
            timings["dense_s"] = time.perf_counter() - t
        if first_stage in ("bm25", "hybrid"):
            t = time.perf_counter()
            mask = allowed[self.bm25_rows]
            lists["bm25"] = [self._bm25_search(q, n, mask, expansion) for q in queries]
            timings["bm25_s"] = time.perf_counter() - t
        return lists

    def _dense_search(self, vectors: np.ndarray | None, n: int, where: Where, allowed: int) -> list[RankedList]:
        """The dense top ``n``: documents, or in a passage engine each document once by its best passage (ids are
        then passage ids), the passage list widened until ``n`` documents are found or every allowed row is."""
        assert vectors is not None
        if not self.shape.enabled:
            return self.index.search_batch(vectors, n, where=where)
        out: list[RankedList | None] = [None] * len(vectors)
        todo = np.arange(len(vectors))
        fetch = min(allowed, n * 4)
        while len(todo):
            lists = self.index.search_batch(vectors[todo], max(fetch, 1), where=where)
            short = []
            for i, ranked in zip(todo, lists):
                best = best_per_document(ranked, n)
                if len(best) < n and len(ranked) == fetch and fetch < allowed:
                    short.append(i)
                else:
                    out[i] = best
            todo = np.array(short, dtype=np.int64)
            fetch = min(allowed, fetch * 4)
        return out  # type: ignore[return-value]

    def _bm25_search(self, query: str, k: int, mask: np.ndarray, expansion: Expansion | None = None) -> RankedList:
        if expansion is None:
            scores = self.bm25.scores(query)
        else:
            scores = (self.bm25.scores(query, expansion.terms) if expansion.query_text
                      else self.bm25.term_scores(expansion.terms))
        if not mask.all():
            scores = np.where(mask, scores, 0.0)
        if self.shape.enabled and len(scores):  # a document scores its best passage
            best = np.maximum.reduceat(scores, self._groups)
            groups, values = top_k(best, k, positive_only=True)
            ends = np.append(self._groups[1:], len(scores))
            rows = np.array([int(self._groups[g]) + int(np.argmax(scores[self._groups[g]:ends[g]])) for g in groups],
                            dtype=np.int64)
            return RankedList(self.bm25.doc_ids[rows], values)
        rows, values = top_k(scores, k, positive_only=True)
        return RankedList(self.bm25.doc_ids[rows], values)

    # ---- what steering reads (twostage.engine.steer): each returns the ids it holds, skipping others ------------
    def _rows_of(self, ids: list[str]) -> list[int | None]:
        """The dense index's live row of each id (a document's, or in a passage engine a passage's)."""
        return self.index.doc_ids.live_rows(ids, self.index.deleted) if ids else []

    def example_features(self, ids: list[str], m: int) -> dict[str, tuple[np.ndarray, dict[str, float]]]:
        """Each held document's vector (a passage engine: its passages' mean) and its ``m`` strongest BM25 terms
        with their weight (:meth:`~twostage.retriever.bm25.BM25Retriever.strongest_terms` of its rows: each term's
        highest weight over its passages in a passage engine)."""
        out: dict[str, tuple[np.ndarray, dict[str, float]]] = {}
        firsts = self._rows_of([passage_id(d, 0) for d in ids] if self.shape.enabled else list(ids))
        held = [(d, r) for d, r in zip(ids, firsts) if r is not None]
        groups = [self._group_rows(r) if self.shape.enabled else np.array([r], dtype=np.int64) for _, r in held]
        rows = np.concatenate(groups) if groups else np.zeros(0, dtype=np.int64)
        vectors = self.index.rows(rows) if self.index.dim else np.zeros((len(rows), 0), np.float32)
        # the rows whose texts cover the document's words once: a passage engine's passages that do not overlap (each
        # `step`-th, and the last)
        step = max(1, self.shape.words // self.shape.stride) if self.shape.enabled else 1
        at = 0
        for (doc_id, _), group in zip(held, groups):
            terms: dict[str, float] = {}
            if m > 0:
                cover = group[::step] if (len(group) - 1) % step == 0 else np.append(group[::step], group[-1])
                terms = self.bm25.strongest_terms(np.searchsorted(self.bm25_rows, group), m,
                                                  np.searchsorted(self.bm25_rows, cover))
            out[doc_id] = (vectors[at:at + len(group)].mean(axis=0), terms)
            at += len(group)
        return out

    def held_rows(self, row_ids: list[str]) -> list[bool]:
        """Whether each of ``row_ids`` (documents' ids, or a passage engine's passage ids) is a live row here."""
        return [r is not None for r in self._rows_of(row_ids)]

    def token_scores(self, query: np.ndarray, ids: list[str]) -> np.ndarray:
        """MaxSim of ``query`` (q, dim) against each id's stored token vectors (a live row's; an id without one: a
        ConfigError naming it)."""
        if self.tokens is None:
            raise ConfigError("this engine holds no token vectors; build it with --late-interaction MODEL")
        if query.shape[1:] != (self.tokens.model_dim,):
            raise ConfigError(f"the late-interaction model gives {query.shape[1:]}-d token vectors, the engine's were "
                              f"made by a {self.tokens.model_dim}-d model; use the model the engine was built with")
        rows = self._rows_of(ids)
        missing = [i for i, r in zip(ids, rows) if r is None]
        if missing:
            raise ConfigError(f"no token vectors for {missing[0]!r}: not a live row of this engine")
        return self.tokens.scores(query, [int(r) for r in rows if r is not None])

    def vectors_by_id(self, ids: list[str]) -> dict[str, np.ndarray]:
        """The dense vector of each held id (a document's, or a passage's in a passage engine)."""
        pairs = [(i, r) for i, r in zip(ids, self._rows_of(ids)) if r is not None]
        if not pairs:
            return {}
        vectors = self.index.rows(np.array([r for _, r in pairs], dtype=np.int64))
        return {i: v for (i, _), v in zip(pairs, vectors)}

    def matched_terms(self, terms: dict[str, float], ids: list[str]) -> dict[str, list[tuple[str, float]]]:
        """For each held id (BM25's: a document's, or a passage's), each of ``terms`` (term -> its weight in the
        query) that it holds, with its share of the BM25 score: the query weight times its BM25 weight there."""
        names = list(terms)
        out = {}
        for i, row in zip(ids, self._rows_of(ids)):
            if row is None:
                continue
            b = int(np.searchsorted(self.bm25_rows, row))
            weights = self.bm25.term_weights(names, b)
            out[i] = [(t, terms[t] * w) for t, w in zip(names, weights) if w > 0]
        return out

    # ---- writing (twostage.engine.writes) ----------------------------------------------------------
    @classmethod
    def build(cls, corpus: CorpusSource, path: str | Path, *, retriever: str | Path | None = "auto",
              reranker: str | Path | None = None, settings: EngineSettings | None = None, chunk_size: int = 4096,
              resume: bool = True, show_progress: bool = False, device: str = "auto",
              trust_remote_code: bool = False, late_interaction: str | Path | None = None,
              ray_actors: int = 0, ray_address: str | None = None, **overrides: Any) -> SearchEngine:
        """Read ``corpus`` (BEIR dir, jsonl, parquet, CSV, DataFrame or Documents), encode it, index it for BM25
        and dense search, and save the engine at ``path`` (a new version when an engine is already there).

        ``overrides`` set fields of :class:`EngineSettings` (``first_stage="dense"``, ``backend="flat"``, ...).
        An interrupted build resumes from the chunks already encoded when run again. ``device``: where the models
        encode (cpu, cuda, cuda:N or auto); the engine opens on any device afterwards. ``trust_remote_code`` lets
        both models run Python code shipped with them (off by default; recorded in the manifest, so the engine
        loads them the same way later).

        ``retriever="auto"`` (the default): all-MiniLM-L6-v2, or multilingual-e5-small when the corpus's languages
        are not all English and it is on this machine (:func:`twostage.engine.writes.choose_retriever`).
        ``retriever=None`` builds a BM25-only engine (no dense index, nothing encoded; with a reranker, BM25's
        candidates reranked): its first stage is bm25, and dense or hybrid searches are refused.

        ``late_interaction``: a ColBERT model (PyLate or Stanford layout), or a bi-encoder read token by token (the
        zero-shot baseline), by name or directory: every row's token vectors are stored (``late/``) and MaxSim
        reorders the first stage's top ``maxsim_depth`` before the reranker (docs/late-interaction.md).

        ``ray_actors``: encode the corpus with that many Ray actors (``pip install 'twostage-search[ray]'``; a local
        Ray instance, or the cluster at ``ray_address``), on CPU; the engine written is the one encoded here.

        Raises:
            DataNotFoundError: ``corpus`` does not exist.
            DataError: a corpus line or file that cannot be read (named, with its line), or duplicate ids.
            ModelNotFoundError: a model name or directory that is not on this machine.
            ConfigError: a setting out of range, or ``path`` already holding something else.
        """
        from twostage.engine.writes import EngineWriter

        return EngineWriter.build(cls, corpus, path, retriever=retriever, reranker=reranker, settings=settings,
                            chunk_size=chunk_size, resume=resume, show_progress=show_progress, device=device,
                            trust_remote_code=trust_remote_code, late_interaction=late_interaction,
                            ray_actors=ray_actors, ray_address=ray_address, **overrides)

    def add(self, documents: CorpusSource, *, show_progress: bool = False) -> SearchEngine:
        """Add documents (new ids only) to documents, BM25 and the dense index in one version; returns it. A
        passage engine adds every passage of each document in that version.

        Raises:
            DataError: a document that cannot be read, or an id the engine already holds (nothing is written).
            WriterBusyError: another writer holds the lock past the wait.
        """
        from twostage.engine.writes import EngineWriter

        return EngineWriter(self).add(documents, show_progress=show_progress)

    def upsert(self, documents: CorpusSource, *, show_progress: bool = False) -> SearchEngine:
        """Replace the documents with these ids and add the new ones, in one version (a passage engine replaces
        all of a document's passages)."""
        from twostage.engine.writes import EngineWriter

        return EngineWriter(self).upsert(documents, show_progress=show_progress)

    def delete(self, ids: Iterable[str]) -> SearchEngine:
        """Delete documents by id (an unknown id is an error naming it), in one version; a passage engine deletes
        every passage of each.

        Raises:
            ConfigError: no ids, or an id that is not a string.
            DataError: an id the engine does not hold (named; nothing is written).
            WriterBusyError: another writer holds the lock past the wait.
        """
        from twostage.engine.writes import EngineWriter

        return EngineWriter(self).delete(ids)

    def compact(self) -> SearchEngine:
        """Rewrite the dense part without deleted rows (BM25 already holds only live documents)."""
        from twostage.engine.writes import EngineWriter

        return EngineWriter(self).compact()

    def late_interaction(self, model: str | Path, *, dim: int = 0, bits: int = 8, show_progress: bool = False,
                         trust_remote_code: bool = False, serve_choice: bool = False) -> SearchEngine:
        """A new version with every row's token vectors by ``model`` (a ColBERT checkpoint, or a bi-encoder read
        token by token), so that MaxSim reorders the first stage's top ``maxsim_depth``; returns it. ``dim``: store
        them projected to this many dimensions (0: the model's); ``bits``: 8 or 4 a dimension; ``serve_choice``:
        serve the MaxSim weight the model's training chose on dev (in the same commit; none recorded: the settings
        as they are)."""
        from twostage.engine.writes import EngineWriter

        return EngineWriter(self).late_interaction(model, dim=dim, bits=bits, show_progress=show_progress,
                                                   trust_remote_code=trust_remote_code, serve_choice=serve_choice)

    def configure(self, settings: EngineSettings | None = None, **changes: Any) -> SearchEngine:
        """A new version with other search settings (first stage, depths, blend, rerank, precision); the documents
        and indexes are carried over as they are. Index-shape settings (backend, metric) need a rebuild."""
        from twostage.engine.writes import EngineWriter

        return EngineWriter(self).configure(settings, **changes)

    def encode_rows(self, docs: list[Document], show_progress: bool = False) -> tuple[np.ndarray, int]:
        """The vectors of these rows (documents or passages), and how many were longer than the encoder reads."""
        from twostage.engine.writes import EngineWriter

        return EngineWriter(self).encode_rows(docs, show_progress)

    def commit_change(self, make: Callable[[SearchEngine], tuple[IndexChange, list[Document] | None]],
                      settings: EngineSettings | None = None, *, bm25: BM25Retriever | None = None,
                      pinned: bool = False, truncated: int = 0) -> SearchEngine:
        """Lock, re-open the version current now, apply ``make`` to it, write every part, commit, return it
        (:meth:`twostage.engine.writes.EngineWriter.commit_change`)."""
        from twostage.engine.writes import EngineWriter

        return EngineWriter(self).commit_change(make, settings, bm25=bm25, pinned=pinned, truncated=truncated)
