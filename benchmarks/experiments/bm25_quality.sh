#!/usr/bin/env bash
# BM25 quality on SciFact (test) and Cranfield (test) through the harness; results in benchmarks/results/.
# Usage (from the repository root, with the package installed): bash benchmarks/experiments/bm25_quality.sh
set -euo pipefail
case "${1:-}" in -h|--help) echo "usage: bash benchmarks/experiments/bm25_quality.sh  (DATA=DIR of the BEIR collections, default ../shared/data)"; exit 0;; esac
DATA=${DATA:-../shared/data}
twostage -q bench --data "$DATA/scifact" --split test --systems bm25,rank-bm25 --out benchmarks/results/scifact-bm25
twostage -q bench --data "$DATA/cranfield" --split test --systems bm25,rank-bm25 --out benchmarks/results/cranfield-bm25
echo "BM25 quality: benchmarks/results/scifact-bm25/ and benchmarks/results/cranfield-bm25/"
