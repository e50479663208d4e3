"""The retriever's `auto` precision decided on dev data (#46): MiniLM in OpenVINO int8 against fp32, zero-shot.

    python benchmarks/experiments/retriever_precision.py [--work runs/defaults]

The frontier (frontier.md) measured on test splits that an int8 retriever loses nothing and builds an engine about
2.8x faster. A default is chosen on dev data only: here SciFact train (the zero-shot model never trained on it) and
NFCorpus dev. For each, an engine with the defaults (100/50 passages, hnswlib) is built with the retriever in
``openvino-int8``; its dense and hybrid (RRF k 60, and the dev-chosen blend dense 0.5) nDCG@10 are set beside the
same engine in ``openvino-fp32`` (defaults_across.py's engines and numbers: defaults_across.json), with the seconds
each build took to encode. Writes benchmarks/results/retriever_precision.md and .json.
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

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(ROOT / "benchmarks"))
from defaults_across import FUSIONS, CachedQueries  # the same grid and the fp32 engines' numbers

DATA = ROOT.parent / "shared" / "data"
DEV = (("scifact", "train"), ("nfcorpus", "dev"))
SYSTEMS = ("dense", "hybrid rrf k=60", "hybrid blend dense 0.5")


def measure(engine: Any, data: Path, split: str) -> dict[str, float]:
    from twostage.eval.harness import run_bench

    systems = {"dense": engine.as_retriever(first_stage="dense", rerank=False)}
    systems.update({f"hybrid {name}": engine.with_settings(**FUSIONS[name]).as_retriever(first_stage="hybrid",
                                                                                         rerank=False)
                    for name in ("rrf k=60", "blend dense 0.5")})
    table = run_bench(data, split, systems).table()
    return {name: float(row["ndcg@10"]) for name, row in table.iterrows()}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--base", default="all-MiniLM-L6-v2")
    ap.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results" / "retriever_precision.md")
    args = ap.parse_args()

    from serve_load import machine

    from twostage.engine.search_engine import SearchEngine
    from twostage.indexer.beir import BeirDataset

    fp32 = json.loads((ROOT / "benchmarks" / "results" / "defaults_across.json").read_text())
    started = time.perf_counter()
    rows = []
    tmp = Path(tempfile.mkdtemp(prefix="twostage-precision-"))
    try:
        for name, split in DEV:
            t = time.perf_counter()
            engine = SearchEngine.build(BeirDataset(DATA / name).corpus, tmp / name, retriever=args.base,
                                        precision="openvino-int8", show_progress=True)
            build_s = time.perf_counter() - t
            engine.use_models(encoder=CachedQueries(engine.encoder))
            int8 = measure(engine, DATA / name, split)
            engine.close()
            shutil.rmtree(tmp / name)
            ref = fp32["scores"][f"{name}/{split}"]["passages 100/50"]
            rows.append({"collection": name, "split": split, "int8": int8,
                         "fp32": {s: float(ref[s]["ndcg@10"]) for s in SYSTEMS}, "build_s_int8": build_s,
                         "build_s_fp32": float(fp32["build_s"][f"{name} passages 100/50"])})
            print(json.dumps(rows[-1]), flush=True)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    result = {"command": "python benchmarks/experiments/retriever_precision.py " + " ".join(sys.argv[1:]),
              "base": args.base, "rows": rows, "machine": machine(), "seconds": time.perf_counter() - started}
    args.out.with_suffix(".json").write_text(json.dumps(result, indent=1) + "\n")
    args.out.write_text(report(result))
    print(report(result))
    return 0


def report(r: dict[str, Any]) -> str:
    lines = ["# The retriever in int8 against fp32, on dev splits (the `auto` precision decided on dev)", "",
             f"Command: `{r['command']}`", "",
             f"Retriever `{r['base']}` zero-shot, no reranker, the engine defaults (100/50 passages, hnswlib). "
             "fp32 (openvino-fp32, today's `auto`) from defaults_across.json (the same engine settings; its build "
             "seconds were measured in that run, alone on the machine as this one); int8 (openvino-int8) built "
             f"here. nDCG@10 on dev splits only. Machine: {r['machine']}; {r['seconds'] / 60:.1f} min.", "",
             "| dev split | system | fp32 | int8 | int8 - fp32 |", "|---|---|---|---|---|"]
    for x in r["rows"]:
        for s in SYSTEMS:
            lines.append(f"| {x['collection']}/{x['split']} | {s} | {x['fp32'][s]:.4f} | {x['int8'][s]:.4f} | "
                         f"{x['int8'][s] - x['fp32'][s]:+.4f} |")
    lines += ["", "| collection | build s, fp32 | build s, int8 | fp32 / int8 |", "|---|---|---|---|"]
    for x in r["rows"]:
        lines.append(f"| {x['collection']} | {x['build_s_fp32']:.0f} | {x['build_s_int8']:.0f} | "
                     f"{x['build_s_fp32'] / x['build_s_int8']:.2f}x |")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    raise SystemExit(main())
