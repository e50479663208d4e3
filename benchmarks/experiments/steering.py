"""Result lists a user steers (#65): relevance feedback, diversity among near-duplicates, and what each costs.

    python benchmarks/experiments/steering.py [--data ../shared/data] [--retriever all-MiniLM-L6-v2] [--reranker DIR]
        [--parts feedback,diversity,latency] [--choose] [--engine DIR] [--work runs/steering]
        [--out benchmarks/results/steering]

Engines are built with the default settings (``--retriever``, ``--reranker``: none by default) under ``--work`` and
reused when there; ``--engine`` (one collection) uses an engine already built instead, with ``--reranker`` as its
reranker when given (the blend the reranker chose on dev, as a build with it would store). Choices are made on dev (SciFact train, NFCorpus dev), numbers reported on test.

1. **feedback**, the residual-collection protocol: for every query whose first list (the engine's default search)
   holds a relevant document in its top 10, the highest-ranked relevant one is given as ``like``; it leaves the
   judgments and the ranking, and nDCG@10 of what remains is compared with and without feedback (queries left with
   no relevant document are not counted). Paired t-test and randomization test. ``--choose`` first tries
   Rocchio's weight of the liked vector and the weight of BM25's added terms on dev (the mean gain over both
   collections); without it the library's :data:`~twostage.engine.steer.FEEDBACK` is measured.
2. **diversity**: an engine over SciFact with every document twice more, lightly edited (a copy without every 12th
   word, a copy with two sentences swapped and the title in capitals), the copies judged as their original. The
   share of top-10 pairs that are copies of one another and of pairs with cosine >= 0.95 (the documents' mean
   passage vectors), without and with ``diversity``; nDCG@10 of the original SciFact engine with and without it.
   ``--choose``: the default weight and the similarity floor are the setting with the fewest copies on dev among
   those that move the original engine's dev nDCG@10 by at most 0.005.
3. **latency**: one query at a time on SciFact test, the default search, ``like`` with 3 documents and
   ``diversity`` interleaved query by query; p50 / p95 and the ratios; ``--rerank-latency``: also with an untrained
   MiniLM cross-encoder on the default rerank depth (our reranker's cost).

Writes ``--out``.md and .json.
"""

from __future__ import annotations

import argparse
import json
import random
import re
import sys
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[2]
LIKE_GRID = (0.25, 0.5, 0.75, 1.0, 1.5, 2.0, 3.0)
TERM_GRID = (0.0, 0.25, 0.5, 1.0, 1.5, 2.0, 3.0)
DIVERSITY_GRID = (0.1, 0.2, 0.3, 0.5, 0.7)
FLOOR_GRID = (0.0, 0.8, 0.9)
DEV = {"scifact": "train", "nfcorpus": "dev"}


class CachedEncoder:
    """The engine's encoder with each query encoded once (the grid searches every dev query many times); it returns
    the encoder's own vectors, so the engine scores as with the encoder itself."""

    def __init__(self, inner: Any) -> None:
        self.inner, self.cache = inner, {}

    def encode(self, texts: list[str], kind: str = "query", **kw: Any) -> np.ndarray:
        missing = [t for t in dict.fromkeys(texts) if (kind, t) not in self.cache]
        if missing:
            for t, v in zip(missing, self.inner.encode(missing, kind=kind, **kw)):
                self.cache[(kind, t)] = v
        return np.stack([self.cache[(kind, t)] for t in texts])

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)


def engine_for(name: str, corpus: Any, work: Path, retriever: str, reranker: str | None) -> Any:
    from twostage import SearchEngine

    path = work / name
    if (path / "CURRENT").exists() or any(path.glob("v0*")):
        engine = SearchEngine.load(path, verify=False)
    else:
        t = time.perf_counter()
        engine = SearchEngine.build(corpus, path, retriever=retriever, reranker=reranker, show_progress=True)
        print(f"built {name}: {len(engine)} documents in {time.perf_counter() - t:.0f} s", file=sys.stderr)
    engine.use_models(encoder=CachedEncoder(engine.encoder))
    return engine


def given_engine(path: Path, reranker: str | None) -> Any:
    """An engine built already, read only; with ``reranker`` as its reranker when given (a view: the engine's
    settings keep ``rerank_blend="auto"`` when it was built without one, so the reranker's dev choice applies)."""
    from twostage import SearchEngine
    from twostage.models.device import resolve_precision
    from twostage.reranker.cross_encoder import CrossEncoder

    engine = SearchEngine.load(path, verify=False)
    if reranker is not None:
        engine = engine.with_reranker(CrossEncoder.load(reranker, precision=resolve_precision("auto", "reranker")))
    engine.use_models(encoder=CachedEncoder(engine.encoder))
    return engine


# ---- 1. relevance feedback ------------------------------------------------------------------------------------
def residual(engine: Any, split: Any) -> dict[str, Any]:
    """nDCG@10 of the residual collection without and with the top relevant document as ``like``, per query."""
    from twostage.eval.metrics import ndcg10_by_query
    from twostage.indexer.records import Judgment, Qrels, RankedList

    queries = [q for q in split.queries if split.qrels.relevant(q.id)]
    firsts = engine.search_batch([q.text for q in queries], 11)
    base, fed, judgments, ids = {}, {}, [], []
    for q, first in zip(queries, firsts):
        relevant = split.qrels.relevant(q.id)
        liked = next((h.id for h in first.hits[:10] if h.id in relevant), None)
        if liked is None or not relevant - {liked}:
            continue
        ids.append(q.id)
        judgments += [Judgment(q.id, d, g) for d, g in split.qrels.grades(q.id).items() if d != liked]
        rest = [h for h in first.hits if h.id != liked][:10]
        base[q.id] = RankedList(np.array([h.id for h in rest], dtype=object), np.array([h.score for h in rest]))
        fed[q.id] = engine.ranked(q.text, 10, like=[liked])
        assert liked not in set(fed[q.id].ids)
    qrels = Qrels.from_judgments(judgments)
    a, b = ndcg10_by_query(qrels, base), ndcg10_by_query(qrels, fed)
    return {"queries": len(split.queries), "residual_queries": len(ids), "without": a, "with": b}


def summary(r: dict[str, Any]) -> dict[str, Any]:
    from twostage.eval.significance import p_value

    a, b = r["without"], r["with"]
    return {"queries": r["queries"], "residual_queries": r["residual_queries"], "without": float(a.mean()),
            "with": float(b.mean()), "gain": float((b - a).mean()), "better": int((b > a).sum()),
            "worse": int((b < a).sum()), "p_t": p_value(b, a, "t"), "p_randomization": p_value(b, a, "fisher")}


def feedback_part(sets: dict[str, Any], engines: dict[str, Any], choose: bool, like_grid: tuple[float, ...],
                  term_grid: tuple[float, ...]) -> dict[str, Any]:
    from twostage.engine import steer

    out: dict[str, Any] = {"grid": []}
    if choose:
        best = None
        for like in like_grid:
            for term_weight in term_grid:
                steer.FEEDBACK = replace(steer.FEEDBACK, like=like, term_weight=term_weight)
                gains = {name: summary(residual(engines[name], sets[name].split(DEV[name])))["gain"]
                         for name in sets}
                mean = float(np.mean(list(gains.values())))
                out["grid"].append({"like": like, "term_weight": term_weight, **gains, "mean": mean})
                print(f"dev like {like} terms {term_weight}: {gains} mean {mean:+.4f}", file=sys.stderr)
                if best is None or mean > best[0]:
                    best = (mean, like, term_weight)
        assert best is not None
        steer.FEEDBACK = replace(steer.FEEDBACK, like=best[1], term_weight=best[2])
    out["weights"] = steer.FEEDBACK.__dict__
    for name in sets:
        out[name] = {"dev": summary(residual(engines[name], sets[name].split(DEV[name]))),
                     "test": summary(residual(engines[name], sets[name].split("test")))}
    return out


# ---- 2. diversity ---------------------------------------------------------------------------------------------
def copies(doc: Any) -> list[Any]:
    """Two light edits of a document: every 12th word dropped; two sentences swapped and the title in capitals."""
    from twostage.indexer.records import Document

    words = doc.text.split()
    dropped = " ".join(w for i, w in enumerate(words) if i % 12 != 11)
    sentences = re.split(r"(?<=[.!?])\s+", doc.text)
    if len(sentences) > 2:
        sentences[0], sentences[1] = sentences[1], sentences[0]
    return [Document(f"{doc.id}~a", dropped or doc.text, doc.title, dict(doc.metadata)),
            Document(f"{doc.id}~b", " ".join(sentences), doc.title.upper(), dict(doc.metadata))]


def original(doc_id: str) -> str:
    return doc_id.split("~")[0]


def duplicate_shares(engine: Any, queries: list[str], diversity: float) -> tuple[float, float]:
    """The share of top-10 pairs that are copies of one document, and of pairs with cosine >= 0.95."""
    copies_, near, pairs = 0, 0, 0
    results = engine.search_batch(queries, 10, diversity=diversity or None)
    ids = sorted({h.id for r in results for h in r.hits})
    vectors = document_vectors(engine, ids)
    for r in results:
        hits = [h.id for h in r.hits]
        for i in range(len(hits)):
            for j in range(i + 1, len(hits)):
                pairs += 1
                copies_ += original(hits[i]) == original(hits[j])
                near += float(vectors[hits[i]] @ vectors[hits[j]]) >= 0.95
    return copies_ / max(pairs, 1), near / max(pairs, 1)


def document_vectors(engine: Any, ids: list[str]) -> dict[str, np.ndarray]:
    """Each document's mean passage vector, normalised."""
    found = engine.example_features(ids, 0)
    return {d: v / max(float(np.linalg.norm(v)), 1e-12) for d, (v, _) in found.items()}


def ndcg(engine: Any, split: Any, diversity: float, judged_copies: bool = False) -> float:
    from twostage.eval.metrics import mean_ndcg10
    from twostage.indexer.records import Judgment, Qrels

    qrels = split.qrels
    if judged_copies:
        qrels = Qrels.from_judgments([j2 for j in split.qrels for j2 in
                                      (j, Judgment(j.query_id, f"{j.doc_id}~a", j.grade),
                                       Judgment(j.query_id, f"{j.doc_id}~b", j.grade))])
    results = engine.search_batch([q.text for q in split.queries], 10, diversity=diversity or None)
    return mean_ndcg10(qrels, {q.id: r_to_ranked(r) for q, r in zip(split.queries, results)})


def r_to_ranked(result: Any) -> Any:
    from twostage.indexer.records import RankedList

    return RankedList(np.array([h.id for h in result.hits], dtype=object),
                      np.array([h.score for h in result.hits], dtype=np.float64))


def diversity_part(scifact: Any, plain: Any, dup: Any, choose: bool,
                   floor_grid: tuple[float, ...] = FLOOR_GRID) -> dict[str, Any]:
    from twostage.engine import steer

    out: dict[str, Any] = {"grid": []}
    dev, test = scifact.split("train"), scifact.split("test")
    if choose:
        base_share = duplicate_shares(dup, [q.text for q in dev.queries], 0.0)[0]
        base_ndcg = ndcg(plain, dev, 0.0)
        chosen = None
        for floor in floor_grid:
            steer.FLOOR = floor
            for lam in DIVERSITY_GRID:
                share = duplicate_shares(dup, [q.text for q in dev.queries], lam)[0]
                moved = ndcg(plain, dev, lam) - base_ndcg
                out["grid"].append({"floor": floor, "diversity": lam, "copies_share": share,
                                    "copies_share_before": base_share, "plain_ndcg_change": moved})
                print(f"dev floor {floor} diversity {lam}: copies {base_share:.3f} -> {share:.3f}, plain nDCG "
                      f"{moved:+.4f}", file=sys.stderr)
                # the fewest copies among the settings that move the original engine by at most 0.005
                if abs(moved) <= 0.005 and (chosen is None or share < chosen[0] - 1e-12):
                    chosen = (share, floor, lam)
        if chosen is not None:
            steer.FLOOR, steer.DEFAULT_DIVERSITY = chosen[1], chosen[2]
    lam = steer.DEFAULT_DIVERSITY
    out["diversity"], out["floor"] = lam, steer.FLOOR
    for name, split in (("dev", dev), ("test", test)):
        texts = [q.text for q in split.queries]
        before, after = duplicate_shares(dup, texts, 0.0), duplicate_shares(dup, texts, lam)
        out[name] = {"copies_share": [before[0], after[0]], "cosine_share": [before[1], after[1]],
                     "plain_ndcg": [ndcg(plain, split, 0.0), ndcg(plain, split, lam)],
                     "dup_ndcg": [ndcg(dup, split, 0.0, True), ndcg(dup, split, lam, True)]}
    return out


# ---- 3. latency -----------------------------------------------------------------------------------------------
def latency_part(engine: Any, split: Any, reranker: Any, rounds: int = 1) -> dict[str, Any]:
    """p50 / p95 of the default search, ``like`` with 3 documents and the default ``diversity``, one query at a
    time, interleaved in random order per query; with the engine as built and, when it has no reranker, again with
    ``reranker`` on its default depth (all-MiniLM-L6-v2 with an untrained one-logit head: our reranker's shape, its
    scores meaningless, its cost real)."""
    from twostage.engine import steer

    if isinstance(engine.encoder, CachedEncoder):  # latency with the encoder itself: every query encoded
        engine.use_models(encoder=engine.encoder.inner)
    systems = [("", engine)]
    if not engine.has_reranker and reranker is not None:
        systems.append((f" + rerank top {engine.settings.rerank_depth}", engine.with_reranker(reranker)))
    queries = [q.text for q in split.queries]
    liked = {q: [h.id for h in engine.search(q, 3).hits] for q in queries}
    diverse = f"diversity {steer.DEFAULT_DIVERSITY}"
    options = [("default", {}), ("like 3", None), (diverse, {"diversity": True})]
    times: dict[str, list[float]] = {f"{name}{tag}": [] for tag, _ in systems for name, _ in options}
    for tag, system in systems:
        for q in queries[:20]:  # warm-up
            for _, kw in options:
                system.search(q, 10, **(kw if kw is not None else {"like": liked[q]}))
    order = random.Random(0)
    for _ in range(rounds):
        for q in queries:
            runs = [(tag, system, name, kw) for tag, system in systems for name, kw in options]
            order.shuffle(runs)  # interleaved, in random order per query
            for tag, system, name, kw in runs:
                t = time.perf_counter()
                system.search(q, 10, **(kw if kw is not None else {"like": liked[q]}))
                times[f"{name}{tag}"].append(time.perf_counter() - t)
    out = {name: {"p50_ms": 1000 * float(np.percentile(v, 50)), "p95_ms": 1000 * float(np.percentile(v, 95))}
           for name, v in times.items()}
    for tag, _ in systems:
        for name, _ in options:
            out[f"{name}{tag}"]["p50_ratio"] = out[f"{name}{tag}"]["p50_ms"] / out[f"default{tag}"]["p50_ms"]
    return out


def latency_reranker(work: Path) -> Any:
    """all-MiniLM-L6-v2 with a fresh one-logit head, in the precision an engine's ``auto`` gives a reranker."""
    from twostage.models.device import resolve_precision
    from twostage.models.weights import resolve_model
    from twostage.reranker.cross_encoder import CrossEncoder

    path = work / "latency-reranker"
    if not (path / "config.json").is_file():
        ce = CrossEncoder.load(resolve_model("all-MiniLM-L6-v2"), allow_untrained_head=True)
        ce.head_trained = True
        ce.save(path)
    return CrossEncoder.load(path, precision=resolve_precision("auto", "reranker"))


# ---- the report ---------------------------------------------------------------------------------------------
def report(result: dict[str, Any], command: str) -> str:
    lines = ["# Result lists a user steers: feedback, diversity, their cost", "", f"Command: `{command}`", "",
             f"Machine: 2 cores (quality does not depend on the load; latency is measured alone on it). Models: "
             f"retriever {result['retriever']}, reranker "
             f"{result['reranker'] or 'none'}; engines with the default settings.", ""]
    fb = result.get("feedback")
    if fb:
        w = fb["weights"]
        lines += ["## Relevance feedback, residual collection (nDCG@10)", "",
                  f"Weights: Rocchio like {w['like']}, unlike {w['unlike']}; BM25 gains the liked document's "
                  f"{w['terms']} strongest terms, the strongest weighted {w['term_weight']}"
                  + (" (chosen on dev: the grid below)" if fb["grid"] else "") + ".", "",
                  "| collection | split | queries (residual) | without | with like | gain | better / worse | p (t) | "
                  "p (randomization) |", "|---|---|---|---:|---:|---:|---|---:|---:|"]
        for name in DEV:
            if name not in fb:
                continue
            for split in ("dev", "test"):
                s = fb[name][split]
                lines.append(f"| {name} | {DEV[name] if split == 'dev' else 'test'} | {s['queries']} "
                             f"({s['residual_queries']}) | {s['without']:.4f} | {s['with']:.4f} | "
                             f"**{s['gain']:+.4f}** | {s['better']} / {s['worse']} | {s['p_t']:.2g} | "
                             f"{s['p_randomization']:.2g} |".replace("| 0 |", "| < 1e-4 |"))
        if fb["grid"]:
            lines += ["", "Dev grid (mean gain over the collections' dev splits):", "",
                      "| like | term weight | " + " | ".join(DEV) + " | mean |", "|---:|---:|" + "---:|" * (len(DEV) + 1)]
            for g in fb["grid"]:
                lines.append(f"| {g['like']} | {g['term_weight']} | "
                             + " | ".join(f"{g.get(n, float('nan')):+.4f}" for n in DEV) + f" | {g['mean']:+.4f} |")
        lines.append("")
    dv = result.get("diversity")
    if dv:
        lines += [f"## Diversity among near-duplicates (diversity {dv['diversity']}, floor {dv['floor']})", "",
                  f"SciFact with two lightly edited copies of every document ({result['dup_documents']} documents), "
                  "the copies judged as their original; the share of top-10 pairs that are copies of one document "
                  "and of pairs with cosine >= 0.95; nDCG@10 of the original engine (no copies) and of the one "
                  "with copies.", "",
                  "| split | copies' share | cosine >= 0.95 share | original engine nDCG@10 | with copies nDCG@10 |",
                  "|---|---|---|---|---|"]
        for split in ("dev", "test"):
            s = dv[split]
            lines.append(f"| {'train (dev)' if split == 'dev' else 'test'} | {s['copies_share'][0]:.3f} -> "
                         f"**{s['copies_share'][1]:.3f}** | {s['cosine_share'][0]:.3f} -> {s['cosine_share'][1]:.3f}"
                         f" | {s['plain_ndcg'][0]:.4f} -> {s['plain_ndcg'][1]:.4f} "
                         f"(**{s['plain_ndcg'][1] - s['plain_ndcg'][0]:+.4f}**) | {s['dup_ndcg'][0]:.4f} -> "
                         f"{s['dup_ndcg'][1]:.4f} |")
        if dv["grid"]:
            lines += ["", "Dev grid (SciFact train): the default is the setting with the fewest copies among those "
                      "that move the original engine by at most 0.005 (floor: the cosine below which two hits count "
                      "as no redundancy; 0 is plain MMR).", "",
                      "| floor | diversity | copies' share | original engine nDCG@10 change |", "|---:|---:|---|---:|"]
            for g in dv["grid"]:
                lines.append(f"| {g.get('floor', 0.0)} | {g['diversity']} | {g['copies_share_before']:.3f} -> "
                             f"{g['copies_share']:.3f} | {g['plain_ndcg_change']:+.4f} |")
        lines.append("")
    lat = result.get("latency")
    if lat:
        lines += ["## Latency, one query at a time (SciFact test, interleaved)", "",
                  "The engine's default depths (first stages 100, reranker 20). \"+ rerank\": the same engine with "
                  "all-MiniLM-L6-v2 and an untrained one-logit head as its reranker, in the `auto` precision: our "
                  "reranker's shape and cost, its scores meaningless.", "",
                  "| search | p50 ms | p95 ms | p50 / default |", "|---|---:|---:|---:|"]
        for name, s in lat.items():
            lines.append(f"| {name} | {s['p50_ms']:.1f} | {s['p95_ms']:.1f} | **{s['p50_ratio']:.3f}x** |")
        lines.append("")
    return "\n".join(lines)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--data", type=Path, default=ROOT.parent / "shared" / "data")
    p.add_argument("--retriever", default="all-MiniLM-L6-v2")
    p.add_argument("--reranker", default=None)
    p.add_argument("--parts", default="feedback,diversity,latency")
    p.add_argument("--collections", default="scifact,nfcorpus")
    p.add_argument("--choose", action="store_true", help="choose the weights on dev first")
    p.add_argument("--like-grid", default=",".join(map(str, LIKE_GRID)), help="--choose: Rocchio's weights tried")
    p.add_argument("--term-grid", default=",".join(map(str, TERM_GRID)),
                   help="--choose: the added terms' weights tried")
    p.add_argument("--floor-grid", default=",".join(map(str, FLOOR_GRID)),
                   help="--choose: the similarity floors tried (0: plain MMR)")
    p.add_argument("--rerank-latency", action="store_true",
                   help="latency also with an untrained MiniLM cross-encoder on the default depth (slow: minutes)")
    p.add_argument("--engine", type=Path, default=None,
                   help="an engine of the one collection in --collections, built already (not written to)")
    p.add_argument("--work", type=Path, default=ROOT / "runs" / "steering")
    p.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results" / "steering")
    args = p.parse_args()
    from twostage.indexer.beir import BeirDataset

    parts = args.parts.split(",")
    tag = Path(args.reranker).parent.name if args.reranker else "zeroshot"
    sets = {name: BeirDataset(args.data / name) for name in args.collections.split(",")}
    if args.engine is not None:
        if len(sets) != 1:
            raise SystemExit("--engine is one collection's engine: give that one collection to --collections")
        engines = {name: given_engine(args.engine, args.reranker) for name in sets}
    else:
        engines = {name: engine_for(f"{name}-{tag}", sets[name].root, args.work, args.retriever, args.reranker)
                   for name in sets}
    result: dict[str, Any] = {"retriever": next(iter(engines.values())).manifest.retriever.name
                              if args.engine is not None else args.retriever, "reranker": args.reranker}
    if "feedback" in parts:
        result["feedback"] = feedback_part(sets, engines, args.choose,
                                           tuple(map(float, args.like_grid.split(","))),
                                           tuple(map(float, args.term_grid.split(","))))
    if "diversity" in parts:
        corpus = list(sets["scifact"].corpus)
        dup_docs = corpus + [c for d in corpus for c in copies(d)]
        result["dup_documents"] = len(dup_docs)
        dup = engine_for(f"scifact-copies-{tag}", dup_docs, args.work, args.retriever, args.reranker)
        result["diversity"] = diversity_part(sets["scifact"], engines["scifact"], dup, args.choose,
                                             tuple(map(float, args.floor_grid.split(","))))
    if "latency" in parts:
        result["latency"] = latency_part(engines["scifact"], sets["scifact"].split("test"),
                                         latency_reranker(args.work) if args.rerank_latency else None)
    command = "python benchmarks/experiments/steering.py " + " ".join(sys.argv[1:])
    args.out.parent.mkdir(parents=True, exist_ok=True)
    text = report(result, command)
    args.out.with_suffix(".md").write_text(text + "\n", encoding="utf-8")

    def plain(x: Any) -> Any:
        return x.tolist() if isinstance(x, np.ndarray) else str(x)

    args.out.with_suffix(".json").write_text(json.dumps(result, indent=1, default=plain), encoding="utf-8")
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
