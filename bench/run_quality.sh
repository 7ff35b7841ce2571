#!/usr/bin/env bash
# Reproduces docs/quality.md: the rank-correlation study, the selection study, the musique target run and the
# quality/TTFT frontier on both datasets with the vLLM engine. Run from the repo root after `make setup`, under
# the machine-wide benchmark lock; every frontier run appends per-record rows and resumes where it stopped.
set -euo pipefail
DATA=../shared/data
OUT=docs/results
PY=.venv/bin/python
$PY bench/quality_rank_correlation.py --data $DATA/hotpotqa_hipporag.dev.jsonl --limit 20 --out $OUT/rank_correlation/rank_correlation.json
$PY bench/quality_selection_study.py --data $DATA/hotpotqa_hipporag.dev.jsonl --limit 20 \
    --out $OUT/scout_depth/selection_study_hotpotqa.json
$PY bench/frontier.py --data $DATA/musique_cacheblend.dev.jsonl --limit 100 --engine vllm \
    --modes full_reuse,cacheblend,query_driven --ratios 0.15,0.2 \
    --rows $OUT/frontier/frontier_musique.jsonl --out $OUT/musique_target/frontier_musique_target.json
for name in hotpotqa_hipporag musique_cacheblend; do
    $PY bench/frontier.py --data $DATA/$name.dev.jsonl --limit 100 --engine vllm \
        --rows $OUT/frontier/frontier_${name%%_*}.jsonl --out $OUT/frontier/frontier_${name%%_*}.json \
        --plot docs/frontier_${name%%_*}.png
done
$PY bench/quality_report.py
