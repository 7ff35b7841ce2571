"""The load-point report: paired intervals of the TTFT ratio and throughput at equal p95 (pure, synthetic runs)."""
from bench.load_points_report import paired_median_ratio_interval, workload_summary


def _point(ttfts: list[float], throughput: float, concurrency: int) -> dict:
    ordered = sorted(ttfts)
    requests = [{"id": f"r{i}", "ok": True, "ttft_s": t} for i, t in enumerate(ttfts)]
    summary = {"num_requests": len(ttfts), "num_ok": len(ttfts), "throughput_req_s": throughput,
               "ttft_s": {"p50": ordered[len(ordered) // 2], "p95": ordered[-1]}}
    return {"load": {"rate_rps": None, "concurrency": concurrency}, "summary": summary, "requests": requests}


def test_ratios_intervals_and_throughput_at_equal_p95() -> None:
    # plain vLLM takes 2x as long on every request; blendserve also serves twice the requests per second
    ours = [_point([1.0, 1.1, 1.2, 1.3, 1.4], 2.0, 1), _point([2.0, 2.1, 2.2, 2.3, 2.4], 3.0, 2)]
    theirs = [_point([2.0, 2.2, 2.4, 2.6, 2.8], 1.0, 1), _point([4.0, 4.2, 4.4, 4.6, 4.8], 1.5, 2)]
    result = {"plan": {"points": [{}, {}]},
              "systems": {"blendserve": {"points": ours}, "vllm": {"points": theirs}}}
    points = workload_summary([result, result])
    assert [round(p["ttft_p50_ratio"], 6) for p in points] == [2.0, 2.0]
    assert points[0]["ttft_p50_ratio_ci95"] == [2.0, 2.0]  # every request exactly 2x: no spread
    assert points[0]["throughput_ratio"] == 2.0
    # within vLLM's p95 of 2.8 s blendserve reaches both its points (p95 1.4 s and 2.4 s): 3 requests/s
    assert points[0]["throughput_at_equal_p95_ratio"] == 3.0
    assert points[1]["throughput_at_equal_p95_ratio"] == 3.0 / 1.5  # within 4.8 s as well
    low, high = paired_median_ratio_interval([2.0, 3.0, 4.0, 9.0], [1.0, 1.0, 1.0, 1.0])
    assert 2.0 <= low <= 3.5 <= high <= 9.0


def test_throughput_at_equal_p95_takes_each_systems_best_within_the_budget() -> None:
    # vLLM's second point is both faster and within its first point's p95: its own best there is 1.5 req/s
    ours = [_point([1.0, 1.0, 1.0, 1.0, 1.0], 2.0, 1), _point([1.5, 1.5, 1.5, 1.5, 1.5], 3.0, 2)]
    theirs = [_point([1.0, 1.0, 1.0, 1.0, 3.0], 1.0, 1), _point([1.0, 1.0, 1.0, 1.0, 2.9], 1.5, 2)]
    result = {"plan": {"points": [{}, {}]},
              "systems": {"blendserve": {"points": ours}, "vllm": {"points": theirs}}}
    points = workload_summary([result])
    assert points[0]["throughput_at_equal_p95_ratio"] == 3.0 / 1.5  # not 3.0 / 1.0, vLLM's first point alone
