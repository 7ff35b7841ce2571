"""The vLLM engine: blendserve fuses the context KV, vLLM schedules, batches, prefills the question and decodes."""
import time
import uuid
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import torch
from transformers import PreTrainedTokenizerBase

from workers.chunk_store import DEFAULT_NAMESPACE, ChunkStore
from workers.engine import BlendEngine, BlendRequest, Generation, PrefillStats
from workers.engine_base import Engine, StoredChunk
from workers.fusion.base import FusionOptions
from workers.fusion.layout import SUFFIX, BlendLayout
from workers.prompt import PromptLayout, PromptTemplate
from workers.sampling import SamplingParams
from workers.vllm.blocks import injectable_tokens
from workers.vllm.engine_config import blend_kv_transfer_config, set_cpu_env
from workers.vllm.engine_loop import EngineLoop, TokenStream
from workers.vllm.handoff import drop_kv, put_kv
from workers.vllm.kv_buffer import ReusedKVBuffer
from workers.vllm.module_runner import VLLMModuleRunner, shared_checkpoint
from workers.vllm.paged_attention import PagedAttention
from workers.vllm.params import ContextKVParams
from workers.vllm.settings import VLLMSettings

PLAIN_MODE = "full_prefill"  # served by vLLM alone: no fusion, no injection


class VLLMEngine(Engine):
    """Fusion (BlendEngine's, on vLLM's loaded modules) writes the context KV; vLLM does the rest, batched."""

    def __init__(
        self,
        model_path: Path,
        scratch_dir: Path,
        settings: VLLMSettings = VLLMSettings(),
        options: FusionOptions = FusionOptions(),
        store: ChunkStore | None = None,
        template: PromptTemplate | None = None,
        chunk_context: str = "prefix",
        dtype: str = "bfloat16",  # concrete (workers.dtype.resolve_dtype makes "auto" so)
    ) -> None:
        self.settings = settings
        self.max_concurrent_jobs = settings.max_concurrent_jobs
        cpu = settings.device == "cpu" or (settings.device == "auto" and not torch.cuda.is_available())
        set_cpu_env(Path(scratch_dir), in_process=True, num_threads=settings.num_threads, cpu=cpu)
        self._loop = EngineLoop(lambda: _build_llm_engine(Path(model_path), settings, dtype))
        model = self._loop.call(self._model)
        checkpoint = shared_checkpoint(Path(model_path), model, template.tokenizer if template else None)
        block_size = self._loop.engine.vllm_config.cache_config.block_size
        self.blend = BlendEngine(checkpoint, options, store, template, chunk_context)
        paged = PagedAttention.from_vllm_model(model, block_size) if settings.paged_fusion_attention else None
        self.blend.runner = VLLMModuleRunner(checkpoint, model, paged)  # fusion computes with vLLM's weights
        self._buffer = ReusedKVBuffer(checkpoint.config, self.blend.runner.dtype)
        self.stop_token_ids = self.blend.stop_token_ids
        self._vocab_size = checkpoint.config.vocab_size

    @property
    def tokenizer(self) -> PreTrainedTokenizerBase:
        """The served model's tokenizer."""
        return self.blend.tokenizer

    @property
    def dtype(self) -> torch.dtype:
        """The dtype vLLM and the fusion compute and cache KV in."""
        return self.blend.runner.dtype

    @property
    def max_context_tokens(self) -> int:
        """Prompt plus generated tokens vLLM schedules for one request."""
        return min(self.settings.max_model_len, self.blend.max_context_tokens)

    def open(self, request: BlendRequest) -> Generation:
        """Fuse the context (one request at a time), hand the request to vLLM, return at its first token."""
        if request.mode != PLAIN_MODE and request.mode not in self.blend.modes:
            raise ValueError(f"unknown fusion mode {request.mode!r}; choose from {sorted(self.blend.modes)}")
        ratio = self.blend.options.recompute_ratio if request.recompute_ratio is None else request.recompute_ratio
        if not 0.0 <= ratio <= 1.0:
            raise ValueError(f"recompute_ratio must be in [0, 1], got {ratio}")
        sampling = request.sampling
        if not sampling.stop_token_ids:
            sampling = replace(sampling, stop_token_ids=self.stop_token_ids)
        start_s = time.perf_counter()
        prompt = self.blend.layout(request.documents, request.question)
        num_tokens = len(prompt.token_ids)
        if num_tokens + sampling.max_new_tokens > self.max_context_tokens:
            raise ValueError(
                f"prompt of {num_tokens} tokens plus max_tokens {sampling.max_new_tokens} exceeds the "
                f"model's context of {self.max_context_tokens} tokens"
            )
        fused: dict[str, Any] = {}
        stream = self._loop.call(lambda: self._submit(prompt, request, ratio, sampling, fused))
        tokens = iter(stream)
        try:
            first = next(tokens)
        except BaseException:
            self._loop.abort(stream)
            raise
        stats = self._stats(request.mode, ratio, time.perf_counter() - start_s, prompt, fused, stream)
        write_back = self._write_back(prompt, request, fused.get("layout"))
        return Generation(stats, self._tokens(first, tokens, stream), write_back)

    def store_documents(self, documents: list[str], namespace: str = DEFAULT_NAMESPACE) -> list[StoredChunk]:
        """Compute (if missing) and store each document's chunk KV, on the engine thread."""
        return self._loop.call(lambda: self.blend.store_documents(documents, namespace))

    def close(self) -> None:
        """Stop the engine thread."""
        self._loop.close()

    @property
    def peak_running(self) -> int:
        """Most requests vLLM held at once since the last reset (continuous batching at work when > 1)."""
        return self._loop.peak_running

    def reset_peak_running(self) -> None:
        """Start counting peak_running afresh."""
        self._loop.peak_running = 0

    # ---------------- on the engine thread ----------------

    def _model(self) -> torch.nn.Module:
        models = self._loop.engine.apply_model(lambda model: model)
        if len(models) != 1:
            raise RuntimeError(f"expected one in-process vLLM worker, got {len(models)}")
        return models[0]

    def _submit(
        self, prompt: PromptLayout, request: BlendRequest, ratio: float, sampling: SamplingParams, fused: dict[str, Any]
    ) -> TokenStream:
        params = self._vllm_params(sampling)
        key = None
        if request.mode != PLAIN_MODE and len(prompt.token_ids) > len(prompt.suffix_ids):  # some context to fuse
            context = replace(prompt, suffix_ids=[])  # vLLM prefills the question itself, over the fused KV
            cache = self._buffer.take(len(context.token_ids))
            try:
                cache, prefill, layout = self.blend.fuse(context, request.mode, ratio, 0, request.namespace, cache)
                num_context = layout.num_context_tokens
                injected = injectable_tokens(num_context, len(prompt.token_ids))
                fused.update(layout=layout, fraction=prefill.recomputed_fraction, injected=injected)
                if injected > 0:
                    key = put_kv(cache.data[:, :, :num_context])
                    extra = ContextKVParams(num_context, key=key).as_extra_args()
                    params.extra_args = {**(params.extra_args or {}), **extra}
            finally:
                self._buffer.release(cache, key)  # reusable once the connector drops the KV (request finished)
        try:
            return self._loop.add_request(uuid.uuid4().hex, {"prompt_token_ids": prompt.token_ids}, params)
        except BaseException:
            if key is not None:
                drop_kv(key)
            raise

    def _vllm_params(self, sampling: SamplingParams) -> Any:
        from vllm import SamplingParams as VLLMSamplingParams
        from vllm.sampling_params import RequestOutputKind

        return VLLMSamplingParams(
            max_tokens=sampling.max_new_tokens,
            temperature=sampling.temperature,
            top_p=sampling.top_p,
            seed=sampling.seed,
            stop_token_ids=list(sampling.stop_token_ids),
            ignore_eos=True,  # stopping is decided by stop_token_ids alone, as in the torch engine
            logprobs=self.settings.first_token_logprobs or None,
            output_kind=RequestOutputKind.DELTA,
            detokenize=False,
        )

    # ---------------- on the caller's thread ----------------

    def _tokens(self, first: int, rest: Iterator[int], stream: TokenStream) -> Iterator[int]:
        try:
            yield first
            yield from rest
        finally:
            self._loop.abort(stream)  # no-op once vLLM finished it

    def _write_back(self, prompt: PromptLayout, request: BlendRequest, layout: BlendLayout | None) -> Any:
        missed = layout is not None and self.blend.modes[request.mode].reads_chunk_cache and any(
            seg.cached is None and seg.kind != SUFFIX for seg in layout.segments
        )

        def write_back() -> None:
            if missed:
                self._loop.call(lambda: self.blend.precompute(prompt, request.namespace))

        return write_back

    def _stats(
        self, mode: str, ratio: float, ttft_s: float, prompt: PromptLayout, fused: dict[str, Any], stream: TokenStream
    ) -> PrefillStats:
        num_tokens = len(prompt.token_ids)
        context = num_tokens - len(prompt.suffix_ids)
        layout: BlendLayout | None = fused.get("layout")
        injected = fused.get("injected", 0)  # context tokens the connector writes, decided when fusing
        fraction = fused.get("fraction", 1.0) if injected else 1.0
        logprobs = torch.full((self._vocab_size,), float("-inf"))
        for token, value in stream.first_logprobs.items():
            logprobs[token] = value
        return PrefillStats(
            mode=mode,
            recompute_ratio=ratio,
            ttft_s=ttft_s,
            num_prompt_tokens=num_tokens,
            context_tokens=context,
            reused_tokens_by_tier=_reused_by_tier(layout, injected),
            recomputed_tokens=round(fraction * injected) + num_tokens - injected,
            recomputed_fraction=(fraction * injected + context - injected) / max(context, 1),
            first_token_logprobs=logprobs,
        )


def _reused_by_tier(layout: BlendLayout | None, injected: int) -> dict[str, int]:
    """Tokens of cached KV that reached vLLM (the injected context), per tier they were found in."""
    reused: dict[str, int] = {}
    for seg in layout.segments if layout is not None else ():
        overlap = min(seg.end, injected) - seg.start
        if seg.cached is not None and overlap > 0:
            reused[seg.cached.source_tier] = reused.get(seg.cached.source_tier, 0) + overlap
    return reused


def _build_llm_engine(model_path: Path, settings: VLLMSettings, dtype: str) -> Any:
    """vLLM's LLMEngine with BlendKVConnector, prefix caching off (fused KV must never be reused as exact)."""
    from vllm.config import KVTransferConfig
    from vllm.engine.arg_utils import EngineArgs
    from vllm.v1.engine.llm_engine import LLMEngine

    args = EngineArgs(
        model=str(model_path),
        dtype=dtype,
        enforce_eager=settings.enforce_eager,
        gpu_memory_utilization=settings.gpu_memory_utilization,
        max_model_len=settings.max_model_len,
        max_num_seqs=settings.max_num_seqs,
        enable_prefix_caching=False,
        kv_transfer_config=KVTransferConfig(**blend_kv_transfer_config()),
        disable_log_stats=True,
        kv_cache_memory_bytes=settings.kv_cache_bytes,
        **({"block_size": settings.block_size} if settings.block_size else {}),
    )
    return LLMEngine.from_engine_args(args)
