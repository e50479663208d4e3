#!/usr/bin/env bash
# BM25 quality on SciFact (test) and Cranfield (test) through the harness; results in benchmarks/results/.
# Usage (from the repository root, with the package installed): bash benchmarks/bm25_quality.sh
set -euo pipefail
DATA=${DATA:-../shared/data}
twostage -q bench --data "$DATA/scifact" --split test --systems bm25,rank-bm25 --out benchmarks/results/scifact-bm25
twostage -q bench --data "$DATA/cranfield" --split test --systems bm25,rank-bm25 --out benchmarks/results/cranfield-bm25
