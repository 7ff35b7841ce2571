"""Fact-finding tasks: reproducible, facts where the settings put them, the haystack sized in real tokens."""
import json
import re
from pathlib import Path

import pytest

from workers.evaluation.dataset import load_records
from workers.evaluation.scoring import contains_answer
from workers.evaluation.tasks import FAMILIES, Placed, TaskSettings, fact_chunk, make_tasks
from workers.model.checkpoint import load_model_card
from workers.model.default import prepare_default_model

POOL = Path(__file__).resolve().parents[3].parent / "shared" / "data" / "2wiki_pool" / "corpus.json"


@pytest.fixture(scope="module")
def passages() -> list[str]:
    return [f"{p['title']}. {p['text']}" for p in json.loads(POOL.read_text())[:400]]


@pytest.fixture(scope="module")
def count_tokens():
    _, tokenizer = load_model_card(prepare_default_model())
    return lambda text: len(tokenizer.encode(text, add_special_tokens=False))


def chunks_with(record: dict, text: str) -> list[int]:
    return [index for index, document in enumerate(record["documents"]) if text in document]


@pytest.mark.parametrize("family", FAMILIES)
def test_a_seed_gives_the_same_instances_and_another_seed_others(family, passages, count_tokens) -> None:
    settings = TaskSettings(family, num_chunks=5, context_tokens=600)
    first = make_tasks(settings, passages, 3, 0, count_tokens)
    assert first == make_tasks(settings, passages, 3, 0, count_tokens)
    assert first != make_tasks(settings, passages, 3, 1, count_tokens)
    assert len({record["id"] for record in first}) == 3


@pytest.mark.parametrize(("family", "num_chunks", "context_tokens"), [("single_fact", 5, 1000), ("chain", 10, 2000),
                                                                      ("reference", 20, 4000)])
def test_the_documents_fill_the_token_budget_in_real_tokens(family, num_chunks, context_tokens, passages,
                                                            count_tokens) -> None:
    for record in make_tasks(TaskSettings(family, num_chunks, context_tokens), passages, 4, 0, count_tokens):
        assert len(record["documents"]) == num_chunks
        total = sum(count_tokens(document) for document in record["documents"])
        assert 0.8 * context_tokens <= total <= 1.02 * context_tokens


@pytest.mark.parametrize("depth", [0.0, 0.5, 1.0])
def test_the_asked_needle_sits_at_its_depth_and_distractors_elsewhere(depth, passages, count_tokens) -> None:
    settings = TaskSettings("multi_key", num_chunks=8, context_tokens=1600, depth=depth, num_distractors=3)
    for record in make_tasks(settings, passages, 5, 0, count_tokens):
        key = re.search(r"magic number for (\w+) mentioned", record["question"]).group(1)
        needle = f"One of the special magic numbers for {key} is: {record['answers'][0]}."
        assert chunks_with(record, needle) == [fact_chunk(settings)]
        needles = re.findall(r"special magic numbers for (\w+) is: (\d{7})\.", " ".join(record["documents"]))
        assert len(needles) == 4 and len({k for k, _ in needles}) == 4


@pytest.mark.parametrize(("order", "depth"), [("forward", 0.0), ("forward", 0.5), ("backward", 0.5),
                                              ("backward", 1.0), ("forward", 1.0), ("backward", 0.0)])
def test_a_chain_spans_two_chunks_in_the_order_asked(order, depth, passages, count_tokens) -> None:
    settings = TaskSettings("chain", num_chunks=6, context_tokens=1200, depth=depth, order=order)
    for record in make_tasks(settings, passages, 5, 0, count_tokens):
        value = record["answers"][0]
        asked = re.search(r"VAR (\w+) assigned", record["question"]).group(1)
        first = re.search(rf"VAR (\w+) = {value}\.", " ".join(record["documents"])).group(1)
        [anchor] = chunks_with(record, f"VAR {first} = {value}.")
        [partner] = chunks_with(record, f"VAR {asked} = VAR {first}.")
        assert anchor == fact_chunk(settings) != partner
        # at the end the chunk after does not exist (and at the start the one before): the other side is used
        wrapped = (order == "forward" and anchor == 5) or (order == "backward" and anchor == 0)
        assert (partner > anchor) == ((order == "forward") != wrapped)


def test_a_reference_puts_the_label_and_its_value_in_different_chunks(passages, count_tokens) -> None:
    for record in make_tasks(TaskSettings("reference", num_chunks=5, context_tokens=1000), passages, 5, 0,
                             count_tokens):
        name = re.search(r"extension of (\w+)'s office", record["question"]).group(1)
        label = re.search(rf"{name}'s office is room (\w+)\.", " ".join(record["documents"])).group(1)
        [value_chunk] = chunks_with(record, f"The phone extension of room {label} is {record['answers'][0]}.")
        [label_chunk] = chunks_with(record, f"{name}'s office is room {label}.")
        assert value_chunk != label_chunk


def test_the_eval_reads_the_instances_as_qa_records(tmp_path, passages, count_tokens) -> None:
    records = make_tasks(TaskSettings("single_fact", 4, 400), passages, 2, 0, count_tokens)
    path = tmp_path / "tasks.jsonl"
    path.write_text("".join(json.dumps(record) + "\n" for record in records))
    loaded = load_records(path)
    assert [(r.id, r.question, r.answers, r.documents) for r in loaded] == [
        (r["id"], r["question"], r["answers"], r["documents"]) for r in records]


def test_accuracy_is_the_gold_value_found_whole_in_the_answer() -> None:
    assert contains_answer("The special magic number is 4712193.", ["4712193"]) == 1.0
    assert contains_answer("It is 47121934", ["4712193"]) == 0.0
    assert contains_answer("Paris, France", ["paris"]) == 1.0
    assert contains_answer("", ["4712193"]) == 0.0


@pytest.mark.parametrize(("field", "value"), [("family", "needle"), ("num_chunks", 1), ("context_tokens", 10),
                                              ("depth", 1.5), ("order", "sideways"), ("num_distractors", 10)])
def test_bad_settings_are_refused_naming_the_knob(field, value) -> None:
    arguments = {"family": "multi_key", "num_chunks": 10, "context_tokens": 2000, field: value}
    with pytest.raises(ValueError, match=field):
        TaskSettings(**arguments)


def test_an_empty_haystack_or_no_instances_is_refused() -> None:
    settings = TaskSettings("single_fact", 4, 400)
    with pytest.raises(ValueError, match="passage"):
        make_tasks(settings, [], 1, 0, len)
    with pytest.raises(ValueError, match="num_instances"):
        make_tasks(settings, ["A passage."], 0, 0, len)


@pytest.mark.parametrize("depth", [0.0, 0.5, 1.0])
def test_a_split_fact_ends_one_chunk_and_its_value_starts_the_next(depth, passages, count_tokens) -> None:
    settings = TaskSettings("split_fact", num_chunks=6, context_tokens=1200, depth=depth)
    for record in make_tasks(settings, passages, 5, 0, count_tokens):
        key = re.search(r"magic number for (\w+) mentioned", record["question"]).group(1)
        head, value = f"One of the special magic numbers for {key} is:", record["answers"][0]
        [key_chunk] = chunks_with(record, head)
        assert record["documents"][key_chunk].endswith(head)
        assert record["documents"][key_chunk + 1].startswith(f"{value}. ")
        assert key_chunk + 1 == max(fact_chunk(settings), 1)  # the value at the depth, unless that is chunk 0
        assert not chunks_with(record, f"{head} {value}")  # never whole inside one chunk


def test_a_fact_is_placed_only_where_a_chunk_has_room() -> None:
    with pytest.raises(ValueError, match="at"):
        Placed(0, "A fact.", "middle")
