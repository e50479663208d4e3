"""Dense retrieval on SciFact: zero-shot MiniLM, sentence-transformers' own trainer, and twostage's recipe.

Usage (from the repository root):
    python benchmarks/experiments/dense_scifact.py --stage all          # or zero-shot | st-train | ours | precision
Every model is trained on the train split only and evaluated on the 300 test queries with the same exact
dense search (fp32). Each stage stores its numbers in benchmarks/results/dense-scifact/<stage>.json; the
markdown table (dense-scifact.md) is rebuilt from whatever stages have run.

- st-train: SentenceTransformer.fit with MultipleNegativesRankingLoss (in-batch negatives, batch 32,
  2 epochs, lr 2e-5), the recipe of sentence-transformers' docs.
- ours: `twostage train-retriever` defaults (see RECIPE below).
- precision: nDCG@10 of our model with bf16 and int8 inference against fp32, and encoding throughput of
  each against SentenceTransformer.encode on the same model in the same run.
"""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")

from twostage.eval.metrics import evaluate  # noqa: E402
from twostage.eval.report import versions  # noqa: E402
from twostage.indexer.beir import BeirDataset  # noqa: E402
from twostage.retriever.biencoder import BiEncoder  # noqa: E402
from twostage.retriever.dense import DenseRetriever  # noqa: E402
from twostage.retriever.weights import resolve_model  # noqa: E402

OUT = Path("benchmarks/results/dense-scifact")
MODELS = Path("runs/models")
BASE = "all-MiniLM-L6-v2"
RECIPE = ["--epochs", "3", "--batch-size", "32", "--lr", "3e-5", "--negatives", "1", "--mine-from", "bm25",
          "--bf16"]


def evaluate_model(ds: BeirDataset, model: str | Path, precision: str = "fp32") -> dict[str, float]:
    split = ds.split("test")
    encoder = BiEncoder.load(model, precision=precision)
    t0 = time.perf_counter()
    retriever = DenseRetriever.build(ds.corpus, encoder, batch_size=32)
    encode_s = time.perf_counter() - t0
    truncated = encoder.truncated
    lists = retriever.search_batch([q.text for q in split.queries], 100)
    table = evaluate(split.qrels, dict(zip([q.id for q in split.queries], lists)))
    return {**{m: float(v) for m, v in table.mean().items()}, "encode_s": encode_s,
            "docs_per_s": len(ds.corpus) / encode_s, "truncated": truncated}


def stage_zero_shot(ds: BeirDataset) -> dict:
    return {"system": f"{BASE} zero-shot", **evaluate_model(ds, BASE), "train_s": 0.0}


def stage_st_train(ds: BeirDataset) -> dict:
    from sentence_transformers import InputExample, SentenceTransformer, losses
    from torch.utils.data import DataLoader

    split = ds.split("train")
    corpus = ds.corpus
    examples = [InputExample(texts=[q.text, corpus.get(d).full_text]) for q in split.queries
                for d in sorted(split.qrels.relevant(q.id)) if d in corpus]
    model = SentenceTransformer(str(resolve_model(BASE)), device="cpu")
    loader = DataLoader(examples, shuffle=True, batch_size=32)
    t0 = time.perf_counter()
    model.fit(train_objectives=[(loader, losses.MultipleNegativesRankingLoss(model))], epochs=2,
              optimizer_params={"lr": 2e-5}, warmup_steps=int(0.1 * 2 * len(loader)), show_progress_bar=False)
    train_s = time.perf_counter() - t0
    path = MODELS / "scifact-st"
    model.save(str(path))
    return {"system": "sentence-transformers fit, MNRL in-batch, bs 32, 2 ep, lr 2e-5", **evaluate_model(ds, path),
            "train_s": train_s, "examples": len(examples)}


def stage_ours(ds: BeirDataset) -> dict:
    from twostage.app.cli import main

    path = MODELS / "scifact-ours"
    args = ["-q", "train-retriever", "--data", str(ds.root), "--split", "train", "--base", BASE, "--out", str(path), *RECIPE]
    t0 = time.perf_counter()
    if main(args) != 0:
        raise SystemExit("training failed")
    train_s = time.perf_counter() - t0
    info = json.loads((path / "twostage.json").read_text())["training"]
    return {"system": "twostage: MNRL + 1 BM25 hard negative, bs 32, 3 ep, lr 3e-5, bf16 autocast",
            **evaluate_model(ds, path), "train_s": train_s, "command": "twostage " + " ".join(args[1:]),
            "examples": sum(info["sets"].values())}


def stage_precision(ds: BeirDataset) -> dict:
    from sentence_transformers import SentenceTransformer

    model = MODELS / "scifact-ours" if (MODELS / "scifact-ours").is_dir() else resolve_model(BASE)
    texts = [d.full_text for d in ds.corpus]
    st = SentenceTransformer(str(model), device="cpu")
    st.max_seq_length = 256
    t0 = time.perf_counter()
    st.encode(texts, batch_size=32)
    st_rate = len(texts) / (time.perf_counter() - t0)
    rows = {p: evaluate_model(ds, model, p) for p in ("fp32", "bf16", "int8")}
    return {"model": str(model), "st_docs_per_s": st_rate,
            "rows": {p: {"ndcg@10": r["ndcg@10"], "recall@100": r["recall@100"], "docs_per_s": r["docs_per_s"],
                         "vs_st": r["docs_per_s"] / st_rate} for p, r in rows.items()}}


def render() -> str:
    lines = ["# Dense retrieval on SciFact test (300 queries), trained on the train split only\n",
             "Command: `python benchmarks/experiments/dense_scifact.py --stage all` (stages cache their numbers in this folder).",
             "Exact dense search, fp32 inference, max length 256 (3,681 of the 5,183 documents are longer and "
             "truncated). Wall times on this 2-core CPU machine; both trainings shared it with other work (tests) "
             "for part of their run, so take their ratio, not their absolute values, and loosely.\n",
             "| system | nDCG@10 | MRR@10 | Recall@100 | train wall s |", "|---|---|---|---|---|"]
    for stage in ("zero-shot", "st-train", "ours"):
        f = OUT / f"{stage}.json"
        if f.is_file():
            r = json.loads(f.read_text())
            lines.append(f"| {r['system']} | {r['ndcg@10']:.4f} | {r['mrr@10']:.4f} | {r['recall@100']:.4f} | "
                         f"{r['train_s']:.0f} |")
    if (OUT / "ours.json").is_file():
        lines.append(f"\nOur training command: `{json.loads((OUT / 'ours.json').read_text())['command']}`\n")
    f = OUT / "precision.json"
    if f.is_file():
        r = json.loads(f.read_text())
        fp32 = r["rows"]["fp32"]["ndcg@10"]
        lines += [f"\n## Inference precision ({r['model']})\n",
                  "Quality of the same model with each inference precision. Throughput against sentence-transformers "
                  "is measured with the engines alternating, on an idle machine, in `encode_speed.md`.\n",
                  "| precision | nDCG@10 | change | Recall@100 |", "|---|---|---|---|"]
        for p, row in r["rows"].items():
            lines.append(f"| {p} | {row['ndcg@10']:.4f} | {row['ndcg@10'] - fp32:+.4f} | {row['recall@100']:.4f} |")
    lines.append("\nVersions: " + ", ".join(f"{k} {v}" for k, v in versions().items()))
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--stage", default="all", choices=["all", "zero-shot", "st-train", "ours", "precision", "render"])
    parser.add_argument("--data", type=Path, default=Path("../shared/data/scifact"))
    args = parser.parse_args()
    ds = BeirDataset(args.data)
    OUT.mkdir(parents=True, exist_ok=True)
    stages = {"zero-shot": stage_zero_shot, "st-train": stage_st_train, "ours": stage_ours, "precision": stage_precision}
    for name in (list(stages) if args.stage == "all" else [] if args.stage == "render" else [args.stage]):
        t0 = time.perf_counter()
        result = stages[name](ds)
        result["stage_wall_s"] = time.perf_counter() - t0
        (OUT / f"{name}.json").write_text(json.dumps(result, indent=2) + "\n")
        print(name, json.dumps(result), flush=True)
    (OUT.parent / "dense-scifact.md").write_text(render())
    print(render())


if __name__ == "__main__":
    main()
