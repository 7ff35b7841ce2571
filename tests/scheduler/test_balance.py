"""Imbalance rule and power-of-two choices."""
import random

import pytest

from scheduler.balance import ImbalanceRule, power_of_two
from scheduler.load import WorkerLoad


def queues(**num_queued: int) -> dict[str, WorkerLoad]:
    return {worker: WorkerLoad(n, 0, 16) for worker, n in num_queued.items()}


def test_full_worker_is_overloaded_even_when_everyone_is_busy() -> None:
    loads = {"a": WorkerLoad(16, 0, 16), "b": WorkerLoad(15, 0, 16)}
    assert ImbalanceRule().overloaded("a", loads)


def test_imbalance_needs_both_the_ratio_and_the_gap() -> None:
    rule = ImbalanceRule(queue_ratio=4.0, min_queue_gap=4)
    assert not rule.overloaded("a", queues(a=3, b=0))  # ratio infinite, gap too small
    assert not rule.overloaded("a", queues(a=12, b=6))  # gap large, ratio only 2
    assert rule.overloaded("a", queues(a=5, b=1))
    assert not rule.overloaded("b", queues(a=5, b=1))


def test_power_of_two_returns_the_less_busy_of_its_draw() -> None:
    loads = {"a": WorkerLoad(3, 0, 16), "b": WorkerLoad(3, 500, 16), "c": WorkerLoad(1, 0, 16)}
    for seed in range(50):
        rng = random.Random(seed)
        drawn = random.Random(seed).sample(sorted(loads), 2)
        expected = min(drawn, key=lambda w: (loads[w].num_queued, loads[w].num_tokens_in_flight))
        assert power_of_two(list(loads), loads, rng) == expected


def test_power_of_two_never_returns_the_busiest_of_three() -> None:
    loads = queues(a=9, b=1, c=2)
    picks = {power_of_two(["c", "a", "b"], loads, random.Random(seed)) for seed in range(100)}
    assert picks == {"b", "c"}


def test_power_of_two_breaks_ties_at_random_not_by_worker_id() -> None:
    loads = queues(a=0, b=0, c=0)
    rng = random.Random(0)
    picks = [power_of_two(["a", "b", "c"], loads, rng) for _ in range(3000)]
    # every worker is drawn 2 times in 3 and wins half its ties: a third each (by id, "c" would never win)
    assert all(abs(picks.count(worker) / len(picks) - 1 / 3) < 0.05 for worker in loads)


def test_power_of_two_with_one_worker_returns_it() -> None:
    assert power_of_two(["only"], queues(only=5), random.Random(0)) == "only"


def test_power_of_two_needs_a_worker() -> None:
    with pytest.raises(ValueError, match="workers"):
        power_of_two([], {}, random.Random(0))


@pytest.mark.parametrize(
    ("kwargs", "field"), [({"queue_ratio": 0.5}, "queue_ratio"), ({"min_queue_gap": 0}, "min_queue_gap")]
)
def test_bad_rule_names_the_field(kwargs: dict, field: str) -> None:
    with pytest.raises(ValueError, match=field):
        ImbalanceRule(**kwargs)
