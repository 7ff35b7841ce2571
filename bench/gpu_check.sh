#!/usr/bin/env bash
# One-shot check on a machine with a CUDA GPU and PyPI access (about 10 minutes): install with vLLM's CUDA
# build, run the tests marked gpu, then the vLLM benchmark on 10 records. Everything lands in RESULTS_DIR.
#   bench/gpu_check.sh RESULTS_DIR
set -euo pipefail
results=$(realpath -m "${1:?usage: bench/gpu_check.sh RESULTS_DIR}")
cd "$(dirname "$0")/.."
mkdir -p "$results"
data=$(realpath -m ../shared/data/musique_cacheblend.dev.jsonl)
nvidia-smi > "$results/nvidia-smi.txt"
make setup ENGINE_EXTRA=gpu > "$results/setup.log" 2>&1
.venv/bin/python -m pytest -m gpu tests/gpu -v -p no:cacheprovider --junitxml "$results/gpu-tests.xml" \
  > "$results/gpu-tests.log" 2>&1 || status=$?
.venv/bin/python bench/vllm_bench.py --data "$data" --limit 10 --out "$results/vllm_bench.json" \
  > "$results/vllm_bench.log" 2>&1
tail -n 3 "$results/gpu-tests.log" "$results/vllm_bench.log"
exit "${status:-0}"
