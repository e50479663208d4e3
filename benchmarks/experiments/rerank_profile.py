"""Where the int8 reranker's time goes, and what the runtime levers left in reach are worth.

    python benchmarks/experiments/rerank_profile.py --reranker runs/models/scifact-e2e-fit/reranker \
        [--data ../shared/data/scifact] [--queries 20] [--depth 20] [--rounds 5] [--out benchmarks/results/rerank_profile]

The pairs are the engine's: BM25's top ``--depth`` for each of ``--queries`` SciFact test queries, tokenised as
``CrossEncoder.predict`` does (exact head-word cut, ``max_length`` of the model). Three parts:

1. OpenVINO's per-operation profile (``PERF_COUNT``) of the model ``CrossEncoder.load(precision="openvino-int8")``
   uses, on one stream's share of a call (``depth / 2`` rows), by operation and kernel, with the achieved GOP/s of
   the int8 matrix products (counted from the model's shape: 4 h^2 + 2 h f multiply-adds a token per layer).
2. The whole call split into tokenising and the runtime, as ``predict`` runs it.
3. Variants of the int8 export, each quantised by NNCF from the same fp32 conversion on the same calibration pairs
   and compiled on two streams as the runner does: NNCF's transformer defaults (what ships), the same with static
   input shapes (``reshape`` to the call's rows and length), attention left unquantised (``IgnoredScope`` of
   ``ScaledDotProductAttention``), and NNCF's performance preset. Timed alternately over ``--rounds`` rounds
   (median ms per call); agreement with the fp32 torch model on the same pairs (max |sigmoid difference|, mean top-10
   overlap of the candidates' order).
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import io
import logging
import os
import sys
import time
import warnings
from pathlib import Path

import numpy as np

os.environ.setdefault("HF_HUB_OFFLINE", "1")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--reranker", required=True)
    ap.add_argument("--data", type=Path, default=Path(__file__).resolve().parents[2] / "shared" / "data" / "scifact")
    ap.add_argument("--queries", type=int, default=20)
    ap.add_argument("--depth", type=int, default=20)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--out", type=Path, default=Path("benchmarks/results/rerank_profile"))
    args = ap.parse_args()

    import nncf
    import openvino as ov
    import torch

    from twostage import BeirDataset, BM25Retriever
    from twostage.reranker.cross_encoder import CrossEncoder, calibration_pairs
    from twostage.retriever.runtime import Forward, OpenVINORunner

    logging.getLogger("nncf").setLevel(logging.ERROR)
    ds = BeirDataset(args.data)
    corpus = list(ds.corpus)
    texts = {d.id: d.full_text for d in corpus}
    bm25 = BM25Retriever.build(corpus)
    queries = list(ds.split("test").queries)[:args.queries]
    groups = [[(q.text, texts[str(d)]) for d in bm25.search(q.text, args.depth).ids] for q in queries]
    # the calibration inference_speed.py gives (300 documents spread over the corpus, as pairs)
    calib = [corpus[i].full_text for i in range(1, len(corpus), max(1, len(corpus) // 300))][:300]

    ce = CrossEncoder.load(args.reranker, precision="openvino-int8", calibration=calibration_pairs(calib))
    names = list(ce.runtime.names)
    feats = [ce.features([q for q, _ in g], [d for _, d in g], "np") for g in groups]
    rows, length = feats[0]["input_ids"].shape
    half = rows // 2
    core = ov.Core()
    lines = [f"# Where the int8 reranker's time goes ({os.cpu_count()} cores)", "",
             "Command: `python benchmarks/experiments/rerank_profile.py " + " ".join(sys.argv[1:]) + "`", "",
             (f"Pairs: BM25's top {args.depth} for {len(groups)} SciFact test queries, tokenised as predict does "
             f"({rows} x {length} tokens a call). Model: {args.reranker}, its cached openvino-int8 export."), ""]

    # 1. per-operation profile of one stream's share, on one stream over every thread
    model = core.read_model(str(ce.runtime.where / "model.xml"))
    prof = core.compile_model(model, "CPU", {"PERFORMANCE_HINT": "LATENCY", "NUM_STREAMS": 1,
                                             "INFERENCE_NUM_THREADS": torch.get_num_threads(), "PERF_COUNT": True})
    req = prof.create_infer_request()
    by_kind: collections.Counter = collections.Counter()
    count: collections.Counter = collections.Counter()
    n = 0
    for f in feats:
        req.infer([f[name][:half] for name in names])
        if f is feats[0]:
            continue  # warm-up
        n += 1
        for p in req.profiling_info:
            by_kind[(p.node_type, p.exec_type)] += p.real_time.total_seconds() * 1000
            count[(p.node_type, p.exec_type)] += 1
    total = sum(by_kind.values()) / n
    cfg = ce.model.config
    macs = (4 * cfg.hidden_size ** 2 + 2 * cfg.hidden_size * cfg.intermediate_size) * cfg.num_hidden_layers \
        * half * length
    fc_ms = sum(v for (node, _), v in by_kind.items() if node.startswith("FullyConnected")) / n
    lines += [f"## 1. OpenVINO profile of one stream's share ({half} x {length}; one stream over every thread)", "",
              (f"Total {total:.1f} ms a call (mean of {n} calls). The int8 matrix products (FullyConnected*): "
              f"{fc_ms:.1f} ms for {2 * macs / 1e9:.1f} GOP, **{2 * macs / 1e9 / fc_ms * 1000:.0f} GOP/s**."), "",
              "| operation | kernel | ms a call | share | nodes |", "|---|---|---|---|---|"]
    for (node, kernel), v in by_kind.most_common(12):
        lines.append(f"| {node} | {kernel} | {v / n:.2f} | {100 * v / n / total:.1f}% | {count[(node, kernel)] // n} |")

    # 2. tokenising and the runtime, as predict runs them
    tok_ms, run_ms = [], []
    for _ in range(args.rounds):
        for g in groups:
            t = time.perf_counter()
            f = ce.features([q for q, _ in g], [d for _, d in g], "np")
            t1 = time.perf_counter()
            ce.runtime(f)
            tok_ms.append(1000 * (t1 - t))
            run_ms.append(1000 * (time.perf_counter() - t1))
    lines += ["", "## 2. One predict call, split", "",
              (f"tokenising {np.median(tok_ms):.1f} ms, the OpenVINO runtime (two streams) {np.median(run_ms):.1f} ms "
              f"(medians over {len(tok_ms)} calls)."), ""]

    # 3. variants of the export, same fp32 conversion, same calibration
    fp32 = CrossEncoder.load(args.reranker)
    with torch.inference_mode():
        ref = [fp32.forward({k: torch.from_numpy(v) for k, v in f.items()}).numpy() for f in feats]
        example = fp32.tokenize(["a query"], ["an example document to trace"])
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            base = ov.convert_model(Forward(fp32, names).eval(), example_input=tuple(example[k] for k in names))
    pairs = calibration_pairs(calib)
    batches = [ce.features([q for q, _ in pairs[i:i + 16]], [d for _, d in pairs[i:i + 16]], "np")
               for i in range(0, len(pairs), 16)]
    data = nncf.Dataset([tuple(np.asarray(b[k], dtype=np.int64) for k in names) for b in batches])
    transformer = nncf.ModelType.TRANSFORMER
    recipes = {
        "NNCF transformer defaults (ships)": {},
        "attention unquantised": {"ignored_scope": nncf.IgnoredScope(types=["ScaledDotProductAttention"])},
        "performance preset": {"preset": nncf.QuantizationPreset.PERFORMANCE},
    }

    def compiled(ir, static: bool) -> OpenVINORunner:
        """``ir`` compiled on two streams and called as the engine calls it (rows split over the streams)."""
        ir = ir.clone()
        if static:
            ir.reshape({p.get_any_name(): ov.PartialShape([half, length]) for p in ir.inputs})
        c = core.compile_model(ir, "CPU", {"PERFORMANCE_HINT": "THROUGHPUT", "NUM_STREAMS": 2,
                                           "INFERENCE_NUM_THREADS": torch.get_num_threads()})
        return OpenVINORunner(c, names, ce.runtime.where, streams=2)

    variants = {}
    for label, kw in recipes.items():
        with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
            q = nncf.quantize(base.clone(), data, model_type=transformer, subset_size=len(batches), **kw)
        variants[label] = compiled(q, False)
        if not kw:
            variants[label + ", static shapes"] = compiled(q, True)
    times = {k: [] for k in variants}
    for r in range(args.rounds):
        order = list(variants)[r % len(variants):] + list(variants)[:r % len(variants)]
        for k in order:
            for f in feats:
                t = time.perf_counter()
                variants[k](f)
                times[k].append(1000 * (time.perf_counter() - t))
    base_ms = float(np.median(times["NNCF transformer defaults (ships)"]))
    lines += ["## 3. Variants of the int8 export (two streams, as the runner compiles them)", "",
              "| variant | ms a call (median) | x ships | max abs sigmoid diff vs fp32 | top-10 overlap with fp32 |",
              "|---|---|---|---|---|"]

    def sigmoid(x):
        return 1 / (1 + np.exp(-np.asarray(x, dtype=np.float64)))

    for k, call in variants.items():
        out = [call(f).reshape(-1) for f in feats]
        diff = max(float(np.abs(sigmoid(o) - sigmoid(r)).max()) for o, r in zip(out, ref))
        overlap = np.mean([len(set(np.argsort(-o)[:10]) & set(np.argsort(-r)[:10])) / 10 for o, r in zip(out, ref)])
        med = float(np.median(times[k]))
        lines.append(f"| {k} | {med:.1f} | {base_ms / med:.2f}x | {diff:.3f} | {overlap:.3f} |")
    text = "\n".join(lines) + "\n"
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.with_suffix(".md").write_text(text)
    print(text)


if __name__ == "__main__":
    main()
