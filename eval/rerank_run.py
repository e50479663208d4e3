"""Rerank someone else's candidates: a TREC run's top documents of each query, read again by a cross-encoder.

The run may come from any system (Pyserini, PyTerrier, a bench run). Each query's top ``depth`` documents are
scored with the query by the cross-encoder, blended with the run's own scores as the engine blends its first stage
(:mod:`twostage.engine.fusion`), and the rest of the run's list follows in its order, exactly as the
harness's ``bm25+rerank`` system does with its own BM25 list. It goes through the engine's own reranking: the
run's top documents are put in a temporary BM25-only engine (whole documents) with the reranker, whose
:meth:`~twostage.engine.search.SearchMethods.rerank` reads and blends them.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

from twostage.engine.settings import EngineSettings, is_blend, renamed, renames
from twostage.eval.run import Run
from twostage.indexer.beir import BeirDataset
from twostage.indexer.errors import ConfigError, DataError
from twostage.indexer.records import check_k

logger = logging.getLogger(__name__)
FIRST_STAGES = ("bm25", "dense", "hybrid")


def rerank_run(run: Run, data: str | Path | BeirDataset, reranker: str | Path, *,
               rerank_depth: int = EngineSettings().rerank_depth, rerank_blend: float | str | None = "auto",
               precision: str = "auto", batch_size: int = 32, source: str = "run", show_progress: bool = False,
               device: str = "auto", **old_names: Any) -> Run:
    """``run`` with the top ``rerank_depth`` of each query reranked by ``reranker`` (a directory or name); the
    defaults are the engine's (``depth`` and ``interpolation``, the old names, still work with a warning).

    ``rerank_blend``: ``"auto"`` takes the blend the reranker chose on dev for the run's first stage (the run's
    name, when it is bm25, dense or hybrid; else its overall choice), ``None`` ranks by the reranker alone, a number
    in [0, 1] is the blend. Every query and document of the run must be in ``data`` (else a DataError naming it).
    Queries are reranked one at a time, as the harness does, so the scores equal its ``+rerank`` systems'.
    """
    import shutil
    import tempfile

    from tqdm.auto import tqdm

    from twostage.engine.knobs import dev_choice
    from twostage.engine.search_engine import SearchEngine

    unknown = sorted(set(old_names) - set(renames("rerank")))
    if unknown:
        raise ConfigError(f"rerank_run: unknown argument(s) {', '.join(unknown)}")
    given = renamed(old_names, "rerank_run", "rerank")
    depth = check_k(given.get("rerank_depth", rerank_depth))
    interpolation = given.get("rerank_blend", rerank_blend)
    dataset = data if isinstance(data, BeirDataset) else BeirDataset(data)
    queries, corpus = dataset.queries, dataset.corpus
    for qid, ranked in run.items():
        if qid not in queries:
            raise DataError(f"{source}: query {qid!r} is not in {dataset.root / 'queries.jsonl'}; rerank a run of "
                            "this collection")
        missing = [str(d) for d in ranked.ids[:depth] if str(d) not in corpus]
        if missing:
            raise DataError(f"{source}: document {missing[0]!r} (query {qid!r}) is not in "
                            f"{dataset.root / 'corpus.jsonl'}; rerank a run of this collection")
    if interpolation != "auto" and not is_blend(interpolation):
        raise ConfigError(f"rerank_blend must be auto, none or a number in [0, 1], got {interpolation!r}")
    heads = sorted({str(d) for ranked in run.values() for d in ranked.ids[:depth]})
    if not heads:
        raise DataError(f"{source}: no query lists a document; nothing to rerank")
    work = Path(tempfile.mkdtemp(prefix="twostage-rerank-"))
    try:  # the run's candidates in a temporary BM25-only engine (whole documents): reranked by the engine's path
        engine = SearchEngine.build([corpus.get(d) for d in heads], work / "engine", retriever=None,
                                    reranker=reranker, passage_words=0, precision=precision, batch_size=batch_size,
                                    device=device)
        alpha = dev_choice(engine.reranker.path).blend_for(run.name if run.name in FIRST_STAGES else None) \
            if interpolation == "auto" else None if interpolation is None else float(interpolation)
        logger.info("reranking %d queries, top %d each, blend %s", len(run), depth, alpha)
        out = {}
        for qid, ranked in tqdm(run.items(), total=len(run), desc="rerank", unit="q", disable=not show_progress):
            out[qid] = engine.rerank([queries[qid].text], [ranked], rerank_depth=depth,
                                     rerank_blend="none" if alpha is None else alpha)[0]
        engine.close()
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return Run(f"{run.name}+rerank", out)
