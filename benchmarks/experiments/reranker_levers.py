"""Training levers for the reranker (#18: "longer training where it pays", "NLI pairs"): ablated on SciFact dev,
reported on test.

Usage (from the repository root; a variant already trained under ``--runs`` is reused, a killed training resumes):
    python benchmarks/experiments/reranker_levers.py --models runs/models/scifact-e2e-fit

Each variant differs from the one-command reranker (``MODELS/reranker``, ``RerankerConfig()``: listwise, 2 epochs,
7 negatives from BM25 and the one-command bi-encoder, 1,500 (title, text) groups, 128 tokens) in one lever, and is
trained exactly as ``twostage bench --train-split`` trains it (``train_reranker_on``: the same bi-encoder for the
dense negatives, the same 81 dev queries held out with seed 42, best epoch and blends chosen on them):
- ``3 epochs``: ``epochs=3`` (the one-command run's dev score still rose by 0.055 from its epoch 1 to its epoch 2);
- ``snli first``: an intermediate stage before the SciFact recipe, on SNLI dev + test (../shared/data/snli-devtest):
  the premise is the query, its entailed hypothesis the positive; its contradicting hypothesis and 3 hypotheses of
  other premises the negatives; 1 epoch, the same loss and optimiser settings. The SciFact recipe then starts from it.

Every variant reranks the same hybrid top 20 (the one-command bi-encoder, RRF with BM25, exact search, fp32) of
SciFact dev (81 held-out train queries) and test (300), alone and blended with the first stage; the reranker runs
in fp32 (the lever, not quantisation noise). Each blend ``a`` is chosen on dev by the engine's rule (the smallest
``a`` within one standard error of the best, ``reranker/interpolation.py``) and applied to test.

Decision, on dev only: a lever is kept when its reranker alone beats the one-command reranker alone on dev by more
than one standard error of the per-query difference (the rule the blends are chosen by). Test is reported, never
used to choose.

Writes benchmarks/results/reranker-levers.md; last line: ``levers: kept NAMES (dev); test alone: VARIANT X, ...;
hybrid Y``.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[2]
DATA = ROOT.parent / "shared" / "data"
SNLI = ("snli-devtest/dev.jsonl", "snli-devtest/test.jsonl")
RANDOM_NEGATIVES = 3


def snli_groups(data: Path, seed: int) -> list:
    """(premise, entailed, (contradicting, 3 hypotheses of other premises)) from the NLI triplet reader."""
    from twostage.retriever.examples import PairExample
    from twostage.retriever.training_data import nli_triplets

    triplets = nli_triplets([data / p for p in SNLI]).examples
    own: dict[str, set[str]] = {}
    for e in triplets:
        own.setdefault(e.anchor, set()).update((e.positive, *e.negatives))
    pool = sorted({h for hs in own.values() for h in hs})
    rng = np.random.default_rng(seed)
    groups = []
    for e in triplets:
        extra: list[str] = []
        while len(extra) < RANDOM_NEGATIVES:
            h = pool[int(rng.integers(len(pool)))]
            if h not in own[e.anchor] and h not in extra:
                extra.append(h)
        groups.append(PairExample(e.anchor, e.positive, (*e.negatives, *extra)))
    return groups


def train_variants(args: argparse.Namespace) -> dict[str, Path]:
    """name -> model directory; trains what is missing."""
    from dataclasses import replace

    from twostage.app.train_models import TrainSettings
    from twostage.eval.metrics import ndcg10_by_query
    from twostage.reranker.cross_encoder import CrossEncoder
    from twostage.engine.training import train_reranker_on
    from twostage.reranker.training import train_reranker
    from twostage.retriever.fit import seed_everything

    settings = TrainSettings().aligned()
    config = settings.reranker
    models = {"one-command": args.models / "reranker", "3 epochs": args.runs / "epochs3",
              "snli first": args.runs / "snli"}

    def scifact(out: Path, base: str, cfg: object) -> None:
        if (out / "twostage.json").exists():
            return
        train_reranker_on(args.data / "scifact", "train", base, out, cfg, dev_fraction=settings.dev_fraction,
                          rerank_depth=settings.rerank_depth, dev_metric=ndcg10_by_query, retriever=args.models / "retriever",
                          show_progress=True, command="python benchmarks/experiments/reranker_levers.py")

    scifact(models["3 epochs"], settings.base, replace(config, epochs=3))
    stage = args.runs / "snli-stage"
    if not (stage / "twostage.json").exists():
        seed_everything(config.seed)
        model = CrossEncoder.load(settings.base, allow_untrained_head=True)
        train_reranker(model, snli_groups(args.data, config.seed), replace(config, epochs=1), stage,
                       show_progress=True, info={"data": "snli dev+test", "base": settings.base})
    scifact(models["snli first"], str(stage), config)
    return models


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", type=Path, required=True, help="the one-command models directory")
    parser.add_argument("--data", type=Path, default=DATA, help="../shared/data")
    parser.add_argument("--runs", type=Path, default=ROOT / "runs" / "reranker-levers", help="variants' models")
    parser.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results" / "reranker-levers.md")
    args = parser.parse_args()

    from rerank_windows import ALPHAS, DEPTH, blends, dev_and_test, hybrid_first_stage  # the sibling's protocol

    from twostage.eval.metrics import ndcg10_by_query
    from twostage.indexer.beir import BeirDataset
    from twostage.indexer.records import RankedList
    from twostage.reranker.cross_encoder import CrossEncoder
    from twostage.reranker.interpolation import one_se_blend

    start = time.perf_counter()
    models = train_variants(args)
    trained_s = time.perf_counter() - start
    ds = BeirDataset(args.data / "scifact")
    splits = dev_and_test(ds)
    dev = splits["dev"][0]
    hybrid = hybrid_first_stage(ds, args.models / "retriever", "twostage-levers-")
    texts = {i: ds.corpus.get(i).full_text for i in ds.corpus.ids}
    first = {s: {q.id: hybrid.search(q.text, DEPTH) for q in qs} for s, (qs, _) in splits.items()}
    base = {s: ndcg10_by_query(qrels, first[s]) for s, (_, qrels) in splits.items()}
    res: dict[str, dict] = {}
    for name, path in models.items():
        reranker = CrossEncoder.load(path, precision="fp32")
        meta = json.loads((path / "twostage.json").read_text())["training"]
        res[name] = {"history": [(h["epoch"], h["dev"]) for h in meta.get("history", [])],
                     "seconds": meta.get("seconds")}
        for split, (queries, qrels) in splits.items():
            pairs = [(q.text, texts[str(d)]) for q in queries for d in first[split][q.id].ids]
            scores = iter(reranker.predict(pairs, activation=None, show_progress=True).tolist())
            runs: dict[float | None, dict[str, RankedList]] = {a: {} for a in (None, *ALPHAS)}
            for q in queries:
                fs = first[split][q.id]
                rr = np.array([next(scores) for _ in fs.ids], dtype=np.float32)
                for a, ranked in blends(fs, rr).items():
                    runs[a][q.id] = ranked
            res[name][split] = {a: ndcg10_by_query(qrels, run) for a, run in runs.items()}
        res[name]["a"] = one_se_blend([(a, res[name]["dev"][a]) for a in ALPHAS])
        print(name, {s: round(float(res[name][s][None].mean()), 4) for s in splits}, flush=True)

    ref = res["one-command"]
    kept = []
    lines = ["# Reranker training levers: ablation on SciFact dev, reported on test", "",
             f"Command: `python benchmarks/experiments/reranker_levers.py --models {args.models}`", "",
             ("What each variant is and how it is judged: the script's docstring. First stage: hybrid (the "
              f"one-command bi-encoder, RRF with BM25), its top {DEPTH}; reranker fp32. Dev: {len(dev)} held-out "
              f"train queries; test: {len(splits['test'][0])}. Δ: against the one-command reranker alone, paired, "
              "with the standard error of the per-query difference."), "",
             ("| variant | train min | dev by epoch (training's dev score) | dev alone | Δ dev alone (SE) | "
              "dev blended (a) | test alone | Δ test alone | test blended at dev's a |"),
             "|---|---|---|---|---|---|---|---|---|"]
    lines.append(f"| hybrid first stage (no reranker) | - | - | {base['dev'].mean():.4f} | - | - | "
                 f"{base['test'].mean():.4f} | - | - |")
    for name, r in res.items():
        d = r["dev"][None] - ref["dev"][None]
        se = float(d.std(ddof=1) / np.sqrt(len(d)))
        if name != "one-command" and d.mean() > se:
            kept.append(name)
        hist = ", ".join(f"{e}: {v:.3f}" for e, v in r["history"])
        mins = f"{r['seconds'] / 60:.0f}" if r["seconds"] else "-"
        delta = "-" if name == "one-command" else f"{d.mean():+.4f} ({se:.4f})"
        dt = "-" if name == "one-command" else f"{(r['test'][None] - ref['test'][None]).mean():+.4f}"
        lines.append(f"| {name} | {mins} | {hist} | {r['dev'][None].mean():.4f} | {delta} | "
                     f"{r['dev'][r['a']].mean():.4f} ({r['a']:g}) | {r['test'][None].mean():.4f} | {dt} | "
                     f"{r['test'][r['a']].mean():.4f} |")
    lines += ["", ("Test nDCG@10 at every blend (a = 0 is the first stage, 1 the reranker alone; for analysis, never "
                   "used to choose):"), "", "| variant | " + " | ".join(f"{a:g}" for a in ALPHAS) + " |",
              "|---|" + "---|" * len(ALPHAS)]
    lines += [f"| {n} | " + " | ".join(f"{r['test'][a].mean():.4f}" for a in ALPHAS) + " |" for n, r in res.items()]
    alone = ", ".join(f"{n} {r['test'][None].mean():.4f}" for n, r in res.items())
    lines += ["", (f"{(time.perf_counter() - start) / 60:.1f} min on this machine ({trained_s / 60:.1f} of it "
                   "training what was missing)."), "",
              f"levers: kept {', '.join(kept) or 'none'} (dev); test alone: {alone}; hybrid {base['test'].mean():.4f}"]
    args.out.write_text("\n".join(lines) + "\n", encoding="utf-8")
    print(lines[-1])


if __name__ == "__main__":
    main()
