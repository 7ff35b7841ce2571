#!/usr/bin/env bash
# Reproduces docs/quality.md: both datasets with every mode, the ratio sweep, and the design study.
# Run from the repo root after `make setup`. MUSIQUE_LIMIT=100 evaluates the whole file (about 90 minutes
# on 2 CPU cores); docs/quality.md says which limit produced its figures.
set -euo pipefail
MUSIQUE_LIMIT=${MUSIQUE_LIMIT:-50}
MODES=full_prefill,prefix_cache,full_reuse,epic,cacheblend,cachecraft
DATA=../shared/data
.venv/bin/blendserve eval --data $DATA/musique_cacheblend.dev.jsonl --limit "$MUSIQUE_LIMIT" \
    --modes $MODES --ratio 0.15 --out docs/results/musique_cacheblend.json
.venv/bin/blendserve eval --data $DATA/hotpotqa_hipporag.dev.jsonl \
    --modes $MODES --ratio 0.15 --out docs/results/hotpotqa_hipporag.json
.venv/bin/python bench/quality_sweep.py --data $DATA/musique_cacheblend.dev.jsonl --limit 5 \
    --out docs/results/quality_sweep.json --plot docs/quality_sweep.png
.venv/bin/python bench/fusion_study.py --data $DATA/musique_cacheblend.dev.jsonl --limit 3 \
    --out docs/results/fusion_study.json
