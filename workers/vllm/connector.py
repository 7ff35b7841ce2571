"""BlendKVConnector: vLLM treats a request's fused context as already computed and reads its KV from us."""
from typing import TYPE_CHECKING, Any

import torch
from vllm.distributed.kv_transfer.kv_connector.v1.base import (
    KVConnectorBase_V1,
    KVConnectorMetadata,
    KVConnectorRole,
    SupportsHMA,
)
from vllm.model_executor.models.utils import extract_layer_index

from workers.vllm.blocks import injectable_tokens, slot_mapping, written_range
from workers.vllm.handoff import drop_kv
from workers.vllm.metadata import BlendConnectorMetadata, ContextLoad, GroupBlocks
from workers.vllm.params import PARAMS_KEY, ContextKVParams

if TYPE_CHECKING:
    from vllm.config import VllmConfig
    from vllm.forward_context import ForwardContext
    from vllm.v1.attention.backend import AttentionMetadata
    from vllm.v1.core.kv_cache_manager import KVCacheBlocks
    from vllm.v1.core.kv_cache_utils import KVCacheBlock
    from vllm.v1.core.sched.output import SchedulerOutput
    from vllm.v1.kv_cache_interface import KVCacheConfig
    from vllm.v1.request import Request


class BlendKVConnector(KVConnectorBase_V1, SupportsHMA):
    """Load-only connector: the context's KV comes from blendserve, vLLM prefills the question and decodes.

    A request opts in with SamplingParams(extra_args=ContextKVParams(...).as_extra_args()). The worker side
    writes each layer's K/V through the attention backend's own cache writer (do_kv_cache_update) just
    before that layer runs, so it is independent of the backend's paged layout.

    It supports vLLM's hybrid KV cache manager (SupportsHMA): a model with sliding-window layers (Gemma 3)
    keeps its KV in several cache groups with their own block tables, and a sliding-window group holds real
    blocks only for the tokens its window still reaches (the ones before are vLLM's null block). Each layer's
    context KV goes into its own group's blocks, and only into the real ones. Without SupportsHMA vLLM turns
    the manager off for any connector and keeps every layer's KV for every token.
    """

    def __init__(self, vllm_config: "VllmConfig", role: KVConnectorRole, kv_cache_config: "KVCacheConfig") -> None:
        super().__init__(vllm_config, role, kv_cache_config)
        # scheduler side: this engine's KV cache groups, handed to the worker side with each step's loads
        groups = kv_cache_config.kv_cache_groups if kv_cache_config is not None else []
        self._group_of_layer = {name: g for g, group in enumerate(groups) for name in group.layer_names}
        self._block_sizes = [group.kv_cache_spec.block_size for group in groups]
        # scheduler side
        self._pending: list[ContextLoad] = []
        self._loaded_tokens: dict[str, int] = {}
        # worker side
        self._step: list[tuple[ContextLoad, torch.Tensor, list[tuple[int, int, torch.Tensor]]]] = []
        # per load: the KV, and per group the positions [first, end) with real blocks and their slots
        self._layers_left: set[str] = set()
        self._step_groups: dict[str, int] = {}  # this step's layer -> group (from the scheduler side's engine)
        self._forward_context: "ForwardContext | None" = None

    # ---------------- scheduler side ----------------

    def get_num_new_matched_tokens(self, request: "Request", num_computed_tokens: int) -> tuple[int, bool]:
        """Context tokens beyond what vLLM already has (synchronous load, so never async)."""
        params = ContextKVParams.from_kv_transfer_params(request.kv_transfer_params)
        if params is None or not params.is_available():
            return 0, False
        hit = injectable_tokens(params.num_tokens, request.num_prompt_tokens)
        return max(hit - num_computed_tokens, 0), False

    def update_state_after_alloc(self, request: "Request", blocks: "KVCacheBlocks", num_external_tokens: int) -> None:
        """Remember which blocks of each KV cache group receive the context KV; the load runs in this same step."""
        if num_external_tokens <= 0:
            return
        params = ContextKVParams.from_kv_transfer_params(request.kv_transfer_params)
        assert params is not None, "external tokens granted to a request without blendserve params"
        end = injectable_tokens(params.num_tokens, request.num_prompt_tokens)
        groups = [_group_blocks(group) for group in blocks.blocks]
        self._pending.append(ContextLoad(request.request_id, params, groups, end - num_external_tokens, end))
        self._loaded_tokens[request.request_id] = num_external_tokens

    def build_connector_meta(self, scheduler_output: "SchedulerOutput") -> KVConnectorMetadata:
        """Hand this step's loads to the worker side and start a new batch."""
        if not self._pending:
            return BlendConnectorMetadata()
        meta = BlendConnectorMetadata(self._pending, self._group_of_layer, self._block_sizes)
        self._pending = []
        return meta

    def request_finished_all_groups(
        self, request: "Request", block_ids: tuple[list[int], ...]
    ) -> tuple[bool, dict[str, Any] | None]:
        """The hybrid KV cache manager's end of a request: the same as for one group (nothing kept)."""
        return self.request_finished(request, block_ids[0] if block_ids else [])

    def request_finished(self, request: "Request", block_ids: list[int]) -> tuple[bool, dict[str, Any] | None]:
        """Free blocks now; release the in-process KV and report how many tokens were injected."""
        params = ContextKVParams.from_kv_transfer_params(request.kv_transfer_params)
        loaded = self._loaded_tokens.pop(request.request_id, 0)
        if params is None:
            return False, None
        if params.key is not None and params.release:
            drop_kv(params.key)
        return False, {PARAMS_KEY: {"injected_tokens": loaded}}

    # ---------------- worker side ----------------

    def start_load_kv(self, forward_context: "ForwardContext", **kwargs: Any) -> None:
        """Resolve this step's KV tensors and slots; the per-layer writes happen in wait_for_layer_load."""
        meta = self._get_connector_metadata()
        assert isinstance(meta, BlendConnectorMetadata)
        self._step = []
        for load in meta.loads:
            kv = load.params.resolve()
            if kv.shape[2] < load.end:
                raise ValueError(f"request {load.request_id}: context KV has {kv.shape[2]} tokens, need {load.end}")
            writes = []
            for group, size in zip(load.groups, meta.block_sizes, strict=True):
                first, end = written_range(load.start, load.end, group.num_skipped, size)
                writes.append((first, end, slot_mapping(group.block_ids, first, end, size)))
            self._step.append((load, kv, writes))
        self._forward_context = forward_context
        self._step_groups = meta.group_of_layer
        self._layers_left = set(meta.group_of_layer) if self._step else set()

    def wait_for_layer_load(self, layer_name: str) -> None:
        """Write this layer's context K/V into its group's real blocks, just before the layer attends."""
        if layer_name not in self._layers_left:
            return
        self._layers_left.discard(layer_name)
        attn = self._forward_context.no_compile_layers[layer_name]
        # The layer's own bound cache, not one registered with this connector: vLLM keeps one worker-side
        # connector per process, so with two engines in a process registered caches may be the other's.
        cache = attn.kv_cache
        layer, group = extract_layer_index(layer_name), self._step_groups[layer_name]
        for _, kv, writes in self._step:
            first, end, slots = writes[group]
            if first == end:
                continue
            k = kv[layer, 0, first:end].to(device=cache.device, dtype=attn.dtype).contiguous()
            v = kv[layer, 1, first:end].to(device=cache.device, dtype=attn.dtype).contiguous()
            attn.impl.do_kv_cache_update(attn, k, v, cache, slots.to(cache.device))

    def save_kv_layer(
        self, layer_name: str, kv_layer: torch.Tensor, attn_metadata: "AttentionMetadata", **kwargs: Any
    ) -> None:
        """Load-only connector: nothing to save."""

    def wait_for_save(self) -> None:
        """End of step: every layer must have received its context KV."""
        if self._layers_left:
            missing = sorted(self._layers_left)
            self._layers_left = set()
            raise RuntimeError(f"context KV never written for layers {missing[:3]}... (no wait_for_layer_load call)")
        self._step = []
        self._forward_context = None


def _group_blocks(blocks: "list[KVCacheBlock]") -> GroupBlocks:
    """A group's block ids and how many lead with vLLM's null block (it pads only the front of a table)."""
    skipped = next((i for i, block in enumerate(blocks) if not block.is_null), len(blocks))
    return GroupBlocks([block.block_id for block in blocks], skipped)
