#!/usr/bin/env bash
# NFCorpus's one command on a lent GPU machine (no network there, at most 64 MiB carried per call).
#
#   bash benchmarks/experiments/gpu_nfcorpus.sh pack   # here: fill .gpu/ (ignored by git) with what travels
#   bash benchmarks/experiments/gpu_nfcorpus.sh run    # there, from the repository root, with .gpu carried
#
# What travels (about 52 MB): the cp312 wheels the GPU image lacks (bm25s, PyStemmer, rank-bm25, ranx and the
# three packages ranx imports at load time; chroma-hnswlib for `import hnswlib`), twostage as a wheel,
# all-MiniLM-L6-v2 as fp16 safetensors (written back as fp32 there), and NFCorpus as a tarball.
# The GPU image has no hnswlib wheel for its Python, and chroma-hnswlib's index files fail twostage's ANN size
# check, so the run searches with exact (flat) vectors: `bench --backend flat`, and the reranker's dev engine
# gets the same backend by a one-line edit of the installed copy's EngineSettings default (nothing else changes).
# Results: benchmarks/results/nfcorpus-gpu (NOTES.md there says how the lent run went).
set -euo pipefail
case "${1:-}" in
-h|--help)
    echo "usage: bash benchmarks/experiments/gpu_nfcorpus.sh pack|run  (pack here; run on the GPU machine, .gpu carried)"
    ;;
pack)
    mkdir -p .git/info .gpu/whl .gpu/minilm
    grep -qx '/.gpu/' .git/info/exclude 2>/dev/null || echo '/.gpu/' >> .git/info/exclude
    python -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
        --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
        --platform manylinux1_x86_64 -d .gpu/whl bm25s==0.3.16 PyStemmer==3.1.0 rank-bm25==0.2.2 ranx==0.3.21 \
        orjson lz4 cbor2 chroma-hnswlib
    python -m pip wheel -q --no-deps --no-build-isolation -w .gpu/whl .
    tar czf .gpu/nfcorpus.tgz -C ../shared/data nfcorpus
    python - <<'PY'
import shutil
from pathlib import Path

from safetensors.torch import load_file, save_file

from twostage.retriever.weights import resolve_model

src, dst = Path(resolve_model("all-MiniLM-L6-v2")), Path(".gpu/minilm")
for f in src.iterdir():
    if f.name != "model.safetensors" and (f.is_file() or f.name == "1_Pooling"):
        (shutil.copytree if f.is_dir() else shutil.copy)(f, dst / f.name)
tensors = load_file(src / "model.safetensors")
save_file({k: v.half().contiguous() if v.is_floating_point() else v for k, v in tensors.items()},
          dst / "model.safetensors", metadata={"format": "pt"})
PY
    cp benchmarks/settings/nfcorpus-gpu.json .gpu/nfcorpus-gpu.json
    du -sh .gpu
    ;;
run)
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .gpu/whl/*.whl
    mkdir -p /tmp/site/ir_datasets && : > /tmp/site/ir_datasets/__init__.py  # ranx imports it; unused here
    sed -i 's/backend: str = "hnswlib"/backend: str = "flat"/' /tmp/site/twostage/indexer/engine_dir.py
    export PYTHONPATH=/tmp/site HF_HUB_OFFLINE=1 PYTHONUNBUFFERED=1
    mkdir -p /tmp/d && tar xzf .gpu/nfcorpus.tgz -C /tmp/d
    python3 - <<'PY'
import shutil

from safetensors.torch import load_file, save_file

shutil.copytree(".gpu/minilm", "/tmp/minilm", dirs_exist_ok=True)
tensors = load_file(".gpu/minilm/model.safetensors")
save_file({k: v.float().contiguous() if v.is_floating_point() else v for k, v in tensors.items()},
          "/tmp/minilm/model.safetensors", metadata={"format": "pt"})
PY
    python3 - <<'PY'
import json
s = json.load(open(".gpu/nfcorpus-gpu.json"))
json.dump({**s, "base": "/tmp/minilm"}, open("/tmp/nfcorpus-gpu.json", "w"))
PY
    timeout "${BENCH_TIMEOUT:-520}" python3 -m twostage bench --data /tmp/d/nfcorpus --split test \
        --systems bm25,dense,hybrid,hybrid+rerank --train-split train --train-settings /tmp/nfcorpus-gpu.json \
        --backend flat --out /tmp/nf-gpu --models-dir /tmp/models > "$OUT/bench.log" 2>&1
    cp /tmp/nf-gpu/report.md /tmp/nf-gpu/metrics.json /tmp/nf-gpu/config.json "$OUT/"
    for m in retriever reranker; do cp "/tmp/models/$m/twostage.json" "$OUT/$m-twostage.json"; done
    ;;
*)
    echo "usage: $0 pack|run" >&2
    exit 2
    ;;
esac
