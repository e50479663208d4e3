#!/usr/bin/env bash
# NFCorpus's one command on a lent GPU machine (no network there; at most 64 MiB travels each way per call).
#
#   bash benchmarks/experiments/gpu_nfcorpus.sh pack            # here: fill .gpu/ (ignored by git)
#   bash benchmarks/experiments/gpu_nfcorpus.sh run             # there, from the repository root, .gpu carried
#   bash benchmarks/experiments/gpu_nfcorpus.sh join FILES DEST # here: the returned retriever, as fp32, into DEST
#
# SETTINGS (default benchmarks/settings/nfcorpus-gpu.json) and SYSTEMS (default bm25,dense,hybrid,hybrid+rerank)
# choose what `bench --train-split train` trains and scores; pack copies SETTINGS into .gpu.
# What travels (about 52 MB): the cp312 wheels the GPU image lacks (bm25s, PyStemmer, rank-bm25, ranx and the
# three packages ranx imports at load time; chroma-hnswlib for `import hnswlib`), twostage as a wheel,
# all-MiniLM-L6-v2 as fp16 safetensors (written back as fp32 there), and NFCorpus as a tarball.
# The GPU image has no hnswlib wheel for its Python, and chroma-hnswlib's index files fail twostage's ANN size
# check, so the run searches with exact (flat) vectors: `bench --backend flat`, and the reranker's dev engine
# gets the same backend by a one-line edit of the installed copy's EngineSettings default (nothing else changes).
# What comes back: results.tgz (report, metrics, config, log, both models' twostage.json) and the trained
# retriever as fp16 safetensors in 15 MB parts plus its small files (retriever-files.tgz).
# Results: benchmarks/results/nfcorpus-gpu (NOTES.md there says how the lent run went).
set -euo pipefail
SETTINGS=${SETTINGS:-benchmarks/settings/nfcorpus-gpu.json}
SYSTEMS=${SYSTEMS:-bm25,dense,hybrid,hybrid+rerank}

precision() {  # precision SRC DST half|float: copy a model file, its floating tensors cast
    python3 - "$@" <<'PY'
import sys

from safetensors.torch import load_file, save_file

src, dst, kind = sys.argv[1:4]
tensors = load_file(src)
save_file({k: getattr(v, kind)().contiguous() if v.is_floating_point() else v for k, v in tensors.items()}, dst,
          metadata={"format": "pt"})
PY
}

case "${1:-}" in
-h|--help)
    echo "usage: bash benchmarks/experiments/gpu_nfcorpus.sh pack|run|join FILES DEST  (pack here; run on the GPU machine with .gpu carried; join the returned retriever here)"
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
    src=$(python -c 'from twostage.retriever.weights import resolve_model; print(resolve_model("all-MiniLM-L6-v2"))')
    (cd "$src" && tar cf - --exclude=model.safetensors --exclude='twostage-*' --exclude=.gitattributes .) | tar xf - -C .gpu/minilm
    precision "$src/model.safetensors" .gpu/minilm/model.safetensors half
    cp "$SETTINGS" .gpu/settings.json
    du -sh .gpu
    ;;
run)
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .gpu/whl/*.whl
    mkdir -p /tmp/site/ir_datasets && : > /tmp/site/ir_datasets/__init__.py  # ranx imports it; unused here
    sed -i 's/backend: str = "hnswlib"/backend: str = "flat"/' /tmp/site/twostage/indexer/engine_dir.py
    export PYTHONPATH=/tmp/site HF_HUB_OFFLINE=1 PYTHONUNBUFFERED=1
    mkdir -p /tmp/d /tmp/minilm && tar xzf .gpu/nfcorpus.tgz -C /tmp/d
    cp -r .gpu/minilm/. /tmp/minilm/ && precision .gpu/minilm/model.safetensors /tmp/minilm/model.safetensors float
    python3 -c 'import json; s = json.load(open(".gpu/settings.json")); json.dump({**s, "base": "/tmp/minilm"}, open("/tmp/settings.json", "w"))'
    rc=0
    timeout "${BENCH_TIMEOUT:-520}" python3 -m twostage bench --data /tmp/d/nfcorpus --split test \
        --systems "$SYSTEMS" --train-split train --train-settings /tmp/settings.json \
        --backend flat --out /tmp/nf-gpu --models-dir /tmp/models > /tmp/nf-gpu.log 2>&1 || rc=$?
    echo "bench exit status $rc"
    mkdir -p /tmp/collect && cp /tmp/nf-gpu.log /tmp/collect/bench.log
    cp /tmp/nf-gpu/report.md /tmp/nf-gpu/metrics.json /tmp/nf-gpu/config.json /tmp/collect/ 2>/dev/null || true
    for m in retriever reranker; do cp "/tmp/models/$m/twostage.json" "/tmp/collect/$m-twostage.json" 2>/dev/null || true; done
    tar czf "$OUT/results.tgz" -C /tmp/collect .
    if [ -f /tmp/models/retriever/model.safetensors ]; then
        precision /tmp/models/retriever/model.safetensors /tmp/retriever-fp16.safetensors half
        split -b 15M /tmp/retriever-fp16.safetensors "$OUT/retriever.fp16.part-"
        tar czf "$OUT/retriever-files.tgz" -C /tmp/models/retriever --exclude=model.safetensors --exclude=twostage-openvino .
    fi
    tail -3 /tmp/nf-gpu.log
    ;;
join)
    files=${2:?FILES: the folder the run returned}; dest=${3:?DEST: where the retriever goes}
    mkdir -p "$dest" && tar xzf "$files/retriever-files.tgz" -C "$dest"
    cat "$files"/retriever.fp16.part-* > "$dest/model.fp16.safetensors"
    precision "$dest/model.fp16.safetensors" "$dest/model.safetensors" float && rm "$dest/model.fp16.safetensors"
    echo "retriever (fp16-rounded weights, as fp32) in $dest"
    ;;
*)
    echo "usage: $0 pack|run|join FILES DEST" >&2
    exit 2
    ;;
esac
