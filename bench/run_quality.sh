#!/usr/bin/env bash
# Reproduces docs/quality.md: both datasets with every mode, then the ratio sweep. Run from the repo root.
set -euo pipefail
MODES=full_prefill,prefix_cache,full_reuse,epic,cacheblend,cachecraft
MUSIQUE_LIMIT=${1:-100}
.venv/bin/blendserve eval --data ../shared/data/musique_cacheblend.dev.jsonl --limit "$MUSIQUE_LIMIT" \
    --modes $MODES --ratio 0.15 --out docs/results/musique_cacheblend.json
.venv/bin/blendserve eval --data ../shared/data/hotpotqa_hipporag.dev.jsonl \
    --modes $MODES --ratio 0.15 --out docs/results/hotpotqa_hipporag.json
.venv/bin/python bench/quality_sweep.py --data ../shared/data/musique_cacheblend.dev.jsonl --limit 10 \
    --out docs/results/quality_sweep.json --plot docs/quality_sweep.png
