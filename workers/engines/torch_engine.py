"""The reference torch engine: its Fuser fills the whole prompt's KV, blendserve's runner decodes; one at a time."""
import time
from pathlib import Path

from workers.chunks.sources import DEFAULT_CHUNK_CONTEXT
from workers.chunks.store import DEFAULT_NAMESPACE, ChunkStore
from workers.engines.base import (
    BlendRequest,
    Engine,
    EngineLimits,
    Generation,
    StoredChunk,
    prefill_stats,
)
from workers.fuser import Fuser
from workers.fusion.base import FusionOptions
from workers.fusion.layer_feed import LayerLoader
from workers.generation.decode import iter_decode
from workers.generation.prompt import PromptTemplate
from workers.loading.controller import LoadingController
from workers.model.checkpoint import Checkpoint, load_checkpoint
from workers.model.default import prepare_default_model
from workers.model.dtype import AUTO, resolve_dtype, torch_dtype
from workers.model.runner import ModelRunner


class TorchEngine(Engine):
    """Every fusion mode on blendserve's own layer-wise runner, then greedy or sampled decoding on it."""

    def __init__(self, fuser: Fuser) -> None:
        self.fuser = fuser
        config = fuser.runner.config
        self.stop_token_ids = tuple(config.eos_token_ids) or (fuser.tokenizer.eos_token_id,)
        self._limits = EngineLimits(config.max_position_embeddings, frozenset(fuser.modes))

    @classmethod
    def from_checkpoint(
        cls,
        checkpoint: Checkpoint,
        options: FusionOptions = FusionOptions(),
        *,
        store: ChunkStore | None = None,
        template: PromptTemplate | None = None,
        chunk_context: str = DEFAULT_CHUNK_CONTEXT,
        loader: LayerLoader | None = None,
        controller: LoadingController | None = None,
    ) -> "TorchEngine":
        """An engine over a loaded checkpoint, its Fuser built from the same arguments."""
        runner = ModelRunner(checkpoint)
        return cls(
            Fuser(
                runner,
                options,
                store=store,
                template=template,
                chunk_context=chunk_context,
                loader=loader,
                controller=controller,
            )
        )

    @property
    def limits(self) -> EngineLimits:
        """The model's whole context, every fusion mode."""
        return self._limits

    def open(self, request: BlendRequest) -> Generation:
        """Prefill one request with its fusion mode; the returned generation decodes on iteration."""
        start_s = time.perf_counter()
        prepared = self.prepare(request)
        prompt, sampling = prepared.prompt, prepared.sampling
        runner = self.fuser.runner
        cache = runner.new_cache(len(prompt.token_ids) + sampling.max_new_tokens)
        began = time.perf_counter()
        fused = self.fuser.fuse(prompt, prepared.mode, prepared.recompute_ratio, request.namespace, cache)
        prepared.clock.add_fusion(time.perf_counter() - began, fused.lookup_s, fused.load_wait_s)
        first_logits = runner.logits(fused.prefill.last_hidden[None])[0]
        layout = fused.layout
        stats = self.planned_stats(prepared, prefill_stats(
            mode=fused.mode.name,
            recompute_ratio=fused.recompute_ratio,
            ttft_s=time.perf_counter() - start_s,
            num_prompt_tokens=layout.num_tokens,
            context_tokens=layout.num_context_tokens,
            fused_tokens=layout.num_context_tokens,
            fused_fraction=fused.prefill.recomputed_fraction,
            reused_tokens_by_tier=fused.reused_tokens_by_tier(),
            first_token_logprobs=first_logits.log_softmax(-1),
        ))
        tokens = iter_decode(runner, cache, first_logits, sampling)

        def write_back(generated_ids: list[int]) -> None:
            self.fuser.write_back(fused, prompt, request.namespace)
            self.warm(prepared, request.namespace)
            self.store_next_turn(request, prepared, generated_ids)

        return Generation(stats, tokens, write_back)

    def store_documents(self, documents: list[str], namespace: str = DEFAULT_NAMESPACE) -> list[StoredChunk]:
        """Compute (if missing) and store each document's chunk KV; where each now lives, in order."""
        return self.fuser.store_documents(documents, namespace)


def load_torch_engine(
    model_path: Path | None = None,
    dtype: str = AUTO,
    options: FusionOptions = FusionOptions(),
    chunk_context: str = DEFAULT_CHUNK_CONTEXT,
) -> TorchEngine:
    """The default model (or `model_path`) loaded once in `dtype`, made concrete for this CPU, in a TorchEngine."""
    path = model_path or prepare_default_model()
    checkpoint = load_checkpoint(path, torch_dtype(resolve_dtype(dtype, path, on_gpu=False)))
    return TorchEngine.from_checkpoint(checkpoint, options, chunk_context=chunk_context)
