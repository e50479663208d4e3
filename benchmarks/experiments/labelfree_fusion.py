"""Fusion and passage shape chosen per corpus without labels (#46), against the fixed defaults, on four collections.

    python benchmarks/experiments/labelfree_fusion.py [--work runs/defaults] [--documents 300]

defaults_across.py chose one first stage for every corpus on dev labels (100/50 passages, blend dense 0.5; the
engine ships RRF k 60). A user's corpus has no labels; can the engine choose per corpus from the corpus alone?
Here, for each collection, pseudo-queries (:mod:`twostage.retriever.pseudo_queries`: a document's title, or one
of its sentences rich in rare words) are made from a seeded sample of ``--documents`` documents, and each of those
documents is replaced, in a copy of the engine, by its text *without the query's words* (the inverse cloze task:
otherwise BM25 finds the copied words and every choice leans to it). Every cell of defaults_across's grid (two
shapes x RRF at k 10/30/60/100 and the blend at dense 0.3-0.7) is scored by nDCG@10 of the source document on
these queries; the best cell is the corpus's label-free choice. Its test nDCG@10 is read from defaults_across.json
(the same engines and settings, so the same numbers) and set beside the shipped default, the dev-chosen fixed
setting, and each collection's own best (an oracle, for reading only).

The zero-shot engines of defaults_across.py (MiniLM, the engine defaults, no reranker) are copied, never changed.
Writes benchmarks/results/labelfree_fusion.md and .json.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(ROOT / "benchmarks"))
from defaults_across import COLLECTIONS, FUSIONS, SHAPES, CachedQueries  # the same grid and engines

DATA = ROOT.parent / "shared" / "data"
DEFAULT = ("passages 100/50", "hybrid rrf k=60")
DEV_CHOSEN = ("passages 100/50", "hybrid blend dense 0.5")


def pseudo_queries(corpus: Any, n: int, seed: int) -> tuple[list[Any], list[Any]]:
    """(pseudo-queries, their documents with the query's words removed) for a seeded sample of ``n`` documents."""
    from twostage.indexer.records import Document
    from twostage.retriever.pseudo_queries import PseudoQueryConfig, make_pseudo_queries

    docs = list(corpus)
    picked = [docs[i] for i in sorted(np.random.default_rng(seed).choice(len(docs), min(n, len(docs)), replace=False))]
    made = make_pseudo_queries(picked, PseudoQueryConfig(kinds=("title", "sentence"), seed=seed))
    by_id = {d.id: d for d in picked}
    held = {p.doc_id: Document(p.doc_id, p.positive, "", dict(by_id[p.doc_id].metadata)) for p in made}
    return made, list(held.values())


def score(engine: Any, made: list[Any]) -> dict[str, float]:
    """nDCG@10 of each pseudo-query's source document, for every fusion of the grid (the engine's own search)."""
    from twostage.eval.metrics import ndcg10_by_query
    from twostage.retriever.pseudo_queries import as_queries_and_qrels

    queries, qrels = as_queries_and_qrels(made)
    out = {}
    for name, knobs in FUSIONS.items():
        ranked = engine.with_settings(**knobs).as_retriever(first_stage="hybrid", rerank=False).search_batch(
            [q.text for q in queries], 10)
        out[f"hybrid {name}"] = float(np.mean(ndcg10_by_query(qrels, dict(zip((q.id for q in queries), ranked)))))
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--work", type=Path, default=ROOT / "runs" / "defaults", help="defaults_across.py's engines")
    ap.add_argument("--documents", type=int, default=300)
    ap.add_argument("--seed", type=int, default=42)
    ap.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results" / "labelfree_fusion.md")
    args = ap.parse_args()

    from twostage.engine.search_engine import SearchEngine
    from twostage.indexer.beir import BeirDataset

    measured = json.loads((ROOT / "benchmarks" / "results" / "defaults_across.json").read_text())["scores"]
    started = time.perf_counter()
    pseudo: dict[str, dict[str, dict[str, float]]] = {}
    queries_made: dict[str, int] = {}
    tmp = Path(tempfile.mkdtemp(prefix="twostage-labelfree-"))
    try:
        for name, _, _ in COLLECTIONS:
            made, held = pseudo_queries(BeirDataset(DATA / name).corpus, args.documents, args.seed)
            queries_made[name] = len(made)
            for shape in SHAPES:
                source = args.work / f"{name}-{shape.split()[0]}"
                if not (source / "CURRENT").is_file():
                    raise SystemExit(f"{source}: missing; run benchmarks/experiments/defaults_across.py first")
                copy = tmp / source.name
                shutil.copytree(source, copy, ignore=shutil.ignore_patterns("LOCK"))
                engine = SearchEngine.load(copy, verify=False).upsert(held)  # the queries' words taken out
                engine.use_models(encoder=CachedQueries(engine.encoder))
                pseudo.setdefault(name, {})[shape] = score(engine, made)
                engine.close()
                shutil.rmtree(copy)
                print(f"{name} {shape}: {time.perf_counter() - started:.0f} s", flush=True)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    rows = []
    for name, _, test in COLLECTIONS:
        cells = [(shape, system) for shape in pseudo[name] for system in pseudo[name][shape]]
        chosen = max(cells, key=lambda c: (pseudo[name][c[0]][c[1]], c == DEFAULT))
        tested = measured[f"{name}/{test}"]

        def on_test(cell: tuple[str, str], tested: dict[str, Any] = tested) -> float:
            return float(tested[cell[0]][cell[1]]["ndcg@10"])

        oracle = max(cells, key=on_test)
        rows.append({"collection": name, "queries": queries_made[name], "chosen": list(chosen),
                     "pseudo_ndcg": pseudo[name][chosen[0]][chosen[1]],
                     "pseudo_ndcg_default": pseudo[name][DEFAULT[0]][DEFAULT[1]],
                     "test_chosen": on_test(chosen), "test_default": on_test(DEFAULT),
                     "test_dev_chosen": on_test(DEV_CHOSEN), "oracle": list(oracle), "test_oracle": on_test(oracle)})
    result = {"command": "python benchmarks/experiments/labelfree_fusion.py " + " ".join(sys.argv[1:]),
              "rows": rows, "pseudo": pseudo, "seconds": time.perf_counter() - started}
    args.out.with_suffix(".json").write_text(json.dumps(result, indent=1) + "\n")
    args.out.write_text(report(result))
    print(report(result))
    return 0


def report(r: dict[str, Any]) -> str:
    from serve_load import machine

    lines = ["# Fusion chosen per corpus without labels (pseudo-queries), against the fixed defaults", "",
             f"Command: `{r['command']}`", "",
             "Zero-shot all-MiniLM-L6-v2, no reranker, defaults_across.py's engines (the engine defaults). Label-free "
             "choice: the cell (shape x fusion) with the best nDCG@10 on pseudo-queries (titles and rare-word "
             "sentences of a seeded sample of documents, each document's copy without the query's words). Test "
             "nDCG@10 from defaults_across.json (the same engines and settings). Shipped default: passages 100/50, "
             "RRF k 60; dev-chosen fixed: passages 100/50, blend dense 0.5 (chosen on SciFact train and NFCorpus "
             f"dev); oracle: the collection's own best on test, for reading only. Machine: {machine()}; "
             f"{r['seconds'] / 60:.1f} min.", "",
             "| collection | pseudo-queries | label-free choice | its pseudo nDCG@10 (default's) | test: label-free "
             "| test: shipped default | test: dev-chosen fixed | test: oracle |",
             "|---|---|---|---|---|---|---|---|"]
    for x in r["rows"]:
        lines.append(f"| {x['collection']} | {x['queries']} | {x['chosen'][0]}, {x['chosen'][1]} | "
                     f"{x['pseudo_ndcg']:.4f} ({x['pseudo_ndcg_default']:.4f}) | **{x['test_chosen']:.4f}** "
                     f"({x['test_chosen'] - x['test_default']:+.4f}) | {x['test_default']:.4f} | "
                     f"{x['test_dev_chosen']:.4f} | {x['test_oracle']:.4f} ({x['oracle'][0]}, {x['oracle'][1]}) |")
    mean = {k: float(np.mean([x[k] for x in r["rows"]])) for k in ("test_chosen", "test_default", "test_dev_chosen",
                                                                     "test_oracle")}
    lines.append(f"| mean | | | | **{mean['test_chosen']:.4f}** ({mean['test_chosen'] - mean['test_default']:+.4f}) "
                 f"| {mean['test_default']:.4f} | {mean['test_dev_chosen']:.4f} | {mean['test_oracle']:.4f} |")
    beats = sum(x["test_chosen"] >= x["test_default"] for x in r["rows"])
    lines += ["", f"The label-free choice is at least the shipped default on {beats} of {len(r['rows'])} collections."]
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    raise SystemExit(main())
