"""The evaluation holds one record's chunk KV at a time, and a record after a cleared one is scored the same."""
import json

from tests.workers.conftest import DATA_DIR
from workers.evaluation.dataset import QARecord
from workers.evaluation.engines import load_eval_engine
from workers.evaluation.evaluate import REFERENCE_MODE, EvalRun, evaluate


def test_each_records_chunks_are_dropped_after_it_is_scored() -> None:
    with open(DATA_DIR / "hotpotqa_hipporag.dev.jsonl") as handle:
        raw = json.loads(next(handle))
    documents = [f"{c['title']}\n{c['text']}" for c in raw["ctxs"][:3]]
    first = QARecord("first", raw["question"], raw["answers"], documents)
    again = QARecord("again", raw["question"], raw["answers"], documents)  # the same chunks, after the clear
    access = load_eval_engine("torch")
    store = access.engine.fuser.store
    sizes: list[int] = []
    runs = [EvalRun(REFERENCE_MODE, REFERENCE_MODE, 1.0), EvalRun("full_reuse", "full_reuse", 0.0)]
    scores, _ = evaluate(access, [first, again], runs, max_new_tokens=4, teacher_forced=False,
                         on_record=lambda index, rows: sizes.append(len(store)))
    assert sizes == [0, 0] and len(store) == 0
    by_record = {(s.record, s.label): s for s in scores}
    for label in ("full_prefill", "full_reuse"):
        assert by_record[("again", label)].answer == by_record[("first", label)].answer
    assert by_record[("again", "full_reuse")].recomputed_fraction == 0.0  # its chunks were stored again and read
