"""A search engine split into shards that answers exactly as one engine: one query encoding, fan-out, pure merge.

    SHARDED_DIR/
      LOCK, CURRENT          a versioned directory (twostage.indexer.versions)
      vNNNNNN/manifest.json  format twostage.sharded-engine: each shard's directory and the version it serves
      shard-000/ ...         normal engine directories (``twostage search SHARDED_DIR/shard-000 ...`` works)

**Exactness.** Every shard's BM25 scores with the statistics of the whole corpus (document count, average length,
document frequencies summed over the shards: :mod:`twostage.retriever.bm25_stats`), so a document's BM25 score
in its shard is bit for bit its score in one engine. Each shard returns its top ``n`` per first stage; the merge
keeps the global top ``n`` (:func:`twostage.indexer.records.merge_topk`; equal scores: earlier shard first, which
for a built engine, whose shards are contiguous slices of the corpus, is corpus order). RRF and the reranker then
run once, here, on the merged candidates. With an exact dense backend (``backend="flat"``) the sharded engine's
BM25, dense and hybrid top k are the single engine's; with an ANN backend each shard's graph differs from one
big graph, so the dense lists agree only as far as the ANN recall goes.

**Updates** (``add``, ``upsert``, ``delete``) route a new document to a shard by a stable hash of its id (an
existing id stays in its shard), then write a new version of *every* shard (the global statistics changed, so
every shard's BM25 is rebuilt with them), and commit by writing the top-level version that names them: a crash
before that leaves the sharded engine at its previous versions (the shards' own ``CURRENT`` may then be ahead;
the next sharded write starts again from the pinned versions). ``compact`` rewrites each shard's dense part
without its deleted rows and commits the same way. Only write to the shards through this class.
Documents added later that tie *exactly* with others (equal BM25 or dense scores) may come in another order than
in one engine, which orders ties by arrival; a hybrid list built from such a tie can then differ too.

Shards are searched in this process or by Ray actors (``ShardedEngine.load(path, ray=True, replicas=R)``): R per
shard, spread over the cluster's nodes, a lost one replaced (:mod:`twostage.engine.replicas`).
"""

from __future__ import annotations

import hashlib
import logging
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import AbstractContextManager, nullcontext
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np

from twostage.engine.models import Models
from twostage.engine.on_disk import SHARDED_FORMAT
from twostage.engine.replicas import ReplicatedShards
from twostage.engine.search import SearchMethods, ids_to_delete
from twostage.engine.search_engine import SearchEngine
from twostage.engine.settings import EngineSettings, check_replicas, with_changes
from twostage.engine.steer import Expansion
from twostage.indexer.build import check_unique_ids, chunk_documents, slice_chunks
from twostage.indexer.corpus import CorpusSource, iter_documents
from twostage.indexer.errors import ConfigError, DataError, IndexFormatError, PageExpiredError
from twostage.indexer.filters import Where, merge_kinds
from twostage.indexer.index import IndexChange
from twostage.indexer.manifest import check_file_name, manifest_text, read_manifest_json
from twostage.indexer.records import Document, RankedList, contiguous_bounds, merge_topk
from twostage.indexer.versions import VERSION, Lease, commit, current_version, open_current, writer_lock
from twostage.retriever.analyzer import Analyzer
from twostage.retriever.bm25 import BM25Config, BM25Retriever, with_corpus_languages
from twostage.retriever.bm25_stats import CorpusStats

logger = logging.getLogger(__name__)

FORMAT, FORMAT_VERSION = SHARDED_FORMAT, 1
WHAT = "a sharded search engine directory (build one with ShardedEngine.build)"
Lists = dict[str, list[tuple[list[str], list[float]]]]


def shard_of(doc_id: str, shards: int) -> int:
    """The shard a new document goes to: a stable hash of its id (the same on every machine and run)."""
    digest = hashlib.blake2b(doc_id.encode("utf-8"), digest_size=8).digest()
    return int.from_bytes(digest, "big") % shards


class _Shard:
    """One shard, opened at the version its sharded engine names; what the coordinator (or a Ray actor) calls."""

    def __init__(self, root: str, version: str, verify: bool = True) -> None:
        version_dir = Path(root) / version
        try:
            lease = Lease(version_dir)
        except OSError:
            raise IndexFormatError(f"{version_dir}: the shard version the sharded engine names is gone") from None
        if not (version_dir / "manifest.json").is_file():
            lease.release()
            raise IndexFormatError(f"{version_dir}: the shard version the sharded engine names is gone")
        try:
            self.engine = SearchEngine.open_version(Path(root), version_dir, lease, verify)
        except BaseException:
            lease.release()
            raise

    def candidates(self, queries: list[str], vectors: np.ndarray | None, first_stage: str, n: int,
                   where: Where, expansion: Expansion | None = None) -> Lists:
        lists = self.engine.candidates(queries, vectors, first_stage, n, where, {}, expansion)
        return {name: [([str(i) for i in r.ids], r.scores.astype(np.float32).tolist()) for r in ls]
                for name, ls in lists.items()}

    def documents(self, ids: list[str]) -> list[Document]:
        return self.engine.documents([i for i in ids if i in self.engine])

    def example_features(self, ids: list[str], m: int) -> dict[str, tuple[np.ndarray, dict[str, float]]]:
        return self.engine.example_features(ids, m)

    def vectors_by_id(self, ids: list[str]) -> dict[str, np.ndarray]:
        return self.engine.vectors_by_id(ids)

    def matched_terms(self, terms: dict[str, float], ids: list[str]) -> dict[str, list[tuple[str, float]]]:
        return self.engine.matched_terms(terms, ids)

    def token_scores(self, query: np.ndarray, ids: list[str]) -> dict[str, float]:
        held = [i for i, here in zip(ids, self.engine.held_rows(ids)) if here]
        return dict(zip(held, self.engine.token_scores(query, held).tolist())) if held else {}

    def holds(self, ids: list[str]) -> list[bool]:
        return [i in self.engine for i in ids]

    def size(self) -> int:
        return len(self.engine)

    def metadata_kinds(self) -> dict[str, str]:
        return self.engine.metadata_kinds()

    def manifest(self) -> Any:
        return self.engine.manifest

    def analyzer_config(self) -> Any:
        """The shard's BM25 analysis, the corpus's languages included (every shard of one engine has the same)."""
        return self.engine.analyzer().config

    def close(self) -> None:
        self.engine.close()


class ShardedEngine(SearchMethods):
    """N engine directories searched as one. Build with :meth:`build`, open with :meth:`load`.

    >>> engine = ShardedEngine.build("corpus.jsonl", "engines/docs", shards=4, retriever="all-MiniLM-L6-v2")
    >>> engine = ShardedEngine.load("engines/docs", ray=True)      # one Ray actor per shard
    >>> engine = ShardedEngine.load("engines/docs", ray=True, address="auto", replicas=2)  # two, on other nodes
    >>> engine.search("why do cats purr", k=10).hits[0].id
    """

    def __init__(self, root: Path, version_dir: Path, names: list[tuple[str, str]], shards: Any,
                 lease: Lease | None, *, ray: Any = None, local: list[_Shard] | None = None) -> None:
        self.root, self.version_dir, self.names = root, version_dir, names
        self._shards: Any = shards  # the local shards (a list), or their Ray replicas (ReplicatedShards)
        self._ray, self._lease = ray, lease
        self._local = local  # the shards as objects in this process (None when they are Ray actors)
        # how it was opened: ray, address, num_cpus, cpus_per_shard, replicas
        self._opening: tuple[Any, ...] = (False, None, None, None, 1)
        self._size = sum(self._call("size"))
        # the analysis queries are read with (their language decides which stages and models serve them, the terms
        # a hit marks): the shards' own, corpus languages included, in Ray actors as in this process
        analyses = self._call("analyzer_config")
        if any(a != analyses[0] for a in analyses):
            raise IndexFormatError(f"{root}: its shards analyse text differently (their corpus languages differ); "
                                   "rebuild the sharded engine")
        self._analysis = analyses[0]
        self._analyzer: Any = None
        manifests = self._call("manifest")
        self.manifest = manifests[0]
        self._models = Models()
        for (name, _), m in zip(names, manifests):  # searched as one engine: the same models and settings
            if (m.settings, m.retriever and m.retriever.sha256, m.reranker and m.reranker.sha256) != \
                    (self.manifest.settings, self.manifest.retriever and self.manifest.retriever.sha256,
                     self.manifest.reranker and self.manifest.reranker.sha256):
                raise IndexFormatError(f"{root / name}: its settings or models differ from the first shard's; "
                                       "the shards of one engine must match: rebuild the sharded engine")

    # ---- opening -------------------------------------------------------------------------------
    @classmethod
    def load(cls, path: str | Path, *, verify: bool = True, ray: bool = False, address: str | None = None,
             num_cpus: int | None = None, cpus_per_shard: float | None = None, replicas: int = 1) -> ShardedEngine:
        """Open a sharded engine: every shard at the version the sharded manifest names (checked like an engine).

        ``ray``: serve each shard from ``replicas`` Ray actors on different nodes (:mod:`twostage.engine.replicas`),
        each holding ``cpus_per_shard`` CPUs (default: one, or an equal share of a cluster with fewer CPUs than
        actors); ``address`` joins an existing cluster. The shard files must be readable at the same path on
        every node (a shared file system).
        """
        root = Path(path)
        if not root.is_dir():
            raise IndexFormatError(f"{root}: no such sharded engine directory")
        if check_replicas(replicas) != 1 and not ray:
            raise ConfigError("replicas need ray=True: in one process each shard is opened once")
        return open_current(root, lambda v, lease: cls._open(root, v, lease, verify, ray, address, num_cpus,
                                                             cpus_per_shard, replicas), WHAT)

    @classmethod
    def _open(cls, root: Path, version_dir: Path, lease: Lease | None, verify: bool, ray: bool = False,
              address: str | None = None, num_cpus: int | None = None,
              cpus_per_shard: float | None = None, replicas: int = 1) -> ShardedEngine:
        names = read_sharded_manifest(version_dir)
        if not ray:
            local = []
            try:
                for name, version in names:
                    local.append(_Shard(str(root / name), version, verify))
            except BaseException:
                for s in local:
                    s.close()
                raise
            engine = cls(root, version_dir, names, local, lease, local=local)
        else:
            from twostage.indexer.ray_util import connect

            ray_mod = connect(address, num_cpus)
            nodes = [float(n["Resources"]["CPU"]) for n in ray_mod.nodes()
                     if n.get("Alive") and n.get("Resources", {}).get("CPU")] or [1.0]
            actors = len(names) * replicas
            # by default each actor gets half an equal share of the smallest node: every node can hold its share of
            # the actors (a share of the cluster's total can leave one that no node fits), and the next version's
            # replicas (a write) start while this version's still serve
            per = min(1.0, min(nodes) / (2 * -(-actors // len(nodes)))) if cpus_per_shard is None else cpus_per_shard
            if per * actors > sum(nodes):
                raise ConfigError(f"{actors} shard actors x {per} CPUs need more than the cluster's "
                                  f"{sum(nodes):g} CPUs: they would wait forever; lower cpus_per_shard")
            shards = ReplicatedShards(ray_mod, ray_mod.remote(_Shard),
                                      [(str((root / name).resolve()), version) for name, version in names],
                                      verify=verify, replicas=replicas, num_cpus=per)
            try:
                engine = cls(root, version_dir, names, shards, lease, ray=ray_mod)
            except BaseException:
                shards.close()
                raise
        engine._opening = (ray, address, num_cpus, cpus_per_shard, replicas)
        return engine

    def _reopen(self) -> ShardedEngine:
        """The committed version now, opened as this one was (Ray or not), sharing this one's loaded models."""
        engine = open_current(self.root, lambda v, lease: ShardedEngine._open(self.root, v, lease, False,
                                                                               *self._opening), WHAT)
        engine._models = self._models
        return engine

    def refresh(self, *, verify: bool = False) -> ShardedEngine:
        """This engine at the newest committed version (``self`` when nothing changed); models are kept."""
        if current_version(self.root, WHAT) == self.version_dir:
            return self
        return self._reopen()

    def close(self) -> None:
        """Release every shard's version (and stop the Ray actors); a view releases nothing."""
        if self.read_only:
            return
        if self._ray is not None:
            self._shards.close()
        elif self._local:
            for s in self._local:
                s.close()
        self._shards = []
        if self._lease is not None:
            self._lease.release()

    # ---- properties (settings, version, precision, reranker: SearchMethods) -----------------------
    def __len__(self) -> int:
        return self._size

    def __contains__(self, doc_id: object) -> bool:
        return isinstance(doc_id, str) and self.holder([doc_id])[0] is not None

    @property
    def encoder(self) -> Any:
        """The bi-encoder (loaded once, here: queries are encoded once for every shard)."""
        return self.loaded_encoder()

    def info(self) -> dict[str, Any]:
        sizes = self._call("size")
        live = self._shards.health() if self._ray is not None else [1] * len(self.names)
        from twostage.engine.knobs import second_stage

        rr = self.manifest.reranker
        return {"path": str(self.root), "version": self.version, "documents": self._size, "language": self.language,
                "second_stage": second_stage(self.settings, rr.name if rr else None, self._models.reranker),
                "shards": [{"name": n, "version": v, "documents": c, "live_replicas": r}
                           for (n, v), c, r in zip(self.names, sizes, live)],
                "metadata_kinds": self.metadata_kinds(), "remote": self._ray is not None}

    @property
    def replicas(self) -> Any:
        """The Ray actors holding the shards (:class:`~twostage.engine.replicas.ReplicatedShards`: ``health()``,
        ``placement()``, ``events``), or None when the shards are opened in this process."""
        return self._shards if self._ray is not None else None

    def analyzer(self) -> Any:
        """The shards' BM25 analysis (the same in every shard, the corpus's languages included): the first shard's
        analyzer when the shards are in this process, else one made here from their configuration. (One of the
        engine's language alone, as before #84, detected some queries' language differently from one engine,
        which then searched them without the dense model: 1 SciFact query in 300.)"""
        if self._ray is None and self._shards:
            return self._shards[0].engine.analyzer()
        if self._analyzer is None:
            from twostage.retriever.analyzer import Analyzer

            self._analyzer = Analyzer(self._analysis)
        return self._analyzer

    def metadata_kinds(self) -> dict[str, str]:
        """Each metadata field's type over every shard (a field typed differently in two shards is ``mixed``)."""
        return merge_kinds(self._call("metadata_kinds"))

    def metadata_fields(self) -> set[str]:
        return set(self.metadata_kinds())

    def _call(self, method: str, *args: Any) -> list[Any]:
        if self._ray is not None:
            return self._shards.call(method, *args)
        return [getattr(s, method)(*args) for s in self._shards]

    # ---- searching -----------------------------------------------------------------------------
    def candidates(self, queries: list[str], vectors: np.ndarray | None, first_stage: str, n: int, where: Where,
                   timings: dict[str, float], expansion: Expansion | None = None) -> dict[str, list[RankedList]]:
        t = time.perf_counter()
        per_shard = self._call("candidates", queries, vectors, first_stage, n, where, expansion)
        timings["shards_s"] = time.perf_counter() - t
        t = time.perf_counter()
        out = {}
        for name in per_shard[0]:
            out[name] = [merge_topk([RankedList(np.array(shard[name][q][0], dtype=object),
                                                np.array(shard[name][q][1], dtype=np.float32))
                                     for shard in per_shard], n) for q in range(len(queries))]
        timings["merge_s"] = time.perf_counter() - t
        return out

    def documents(self, ids: Iterable[str]) -> list[Document]:
        """The stored documents with these ids, in that order (a KeyError names an unknown one)."""
        ids = list(ids)
        found = {d.id: d for part in self._call("documents", ids) for d in part}
        missing = next((i for i in ids if i not in found), None)
        if missing is not None:
            raise KeyError(missing)
        return [found[i] for i in ids]

    def example_features(self, ids: list[str], m: int) -> dict[str, tuple[np.ndarray, dict[str, float]]]:
        return {k: v for part in self._call("example_features", ids, m) for k, v in part.items()}

    def vectors_by_id(self, ids: list[str]) -> dict[str, np.ndarray]:
        return {k: v for part in self._call("vectors_by_id", ids) for k, v in part.items()}

    def matched_terms(self, terms: dict[str, float], ids: list[str]) -> dict[str, list[tuple[str, float]]]:
        return {k: v for part in self._call("matched_terms", terms, ids) for k, v in part.items()}

    def token_scores(self, query: np.ndarray, ids: list[str]) -> np.ndarray:
        found = {k: v for part in self._call("token_scores", query, ids) for k, v in part.items()}
        return np.array([found.get(i, 0.0) for i in ids], dtype=np.float32)

    def documents_with_passages(self, ids: Iterable[str]) -> list[tuple[Document, list[Document], list[int]]]:
        """Each document as its one passage (the shards hold whole documents)."""
        return [(d, [d], [0]) for d in self.documents(ids)]

    def passages(self, pids: Iterable[str]) -> list[Document]:
        """A sharded engine holds whole documents, no passages."""
        raise ConfigError("this engine holds whole documents, not passages")

    def at_version(self, version: str) -> AbstractContextManager[ShardedEngine]:
        """This engine as it was at ``version`` (for page tokens): only the version it has open."""
        if version != self.version:
            raise PageExpiredError(f"page_token: it belongs to version {version}, the engine is now at "
                                   f"{self.version}; search again for the first page")
        return nullcontext(self)

    def holder(self, ids: Sequence[str]) -> list[int | None]:
        """The shard holding each id (None: no shard)."""
        held = self._call("holds", list(ids))
        return [next((s for s in range(len(held)) if held[s][i]), None) for i in range(len(ids))]

    # ---- building ------------------------------------------------------------------------------
    @classmethod
    def build(cls, corpus: CorpusSource, path: str | Path, *, shards: int, retriever: str | Path = "auto",
              reranker: str | Path | None = None, settings: EngineSettings | None = None, chunk_size: int = 4096,
              resume: bool = True, show_progress: bool = False, **overrides: Any) -> ShardedEngine:
        """Encode ``corpus`` once (as one engine would: the same vectors), split it into ``shards`` contiguous
        slices, write each as an engine whose BM25 scores with the whole corpus's statistics, then commit the
        sharded manifest naming them. Opens it in this process."""
        from tqdm.auto import tqdm

        from twostage.engine.writes import bm25_settings, encode_for_build, write_streamed

        root = Path(path)
        if retriever is None:
            raise ConfigError("a sharded engine needs a retriever; build a BM25-only engine as one engine")
        if root.exists() and any(p.name != "LOCK" for p in root.iterdir()):
            raise ConfigError(f"{root}: exists and is not empty; choose another --out (add documents with add)")
        if overrides.get("passage_words"):
            raise ConfigError("a sharded engine holds whole documents (passage_words 0); build one engine for "
                              "passages, or leave passage_words out")
        # shards are contiguous slices of rows, which would cut a document's passages apart: whole documents
        settings = with_changes(settings or EngineSettings(), overrides, "build")
        if settings.passage_words:
            logger.info("a sharded engine holds whole documents: passage_words %d set to 0", settings.passage_words)
            settings = replace(settings, passage_words=0)
        # the one build path (twostage.engine.writes.encode_for_build), on the CPU; then a version per slice
        settings, enc = encode_for_build(corpus, root, settings, overrides, retriever=retriever, reranker=reranker,
                                         chunk_size=chunk_size, resume=resume, show_progress=show_progress,
                                         device="cpu")
        total = sum(int(c["rows"]) for c in enc.done)
        bounds = contiguous_bounds(total, shards)
        check_unique_ids(enc.work, enc.done)  # across shards (each shard's build checks its own rows)
        bm25 = bm25_settings(settings)
        if bm25.analyzer.language == "auto":  # the whole corpus's languages, the same in every shard
            bm25 = with_corpus_languages(bm25, chunk_documents(enc.work, enc.done))
        stats = _stats([lambda: chunk_documents(enc.work, enc.done)], bm25)
        names = []
        with writer_lock(root):
            for i, (start, stop) in enumerate(tqdm(bounds, desc="write shards", unit="shard",
                                                   disable=not show_progress)):
                name = f"shard-{i:03d}"
                part = enc.work / name  # the shard's rows of the encoded chunks: links, and the cut chunks
                write_streamed(root / name, replace(enc, work=part, done=slice_chunks(enc.work, enc.done, start,
                                                                                        stop, part)), settings, stats,
                               bm25)
                names.append((name, current_version(root / name).name))
            _commit(root, names, total)
        enc.discard()
        return cls.load(root, verify=False)

    # ---- updating ------------------------------------------------------------------------------
    def add(self, documents: CorpusSource, *, show_progress: bool = False) -> ShardedEngine:
        """Add documents (new ids only), each to the shard its id hashes to; one new sharded version."""
        return self._update(list(iter_documents(documents)), [], replace_docs=False)

    def upsert(self, documents: CorpusSource, *, show_progress: bool = False) -> ShardedEngine:
        """Replace the documents with these ids (in the shard holding each) and add the new ones."""
        return self._update(list(iter_documents(documents)), [], replace_docs=True)

    def delete(self, ids: Iterable[str]) -> ShardedEngine:
        """Delete documents by id (an unknown id is an error naming it); one new sharded version."""
        return self._update([], ids_to_delete(ids), replace_docs=False)

    def compact(self) -> ShardedEngine:
        """Rewrite every shard's dense part without its deleted rows (each shard's BM25 already holds only live
        documents), then commit the sharded manifest naming the compacted versions."""
        self.check_writable()
        with writer_lock(self.root):
            base = open_current(self.root, lambda v, lease: ShardedEngine._open(self.root, v, lease, False), WHAT)
            try:
                names = []
                for (name, _), shard in zip(base.names, base._local):
                    new = shard.engine.commit_change(lambda b: (b.index.change_compact(), None), pinned=True)
                    names.append((name, new.version))
                    new.close()
                _commit(self.root, names, len(base))
            finally:
                base.close()
        return self._reopen()

    def _update(self, docs: list[Document], delete: list[str], *, replace_docs: bool) -> ShardedEngine:
        """Under the sharded writer lock: re-open the committed version, route the change, write every shard's next
        version (BM25 rebuilt with the new global statistics), then commit the manifest that names them."""
        self.check_writable()
        with writer_lock(self.root):
            base = open_current(self.root, lambda v, lease: ShardedEngine._open(self.root, v, lease, False), WHAT)
            try:
                n = len(base.names)
                ids = [d.id for d in docs] + delete
                where = dict(zip(ids, base.holder(ids)))
                unknown = next((i for i in delete if where[i] is None), None)
                if unknown is not None:
                    raise DataError(f"cannot delete unknown id {unknown!r}")
                known = next((d.id for d in docs if where[d.id] is not None), None)
                if known is not None and not replace_docs:
                    raise DataError(f"document id {known!r} is already in the engine; use upsert to replace it")
                target = np.array([where[d.id] if where[d.id] is not None else shard_of(d.id, n) for d in docs],
                                  dtype=np.int64)
                route = [[d for d, t in zip(docs, target) if t == s] for s in range(n)]
                gone = [[i for i in delete if where[i] == s] for s in range(n)]
                shards = [s.engine for s in base._local]
                encoder = self.encoder
                for s in shards:  # every shard encodes with the one encoder already loaded here
                    s.use_models(encoder=encoder)
                # encoded in one pass, as one engine would (a document's vector depends on its batch's padding)
                encoded = shards[0].encode_rows(docs)[0] if docs else None
                vectors = [encoded[target == s] if route[s] else None for s in range(n)]
                bm25_of, stats = _bm25_updates(shards, route, gone, replace_docs)
                names = []
                for s, engine in enumerate(shards):
                    bm25 = bm25_of(s)
                    new = engine.commit_change(_change(route[s], vectors[s], gone[s], replace_docs), bm25=bm25,
                                         pinned=True)
                    names.append((base.names[s][0], new.version))
                    new.close()
                _commit(self.root, names, stats.num_docs)
            finally:
                base.close()
        return self._reopen()


def _change(docs: list[Document], vectors: np.ndarray | None, delete: list[str],
            replace_docs: bool) -> Callable[[SearchEngine], tuple[IndexChange, list[Document]]]:
    def make(base: SearchEngine) -> tuple[IndexChange, list[Document]]:
        if delete:
            return base.index.change_delete(delete), []
        if docs:
            return base.index.change_add(docs, vectors, replace=replace_docs), docs
        return base.index.change_unchanged(), []  # [] (not None): BM25 is written anew, with the new statistics
    return make


def _bm25_updates(shards: list[SearchEngine], route: list[list[Document]], gone: list[list[str]],
                  replace_docs: bool) -> tuple[Callable[[int], BM25Retriever], CorpusStats]:
    """The global statistics after the change, and a function giving shard ``s``'s new BM25 scored with them: from
    the stored postings (only the new documents analysed) or, where a shard's BM25 keeps none (saved by an older
    version), from every live document streamed from the stores. A shard's new postings are derived twice (for its
    statistics, then for its index) so that only one shard's new arrays are held at a time."""
    if all(e.bm25.postings is not None for e in shards):
        keeps = []
        for s, e in enumerate(shards):
            drop = set(gone[s]) | ({d.id for d in route[s]} if replace_docs else set())
            keeps.append(np.fromiter((i not in drop for i in e.bm25.doc_ids), dtype=bool, count=len(e.bm25)))
        stats = CorpusStats.combine(e.bm25.stats_after(keeps[s], route[s]) for s, e in enumerate(shards))
        return lambda s: shards[s].bm25.updated(keeps[s], route[s], stats=stats), stats
    lives = [_live_docs(shards[s], route[s], gone[s], replace_docs) for s in range(len(shards))]
    stats = _stats(lives, shards[0].bm25.config)
    return lambda s: BM25Retriever.build_chunked(lives[s], shards[s].bm25.config, stats=stats), stats


def _live_docs(engine: SearchEngine, docs: list[Document], delete: list[str],
               replace_docs: bool) -> Callable[[], Iterator[list[Document]]]:
    """A shard's live documents after the change, as a source of chunks that can be read more than once: its
    kept documents a row group at a time (:meth:`DocStore.document_chunks`), then the new ones."""
    drop = set(delete) | ({d.id for d in docs} if replace_docs else set())
    live = np.flatnonzero(~engine.index.deleted)

    def chunks() -> Iterator[list[Document]]:
        for _, part in engine.index.store.document_chunks(live):
            kept = [d for d in part if d.id not in drop]
            if kept:
                yield kept
        if docs:
            yield list(docs)

    return chunks


def _stats(sources: Sequence[Callable[[], Iterable[Sequence[Document]]]], config: BM25Config) -> CorpusStats:
    """The statistics of every shard's live documents together, a chunk at a time, analysed as ``config`` says."""
    analyzer = Analyzer(config.analyzer)
    return CorpusStats.combine(CorpusStats.of(analyzer.analyse(d.full_text) for d in part)
                               for source in sources for part in source())


def _commit(root: Path, names: list[tuple[str, str]], documents: int) -> None:
    with commit(root) as version:
        text = manifest_text(FORMAT, FORMAT_VERSION, {}, shards=[{"name": n, "version": v} for n, v in names],
                             counts={"documents": documents})
        (version.tmp / "manifest.json").write_text(text, encoding="utf-8")


def read_sharded_manifest(version_dir: Path) -> list[tuple[str, str]]:
    """The (shard directory, version) pairs a sharded version names, each checked to be a plain name."""
    data = read_manifest_json(version_dir, FORMAT, FORMAT_VERSION, "a sharded search engine", "ShardedEngine.build")
    shards = data.get("shards")
    where = version_dir / "manifest.json"
    if not isinstance(shards, list) or not shards or not all(
            isinstance(s, dict) and isinstance(s.get("name"), str) and isinstance(s.get("version"), str)
            for s in shards):
        raise IndexFormatError(f"{where}: shards must be a non-empty list of {{name, version}}; restore or rebuild")
    out = []
    for s in shards:
        check_file_name(s["name"], where)
        if not VERSION.match(s["version"]):
            raise IndexFormatError(f"{where}: shard {s['name']!r} names version {s['version'][:20]!r}, not vNNNNNN")
        out.append((s["name"], s["version"]))
    return out


__all__ = ["ShardedEngine", "read_sharded_manifest", "shard_of"]
