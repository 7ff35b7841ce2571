"""The variant payoff pairs: mean paired differences per metric and the TTFT medians."""
import pytest

from bench.variant_payoff_pairs import paired_report


def _row(kl_a: float, kl_b: float, ttft_a: float) -> dict:
    figures = lambda kl, ttft: {"recomputed_fraction": 0.1, "tf_kl": kl, "agreement_f1": 1.0, "ttft_s": ttft}  # noqa: E731
    return {"fit": "none", "a": figures(kl_a, ttft_a), "b": figures(kl_b, 1.0)}


def test_differences_are_a_minus_b_with_an_interval_around_them() -> None:
    report = paired_report([_row(0.3, 0.1, 2.0), _row(0.5, 0.2, 4.0), _row(0.4, 0.3, 9.0)], "a", "b")
    assert report["requests"] == 3
    assert report["tf_kl"]["difference"] == pytest.approx(0.2)
    low, high = report["tf_kl"]["ci95"]
    assert 0.1 <= low <= 0.2 <= high <= 0.3  # every request's difference is in [0.1, 0.3]
    assert report["recomputed_fraction"]["difference"] == 0.0
    assert report["ttft_s_median"] == {"a": 4.0, "b": 1.0}
    with pytest.raises(ValueError):
        paired_report([], "a", "b")
