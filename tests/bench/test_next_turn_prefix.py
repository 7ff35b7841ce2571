"""The paired next-turn summary (pure: no engine)."""
import pytest

from bench.next_turn_prefix import summary


def _turn(turn: int, stored: float, computed: float | None = None) -> dict:
    row = {"turn": turn, "stored": {"ttft_s": stored, "recomputed_tokens": 100}}
    if computed is not None:
        row["computed"] = {"ttft_s": computed, "recomputed_tokens": 140}
    return row


def test_later_turns_are_paired_and_both_variants_scaled_by_turn_ones_median() -> None:
    chats = [[_turn(1, 2.0), _turn(2, 1.8, 2.4)], [_turn(1, 4.0), _turn(2, 3.0, 6.0)],
             [_turn(1, 3.0), _turn(2, 2.7, 3.0)]]
    first, second = summary(chats)
    assert first["stored"]["ratio_to_turn_1"] == 1.0 and "computed" not in first
    assert "stored_over_computed_median" not in first
    assert second["stored"]["ttft_s_median"] == 2.7 and second["stored"]["ratio_to_turn_1"] == pytest.approx(0.9)
    assert second["computed"]["ratio_to_turn_1"] == pytest.approx(1.0)
    assert second["stored_over_computed_median"] == pytest.approx(0.75)  # of 0.75, 0.5 and 0.9: paired, not medians
    assert second["computed"]["recomputed_tokens_mean"] == 140
