"""The task frontier's points: each run with a relative accuracy, as `blendserve eval` summarises it."""
from bench.task_frontier import frontier_points


def test_only_runs_with_a_relative_accuracy_become_points() -> None:
    result = {"modes": {
        "full_prefill": {"relative_accuracy": 1.0, "relative_accuracy_ci95": [1.0, 1.0], "ttft_s_median": 2.0,
                         "records": 300},
        "full_reuse": {"relative_accuracy": 0.7, "relative_accuracy_ci95": [0.6, 0.8], "ttft_s_median": 0.3,
                       "records": 300},
        "cacheblend": {"ttft_s_median": 0.5, "records": 300},  # rows written before accuracy was scored
    }}
    points = frontier_points(result)
    assert [(p["label"], p["relative_accuracy"], p["low"], p["high"]) for p in points] == [
        ("full_prefill", 1.0, 1.0, 1.0), ("full_reuse", 0.7, 0.6, 0.8)]
