"""Bootstrap intervals of a mean over records."""
import math

import pytest

from workers.evaluation.bootstrap import bootstrap_interval, paired_difference_interval, paired_ratio_interval


def test_the_interval_holds_the_mean_and_narrows_with_more_records() -> None:
    few = [0.0, 1.0, 1.0, 0.5, 0.0, 1.0]
    low, high = bootstrap_interval(few)
    assert low < sum(few) / len(few) < high
    many_low, many_high = bootstrap_interval(few * 20)
    assert many_high - many_low < (high - low) / 2  # 20x the records: ~sqrt(20) narrower
    assert bootstrap_interval([0.7] * 10) == pytest.approx((0.7, 0.7))


def test_the_interval_is_reproducible_and_refuses_nonsense() -> None:
    values = [0.1, 0.9, 0.4, 0.3]
    assert bootstrap_interval(values) == bootstrap_interval(values)
    with pytest.raises(ValueError):
        bootstrap_interval([])
    with pytest.raises(ValueError):
        bootstrap_interval(values, confidence=1.0)


def test_paired_differences_cancel_what_the_records_share() -> None:
    first = [0.1, 0.9, 0.4, 0.3, 0.8]
    second = [x - 0.05 for x in first]  # the same records, 0.05 lower each
    assert paired_difference_interval(first, second) == pytest.approx((0.05, 0.05))
    low, high = bootstrap_interval(first)
    assert high - low > 0.2  # unpaired, the records' spread would hide the difference
    with pytest.raises(ValueError):
        paired_difference_interval(first, second[:-1])


def test_the_ratio_interval_holds_the_ratio_of_means_and_skips_empty_denominators() -> None:
    first = [1.0, 0.0, 1.0, 1.0] * 25
    second = [1.0, 1.0, 1.0, 1.0] * 25
    low, high = paired_ratio_interval(first, second)
    assert low <= 0.75 <= high and high <= 1.0
    assert paired_ratio_interval([1.0, 1.0], [1.0, 1.0]) == (1.0, 1.0)
    assert all(math.isnan(bound) for bound in paired_ratio_interval([1.0], [0.0]))
    with pytest.raises(ValueError, match="equal"):
        paired_ratio_interval([1.0], [1.0, 0.0])
