"""The variant payoff bench's pure parts: its runs, a request's fit bucket, and the per-bucket summary."""
import pytest

from bench.variant_payoff import BASE_RUNS, POOLED_RUNS, fit_bucket, make_runs, summarise


def test_query_driven_runs_follow_the_base_runs_at_their_own_ratios() -> None:
    runs = make_runs([0.05, 0.15], pooled=False)
    assert runs[: len(BASE_RUNS)] == BASE_RUNS
    assert [(r.name, r.engine, r.mode, r.ratio) for r in runs[len(BASE_RUNS) :]] == [
        ("query_driven@0.05", "base", "query_driven", 0.05), ("query_driven@0.15", "base", "query_driven", 0.15)]


def test_pooled_runs_are_cachecraft_pooled_on_the_base_store_and_on_their_own_variants() -> None:
    runs = make_runs([0.15], pooled=True)
    assert runs[len(BASE_RUNS) : len(BASE_RUNS) + 2] == POOLED_RUNS
    assert [(r.engine, r.mode) for r in POOLED_RUNS] == [("base", "cachecraft_pooled"),
                                                         ("variants_pooled", "cachecraft_pooled")]
    assert runs[-1].name == "query_driven@0.15"


def test_fit_buckets_ignore_the_first_chunk() -> None:
    assert fit_bucket([0.0, 0.0, 0.0]) == "none"
    assert fit_bucket([0.0, 1.0, 1.0]) == "exact"
    assert fit_bucket([0.0, 1.0, 0.0]) == "partial"
    assert fit_bucket([0.0, 0.67, 1.0]) == "partial"


def test_summary_averages_each_bucket_and_takes_the_ttft_median() -> None:
    runs = make_runs([], pooled=False)

    def row(fit: str, kl: float, ttft_s: float) -> dict:
        figures = {"recomputed_fraction": 0.1, "tf_kl": kl, "agreement_f1": 1.0, "ttft_s": ttft_s}
        return {"fit": fit, **{run.name: figures for run in runs}}

    summary = summarise([row("none", 0.1, 1.0), row("exact", 0.3, 2.0), row("exact", 0.5, 9.0)], runs)
    assert summary["all"]["requests"] == 3 and "partial" not in summary
    assert summary["all"]["variants"]["tf_kl"] == pytest.approx(0.3)
    assert summary["all"]["variants"]["ttft_s_median"] == 2.0
    assert summary["exact"]["cacheblend"]["tf_kl"] == pytest.approx(0.4)
    assert summary["exact"]["base"]["ttft_s_median"] == 5.5
