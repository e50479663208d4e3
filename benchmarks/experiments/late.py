"""Late interaction (#66): the MaxSim stage's frontier of quality and latency, its storage, and its settings.

    python benchmarks/experiments/late.py --collection scifact [--data ../shared/data] [--model all-MiniLM-L6-v2]
        [--retriever all-MiniLM-L6-v2] [--engine DIR] [--reranker DIR] [--also-model MODEL] [--also-engine DIR]
        [--work runs/late] [--choose] [--codecs DIM:BITS,...] [--out PATH]
    python benchmarks/experiments/late.py --collection scifact --record-choice runs/models/NAME
    python benchmarks/experiments/late.py --collection nfcorpus --retriever DIR --model DIR --reranker DIR \
        --work DIR --rerank-elsewhere [--out PATH]
    python benchmarks/experiments/late.py --collection scifact --engine DIR --model DIR --reranker DIR --work DIR \
        --rerank-after-maxsim [--out PATH]

An engine of the collection is built with the default settings (``--retriever``, no reranker) under ``--work``
(reused when there; the steering study's engines are found there too), and a copy gets token vectors by ``--model``
(``SearchEngine.late_interaction``: every passage encoded again; its seconds and bytes are reported against the
dense part's).

1. **choice** (``--choose``, on dev: SciFact train, NFCorpus dev; for a model trained on that split, only the queries
   its training held out, found again from its ``twostage.json``): MaxSim's blend with the first stage (MaxSim alone,
   0.3, 0.5, 0.7) and depth (50, 100), nDCG@10 of hybrid -> MaxSim; the best is then measured on test. Without it the
   engine's defaults are measured.
2. **frontier** (test): hybrid; hybrid -> MaxSim; with ``--reranker`` hybrid -> cross-encoder and hybrid -> MaxSim ->
   cross-encoder (the reranker's blend as it chose on dev); the same MaxSim rows with each ``--also-model`` (the
   zero-shot model next to a trained one) and the hybrid of each ``--also-engine`` (the zero-shot retriever's);
   nDCG@10, Recall@100 of the list, and one query at a time p50 / p95, the systems interleaved query by query in
   random order (a warm-up pass first). Paired t-test of each system against hybrid.
3. **a reranker elsewhere** (``--rerank-elsewhere``, on dev): the ``--reranker``'s curve after hybrid over every
   weight, on a collection its own dev queries never searched (the evidence for
   :data:`twostage.engine.fusion.RERANK_ELSEWHERE`); nothing else is run.
4. **the reranker after MaxSim** (``--rerank-after-maxsim``): the ``--reranker``'s dev curve after hybrid -> MaxSim
   (the engine's MaxSim settings) at each depth of ``AFTER_MAXSIM_DEPTHS`` and every weight; the depth and weight
   the reranker's dev rule (one standard error) would choose there, then on ``--split`` the cascade as the engine
   serves it (its ``rerank_depth``, the blend chosen after hybrid) against that choice; nothing else is run.

Writes ``--out``.md and .json.
"""

from __future__ import annotations

import argparse
import json
import random
import shutil
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[2]
DEV = {"scifact": "train", "nfcorpus": "dev"}
BLENDS: tuple[float | str, ...] = ("none", 0.3, 0.5, 0.7)
DEPTHS = (50, 100)
AFTER_MAXSIM_DEPTHS = (20, 10, 30, 50)  # the reranker's depths tried after MaxSim (the engine's own first)
IGNORE_IDENTICAL = [False]


def engine_dir(name: str, data: Path, work: Path, retriever: str) -> Path:
    """The collection's plain engine (built once; with the zero-shot retriever, the steering study's when it is
    there; a trained retriever's engine is named by its last two path parts)."""
    from twostage import SearchEngine

    zero_shot = retriever == "all-MiniLM-L6-v2"
    tag = "zeroshot" if zero_shot else "-".join(Path(retriever).parts[-2:])
    found = (work / f"{name}-{tag}",) + ((ROOT / "runs" / "steering" / f"{name}-zeroshot",) if zero_shot else ())
    for path in found:
        if (path / "CURRENT").exists():
            return path
    path = found[0]
    t = time.perf_counter()
    SearchEngine.build(data, path, retriever=retriever, show_progress=True).close()
    print(f"built {name} in {time.perf_counter() - t:.0f} s", file=sys.stderr)
    return path


def with_tokens(plain: Path, work: Path, name: str, model: str) -> tuple[Any, float | None]:
    """A copy of the plain engine with token vectors by ``model`` (made once), and the seconds they took."""
    from twostage import SearchEngine

    path = work / f"{name}-late-{Path(model).name}"
    if (path / "CURRENT").exists():
        engine = SearchEngine.load(path, verify=False)
        if engine.manifest.late is not None:
            meta = path / "late-seconds.json"
            return engine, json.loads(meta.read_text())["seconds"] if meta.is_file() else None
    shutil.rmtree(path, ignore_errors=True)
    shutil.copytree(plain, path)
    t = time.perf_counter()
    engine = SearchEngine.load(path, verify=False).late_interaction(model, show_progress=True)
    seconds = time.perf_counter() - t
    (path / "late-seconds.json").write_text(json.dumps({"seconds": seconds}))
    return engine, seconds


def recoded(engine: Any, dim: int, bits: int, work: Path) -> Any:
    """A copy of ``engine`` (hard links) whose token vectors are stored projected to ``dim`` dimensions (0: as they
    are) in ``bits`` a dimension, made from its int8 codes (what encoding again would give, up to int8's rounding;
    the library makes them from the model: ``late_interaction(model, dim=, bits=)``)."""
    import os
    from dataclasses import replace

    from twostage import SearchEngine
    from twostage.engine.on_disk import engine_files, read_engine_manifest
    from twostage.indexer.tokens import TokenCodec, TokenSegment, dequantise, fit_projection, quantise, write_manifest

    path = work / f"{engine.root.name}-{dim or engine.tokens.model_dim}d-{bits}bit"
    if (path / "CURRENT").exists():
        return SearchEngine.load(path, verify=False)
    shutil.rmtree(path, ignore_errors=True)
    shutil.copytree(engine.root, path, copy_function=os.link, ignore=shutil.ignore_patterns("late"))
    part = engine.tokens
    version = path / engine.version_dir.name
    out = version / "late"
    out.mkdir()
    codec = TokenCodec(bits)
    segments = []
    for i, seg in enumerate(part.segments):
        codes, scales, offsets = part.segment_data(i)
        vectors = dequantise(codes, scales)
        if dim and codec.projection is None:
            pick = np.random.default_rng(0).permutation(len(vectors))[:65536]
            codec = TokenCodec(bits, fit_projection(vectors[pick], dim))
        new_codes, new_scales = quantise(codec.project(vectors), bits)
        np.save(out / f"{seg.name}.codes.npy", new_codes, allow_pickle=False)
        np.save(out / f"{seg.name}.scales.npy", new_scales, allow_pickle=False)
        np.save(out / f"{seg.name}.offsets.npy", np.asarray(offsets), allow_pickle=False)
        segments.append(TokenSegment(seg.name, seg.rows, seg.tokens))
    write_manifest(out, part.model_dim, segments, codec)
    manifest = read_engine_manifest(version)
    (version / "manifest.json").unlink()  # a hard link to the original's: replaced, not written through
    (version / "manifest.json").write_text(replace(manifest, files=engine_files(version)).to_json())
    return SearchEngine.load(path, verify=True)


def storage(engine: Any) -> dict[str, Any]:
    """Bytes on disk of the dense part (vectors and ANN structure, documents excluded) and of the token part."""
    dense = sum(f.stat().st_size for f in (engine.version_dir / "dense").rglob("*")
                if f.is_file() and not f.name.endswith(".parquet"))
    late = sum(f.stat().st_size for f in (engine.version_dir / "late").rglob("*") if f.is_file())
    tokens = sum(s.tokens for s in engine.tokens.segments)
    rows = engine.index.manifest.rows
    return {"documents": len(engine), "rows": rows, "tokens": tokens, "tokens_per_row": tokens / max(rows, 1),
            "dense_bytes": dense, "late_bytes": late, "late_over_dense": late / max(dense, 1),
            "dense_bytes_per_document": dense / max(len(engine), 1),
            "late_bytes_per_document": late / max(len(engine), 1), "dim": engine.tokens.dim}


def lists(engine: Any, queries: list[str], k: int = 100, **knobs: Any) -> list[Any]:
    from twostage.indexer.records import RankedList

    out = []
    for r in engine.search_batch(queries, k, **knobs):
        out.append(RankedList(np.array([h.id for h in r.hits], dtype=object),
                              np.array([h.score for h in r.hits], dtype=np.float64)))
    return out


def per_query(qrels: Any, ids: list[str], runs: list[Any], metric: str) -> np.ndarray:
    from twostage.eval.metrics import evaluate

    # ArguAna's queries are documents of its corpus: the query's own document is not counted (BEIR's protocol)
    table = evaluate(qrels, dict(zip(ids, runs)), [metric], ignore_identical_ids=IGNORE_IDENTICAL[0])
    return table[metric].to_numpy(dtype=np.float64)


def dev_split(ds: Any, collection: str, model: str, training: dict[str, Any] | None) -> tuple[Any, str] | None:
    """The split MaxSim's settings are chosen on: the collection's dev split, or, for a model trained on that split,
    only the queries its training held out (the rest are its training data); None when there is neither."""
    from dataclasses import replace

    from twostage.retriever.training_data import hold_out

    name = DEV.get(collection)
    if name is None:
        return None
    split = ds.split(name)
    if not training or training.get("split") != name or Path(str(training.get("data", ""))).name != collection:
        return split, name
    recipe = training["recipe"]
    _, held = hold_out(list(split.queries), recipe["dev_fraction"], recipe["train"]["seed"])
    if not held:
        return None
    label = f"{name} (the {len(held)} queries {Path(model).name} held out from its training)"
    return replace(split, queries=tuple(held), qrels=split.qrels.subset(q.id for q in held)), label


def choose(engine: Any, split: Any) -> dict[str, Any]:
    queries, ids = [q.text for q in split.queries], [q.id for q in split.queries]
    grid = {"hybrid": float(per_query(split.qrels, ids, lists(engine, queries, 10, maxsim=False), "ndcg@10").mean())}
    for depth in DEPTHS:
        for blend in BLENDS:
            runs = lists(engine, queries, 10, maxsim_depth=depth, maxsim_blend=blend)
            grid[f"blend {blend}, depth {depth}"] = float(per_query(split.qrels, ids, runs, "ndcg@10").mean())
            print(f"dev blend {blend} depth {depth}: {grid[f'blend {blend}, depth {depth}']:.4f}", file=sys.stderr)
    best = max((k for k in grid if k != "hybrid"), key=grid.__getitem__)
    blend_text, depth_text = best.split(", ")
    blend = blend_text.split()[1]
    return {"grid": grid, "best": best, "maxsim_blend": blend if blend == "none" else float(blend),
            "maxsim_depth": int(depth_text.split()[1])}


def rules(engine: Any, split: Any, repeats: int) -> dict[str, Any]:
    """Which rule for MaxSim's weight holds up on queries it did not see: the per-query dev curve over the library's
    grid (:func:`twostage.engine.training.maxsim_curve`, the one command's search), then ``repeats`` random halves of
    the dev queries: each rule of :data:`twostage.engine.fusion.BLEND_RULES` chooses on one half and is scored on
    the other (and the other way round)."""
    from twostage.engine.fusion import BLEND_RULES
    from twostage.engine.training import maxsim_curve
    from twostage.eval.metrics import ndcg10_by_query

    curve = maxsim_curve(engine, list(split.queries), split.qrels, ndcg10_by_query, show_progress=True)
    values = dict(curve)
    n = len(curve[0][1])
    rng = np.random.default_rng(0)
    held: dict[str, list[float]] = {name: [] for name in BLEND_RULES}
    chosen: dict[str, list[float]] = {name: [] for name in BLEND_RULES}
    for _ in range(repeats):
        order = rng.permutation(n)
        for a, b in ((order[: n // 2], order[n // 2:]), (order[n // 2:], order[: n // 2])):
            for name, rule in BLEND_RULES.items():
                weight = rule([(w, v[a]) for w, v in curve])
                chosen[name].append(weight)
                held[name].append(float(values[weight][b].mean()))
    base = np.asarray(held["one_se"])
    return {"queries": n, "repeats": repeats, "curve": {f"{w:g}": float(v.mean()) for w, v in curve},
            "full_dev_choice": {name: rule(curve) for name, rule in BLEND_RULES.items()},
            "held_out": {name: {"mean": float(np.mean(v)), "vs_one_se": float(np.mean(np.asarray(v) - base)),
                                "wins": float(np.mean(np.asarray(v) > base + 1e-12)),
                                "losses": float(np.mean(np.asarray(v) < base - 1e-12)),
                                "mean_weight": float(np.mean(chosen[name])),
                                "off": float(np.mean(np.asarray(chosen[name]) == 0.0))}
                         for name, v in held.items()}}


def frontier(engine: Any, split: Any, reranker: Any, knobs: dict[str, Any],
             more: tuple[tuple[str, Any, dict[str, Any]], ...] = ()) -> dict[str, Any]:
    """The systems measured side by side: ``engine``'s hybrid, -> MaxSim and, with a reranker, -> cross-encoder and
    -> MaxSim -> cross-encoder, then ``more`` (name, engine, search knobs): other models' MaxSim, other engines'."""
    from twostage.eval.significance import p_value

    systems: list[tuple[str, Any, dict[str, Any]]] = [("hybrid", engine, {"maxsim": False, "rerank": False}),
                                                      ("hybrid -> MaxSim", engine, {**knobs, "rerank": False})]
    if reranker is not None or engine.has_reranker:
        ce = engine.with_reranker(reranker) if reranker is not None else engine
        systems += [("hybrid -> cross-encoder", ce, {"maxsim": False}),
                    ("hybrid -> MaxSim -> cross-encoder", ce, dict(knobs))]
    systems += list(more)
    queries, ids = [q.text for q in split.queries], [q.id for q in split.queries]
    quality: dict[str, dict[str, Any]] = {}
    for name, system, kw in systems:
        runs = lists(system, queries, 100, **kw)
        quality[name] = {"ndcg@10": per_query(split.qrels, ids, runs, "ndcg@10"),
                         "recall@100": per_query(split.qrels, ids, runs, "recall@100")}
    for q in queries[:20]:  # warm-up: every model loaded, caches filled
        for _, system, kw in systems:
            system.search(q, 10, **kw)
    times: dict[str, list[float]] = {name: [] for name, _, _ in systems}
    stages: dict[str, list[float]] = {name: [] for name, _, _ in systems}
    order = random.Random(0)
    for q in queries:
        runs = list(systems)
        order.shuffle(runs)
        for name, system, kw in runs:
            t = time.perf_counter()
            result = system.search(q, 10, **kw)
            times[name].append(time.perf_counter() - t)
            stages[name].append(result.timings.get("maxsim_s", 0.0))
    base = quality["hybrid"]["ndcg@10"]
    out = {}
    for name, _, _ in systems:
        nd = quality[name]["ndcg@10"]
        test = p_value(nd, base, "t") if name != "hybrid" else None
        out[name] = {"ndcg@10": float(nd.mean()), "recall@100": float(quality[name]["recall@100"].mean()),
                     "p50_ms": 1000 * float(np.percentile(times[name], 50)),
                     "p95_ms": 1000 * float(np.percentile(times[name], 95)),
                     "maxsim_p50_ms": 1000 * float(np.percentile(stages[name], 50)),
                     "delta": float(nd.mean() - base.mean()), "p": None if test is None else float(test)}
    return out


def _score(value: float | None) -> str:
    return "-" if value is None else f"{value:.4f}"  # "-": not measured (no dev queries, or no choice made on them)


def report(result: dict[str, Any], command: str) -> str:
    name = result["collection"]
    s = result["storage"]
    lines = [f"# Late interaction (MaxSim) on {name}", "", f"Command: `{command}`", "",
             f"Token vectors by `{result['model']}` ({s['dim']}-d, int8 codes + a float16 scale per token) over the "
             f"engine's {s['rows']:,} rows ({s['documents']:,} documents), {s['tokens_per_row']:.0f} tokens a row; "
             f"retriever `{result['retriever']}`, reranker `{result['reranker'] or 'none'}`. Machine: "
             f"{result['machine']}.", "",
             "## Storage", "",
             "| part | bytes | bytes per document | vs the dense part |", "|---|---|---|---|",
             f"| dense (vectors + ANN) | {s['dense_bytes']:,} | {s['dense_bytes_per_document']:,.0f} | 1.00x |",
             f"| token vectors | {s['late_bytes']:,} | {s['late_bytes_per_document']:,.0f} | "
             f"**{s['late_over_dense']:.2f}x** |", "",
             f"Token vectors written in {result['late_seconds']:.0f} s (every row encoded again)."
             if result.get("late_seconds") else "", ""]
    if result.get("choice"):
        c = result["choice"]
        lines += [f"## Choice on dev: {result['dev_split']}", "", "| setting | nDCG@10 |", "|---|---|"]
        lines += [f"| {k} | {v:.4f}{' (chosen)' if k == c['best'] else ''} |" for k, v in c["grid"].items()]
        lines += [""]
    lines += [f"## The frontier on {result['split']} ({result['queries']} queries, one query at a time)", "",
              f"MaxSim settings: {result['knobs']}." + (
                  " A row naming a model in brackets uses that model's token vectors (MaxSim) or that retriever's "
                  "engine (hybrid) in place of the ones above, in the same run." if any(result.get("also", {}).values())
                  else ""), "",
              "| system | nDCG@10 | vs hybrid | p (paired t) | Recall@100 | p50 ms | p95 ms | MaxSim p50 ms |",
              "|---|---|---|---|---|---|---|---|"]
    for sname, r in result["frontier"].items():
        p = "" if r["p"] is None else f"{r['p']:.3g}"
        lines.append(f"| {sname} | {r['ndcg@10']:.4f} | {r['delta']:+.4f} | {p} | {r['recall@100']:.4f} | "
                     f"{r['p50_ms']:.1f} | {r['p95_ms']:.1f} | {r['maxsim_p50_ms']:.1f} |")
    if result.get("codecs"):
        lines += ["", "## Compact token vectors (hybrid -> MaxSim, the same settings)", "",
                  "| stored as | bytes vs the dense part | bytes per document | dev nDCG@10 | test nDCG@10 | p50 ms | "
                  "p95 ms | MaxSim p50 ms |", "|---|---|---|---|---|---|---|---|"]
        full = result["frontier"]["hybrid -> MaxSim"]
        choice = result.get("choice", {})
        dev = choice.get("grid", {}).get(choice.get("best", ""))
        lines.append(f"| {s['dim']} dims, 8 bits (above) | {s['late_over_dense']:.2f}x | "
                     f"{s['late_bytes_per_document']:,.0f} | {_score(dev)} | "
                     f"{full['ndcg@10']:.4f} | "
                     f"{full['p50_ms']:.1f} | {full['p95_ms']:.1f} | {full['maxsim_p50_ms']:.1f} |")
        for name, row in result["codecs"].items():
            t = row["test"]
            st = row["storage"]
            lines.append(f"| {name} | {st['late_over_dense']:.2f}x | {st['late_bytes_per_document']:,.0f} | "
                         f"{_score(row.get('dev_ndcg@10'))} | "
                         f"{t['ndcg@10']:.4f} | {t['p50_ms']:.1f} | "
                         f"{t['p95_ms']:.1f} | {t['maxsim_p50_ms']:.1f} |")
    t = result.get("model_training")
    if t:
        history = ", ".join(f"epoch {h['epoch']} {h['dev']:.4f}" for h in t.get("history", []) if h.get("dev"))
        lines += ["", "## The model", "",
                  (f"`{result['model']}`, trained from `{t['base']}` on {Path(t['data']).name} {t['split']} "
                  f"({t['train_queries']} queries; {t['dev_queries']} held out) in {t['steps']} steps, "
                  f"{t['seconds']:.0f} s; recipe: {t['recipe']['train']['epochs']} epochs, batch "
                  f"{t['recipe']['train']['batch_size']}, lr {t['recipe']['train']['lr']:g}, "
                  f"{t['recipe']['negatives']} {t['recipe']['mine_from']}-mined negative(s), "
                  f"{t['recipe']['max_length']} document tokens. Its held-out queries by epoch (MaxSim alone over "
                  f"their pool, what chose the epoch): {history}.")]
    return "\n".join(lines) + "\n"


def rerank_curve(engine: Any, split: Any, reranker: Any) -> dict[str, Any]:
    """The reranker's dev curve after hybrid over this collection (what the one command measures on its own dev
    corpus, :func:`twostage.engine.training.blend_curve`): nDCG@10 at every weight of the library's grid over the
    engine's top ``rerank_depth``, MaxSim off; each weight's gain over hybrid alone with its standard error, and the
    weight each rule of :data:`twostage.engine.fusion.BLEND_RULES` chooses."""
    from twostage.engine.fusion import BLEND_RULES
    from twostage.engine.training import ScoreMemo, blend_curve
    from twostage.eval.metrics import ndcg10_by_query

    plain, queries = engine.with_settings(maxsim=False), list(split.queries)
    curve = blend_curve(plain, ScoreMemo(reranker), queries, split.qrels, "hybrid", plain.settings.rerank_depth,
                        ndcg10_by_query)
    first = curve[0][1]
    rows = {f"{a:g}": {"ndcg@10": float(v.mean()), "gain": float((v - first).mean()),
                       "se": float((v - first).std(ddof=1) / np.sqrt(len(v)))} for a, v in curve}
    return {"queries": len(queries), "depth": plain.settings.rerank_depth, "curve": rows,
            "chosen": {name: rule(curve) for name, rule in BLEND_RULES.items()}}


def after_maxsim(engine: Any, dev: Any, test: Any, reranker: Any) -> dict[str, Any]:
    """The reranker after hybrid -> MaxSim (``engine``'s MaxSim settings): its dev curve at each of
    :data:`AFTER_MAXSIM_DEPTHS` over every weight (:func:`twostage.engine.training.blend_curve`), the weight the
    reranker's rule (:func:`~twostage.engine.fusion.one_se_blend`) chooses at each depth and the depth whose choice
    scores highest (:func:`~twostage.engine.fusion.maxsim_depth_rule` with that rule); then ``test``'s nDCG@10 of
    hybrid -> MaxSim, of the cascade as the engine serves it (its ``rerank_depth``, the blend chosen after hybrid)
    and of dev's choice, with paired t-tests."""
    from twostage.engine.fusion import maxsim_depth_rule, one_se_blend
    from twostage.engine.knobs import blend_of
    from twostage.engine.training import ScoreMemo, blend_curve
    from twostage.eval.metrics import ndcg10_by_query
    from twostage.eval.significance import p_value

    view, memo = engine.with_settings(maxsim=True), ScoreMemo(reranker)
    curves = {d: blend_curve(view, memo, list(dev.queries), dev.qrels, "hybrid", d, ndcg10_by_query)
              for d in AFTER_MAXSIM_DEPTHS}
    chosen = {d: one_se_blend(c) for d, c in curves.items()}
    picked = maxsim_depth_rule(list(curves.items()), one_se_blend)
    served_depth = view.settings.rerank_depth
    served_blend = blend_of(engine.with_reranker(reranker).settings, reranker, "hybrid")
    served_weight = 1.0 if served_blend is None else served_blend  # None: the reranker's score alone

    def on_test(depth: int, weight: float) -> np.ndarray:
        return blend_curve(view, memo, list(test.queries), test.qrels, "hybrid", depth, ndcg10_by_query,
                           grid=(weight,))[0][1]

    maxsim, served, pick = on_test(served_depth, 0.0), on_test(served_depth, served_weight), on_test(picked,
                                                                                                     chosen[picked])
    return {"dev_queries": len(dev.queries), "test_queries": len(test.queries),
            "dev": {str(d): {f"{a:g}": float(v.mean()) for a, v in c} for d, c in curves.items()},
            "chosen_by_depth": {str(d): w for d, w in chosen.items()}, "picked_depth": picked,
            "picked_weight": chosen[picked], "served_depth": served_depth, "served_weight": served_weight,
            "dev_served": float(dict(curves[served_depth])[served_weight].mean())
            if served_depth in curves and served_weight in dict(curves[served_depth]) else None,
            "test": {"hybrid -> MaxSim": float(maxsim.mean()), "served": float(served.mean()),
                     "dev_choice": float(pick.mean()), "p_choice_vs_served": float(p_value(pick, served, "t")),
                     "p_served_vs_maxsim": float(p_value(served, maxsim, "t"))}}


def after_maxsim_report(result: dict[str, Any], command: str) -> str:
    r = result["after_maxsim"]
    weights = list(next(iter(r["dev"].values())))
    t = r["test"]
    lines = [f"# The reranker after MaxSim: its depth and weight on dev ({result['collection']})", "",
             f"Command: `{command}`", "",
             f"Reranker `{result['reranker']}` after hybrid -> MaxSim (late model `{result['model']}`, "
             f"{result['knobs']}) in an engine with retriever `{result['retriever']}`. Dev: {result['dev_split']}, "
             f"{r['dev_queries']} queries; nDCG@10 by the reranker's depth (rows) and weight (columns; 0: hybrid -> "
             "MaxSim alone).", "",
             "| depth | " + " | ".join(weights) + " | one-SE weight |", "|---" * (len(weights) + 2) + "|"]
    lines += [f"| {d} | " + " | ".join(f"{v:.4f}" for v in row.values()) + f" | {r['chosen_by_depth'][d]:g} |"
              for d, row in r["dev"].items()]
    lines += ["", f"Dev's choice (the depth whose one-SE weight scores highest, the engine's own "
                  f"{r['served_depth']} unless another is strictly higher): top {r['picked_depth']} at weight "
                  f"{r['picked_weight']:g}. The engine serves top {r['served_depth']} at weight {r['served_weight']:g} "
                  f"(the blend its training chose after hybrid)" + (
                      f", {r['dev_served']:.4f} on dev." if r["dev_served"] is not None else "."), "",
              f"## On {result['split']} ({r['test_queries']} queries)", "",
              "| system | nDCG@10 |", "|---|---|",
              f"| hybrid -> MaxSim | {t['hybrid -> MaxSim']:.4f} |",
              f"| -> cross-encoder as served (top {r['served_depth']}, weight {r['served_weight']:g}) | "
              f"{t['served']:.4f} |",
              f"| -> cross-encoder as dev chooses (top {r['picked_depth']}, weight {r['picked_weight']:g}) | "
              f"{t['dev_choice']:.4f} |", "",
              f"Paired t-test: dev's choice against the served cascade p = {t['p_choice_vs_served']:.3g}; the served "
              f"cascade against hybrid -> MaxSim p = {t['p_served_vs_maxsim']:.3g}."]
    return "\n".join(lines) + "\n"


def rerank_report(result: dict[str, Any], command: str) -> str:
    r = result["rerank_elsewhere"]
    lines = [f"# A reranker over a corpus its dev queries did not search ({result['collection']})", "",
             f"Command: `{command}`", "",
             f"Reranker `{result['reranker']}` after the hybrid of an engine with retriever `{result['retriever']}` "
             f"(its top {r['depth']}, MaxSim off); dev: {result['dev_split']}, {r['queries']} queries. Weight 0 is the "
             "hybrid alone; the gain and its standard error are per query against it.", "",
             "| weight | nDCG@10 | gain | standard error |", "|---|---|---|---|"]
    lines += [f"| {w} | {v['ndcg@10']:.4f} | {v['gain']:+.4f} | {v['se']:.4f} |" for w, v in r["curve"].items()]
    lines += ["", "Weight each rule chooses here: " + ", ".join(f"{k} {v:g}" for k, v in r["chosen"].items()) + "."]
    return "\n".join(lines) + "\n"


def rules_report(result: dict[str, Any], command: str) -> str:
    r = result["rules"]
    lines = [f"# MaxSim's weight: which rule holds up on unseen dev queries ({result['collection']})", "",
             f"Command: `{command}`", "",
             f"Late model `{result['model']}` over an engine with retriever `{result['retriever']}`; dev: "
             f"{result['dev_split']}, {r['queries']} queries. Each rule chooses the weight on one random half and is "
             f"scored (nDCG@10 of hybrid -> MaxSim) on the other, both ways, {r['repeats']} random halvings.", "",
             "Dev curve (all the dev queries): " + ", ".join(f"{w} {v:.4f}" for w, v in r["curve"].items()) + ".", "",
             "| rule | weight on all of dev | held-out nDCG@10 (mean) | vs one_se | wins / losses vs one_se | "
             "mean weight chosen | MaxSim off |", "|---|---|---|---|---|---|---|"]
    for name, h in r["held_out"].items():
        lines.append(f"| {name} | {r['full_dev_choice'][name]:g} | {h['mean']:.4f} | {h['vs_one_se']:+.4f} | "
                     f"{h['wins']:.0%} / {h['losses']:.0%} | {h['mean_weight']:.2f} | {h['off']:.0%} |")
    return "\n".join(lines) + "\n"


def write_result(out: Path, result: dict[str, Any], render: Any) -> int:
    """``out``.json (the result) and ``out``.md (``render(result, command)``, also printed), naming this run's
    command."""
    text = render(result, "python benchmarks/experiments/late.py " + " ".join(sys.argv[1:]))
    out.with_suffix(".json").write_text(json.dumps(result, indent=2, default=str) + "\n")
    out.with_suffix(".md").write_text(text)
    print(text)
    return 0


def model_training(model: str) -> dict[str, Any] | None:
    """The training record in a model's ``twostage.json`` (None for a model trained elsewhere)."""
    card = Path(model) / "twostage.json"
    return json.loads(card.read_text()).get("training") if card.is_file() else None


def record_choice(data: Path, models: Path) -> int:
    """MaxSim's dev choice made again for a late model the one command trained before the record held the weight for
    another corpus and the dev corpus's sketch: the same held-out train queries (the default settings' dev fraction
    and seed), the same engine (the collection's corpus, MODELS/retriever and MODELS/late), written in place."""
    from twostage import BeirDataset
    from twostage.engine.train_models import TrainSettings
    from twostage.eval.systems import SystemOptions
    from twostage.eval.workflows import choose_maxsim, record_maxsim_choice

    for part in ("retriever", "late"):
        if not (models / part / "twostage.json").is_file():
            raise SystemExit(f"{models / part}: not a trained model directory; give the one command's --models-dir")
    settings, dataset = TrainSettings(), BeirDataset(data)
    options = SystemOptions(retriever_model=str(models / "retriever"), late_model=str(models / "late"),
                            show_progress=True)
    choice = choose_maxsim(dataset, "train", settings.dev_fraction, settings.seed, options)
    record_maxsim_choice(models / "late", choice, dataset.corpus)
    print(choice.line)
    return 0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--collection", required=True, help="scifact, nfcorpus, arguana (a folder of --data)")
    ap.add_argument("--data", type=Path, default=ROOT.parent / "shared" / "data")
    ap.add_argument("--model", default="all-MiniLM-L6-v2", help="the late-interaction model")
    ap.add_argument("--retriever", default="all-MiniLM-L6-v2")
    ap.add_argument("--engine", type=Path, default=None, help="an engine of the collection to copy (default: one "
                    "built with --retriever under --work)")
    ap.add_argument("--reranker", default=None)
    ap.add_argument("--also-model", action="append", default=[], metavar="MODEL",
                    help="another late-interaction model measured in the same run over the same engine (repeatable; "
                         "e.g. all-MiniLM-L6-v2, the zero-shot baseline, next to a trained --model)")
    ap.add_argument("--also-engine", action="append", default=[], type=Path, metavar="DIR",
                    help="another engine of the collection whose hybrid is measured in the same run (repeatable; "
                         "e.g. one with the zero-shot retriever next to a trained --engine)")
    ap.add_argument("--split", default="test")
    ap.add_argument("--choose", action="store_true", help="choose MaxSim's blend and depth on the dev split first")
    ap.add_argument("--codecs", default=None, metavar="DIM:BITS,...",
                    help="also store the token vectors projected to DIM dimensions (0: the model's) in BITS (8 or 4) "
                         "and measure each: storage, dev and test nDCG@10, latency")
    ap.add_argument("--rules", type=int, default=0, metavar="REPEATS",
                    help="compare the rules for MaxSim's weight on dev by REPEATS random halves (choose on one, score "
                         "on the other), then stop")
    ap.add_argument("--rerank-elsewhere", action="store_true",
                    help="the --reranker's dev curve after hybrid on --collection's dev split (a reranker trained on "
                         "another collection: whether it earns its place off its own corpus), then stop")
    ap.add_argument("--rerank-after-maxsim", action="store_true",
                    help="the --reranker's depth and weight after hybrid -> MaxSim chosen on dev, then measured on "
                         "--split against the cascade as the engine serves it, then stop")
    ap.add_argument("--no-frontier", action="store_true", help="build and choose only (the timed part needs the "
                    "machine to itself)")
    ap.add_argument("--record-choice", type=Path, default=None, metavar="MODELS",
                    help="only choose MaxSim's weight again, as the one command does, for the models it trained into "
                         "MODELS (retriever/, late/) on --collection's train split, and record it in MODELS/late "
                         "(a record from before the weight for another corpus); nothing else is run")
    ap.add_argument("--work", type=Path, default=ROOT / "runs" / "late")
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args()
    if args.record_choice is not None:
        return record_choice(args.data / args.collection, args.record_choice)
    import platform

    from twostage import BeirDataset, SearchEngine
    from twostage.engine.knobs import settings_for

    args.work.mkdir(parents=True, exist_ok=True)
    IGNORE_IDENTICAL[0] = args.collection == "arguana"
    data = args.data / args.collection
    ds = BeirDataset(data)
    plain = args.engine or engine_dir(args.collection, data, args.work, args.retriever)
    plain_name = args.collection if args.engine is None else plain.name  # names its copies with token vectors
    engine, seconds = with_tokens(plain, args.work, plain_name, args.model)
    reranker = None
    if args.reranker:
        from twostage.models.device import resolve_precision
        from twostage.reranker.cross_encoder import CrossEncoder

        reranker = CrossEncoder.load(args.reranker, precision=resolve_precision("auto", "reranker"))
    result: dict[str, Any] = {"collection": args.collection, "model": args.model,
                              "retriever": engine.manifest.retriever.name if engine.manifest.retriever else None,
                              "reranker": args.reranker or (engine.manifest.reranker.name if engine.manifest.reranker
                                                            else None), "split": args.split, "late_seconds": seconds,
                              "storage": storage(engine), "model_training": model_training(args.model),
                              "machine": f"{platform.machine()}, "
                              f"{__import__('os').cpu_count()} cores"}
    knobs: dict[str, Any] = {}
    dev = dev_split(ds, args.collection, args.model, result["model_training"])
    if args.rerank_elsewhere:
        if dev is None or reranker is None:
            raise SystemExit(f"{args.collection}: --rerank-elsewhere needs a dev split and --reranker")
        result["dev_split"], result["rerank_elsewhere"] = dev[1], rerank_curve(engine, dev[0], reranker)
        return write_result(args.out or ROOT / "benchmarks" / "results" / f"rerank-elsewhere-{args.collection}",
                            result, rerank_report)
    if args.rerank_after_maxsim:
        if dev is None or reranker is None:
            raise SystemExit(f"{args.collection}: --rerank-after-maxsim needs a dev split and --reranker")
        from twostage.engine.knobs import served_maxsim, with_maxsim

        s = with_maxsim(engine.settings, served_maxsim(args.model, ds.corpus.ids))  # as `twostage build` serves it
        result["knobs"] = f"MaxSim over the top {s.maxsim_depth} at weight {s.maxsim_blend:g}"
        result["dev_split"] = dev[1]
        view = engine.with_settings(maxsim=True, maxsim_blend=s.maxsim_blend, maxsim_depth=s.maxsim_depth)
        result["after_maxsim"] = after_maxsim(view, dev[0], ds.split(args.split), reranker)
        return write_result(args.out or ROOT / "benchmarks" / "results" / f"rerank-after-maxsim-{args.collection}",
                            result, after_maxsim_report)
    if args.rules:
        if dev is None:
            raise SystemExit(f"{args.collection}: no dev queries to compare the rules on; leave out --rules")
        result["dev_split"], result["rules"] = dev[1], rules(engine, dev[0], args.rules)
        return write_result(args.out or ROOT / "benchmarks" / "results" / f"late-rules-{args.collection}", result,
                            rules_report)
    if args.choose:
        if dev is None:
            raise SystemExit(f"{args.collection}: no dev queries to choose on (no dev split, or {args.model} trained on "
                             "all of it); leave out --choose")
        result["dev_split"] = dev[1]
        cached = engine.root.parent / f"{engine.root.name}-choice.json"  # the dev choice, made once
        if not cached.is_file():
            cached.write_text(json.dumps(choose(engine, dev[0]), indent=2))
        result["choice"] = json.loads(cached.read_text())
        knobs = {"maxsim_blend": result["choice"]["maxsim_blend"], "maxsim_depth": result["choice"]["maxsim_depth"]}
    s, _ = settings_for(engine.settings, knobs)
    result["knobs"] = f"depth {s.maxsim_depth}, blend {s.maxsim_blend if s.maxsim_blend is not None else 'none'}"
    if args.no_frontier:
        print(json.dumps(result, indent=2, default=str))
        return 0
    split = ds.split(args.split)
    result["queries"] = len(split.queries)
    more = []
    for other in args.also_model:  # another model's token vectors over the same engine (e.g. the zero-shot one)
        variant, _ = with_tokens(plain, args.work, plain_name, other)
        label = Path(other).name
        more.append((f"hybrid -> MaxSim ({label})", variant, {**knobs, "rerank": False}))
        if reranker is not None:
            more.append((f"hybrid -> MaxSim ({label}) -> cross-encoder", variant.with_reranker(reranker), dict(knobs)))
    for other_engine in args.also_engine:  # another engine's first stage (e.g. the zero-shot retriever's)
        other_plain = SearchEngine.load(other_engine, verify=False)
        more.append((f"hybrid ({other_plain.manifest.retriever.name if other_plain.manifest.retriever else '?'})",
                     other_plain, {"maxsim": False, "rerank": False}))
    result["also"] = {"models": args.also_model, "engines": [str(e) for e in args.also_engine]}
    result["frontier"] = frontier(engine, split, reranker, knobs, tuple(more))
    if args.codecs:
        result["codecs"] = {}
        for spec in args.codecs.split(","):
            dim, bits = map(int, spec.split(":"))
            variant = recoded(engine, dim, bits, args.work)
            row = {"storage": storage(variant), "test": frontier(variant, split, None, knobs)["hybrid -> MaxSim"]}
            if dev is not None:
                dev_queries = dev[0]
                queries, ids = [q.text for q in dev_queries.queries], [q.id for q in dev_queries.queries]
                row["dev_ndcg@10"] = float(per_query(dev_queries.qrels, ids, lists(variant, queries, 10, **knobs),
                                                     "ndcg@10").mean())
            result["codecs"][f"{dim or variant.tokens.model_dim} dims, {bits} bits"] = row
            print(f"codec {spec}: {row['test']['ndcg@10']:.4f}, {row['storage']['late_over_dense']:.2f}x",
                  file=sys.stderr)
    return write_result(args.out or ROOT / "benchmarks" / "results" / f"late-{args.collection}", result, report)


if __name__ == "__main__":
    raise SystemExit(main())
