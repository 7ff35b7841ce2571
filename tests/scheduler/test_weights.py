"""Router weights: validated knobs, frozen even against the caller's dict, and the load penalty formula."""
import pytest

from scheduler.load import WorkerLoad
from scheduler.weights import DEFAULT_TIER_WEIGHTS, RouterWeights


def test_default_tiers_are_ordered_fastest_first() -> None:
    order = ["device", "ram", "ssd", "remote", "object"]
    weights = [DEFAULT_TIER_WEIGHTS[tier] for tier in order]
    assert weights == sorted(weights, reverse=True) and len(set(weights)) == len(weights)


def test_penalty_adds_queue_and_tokens_in_flight() -> None:
    weights = RouterWeights(penalty_bytes_per_queued=100, penalty_bytes_per_token_in_flight=2)
    assert weights.penalty_bytes(WorkerLoad(num_queued=3, num_tokens_in_flight=10, queue_capacity=8)) == 320


def test_mutating_the_callers_dict_does_not_change_validated_weights() -> None:
    tiers = {"device": 1.0}
    weights = RouterWeights(tier_weights=tiers)
    tiers["device"] = -5.0
    assert weights.tier_weight("device") == 1.0
    with pytest.raises(TypeError):
        weights.tier_weights["device"] = 2.0  # type: ignore[index]


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        ({"tier_weights": {}}, "tier_weights"),
        ({"tier_weights": {"ram": -1.0}}, "tier_weights\\['ram'\\]"),
        ({"tier_weights": {"ram": float("nan")}}, "tier_weights\\['ram'\\]"),
        ({"penalty_bytes_per_queued": -1}, "penalty_bytes_per_queued"),
        ({"penalty_bytes_per_token_in_flight": float("inf")}, "penalty_bytes_per_token_in_flight"),
    ],
)
def test_bad_weights_name_the_field(kwargs: dict, field: str) -> None:
    with pytest.raises(ValueError, match=field):
        RouterWeights(**kwargs)


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        ({"num_queued": -1, "num_tokens_in_flight": 0, "queue_capacity": 1}, "num_queued"),
        ({"num_queued": 0, "num_tokens_in_flight": -1, "queue_capacity": 1}, "num_tokens_in_flight"),
        ({"num_queued": 0, "num_tokens_in_flight": 0, "queue_capacity": 0}, "queue_capacity"),
    ],
)
def test_bad_load_names_the_field(kwargs: dict, field: str) -> None:
    with pytest.raises(ValueError, match=field):
        WorkerLoad(**kwargs)


def test_a_queue_at_capacity_is_full() -> None:
    assert WorkerLoad(4, 0, 4).is_full and not WorkerLoad(3, 0, 4).is_full
