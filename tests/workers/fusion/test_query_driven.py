"""Query-driven selection: what it may choose, its budget, and exactness on the real model (float32)."""
import pytest
import torch

from workers.chunks.kv import ChunkLayers
from workers.engines.base import BlendRequest
from workers.engines.torch_engine import TorchEngine
from workers.fusion.layout import BlendLayout
from workers.fusion.query_driven import QueryScoring, question_attention, scout_attention, select_tokens
from workers.generation.divergence import first_token_kl
from workers.generation.prompt import PromptLayout
from workers.generation.sampling import SamplingParams
from workers.model.checkpoint import Checkpoint


def _layout(kv_end: int | None = None) -> BlendLayout:
    """Prefix [0, 4) at 0, chunk A [4, 12) computed after the prefix (exact), chunk B [12, 20), question [20, 24)."""
    prompt = PromptLayout([1] * 4, [[2] * 8, [3] * 8], [4] * 4)
    cached = [ChunkLayers([2] * 8, iter(()), 1, base_position=4), ChunkLayers([3] * 8, iter(()), 1, base_position=4)]
    return BlendLayout.build(prompt, cached, ChunkLayers([1] * 4, iter(()), 1), kv_end=kv_end)


def test_exact_leading_segments_are_never_chosen() -> None:
    layout = _layout()
    assert layout.exact_end() == 12  # the prefix and the first chunk sit where they were computed
    scores = torch.arange(24, dtype=torch.float32).flip(0)  # the earliest tokens score highest
    chosen = select_tokens(scores, layout, 0.25, 1, "global").tolist()
    # 25% of the 20 reused tokens = 5, all from chunk B (best first: its earliest), plus the forced question
    assert chosen == [12, 13, 14, 15, 16, 20, 21, 22, 23]
    assert select_tokens(scores, layout, 1.0, 1, "global").tolist() == list(range(12, 24))  # all B: 8 of 20


def test_chunks_computed_after_another_prefix_are_never_exact() -> None:
    # the default prefix [1]*4 stored the chunks; this prompt's own prefix (a system prompt) differs
    prompt = PromptLayout([7] * 4, [[2] * 8, [3] * 8], [4] * 4, chunk_context=[1] * 4)
    cached = [ChunkLayers([2] * 8, iter(()), 1, base_position=4), ChunkLayers([3] * 8, iter(()), 1, base_position=4)]
    layout = BlendLayout.build(prompt, cached, ChunkLayers([7] * 4, iter(()), 1))
    assert layout.exact_end() == 4  # the prefix alone: chunk A sits where it was computed, after other tokens


def test_spans_and_the_vllm_layout() -> None:
    layout = _layout(kv_end=20)  # the vLLM engine: KV for the context only, its last token forced
    scores = torch.zeros(20)
    scores[17] = 1.0
    assert select_tokens(scores, layout, 0.1, 4, "global").tolist() == [16, 17, 18, 19]  # the span [16, 20)
    assert select_tokens(scores, layout, 0.0, 4, "global").tolist() == [19]


def test_a_per_chunk_budget_takes_the_same_share_of_each_chunk() -> None:
    prompt = PromptLayout([1] * 4, [[2] * 8, [3] * 8, [5] * 8], [4] * 4)
    cached = [ChunkLayers(ids, iter(()), 1, base_position=4) for ids in prompt.chunk_ids]
    layout = BlendLayout.build(prompt, cached, ChunkLayers([1] * 4, iter(()), 1))
    scores = torch.zeros(32)
    scores[12:20] = torch.linspace(2.0, 1.0, 8)  # chunk B holds all the relevance, its earliest tokens most
    global_pick = select_tokens(scores, layout, 0.25, 1, "global").tolist()
    split = select_tokens(scores, layout, 0.25, 1, "per_chunk").tolist()
    assert [p for p in global_pick if p < 28] == list(range(12, 19))  # 7 = 25% of 28 reused, all in B
    assert sum(12 <= p < 20 for p in split) == sum(20 <= p < 28 for p in split) == 4  # half of each of B and C


def test_options_are_validated() -> None:
    for bad in (dict(first_layer=-1), dict(first_layer=3, last_layer=2), dict(query_tokens=0), dict(budget_split="x")):
        with pytest.raises(ValueError):
            QueryScoring(**bad)


def _attention_by_definition(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, context_k: torch.Tensor, context_v: torch.Tensor,
    window: int | None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Softmax over [context | own causal] keys for every head, in float64, context at positions 0..N-1 and the
    question right after it; with a window a query sees only keys less than `window` positions back."""
    num_queries, num_heads, head_dim = q.shape
    group = num_heads // k.shape[1]
    keys = torch.cat([context_k, k]).double().repeat_interleave(group, dim=1)  # [N + Q, H, D]
    values = torch.cat([context_v, v]).double().repeat_interleave(group, dim=1)
    logits = torch.einsum("qhd,nhd->hqn", q.double(), keys) * 0.125  # [H, Q, N + Q]
    num_context = context_k.shape[0]
    query_at = torch.arange(num_context, num_context + num_queries)[:, None]
    key_at = torch.arange(num_context + num_queries)[None, :]
    visible = (key_at <= query_at) & (query_at - key_at < (window or num_context + num_queries))  # [Q, N + Q]
    probs = logits.masked_fill(~visible, float("-inf")).softmax(-1)
    return probs, torch.einsum("hqn,nhd->qhd", probs, values).reshape(num_queries, -1)


@pytest.mark.parametrize("counted", [slice(None), slice(2, None)])
@pytest.mark.parametrize("window", [None, 20])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_scout_attention_is_grouped_causal_attention_over_context_and_question(
    dtype: torch.dtype, window: int | None, counted: slice
) -> None:
    torch.manual_seed(0)
    num_queries, num_context, num_kv_heads, group, head_dim = 5, 37, 3, 3, 64
    q = torch.randn(num_queries, num_kv_heads * group, head_dim).to(dtype)
    k, v = (torch.randn(num_queries, num_kv_heads, head_dim).to(dtype) for _ in range(2))
    context_k, context_v = (torch.randn(num_context, num_kv_heads, head_dim).to(dtype) for _ in range(2))
    own = torch.ones(num_queries, num_queries, dtype=torch.bool).tril()
    query_at = torch.arange(num_context, num_context + num_queries)[:, None]
    context_visible = None if window is None else (query_at - torch.arange(num_context)[None, :]) < window
    received, out = scout_attention(q, k, v, context_k, context_v, own, 0.125, context_visible, counted)
    want_probs, want_out = _attention_by_definition(q, k, v, context_k, context_v, window)  # [H, Q, N + Q]
    want_received = want_probs[:, counted, :num_context].sum(dim=(0, 1))  # [N]
    # float32: rounding only; bf16: the context products are rounded to bf16 (8 significant bits). Measured:
    # 3e-7 and 3e-3 on sums up to 3.1, within one weight's tolerance although up to 45 weights are summed
    tolerance = 1e-5 if dtype == torch.float32 else 2 * 2.0**-8
    num_summed = want_probs[:, counted].shape[0] * want_probs[:, counted].shape[1]
    torch.testing.assert_close(received.double(), want_received, atol=tolerance, rtol=0.0)
    torch.testing.assert_close(out.double(), want_out, atol=tolerance * float(want_out.abs().max()), rtol=0.0)
    if window is not None:  # the first question token, at position N, sees no context key `window` or more back
        assert float(received[: num_context - window + 1].abs().sum()) == 0.0
        # the last, at N + Q - 1, none before N + Q - window
        last, _ = scout_attention(q, k, v, context_k, context_v, own, 0.125, context_visible, slice(-1, None))
        assert float(last[: num_context + num_queries - window].abs().sum()) == 0.0
    # the first query sees no later question key: changing those keys and values leaves its output as it was
    later_k, later_v = k.clone(), v.clone()
    later_k[1:], later_v[1:] = later_k[1:] + 1.0, later_v[1:] - 1.0
    _, moved = scout_attention(q, later_k, later_v, context_k, context_v, own, 0.125, context_visible, counted)
    assert torch.equal(moved[0], out[0]) and not torch.equal(moved[1:], out[1:])
    assert 0.0 < float(received.sum()) / num_summed < 1.0  # each row's weights sum to 1 over [context | own]


@pytest.mark.slow  # make test's budget: three fusions of a long record
def test_the_scout_over_the_cached_context_is_full_reuse_and_ratio_one_is_full_prefill(
    checkpoint: Checkpoint, qa_records: list[dict]
) -> None:
    engine = TorchEngine.from_checkpoint(checkpoint)
    record = qa_records[0]
    prompt = engine.fuser.layout(record["documents"], record["question"])
    engine.fuser.precompute(prompt)
    runner = engine.fuser.runner
    logprobs = lambda mode, ratio: runner.logits(  # noqa: E731
        engine.fuser.fuse(prompt, mode, ratio).prefill.last_hidden[None])[0].log_softmax(-1)
    # The scout runs the question over the cached KV, as full reuse does: per layer, the question's attention to
    # the context is a share of each row's distribution (the rest goes to the question's own tokens).
    fused = engine.fuser.fuse(prompt, "full_reuse", 0.0)
    layout = fused.layout
    scores = question_attention(runner, layout, fused.cache, None, runner.config.num_layers - 1, None)
    num_question = layout.num_tokens - layout.num_context_tokens
    mass = scores.sum(dim=1) / (num_question * runner.config.num_heads)  # [L]: context's share of the attention
    assert bool(((mass > 0.25) & (mass <= 1.0 + 1e-5)).all())  # measured 0.31-0.89 per layer
    assert float(scores[:, layout.num_context_tokens :].abs().sum()) == 0.0  # the question's own keys not counted
    # At ratio 1 every inexact token is recomputed: the same distribution as full prefill (float32 rounding).
    full = logprobs("full_prefill", 1.0)
    torch.testing.assert_close(logprobs("query_driven", 1.0), full, atol=2e-3, rtol=0.0)
    assert first_token_kl(full, logprobs("query_driven", 0.15)) < first_token_kl(full, logprobs("full_reuse", 0.0))
    result = engine.generate(BlendRequest(record["documents"], record["question"], "query_driven", 0.15,
                                          SamplingParams(max_new_tokens=2)))
    assert 0.1 < result.stats.recomputed_fraction < 0.2 and result.stats.mode == "query_driven"


@pytest.mark.parametrize("mode", ["query_driven", "query_boundary"])
def test_a_cold_request_is_full_prefill(checkpoint: Checkpoint, qa_records: list[dict], mode: str) -> None:
    engine = TorchEngine.from_checkpoint(checkpoint)  # an empty store: no chunk nor prefix KV to score
    record = qa_records[0]
    prompt = engine.fuser.layout(record["documents"], record["question"])
    fused = engine.fuser.fuse(prompt, mode, 0.15)
    assert fused.prefill.recomputed_fraction == 1.0  # nothing cached: every context token recomputed
    logits = lambda f: engine.fuser.runner.logits(f.prefill.last_hidden[None])[0]  # noqa: E731
    reference = TorchEngine.from_checkpoint(checkpoint).fuser.fuse(prompt, "full_prefill", 1.0)
    torch.testing.assert_close(logits(fused), logits(reference), atol=2e-3, rtol=0.0)
