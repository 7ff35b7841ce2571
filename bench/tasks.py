"""Write fact-finding task instances (workers/evaluation/tasks.py) as a QA file that `blendserve eval` reads.

The haystack is the 2wiki pool's passages; tokens are counted with the model's tokenizer (`--model`, default
SmolLM2-135M), as bench/task_sizing.py counts them. Score with
`blendserve eval --data OUT ...`: each row's `accuracy` is 1.0 when the gold value appears in the answer.

    .venv/bin/python bench/tasks.py --family chain --num-chunks 10 --context-tokens 2000 --depth 0.5 \\
        --instances 300 --seed 0 --out docs/results/tasks/chain_k10_t2000.jsonl
"""
import argparse
import json
from pathlib import Path

from workers.evaluation.tasks import FAMILIES, ORDERS, TaskSettings, make_tasks
from workers.model.checkpoint import load_model_card
from workers.model.default import prepare_default_model


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--family", choices=FAMILIES, required=True)
    parser.add_argument("--num-chunks", type=int, default=10)
    parser.add_argument("--context-tokens", type=int, default=2000)
    parser.add_argument("--depth", type=float, default=0.5)
    parser.add_argument("--order", choices=ORDERS, default="forward")
    parser.add_argument("--num-distractors", type=int, default=3)
    parser.add_argument("--instances", type=int, default=300)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--pool", type=Path, default=Path("../shared/data/2wiki_pool/corpus.json"))
    parser.add_argument("--model", type=Path, default=None, help="A checkpoint directory (default: SmolLM2-135M).")
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    settings = TaskSettings(args.family, args.num_chunks, args.context_tokens, args.depth, args.order,
                            args.num_distractors)
    passages = [f"{p['title']}. {p['text']}" for p in json.loads(args.pool.read_text())]
    _, tokenizer = load_model_card(args.model or prepare_default_model())
    records = make_tasks(settings, passages, args.instances, args.seed,
                         lambda text: len(tokenizer.encode(text, add_special_tokens=False)))
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text("".join(json.dumps(record) + "\n" for record in records))


if __name__ == "__main__":
    main()
