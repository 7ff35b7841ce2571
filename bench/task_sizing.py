"""Size the fact-finding tasks to a model: full prefill's (and full reuse's) accuracy up a ladder of settings.

Each family climbs the ladder (chunks x context tokens, easiest first) while full prefill scores at least
`--floor`; the first setting below it ends the family's climb. The summary names, per family, the hardest setting
full prefill passes and the settings where full reuse loses at least `--reuse-gap` against it. One engine serves
every setting; rows are appended per record, so a stopped run resumes where it stopped.

    .venv/bin/python bench/task_sizing.py --instances 30 --rows docs/results/tasks/sizing_smollm2.jsonl \\
        --out docs/results/tasks/sizing_smollm2.json
"""
import argparse
import json
import logging
from collections.abc import Sequence
from pathlib import Path

from workers.evaluation.dataset import QARecord
from workers.evaluation.engines import ENGINE_KINDS, load_eval_engine
from workers.evaluation.evaluate import (
    REFERENCE_MODE,
    EngineAccess,
    EvalRun,
    RecordScore,
    evaluate,
    read_rows,
    score_row,
    summarise,
)
from workers.evaluation.tasks import FAMILIES, CountTokens, TaskSettings, make_tasks
from workers.model.dtype import measured_on

LADDER = ((2, 500), (5, 1000), (10, 2000), (10, 4000), (20, 4000), (20, 8000))  # (chunks, context tokens)
RUNS = [EvalRun(REFERENCE_MODE, REFERENCE_MODE, 1.0), EvalRun("full_reuse", "full_reuse", 0.0)]
log = logging.getLogger("task_sizing")


def ladder(family: str, depth: float, rungs: Sequence[tuple[int, int]] = LADDER) -> list[TaskSettings]:
    """The family's settings from easiest to hardest."""
    # multi_key keeps 3 distractors where the chunks allow (RULER's default is 3 extra keys)
    return [TaskSettings(family, num_chunks, tokens, depth, num_distractors=min(3, num_chunks - 1))
            for num_chunks, tokens in rungs]


def climb_verdict(family: str, points: list[dict], floor: float, reuse_gap: float) -> dict:
    """The hardest setting full prefill passes (None: not even the easiest) and where full reuse loses enough."""
    passing = [p for p in points if p["full_prefill"] >= floor]
    return {
        "family": family,
        "hardest_passing": passing[-1]["setting"] if passing else None,
        "reuse_loses": [p["setting"] for p in passing if p["full_prefill"] - p["full_reuse"] >= reuse_gap],
    }


def _records(
    settings: TaskSettings, passages: list[str], instances: int, seed: int, count_tokens: CountTokens
) -> list[QARecord]:
    raw = make_tasks(settings, passages, instances, seed, count_tokens)
    return [QARecord(r["id"], r["question"], r["answers"], r["documents"]) for r in raw]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--families", default=",".join(FAMILIES))
    parser.add_argument("--depth", type=float, default=0.5)
    parser.add_argument("--instances", type=int, default=30)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--floor", type=float, default=0.6, help="Full prefill's accuracy a setting must reach.")
    parser.add_argument("--reuse-gap", type=float, default=0.15, help="Full reuse's loss that makes a setting count.")
    parser.add_argument("--engine", choices=ENGINE_KINDS, default="vllm")
    parser.add_argument("--model", type=Path, default=None, help="A checkpoint directory (default: SmolLM2-135M).")
    parser.add_argument("--max-new-tokens", type=int, default=24)
    parser.add_argument("--pool", type=Path, default=Path("../shared/data/2wiki_pool/corpus.json"))
    parser.add_argument("--rows", type=Path, required=True, help="Rows of every setting (appended; resumable).")
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s")
    ladders = {family: ladder(family, args.depth) for family in args.families.split(",")}  # bad knobs fail here
    passages = [f"{p['title']}. {p['text']}" for p in json.loads(args.pool.read_text())]
    access = load_eval_engine(args.engine, args.model)
    tokenizer = access.engine.fuser.runner.checkpoint.tokenizer

    def count_tokens(text: str) -> int:
        return len(tokenizer.encode(text, add_special_tokens=False))

    done = {(row.record, row.label): row for row in read_rows(args.rows)}
    args.rows.parent.mkdir(parents=True, exist_ok=True)
    points: dict[str, list[dict]] = {}
    try:
        with args.rows.open("a") as rows_file:
            for family, settings_ladder in ladders.items():
                for settings in settings_ladder:
                    records = _records(settings, passages, args.instances, args.seed, count_tokens)
                    pending = [r for r in records if any((r.id, run.label) not in done for run in RUNS)]

                    def on_record(index: int, scores: list[RecordScore]) -> None:
                        rows_file.writelines(json.dumps(score_row(s)) + "\n" for s in scores)
                        rows_file.flush()
                        done.update({(s.record, s.label): s for s in scores})

                    evaluate(access, pending, RUNS, args.max_new_tokens, teacher_forced=False, on_record=on_record,
                             warm_up=False)
                    summary = summarise([done[(r.id, run.label)] for r in records for run in RUNS], RUNS)
                    point = {"setting": settings.name, **{label: summary[label]["accuracy"] for label in summary},
                             "summary": summary}
                    points.setdefault(family, []).append(point)
                    log.info("%s: full prefill %.2f, full reuse %.2f", settings.name, point[REFERENCE_MODE],
                             point["full_reuse"])
                    write_document(args, access, points)  # after every setting: a stopped run keeps its figures
                    if point[REFERENCE_MODE] < args.floor:
                        break
    finally:
        access.engine.close()


def write_document(args: argparse.Namespace, access: EngineAccess, points: dict[str, list[dict]]) -> None:
    """The sizing so far: per family its points up the ladder and the verdict."""
    verdicts = [climb_verdict(family, family_points, args.floor, args.reuse_gap)
                for family, family_points in points.items()]
    document = {"model": access.engine.fuser.runner.checkpoint.path.name, "engine": args.engine,
                **measured_on(access.engine.dtype), "instances": args.instances, "seed": args.seed,
                "depth": args.depth, "floor": args.floor, "reuse_gap": args.reuse_gap, "verdicts": verdicts,
                "points": points}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(document, indent=2) + "\n")


if __name__ == "__main__":
    main()
