"""How much of a prompt vLLM's prefix cache holds under a salt, asked before deciding to fuse it again."""
import hashlib
from typing import Any

PROBE_REQUEST_ID = "blendserve-prefix-probe"


def cached_prefix_tokens(engine: Any, token_ids: list[int], salt: str) -> int:
    """Leading tokens of `token_ids` (whole blocks) whose KV the in-process engine's prefix cache holds under `salt`.

    Asked the way vLLM's scheduler asks when it admits a request, on the engine thread; nothing is allocated.
    """
    from vllm import SamplingParams
    from vllm.v1.request import Request

    core = engine.engine_core.engine_core  # the in-process EngineCore (VLLM_ENABLE_V1_MULTIPROCESSING=0)
    if core.request_block_hasher is None:
        return 0
    probe = Request(PROBE_REQUEST_ID, list(token_ids), SamplingParams(max_tokens=1), None, cache_salt=salt,
                    block_hasher=core.request_block_hasher)
    _, num_tokens, _ = core.scheduler.kv_cache_manager.get_computed_blocks(probe)
    return num_tokens


def fused_salt(namespace: str, mode: str, recompute_ratio: float, question_ids: list[int] | None) -> str:
    """The prefix-cache salt of a tenant's fused KV in one mode and ratio (and question, where the mode reads it).

    Requests whose prompts start alike share the fused blocks (a conversation's later turns, a repeated
    question); requests that must not (other tenants, other fusions, plain prefill's exact KV) never do.
    """
    identity = f"{mode}@{recompute_ratio:g}"
    if question_ids is not None:
        identity += "/" + hashlib.sha256(repr(question_ids).encode()).hexdigest()[:16]
    return f"{namespace}\0fused\0{identity}"
