"""The one request check the gateway and both engines run."""
import pytest
import torch

from workers.engines.base import BlendRequest, EngineLimits, RequestError, check_request, prefill_stats
from workers.generation.sampling import SamplingParams

LIMITS = EngineLimits(max_context_tokens=100, modes=frozenset({"cacheblend", "full_prefill"}))


def request(mode: str = "cacheblend", ratio: float | None = None, max_new_tokens: int = 10) -> BlendRequest:
    return BlendRequest(["a document"], "a question?", mode, ratio, SamplingParams(max_new_tokens=max_new_tokens))


def test_a_request_that_fits_passes() -> None:
    check_request(request(), 90, LIMITS)
    check_request(request("full_prefill", 1.0), 90, LIMITS)
    check_request(request(ratio=0.0), 0, LIMITS)


@pytest.mark.parametrize(
    "bad,num_prompt_tokens,field,message",
    [
        (request("turbo"), 10, "mode", "unknown fusion mode 'turbo'; choose from ['cacheblend', 'full_prefill']"),
        (request(ratio=1.5), 10, "recompute_ratio", "recompute_ratio must be in [0, 1], got 1.5"),
        (request(ratio=-0.1), 10, "recompute_ratio", "recompute_ratio must be in [0, 1], got -0.1"),
        (request(max_new_tokens=11), 90, "prompt", "plus max_tokens 11 exceeds the model's context of 100 tokens"),
    ],
)
def test_what_the_engine_cannot_serve_is_refused_naming_the_field(
    bad: BlendRequest, num_prompt_tokens: int, field: str, message: str
) -> None:
    with pytest.raises(RequestError) as caught:
        check_request(bad, num_prompt_tokens, LIMITS)
    assert caught.value.field == field and message in str(caught.value)


def test_limits_need_a_context() -> None:
    with pytest.raises(ValueError, match="max_context_tokens"):
        EngineLimits(0, frozenset())


def test_prefill_stats_count_the_context_the_fusion_did_not_fill_as_recomputed() -> None:
    common = {"mode": "cacheblend", "recompute_ratio": 0.15, "ttft_s": 0.1, "reused_tokens_by_tier": {"ram": 80}}
    whole = prefill_stats(
        num_prompt_tokens=110, context_tokens=100, fused_tokens=100, fused_fraction=0.2,
        first_token_logprobs=torch.zeros(4), **common,
    )
    assert whole.recomputed_fraction == 0.2 and whole.recomputed_tokens == 20 + 10  # the question is computed
    part = prefill_stats(  # the last 20 context tokens never reached the decoder as KV (vLLM's injection)
        num_prompt_tokens=110, context_tokens=100, fused_tokens=80, fused_fraction=0.25,
        first_token_logprobs=torch.zeros(4), **common,
    )
    assert part.recomputed_fraction == pytest.approx((20 + 20) / 100) and part.recomputed_tokens == 20 + 30
    assert part.reused_tokens == 80
