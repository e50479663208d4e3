"""CPU inference side by side: sentence-transformers' backends against every precision of ours, same models and texts.

    python benchmarks/inference_speed.py --retriever MODEL_DIR --reranker MODEL_DIR \
        [--peer-python PEER_ENV/bin/python] [--data ../shared/data/scifact] [--out benchmarks/results/inference_speed]

Peers (sentence-transformers, each with its own export helpers): torch fp32, ONNX, ONNX int8
(``export_dynamic_quantized_onnx_model``, avx512_vnni), OpenVINO, OpenVINO int8
(``export_static_quantized_openvino_model``, calibrated on SciFact documents given as a local dataset: the hub's
default calibration set is out of reach here).
Ours: fp32, bf16, int8 (torch dynamic), openvino-fp32, openvino-int8 (calibrated on SciFact documents; rows split
over one stream per core), and openvino-int8:1-stream (the same export compiled with one stream over every core).

sentence-transformers' ONNX and OpenVINO backends need optimum-onnx / optimum-intel, which pin transformers 4.x,
while twostage needs transformers 5: the peers run in their own interpreter (``--peer-python``, default this one),
ours in this one, each as a worker process. The peers' environment (sentence-transformers 5.x is the newest that
accepts transformers 4.x)::

    python3 -m venv peer && peer/bin/pip install torch==2.13.0 && peer/bin/pip install "sentence-transformers<6" \
        "optimum-intel[openvino]" "optimum-onnx[onnxruntime]" "datasets<5" "huggingface-hub<1"

Within a run the rounds alternate between modes (the first mode of each round rotates) and the medians are
reported.

Measured per mode: ``encode`` of ``--docs`` SciFact documents (batch 32; documents/s), ``predict`` of one query's
``--depth`` candidates (BM25's top ``--depth`` of ``--queries`` test queries, one call per query as the engine
does; ms per query), and nDCG@10 on SciFact test of the dense first stage (exact search over the whole corpus)
and of hybrid+rerank (RRF of BM25 and the mode's dense top 100, the mode's reranker on the top ``--depth``,
blended with the reranker's dev-chosen hybrid weight). Modes meant to compute in fp32 (torch and OpenVINO / ONNX
fp32) are checked against our fp32 on the speed sample instead (max |difference| of embeddings and scores), and
evaluated like the others when they differ by more than 1e-3 (OpenVINO computes in bf16 where the CPU has it
unless told otherwise).

Each stage is judged on its own nDCG@10 (encode: dense; rerank: hybrid+rerank), since a user picks the
bi-encoder's and the cross-encoder's backends separately: an int8 reranker that keeps hybrid+rerank's quality
counts for rerank even where the same mode's int8 bi-encoder loses dense quality.

The last line: ``speed: encode X.XXx, rerank Y.YYx against the fastest sentence-transformers backend that keeps
nDCG@10 within 0.005``.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

PEER_MODES = ("st-torch", "st-onnx", "st-onnx-int8", "st-openvino", "st-openvino-int8")
OUR_MODES = ("fp32", "bf16", "int8", "openvino-fp32", "openvino-int8", "openvino-int8:1-stream")
FP32_MODES = ("st-torch", "st-onnx", "st-openvino", "openvino-fp32")  # fp32 arithmetic: compared, not re-evaluated
FP32_MATCH = 1e-3  # ... when their numbers match our fp32's this closely (OpenVINO may compute in bf16 by itself)
TOLERANCE = 0.005


# ---- workers (the peer worker imports only sentence-transformers: it runs in another environment) -------------
def _peer_models(spec: dict) -> dict:
    """Every sentence-transformers backend, exported with its own helpers into a scratch copy of the models."""
    import datasets  # noqa: F401  (the OpenVINO int8 export reads its calibration set through it)
    from sentence_transformers import CrossEncoder, SentenceTransformer
    from sentence_transformers.backend import (
        export_dynamic_quantized_onnx_model,
        export_static_quantized_openvino_model,
    )

    work = Path(spec["work"])
    ret, rer = work / "retriever", work / "reranker"
    for src, dst in ((spec["retriever"], ret), (spec["reranker"], rer)):
        shutil.copytree(src, dst, ignore=shutil.ignore_patterns("twostage-openvino", "openvino", "onnx"))
    calib = work / "calibration"
    calib.mkdir()
    (calib / "train.jsonl").write_text("".join(json.dumps({"sentence": t}) + "\n" for t in spec["calibration"]))
    max_len = spec["reranker_max_length"]
    models = {"st-torch": (SentenceTransformer(str(ret), device="cpu"),
                           CrossEncoder(str(rer), device="cpu", max_length=max_len))}
    # the export helpers change the model they are given: export from throw-away instances, time fresh ones
    from optimum.intel import OVQuantizationConfig

    for path, cls in ((ret, SentenceTransformer), (rer, CrossEncoder)):
        export_dynamic_quantized_onnx_model(cls(str(path), device="cpu", backend="onnx"), "avx512_vnni", str(path))
        export_static_quantized_openvino_model(
            cls(str(path), device="cpu", backend="openvino"),
            OVQuantizationConfig(num_samples=len(spec["calibration"])), str(path), dataset_name=str(calib),
            dataset_config_name="default", dataset_split="train", column_name="sentence")
    for backend in ("onnx", "openvino"):
        models[f"st-{backend}"] = (SentenceTransformer(str(ret), device="cpu", backend=backend),
                                   CrossEncoder(str(rer), device="cpu", backend=backend, max_length=max_len))
    onnx_q = {"file_name": "onnx/model_qint8_avx512_vnni.onnx"}
    ov_q = {"file_name": "openvino/openvino_model_qint8_quantized.xml"}
    models["st-onnx-int8"] = (SentenceTransformer(str(ret), device="cpu", backend="onnx", model_kwargs=onnx_q),
                              CrossEncoder(str(rer), device="cpu", backend="onnx", model_kwargs=onnx_q,
                                           max_length=max_len))
    models["st-openvino-int8"] = (SentenceTransformer(str(ret), device="cpu", backend="openvino", model_kwargs=ov_q),
                                  CrossEncoder(str(rer), device="cpu", backend="openvino", model_kwargs=ov_q,
                                               max_length=max_len))
    return {name: {"encode": lambda t, kind, e=e: e.encode(t, batch_size=32, convert_to_numpy=True),
                   "predict": lambda p, c=c: np.asarray(c.predict(p, batch_size=32), dtype=np.float32)}
            for name, (e, c) in models.items()}


def _our_models(spec: dict) -> dict:
    from twostage.models.runtime import openvino_runner
    from twostage.reranker.cross_encoder import CrossEncoder, calibration_pairs
    from twostage.retriever.biencoder import BiEncoder

    texts = spec["calibration"]
    pairs = calibration_pairs(texts)
    out = {}
    for mode in spec["ours"]:
        precision, _, one_stream = mode.partition(":")
        e = BiEncoder.load(spec["retriever"], precision=precision, calibration=texts)
        c = CrossEncoder.load(spec["reranker"], precision=precision, calibration=pairs)
        if one_stream:  # the same export compiled as before streams: one stream over every thread
            e.runtime = openvino_runner(e, e.tokenize(["a"]), e.path, precision, streams=1)
            c.runtime = openvino_runner(c, c.tokenize(["a"], ["b"]), c.path, precision, streams=1)
        out[mode] = {"encode": lambda t, kind, e=e: e.encode(t, kind=kind, batch_size=32),
                     "predict": lambda p, c=c: c.predict(p, batch_size=32)}
    return out


def worker(side: str) -> None:
    """Answer JSON requests on stdin, one per line; answers are stdout lines starting with '@@'."""
    spec = json.loads(sys.stdin.readline())
    t0 = time.perf_counter()
    models = _peer_models(spec) if side == "peer" else _our_models(spec)
    print("@@" + json.dumps({"ready": sorted(models), "seconds": time.perf_counter() - t0}), flush=True)
    for line in sys.stdin:
        req = json.loads(line)
        m = models[req["mode"]]
        if req["op"] == "encode":
            t = time.perf_counter()
            vec = m["encode"](req["texts"], req.get("kind", "document"))
            answer = {"seconds": time.perf_counter() - t}
        elif req["op"] == "predict":
            times, scores = [], []
            for pairs in req["groups"]:
                t = time.perf_counter()
                scores.append(m["predict"]([tuple(p) for p in pairs]))
                times.append(time.perf_counter() - t)
            vec = np.concatenate(scores)
            answer = {"seconds": times}
        else:
            raise SystemExit(f"unknown op {req['op']}")
        if req.get("save"):
            np.save(req["save"], np.asarray(vec, dtype=np.float32))
        print("@@" + json.dumps(answer), flush=True)


class Worker:
    def __init__(self, python: str, side: str, spec: dict) -> None:
        env = dict(os.environ, TOKENIZERS_PARALLELISM="false", HF_HUB_OFFLINE="1", HF_DATASETS_OFFLINE="1")
        self.proc = subprocess.Popen([python, __file__, "--worker", side], stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, text=True, env=env)
        self.ready = self.ask(spec)

    def ask(self, request: dict) -> dict:
        self.proc.stdin.write(json.dumps(request) + "\n")
        self.proc.stdin.flush()
        for line in self.proc.stdout:
            if line.startswith("@@"):
                return json.loads(line[2:])
        raise SystemExit(f"worker died (exit {self.proc.wait()})")

    def close(self) -> None:
        self.proc.stdin.close()
        self.proc.wait()


# ---- the orchestrator ---------------------------------------------------------------------------------------------
def peak_gflops() -> dict[str, float]:
    """The machine's measured matrix-product peak: torch fp32 GEMM and OpenVINO int8 MatMul (VNNI), same shapes."""
    import torch

    m, k, n = 4096, 384, 1536
    a, w = torch.randn(m, k), torch.randn(n, k)
    out = {}
    for _ in range(3):
        torch.nn.functional.linear(a, w)
    t = time.perf_counter()
    for _ in range(20):
        torch.nn.functional.linear(a, w)
    out["fp32 (torch GEMM)"] = 2 * m * k * n * 20 / (time.perf_counter() - t) / 1e9
    import nncf
    import openvino as ov

    lin = torch.nn.Sequential(torch.nn.Linear(k, n), torch.nn.Linear(n, k)).eval()
    model = ov.convert_model(lin, example_input=torch.randn(64, k))
    q = nncf.quantize(model, nncf.Dataset([np.random.randn(64, k).astype(np.float32) for _ in range(4)]),
                      subset_size=4, fast_bias_correction=True)
    compiled = ov.Core().compile_model(q, "CPU", {"PERFORMANCE_HINT": "LATENCY"})
    x = np.random.randn(m, k).astype(np.float32)
    req = compiled.create_infer_request()
    for _ in range(3):
        req.infer([x])
    t = time.perf_counter()
    for _ in range(20):
        req.infer([x])
    out["int8 (OpenVINO MatMul)"] = 2 * 2 * m * k * n * 20 / (time.perf_counter() - t) / 1e9
    return out


def encoder_flops(texts: list[str], tokenizer, max_length: int, layers: int, hidden: int, ffn: int) -> float:
    """FLOPs of a BERT encoder's forward over ``texts`` batched as encode() does (sorted, batch 32, padded)."""
    lengths = sorted((min(len(ids), max_length) for ids in tokenizer(texts, truncation=False)["input_ids"]),
                     reverse=True)
    total = 0.0
    for i in range(0, len(lengths), 32):
        b, s = len(lengths[i:i + 32]), lengths[i]
        per_layer = 2 * b * s * (4 * hidden * hidden + 2 * hidden * ffn) + 2 * 2 * b * s * s * hidden
        total += layers * per_layer
    return total


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--worker", choices=["ours", "peer"], help=argparse.SUPPRESS)
    ap.add_argument("--retriever")
    ap.add_argument("--reranker")
    ap.add_argument("--peer-python", default=sys.executable)
    ap.add_argument("--data", type=Path, default=Path(__file__).resolve().parents[2] / "shared" / "data" / "scifact")
    ap.add_argument("--docs", type=int, default=256, help="documents encoded per round")
    ap.add_argument("--queries", type=int, default=20, help="queries reranked per round")
    ap.add_argument("--ours", default=None, help="our modes, comma-separated (default: all; bf16 only where the CPU "
                    "has native bf16: emulated it is 4x slower than fp32)")
    ap.add_argument("--depth", type=int, default=20, help="candidates per query (the engine's rerank_depth)")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--skip-quality", action="store_true")
    ap.add_argument("--quality-from", type=Path, default=None, help="take the nDCG@10 columns from an earlier run's "
                    ".json (same models and exports; the speed rounds run anew, quality is not recomputed)")
    ap.add_argument("--out", type=Path, default=Path("benchmarks/results/inference_speed"))
    args = ap.parse_args()
    if args.worker:
        worker(args.worker)
        return
    if not (args.retriever and args.reranker):
        ap.error("--retriever and --reranker are required")

    from twostage import BeirDataset, BM25Retriever
    from twostage.engine.fusion import rerank_lists, rrf
    from twostage.engine.knobs import dev_choice
    from twostage.engine.settings import EngineSettings
    from twostage.eval.metrics import mean_ndcg10
    from twostage.indexer.records import RankedList
    from twostage.reranker.cross_encoder import CrossEncoder

    ds = BeirDataset(args.data)
    corpus = list(ds.corpus)
    split = ds.split("test")
    queries = list(split.queries)
    texts = {d.id: d.full_text for d in corpus}
    step = max(1, len(corpus) // args.docs)
    sample = [corpus[i].full_text for i in range(0, len(corpus), step)][:args.docs]
    calibration = [corpus[i].full_text for i in range(1, len(corpus), max(1, len(corpus) // 300))][:300]
    bm25 = BM25Retriever.build(corpus)
    speed_q = queries[:args.queries]
    groups = [[(q.text, texts[str(d)]) for d in bm25.search(q.text, args.depth).ids] for q in speed_q]
    ce_meta = CrossEncoder.load(args.reranker)
    from twostage.models.device import resolve_precision

    our_modes = args.ours.split(",") if args.ours else \
        [m for m in OUR_MODES if m != "bf16" or resolve_precision("auto", "retriever") == "bf16"]
    from twostage.models.weights import resolve_model

    args.retriever_dir, args.reranker_dir = resolve_model(args.retriever), resolve_model(args.reranker)
    spec = {"retriever": str(args.retriever_dir), "reranker": str(args.reranker_dir),
            "calibration": calibration, "reranker_max_length": ce_meta.max_length, "ours": our_modes}
    scratch = Path(tempfile.mkdtemp(prefix="inference-speed-"))
    print("starting workers (exports and quantisation happen here)", flush=True)
    ours = Worker(sys.executable, "ours", spec)
    peer = Worker(args.peer_python, "peer", {**spec, "work": str(scratch / "peer")})
    workers = {m: ours for m in our_modes} | {m: peer for m in PEER_MODES}
    order = [m for pair in zip(PEER_MODES, our_modes) for m in pair] + list(PEER_MODES[len(our_modes):]) \
        + our_modes[len(PEER_MODES):]
    enc_s = {m: [] for m in order}
    rr_ms = {m: [] for m in order}
    for r in range(args.rounds):
        rot = order[r % len(order):] + order[:r % len(order)]
        for m in rot:
            enc_s[m].append(workers[m].ask({"op": "encode", "mode": m, "texts": sample})["seconds"])
            rr_ms[m] += [1000 * s for s in workers[m].ask({"op": "predict", "mode": m, "groups": groups})["seconds"]]
        print(f"round {r + 1}: " + ", ".join(f"{m} {len(sample) / enc_s[m][-1]:.1f} doc/s" for m in order), flush=True)
    # the same texts once more, saved, to compare every mode's numbers with our fp32
    diffs = {}
    for m in order:
        workers[m].ask({"op": "encode", "mode": m, "texts": sample, "save": str(scratch / f"{m}.enc.npy")})
        workers[m].ask({"op": "predict", "mode": m, "groups": groups, "save": str(scratch / f"{m}.ce.npy")})
    ref_e, ref_c = np.load(scratch / "fp32.enc.npy"), np.load(scratch / "fp32.ce.npy")
    for m in order:
        diffs[m] = (float(np.abs(np.load(scratch / f"{m}.enc.npy") - ref_e).max()),
                    float(np.abs(np.load(scratch / f"{m}.ce.npy") - ref_c).max()))

    quality = json.loads(args.quality_from.read_text())["quality"] if args.quality_from else {}
    if not args.skip_quality and not args.quality_from:
        qtexts = [q.text for q in queries]
        bm_lists = bm25.search_batch(qtexts, EngineSettings().first_stage_depth)
        ids = np.array([d.id for d in corpus], dtype=object)
        alpha = dev_choice(ce_meta.path).blend_for("hybrid")
        for m in order:
            if (m in FP32_MODES and max(diffs[m]) < FP32_MATCH) or m.endswith(":1-stream"):
                continue  # fp32's numbers; the 1-stream mode computes what its precision computes
            t = time.perf_counter()
            w = workers[m]
            w.ask({"op": "encode", "mode": m, "texts": [d.full_text for d in corpus], "save": str(scratch / "c.npy")})
            w.ask({"op": "encode", "mode": m, "texts": qtexts, "kind": "query", "save": str(scratch / "q.npy")})
            cv, qv = np.load(scratch / "c.npy"), np.load(scratch / "q.npy")
            sims = qv @ cv.T
            dense = {}
            for i, q in enumerate(queries):
                top = np.argsort(-sims[i], kind="stable")[:EngineSettings().first_stage_depth]
                dense[q.id] = RankedList(ids[top], sims[i, top].astype(np.float32))
            hybrid = [rrf([bm_lists[i], dense[q.id]], EngineSettings().k_rrf) for i, q in enumerate(queries)]

            class Remote:
                def predict(self, pairs, batch_size=32, w=w, m=m):
                    w.ask({"op": "predict", "mode": m, "groups": [pairs], "save": str(scratch / "s.npy")})
                    return np.load(scratch / "s.npy")

            reranked = rerank_lists(Remote(), qtexts, hybrid, texts.__getitem__, k=10, rerank_depth=args.depth,
                                    blend=alpha)
            quality[m] = {"dense": mean_ndcg10(split.qrels, dense),
                          "hybrid": mean_ndcg10(split.qrels, {q.id: h for q, h in zip(queries, hybrid)}),
                          "hybrid+rerank": mean_ndcg10(split.qrels,
                                                       {q.id: r.ranked for q, r in zip(queries, reranked)})}
            print(f"quality {m}: {quality[m]} ({time.perf_counter() - t:.0f} s)", flush=True)
    ours.close()
    peer.close()
    report(args, sample, groups, enc_s, rr_ms, diffs, quality, ours.ready, peer.ready, ce_meta)
    shutil.rmtree(scratch, ignore_errors=True)


def report(args, sample, groups, enc_s, rr_ms, diffs, quality, ours_ready, peer_ready, ce_meta) -> None:
    from transformers import AutoConfig, AutoTokenizer

    from twostage.indexer.manifest import library_versions

    cfg = AutoConfig.from_pretrained(args.retriever_dir)
    tok = AutoTokenizer.from_pretrained(args.retriever_dir)
    flops = encoder_flops(sample, tok, 256, cfg.num_hidden_layers, cfg.hidden_size, cfg.intermediate_size)
    peaks = peak_gflops()
    order = list(enc_s)
    docs_s = {m: len(sample) / float(np.median(enc_s[m])) for m in order}
    rr_p50 = {m: float(np.median(rr_ms[m])) for m in order}
    ref = quality.get("fp32", {})

    def ok(m: str, stage: str) -> bool | None:
        """Whether mode ``m`` keeps ``stage``'s nDCG@10 (``dense`` for encode, ``hybrid+rerank`` for rerank) within
        TOLERANCE of our fp32. Each stage is judged on its own: a user picks the bi-encoder's and the
        cross-encoder's backends separately. The rerank column is conservative: its first stage is the mode's own
        dense, so an int8 reranker is judged behind an int8 first stage."""
        if m in FP32_MODES and max(diffs[m]) < FP32_MATCH:
            return True
        m = m.split(":")[0]  # openvino-int8:1-stream computes what openvino-int8 computes
        if m not in quality or not ref:
            return None
        return abs(quality[m][stage] - ref[stage]) <= TOLERANCE

    base_e, base_r = docs_s["st-torch"], rr_p50["st-torch"]
    lines = [f"# CPU inference, side by side (SciFact; {os.cpu_count()} cores)", "",
             "Command: `python benchmarks/inference_speed.py " + " ".join(sys.argv[1:]) + "`", "",
             f"encode: {len(sample)} SciFact documents (batch 32, max length 256), median of {args.rounds} rounds; "
             f"rerank: {len(groups)} test queries x BM25's top {args.depth} (max length {ce_meta.max_length}), one "
             "predict call per query, median ms per query over all rounds. Modes alternate within a round; the "
             "first mode rotates. nDCG@10 on all SciFact test queries (dense = exact search; hybrid+rerank = RRF of "
             "BM25 and the mode's dense top 100, the mode's reranker on the top 20, the reranker's hybrid blend). "
             "fp32-arithmetic modes are compared with our fp32 on the speed sample (max |diff| of embeddings, "
             "of sigmoid scores) instead of being re-evaluated. Each stage is judged on its own nDCG@10 (encode: "
             "dense; rerank: hybrid+rerank, behind the mode's own first stage).", "",
             "| mode | encode doc/s | x st-torch | rerank p50 ms/query | x st-torch | dense nDCG@10 | hybrid+rerank "
             "nDCG@10 | max diff emb / score vs fp32 | within 0.005: encode / rerank |",
             "|---|---|---|---|---|---|---|---|---|"]
    for m in order:
        q = quality.get(m)
        lines.append(f"| {m} | {docs_s[m]:.1f} | {docs_s[m] / base_e:.2f}x | {rr_p50[m]:.1f} | "
                     f"{base_r / rr_p50[m]:.2f}x | {q['dense']:.4f} | {q['hybrid+rerank']:.4f} | " if q else
                     f"| {m} | {docs_s[m]:.1f} | {docs_s[m] / base_e:.2f}x | {rr_p50[m]:.1f} | "
                     f"{base_r / rr_p50[m]:.2f}x | - | - | ")
        lines[-1] += f"{diffs[m][0]:.1e} / {diffs[m][1]:.1e} | {ok(m, 'dense')} / {ok(m, 'hybrid+rerank')} |"
    best_e = max((m for m in PEER_MODES if ok(m, "dense")), key=lambda m: docs_s[m])
    best_r = min((m for m in PEER_MODES if ok(m, "hybrid+rerank")), key=lambda m: rr_p50[m])
    ours_m = [m for m in order if m not in PEER_MODES]
    mine_e = max((m for m in ours_m if ok(m, "dense")), key=lambda m: docs_s[m])
    mine_r = min((m for m in ours_m if ok(m, "hybrid+rerank")), key=lambda m: rr_p50[m])
    gflops = flops / 1e9 / float(np.median(enc_s[mine_e]))
    if args.quality_from:
        lines += ["", f"nDCG@10 columns from the earlier run `{args.quality_from}`: the same models and the same "
                  "int8 exports (streams and threads change the speed, not the arithmetic)."]
    lines += ["", f"Fastest within 0.005 of fp32: ours {mine_e} (encode), {mine_r} (rerank); sentence-transformers "
              f"{best_e} (encode), {best_r} (rerank).", "",
              f"Achieved by {mine_e} encoding: {gflops:.0f} GFLOP/s (the sample's forward: {flops / 1e9:.0f} GFLOP, "
              "padding included). Measured peaks on this machine: " +
              ", ".join(f"{k} {v:.0f} GFLOP/s" for k, v in peaks.items()) + ".", "",
              f"Start-up (loading, exporting and quantising every mode): ours {ours_ready['seconds']:.0f} s, "
              f"sentence-transformers {peer_ready['seconds']:.0f} s.", "",
              "Versions: " + ", ".join(f"{k} {v}" for k, v in library_versions().items()), "",
              f"speed: encode {docs_s[mine_e] / docs_s[best_e]:.2f}x, rerank {rr_p50[best_r] / rr_p50[mine_r]:.2f}x "
              "against the fastest sentence-transformers backend that keeps nDCG@10 within 0.005"]
    text = "\n".join(lines) + "\n"
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.with_suffix(".md").write_text(text)
    args.out.with_suffix(".json").write_text(json.dumps(
        {"encode_seconds": enc_s, "rerank_ms": rr_ms, "diffs": diffs, "quality": quality, "peaks": peaks,
         "encode_gflop": flops / 1e9}, indent=1) + "\n")
    print(text)
    print(lines[-1] + f"; report in {args.out.with_suffix('.md')}")


if __name__ == "__main__":
    main()
