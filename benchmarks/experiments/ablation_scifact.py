"""Ablation of the quality levers on SciFact's *dev* split (train queries held out; the test split is not read).

Usage (from the repository root; every variant is cached under runs/ablation/ and in OUT/variants/, so a killed
run continues where it stopped, and --render rewrites the report from the cache):
    python benchmarks/experiments/ablation_scifact.py [--only NAME,...] [--render]

Protocol. dev = the 10% of SciFact's train queries that `twostage bench --train-split` holds out (81 queries,
seed 42); every model here trains on the other 728 only. Retriever variants differ from the baseline (MNRL +
1 BM25 hard negative, bs 32, lr 3e-5, bf16, **2 epochs**, a shorter budget than the shipped 3 to afford
seven trainings) in one lever each; each is evaluated on dev over the *whole* corpus, dense alone and
RRF(BM25, dense). Reranker variants differ from the first fast recipe (listwise, 7 negatives from BM25 and
the baseline bi-encoder, 1 epoch, 128 tokens, 500 title groups) in one lever each; each reranks the baseline's
dense and hybrid top 10 / 20 / 50 of the dev queries, alone and blended with the first stage at the alpha its
training chose. The rerankers choose their epoch and alpha on these same dev queries, so their blended rows
are optimistic by the same amount; compare rows, do not quote them as test numbers. The MarginMSE teacher is
runs/models/scifact-ce2 (42-minute recipe), trained with exactly these 81 dev queries held out.
"""

from __future__ import annotations

import argparse
import json
import os
import time
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402
from scipy.stats import ttest_rel  # noqa: E402

from twostage.eval.metrics import evaluate  # noqa: E402
from twostage.eval.report import markdown_table, versions  # noqa: E402
from twostage.indexer.beir import BeirDataset  # noqa: E402
from twostage.indexer.records import RankedList  # noqa: E402
from twostage.reranker.training import RerankerConfig  # noqa: E402
from twostage.retriever.mining import MiningConfig  # noqa: E402
from twostage.retriever.recipe import RetrieverRecipe  # noqa: E402
from twostage.retriever.trainer import TrainConfig  # noqa: E402
from twostage.retriever.training_data import hold_out  # noqa: E402

METRICS = ["ndcg@10", "mrr@10", "recall@100"]
DEV_FRACTION, SEED = 0.1, 42
MODELS = Path("runs/ablation")
TEACHER = "runs/models/scifact-ce2"
SNLI = ("../shared/data/snli-devtest/dev.jsonl", "../shared/data/snli-devtest/test.jsonl")

BASE_RETRIEVER = RetrieverRecipe(train=TrainConfig(epochs=2, batch_size=32, lr=3e-5, bf16=True, seed=SEED),
                                 negatives=1, mine_from="bm25", dev_fraction=DEV_FRACTION)
BASE_RERANKER = RerankerConfig(epochs=1, negatives=7, lr=5e-5, max_length=128, bf16=True, seed=SEED,
                               mine_from=("bm25", "dense"), title_groups=500,
                               mining=MiningConfig(num_negatives=7, depth=50, skip_top=0))


@dataclass(frozen=True)
class Variant:
    name: str
    lever: str
    recipe: Any  # RetrieverRecipe or RerankerConfig
    teacher: str | None = None
    trained: str | None = None  # an already trained model to evaluate instead of training one
    extra: dict[str, Any] = field(default_factory=dict)


RETRIEVERS = [
    Variant("r-bm25neg", "baseline: MNRL + 1 BM25 hard negative", BASE_RETRIEVER),
    Variant("r-inbatch", "in-batch negatives only (no hard negative)", replace(BASE_RETRIEVER, negatives=0)),
    Variant("r-round2", "second round: the hard negative mined by the baseline model",
            replace(BASE_RETRIEVER, mine_from="dense", mine_with=str(MODELS / "r-bm25neg"))),
    Variant("r-marginmse", "+ MarginMSE distillation of the reranker (scifact-ce2) on the same triples",
            BASE_RETRIEVER, teacher=TEACHER),
    Variant("r-titles", "+ 1,000 (title, text) pairs of the corpus", replace(BASE_RETRIEVER, title_pairs=1000)),
    Variant("r-nli", "+ 1,000 SNLI (premise, entailed, contradiction) triplets",
            replace(BASE_RETRIEVER, nli=SNLI, nli_pairs=1000)),
    Variant("r-gradcache", "batch 128 through GradCache (mini-batch 32), lr 6e-5",
            replace(BASE_RETRIEVER, train=replace(BASE_RETRIEVER.train, batch_size=128, mini_batch_size=32, lr=6e-5))),
    Variant("r-zeroshot", "no training: all-MiniLM-L6-v2 as published", BASE_RETRIEVER, trained="all-MiniLM-L6-v2"),
    Variant("r-marginmse-rank10", "as r-marginmse with MNRL weighted 10 (MarginMSE alone is ~50x MNRL in size)",
            replace(BASE_RETRIEVER, train=replace(BASE_RETRIEVER.train, margin_rank_weight=10.0)), teacher=TEACHER),
]
RERANKERS = [
    Variant("ce-fast", "baseline: the first fast recipe (listwise, 1 epoch, 128 tokens, 500 title groups)", BASE_RERANKER),
    Variant("ce-full", "42-min recipe (2 epochs, 192 tokens, 1,500 title groups; scifact-ce2)", BASE_RERANKER,
            trained=TEACHER),
    Variant("ce-e2e", "2 epochs + 1,500 title groups (128 tokens): the reranker `bench --train-split` trains with "
            "benchmarks/settings/scifact-fast.json (its dense negatives from that run's 3-epoch bi-encoder)",
            replace(BASE_RERANKER, epochs=2, title_groups=1500), trained="runs/models/scifact-e2e/reranker"),
    Variant("ce-2ep", "2 epochs", replace(BASE_RERANKER, epochs=2)),
    Variant("ce-bce", "pointwise BCE loss instead of listwise", replace(BASE_RERANKER, loss="bce")),
    Variant("ce-notitles", "no (title, text) groups", replace(BASE_RERANKER, title_groups=0)),
]


def _dev(ds: BeirDataset) -> tuple[list, Any]:
    sp = ds.split("train")
    _, dev = hold_out(list(sp.queries), DEV_FRACTION, SEED)
    return dev, sp.qrels.subset(q.id for q in dev)


def _ndcg(qrels: Any, run: Any) -> Any:
    return evaluate(qrels, run, ["ndcg@10"])["ndcg@10"].to_numpy()


def _train_retriever(ds: BeirDataset, v: Variant) -> None:
    from twostage.reranker.cross_encoder import CrossEncoder
    from twostage.retriever.recipe import train_retriever

    teacher = None
    if v.teacher:
        ce = CrossEncoder.load(v.teacher, precision="bf16")
        teacher = lambda pairs: ce.predict(pairs, activation=None, batch_size=32, show_progress=True)  # noqa: E731
    train_retriever(ds, "train", "all-MiniLM-L6-v2", MODELS / v.name, v.recipe, dev_metric=_ndcg, teacher=teacher,
                    teacher_name=v.teacher or "", show_progress=True)


def _train_reranker(ds: BeirDataset, v: Variant) -> None:
    from twostage.engine.training import train_reranker_on

    retriever = MODELS / "r-bm25neg"
    train_reranker_on(ds, "train", "all-MiniLM-L6-v2", MODELS / v.name, v.recipe, dev_fraction=DEV_FRACTION,
                      rerank_depth=30, dev_metric=_ndcg, retriever=retriever, show_progress=True,
                      command="python benchmarks/experiments/ablation_scifact.py")


_FIRST_STAGES: dict[str, dict[str, dict[str, RankedList]]] = {}


def _first_stages(ds: BeirDataset, model: Path, queries: list) -> dict[str, dict[str, RankedList]]:
    """The dev queries' dense and hybrid top 100 with ``model`` (computed once per model and process)."""
    if str(model) not in _FIRST_STAGES:
        _FIRST_STAGES[str(model)] = _search_first_stages(ds, model, queries)
    return _FIRST_STAGES[str(model)]


def _search_first_stages(ds: BeirDataset, model: Path, queries: list) -> dict[str, dict[str, RankedList]]:
    from twostage.retriever.biencoder import BiEncoder
    from twostage.retriever.bm25 import BM25Retriever
    from twostage.retriever.dense import DenseRetriever
    from twostage.retriever.hybrid import HybridRetriever

    bm25 = BM25Retriever.build(ds.corpus)
    dense = DenseRetriever.build(ds.corpus, BiEncoder.load(model, precision="bf16"), show_progress=True)
    hybrid = HybridRetriever([bm25, dense], depth=100)
    return {"dense": {q.id: dense.search(q.text, 100) for q in queries},
            "hybrid": {q.id: hybrid.search(q.text, 100) for q in queries}}


def _eval_bm25(ds: BeirDataset) -> dict[str, Any]:
    from twostage.retriever.bm25 import BM25Retriever

    queries, qrels = _dev(ds)
    bm25 = BM25Retriever.build(ds.corpus)
    table = evaluate(qrels, {q.id: bm25.search(q.text, 100) for q in queries}, METRICS)
    return {"mean": {m: float(table[m].mean()) for m in METRICS}}


def _eval_retriever(ds: BeirDataset, v: Variant) -> dict[str, Any]:
    queries, qrels = _dev(ds)
    runs = _first_stages(ds, Path(v.trained) if v.trained and Path(v.trained).is_dir() else
                         (v.trained or MODELS / v.name), queries)
    out: dict[str, Any] = {}
    for stage, run in runs.items():
        table = evaluate(qrels, run, METRICS)
        out[stage] = {"mean": {m: float(table[m].mean()) for m in METRICS},
                      "per_query_ndcg": table["ndcg@10"].round(6).to_dict()}
    return out


def _eval_reranker(ds: BeirDataset, v: Variant, depths: tuple[int, ...] = (10, 20, 50)) -> dict[str, Any]:
    from twostage.reranker.cross_encoder import CrossEncoder
    from twostage.reranker.interpolation import rerank_order

    queries, qrels = _dev(ds)
    texts = {d.id: d.full_text for d in ds.corpus}
    path = v.trained or str(MODELS / v.name)
    ce = CrossEncoder.load(path, precision="bf16")
    runs = _first_stages(ds, MODELS / "r-bm25neg", queries)
    pairs = sorted({(q.text, texts[str(d)]) for q in queries for run in runs.values() for d in run[q.id].ids[: max(depths)]})
    t0 = time.perf_counter()
    cache = dict(zip(pairs, ce.predict(pairs, batch_size=32, show_progress=True).tolist()))
    out: dict[str, Any] = {"alpha": ce.interpolation, "score_s": time.perf_counter() - t0, "pairs": len(pairs)}
    for stage, run in runs.items():
        for depth in depths:
            for mode, alpha in (("alone", None), ("blend", ce.interpolation)):
                new = {}
                for q in queries:
                    first = run[q.id].truncate(depth)
                    rr = np.array([cache[(q.text, texts[str(d)])] for d in first.ids], dtype=np.float32)
                    order, scores = rerank_order(first.scores, rr, alpha)
                    new[q.id] = RankedList(first.ids[order], scores[order])
                table = evaluate(qrels, new, METRICS[:2])
                out[f"{stage}/{depth}/{mode}"] = {"mean": {m: float(table[m].mean()) for m in METRICS[:2]},
                                                  "per_query_ndcg": table["ndcg@10"].round(6).to_dict()}
    meta = json.loads((Path(path) / "twostage.json").read_text())
    out["train_seconds"] = meta.get("training", {}).get("seconds")
    out["dev_alone_training"] = meta.get("training", {}).get("best_dev")
    return out


def _train_seconds(model: Path) -> float | None:
    meta = json.loads((model / "twostage.json").read_text())
    return meta.get("training", {}).get("seconds")


def run_variant(ds: BeirDataset, v: Variant, out: Path, kind: str) -> None:
    cached = out / "variants" / f"{v.name}.json"
    if cached.exists():
        return
    model = Path(v.trained) if v.trained else MODELS / v.name
    if not v.trained and not (model / "twostage.json").exists():
        (_train_retriever if kind == "retriever" else _train_reranker)(ds, v)
    result = _eval_retriever(ds, v) if kind == "retriever" else _eval_reranker(ds, v)
    if kind == "retriever" and not v.trained:
        result["train_seconds"] = _train_seconds(model)
    result.update(name=v.name, lever=v.lever, recipe=asdict(v.recipe) if not v.trained else None)
    cached.parent.mkdir(parents=True, exist_ok=True)
    cached.write_text(json.dumps(result, indent=1, default=str))


def _delta(row: dict[str, Any], base: dict[str, Any], key: str) -> tuple[float, float]:
    a, b = pd.Series(row[key]["per_query_ndcg"]), pd.Series(base[key]["per_query_ndcg"])
    b = b.loc[a.index]
    p = float(ttest_rel(a, b).pvalue) if (a != b).any() else 1.0
    return float(a.mean() - b.mean()), p


def render(out: Path) -> None:
    load = lambda n: json.loads((out / "variants" / f"{n}.json").read_text())  # noqa: E731
    have = {p.stem for p in (out / "variants").glob("*.json")}
    lines = ["# Ablation of the quality levers on SciFact dev (81 held-out train queries)", "",
             "Command: `python benchmarks/experiments/ablation_scifact.py` (stages cached in `variants/`; models in "
             "runs/ablation/, gitignored).", "", (__doc__ or "").split("Protocol. ")[1].strip(), ""]
    if "r-bm25neg" in have:
        base = load("r-bm25neg")
        rows = []
        for v in RETRIEVERS:
            if v.name not in have:
                continue
            r = load(v.name)
            row = {"variant": v.name, "lever": v.lever}
            for stage in ("dense", "hybrid"):
                row.update({f"{stage} {m}": r[stage]["mean"][m] for m in METRICS})
                d, p = _delta(r, base, stage)
                row[f"{stage} Δ nDCG@10 (p)"] = "-" if v.name == "r-bm25neg" else f"{d:+.3f} ({p:.2f})"
            row["train s"] = f"{r['train_seconds']:.0f}" if r.get("train_seconds") else "-"
            rows.append(row)
        if (out / "variants" / "bm25.json").exists():
            b = load("bm25")["mean"]
            rows.insert(0, {"variant": "bm25", "lever": "BM25 alone, no model (its numbers in the dense columns)",
                            **{f"dense {m}": b[m] for m in METRICS}, "dense Δ nDCG@10 (p)": "-", "train s": "-"})
        table = pd.DataFrame(rows, columns=list(rows[-1])).astype(object).fillna("-").set_index("variant")
        lines += ["## Bi-encoder levers (2 epochs each; Δ and paired t-test p against the baseline row)", "",
                  markdown_table(table, mark_best=False), ""]
    rer = [v for v in RERANKERS if v.name in have]
    if rer:
        rows = []
        base = load("ce-fast") if "ce-fast" in have else None
        for v in rer:
            r = load(v.name)
            for stage in ("dense", "hybrid"):
                row = {"variant": v.name, "first stage": stage, "alpha": r["alpha"]}
                for depth in (10, 20, 50):
                    for mode in ("alone", "blend"):
                        row[f"{mode} @{depth}"] = r[f"{stage}/{depth}/{mode}"]["mean"]["ndcg@10"]
                row["Δ blend@20 vs ce-fast (p)"] = "-"
                if base is not None and v.name != "ce-fast":
                    d, p = _delta(r, base, f"{stage}/20/blend")
                    row["Δ blend@20 vs ce-fast (p)"] = f"{d:+.3f} ({p:.2f})"
                row["train s"] = f"{r['train_seconds']:.0f}" if r.get("train_seconds") else "-"
                rows.append(row)
        lines += ["## Reranker levers and rerank depth (dev nDCG@10 over the baseline bi-encoder's dense and hybrid "
                  "first stages; the first stage alone is in the table above, row r-bm25neg)", "",
                  markdown_table(pd.DataFrame(rows).set_index(["variant", "first stage"]), mark_best=False), "",
                  "Lever descriptions: " + "; ".join(f"**{v.name}**: {v.lever}" for v in rer) + ".", ""]
    lines += ["Versions: " + ", ".join(f"{k} {v}" for k, v in versions().items()), ""]
    (out / "README.md").write_text("\n".join(lines))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data", type=Path, default=Path("../shared/data/scifact"))
    parser.add_argument("--out", type=Path, default=Path("benchmarks/results/ablation-scifact"))
    parser.add_argument("--only", default="", help="comma-separated variant names (default: all, in order)")
    parser.add_argument("--render", action="store_true", help="only rewrite README.md from the cached variants")
    args = parser.parse_args()
    if not args.render:
        ds = BeirDataset(args.data)
        only = {n.strip() for n in args.only.split(",") if n.strip()}
        if not (args.out / "variants" / "bm25.json").exists():
            (args.out / "variants").mkdir(parents=True, exist_ok=True)
            (args.out / "variants" / "bm25.json").write_text(json.dumps(_eval_bm25(ds), indent=1))
        # the baseline bi-encoder first (the rerankers mine with it), then the rerankers, then the other levers
        order = [("retriever", RETRIEVERS[0])] + [("reranker", v) for v in RERANKERS] + \
            [("retriever", v) for v in RETRIEVERS[1:]]
        for kind, v in order:
            if not only or v.name in only:
                print(f"== {v.name}: {v.lever}", flush=True)
                t0 = time.perf_counter()
                run_variant(ds, v, args.out, kind)
                print(f"== {v.name} done in {time.perf_counter() - t0:.0f} s", flush=True)
                render(args.out)
    render(args.out)


if __name__ == "__main__":
    main()
