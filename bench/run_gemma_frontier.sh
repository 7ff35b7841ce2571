#!/usr/bin/env bash
# The quality/TTFT frontier of Gemma 3 270M beside the default model's (bench/run_quality.sh): the same
# modes, ratios and datasets through bench/frontier.py with the vLLM engine. Run from the repo root after
# `make setup MODEL=gemma3-270m`, under the machine-wide benchmark lock; rows are appended per record, so a stopped
# run resumes where it stopped. LIMIT (default 20) bounds the records per dataset.
set -euo pipefail
DATA=../shared/data
OUT=docs/results/gemma3_vs_smollm2
PY=.venv/bin/python
LIMIT=${LIMIT:-20}
MODEL=$(.venv/bin/blendserve prepare-model --model gemma3-270m | tail -1)
for name in hotpotqa_hipporag musique_cacheblend; do
    $PY bench/frontier.py --model "$MODEL" --data $DATA/$name.dev.jsonl --limit "$LIMIT" --engine vllm \
        --rows $OUT/frontier_gemma3_${name%%_*}.jsonl --out $OUT/frontier_gemma3_${name%%_*}.json \
        --plot docs/frontier_gemma3_${name%%_*}.png
done
