"""BlendKVConnector: vLLM treats a request's fused context as already computed and reads its KV from us."""
from typing import TYPE_CHECKING, Any

import torch
from vllm.distributed.kv_transfer.kv_connector.v1.base import (
    KVConnectorBase_V1,
    KVConnectorMetadata,
    KVConnectorRole,
)
from vllm.model_executor.models.utils import extract_layer_index

from workers.vllm.blocks import injectable_tokens, slot_mapping
from workers.vllm.handoff import drop_kv
from workers.vllm.metadata import BlendConnectorMetadata, ContextLoad
from workers.vllm.params import PARAMS_KEY, ContextKVParams

if TYPE_CHECKING:
    from vllm.config import VllmConfig
    from vllm.forward_context import ForwardContext
    from vllm.v1.attention.backend import AttentionMetadata
    from vllm.v1.core.kv_cache_manager import KVCacheBlocks
    from vllm.v1.core.sched.output import SchedulerOutput
    from vllm.v1.kv_cache_interface import KVCacheConfig
    from vllm.v1.request import Request


class BlendKVConnector(KVConnectorBase_V1):
    """Load-only connector: the context's KV comes from blendserve, vLLM prefills the question and decodes.

    A request opts in with SamplingParams(extra_args=ContextKVParams(...).as_extra_args()). The worker side
    writes each layer's K/V through the attention backend's own cache writer (do_kv_cache_update) just
    before that layer runs, so it is independent of the backend's paged layout.
    """

    def __init__(self, vllm_config: "VllmConfig", role: KVConnectorRole, kv_cache_config: "KVCacheConfig") -> None:
        super().__init__(vllm_config, role, kv_cache_config)
        self._block_size = vllm_config.cache_config.block_size
        self._dtype = vllm_config.model_config.dtype  # K/V enter the cache writer in the model's dtype
        # scheduler side
        self._pending: list[ContextLoad] = []
        self._loaded_tokens: dict[str, int] = {}
        # worker side
        self._kv_caches: dict[str, torch.Tensor] = {}
        self._step: list[tuple[ContextLoad, torch.Tensor, torch.Tensor]] = []  # load, KV, slots
        self._layers_left: set[str] = set()
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
        """Remember which blocks receive the context KV; the load runs in this same step."""
        if num_external_tokens <= 0:
            return
        params = ContextKVParams.from_kv_transfer_params(request.kv_transfer_params)
        assert params is not None, "external tokens granted to a request without blendserve params"
        end = injectable_tokens(params.num_tokens, request.num_prompt_tokens)
        block_ids = list(blocks.get_block_ids()[0])
        self._pending.append(ContextLoad(request.request_id, params, block_ids, end - num_external_tokens, end))
        self._loaded_tokens[request.request_id] = num_external_tokens

    def build_connector_meta(self, scheduler_output: "SchedulerOutput") -> KVConnectorMetadata:
        """Hand this step's loads to the worker side and start a new batch."""
        meta = BlendConnectorMetadata(self._pending)
        self._pending = []
        return meta

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

    def register_kv_caches(self, kv_caches: dict[str, torch.Tensor]) -> None:
        """Keep the paged cache tensor of every attention layer, by layer name."""
        self._kv_caches = dict(kv_caches)

    def start_load_kv(self, forward_context: "ForwardContext", **kwargs: Any) -> None:
        """Resolve this step's KV tensors and slots; the per-layer writes happen in wait_for_layer_load."""
        meta = self._get_connector_metadata()
        assert isinstance(meta, BlendConnectorMetadata)
        self._step = []
        for load in meta.loads:
            kv = load.params.resolve()
            if kv.shape[2] < load.end:
                raise ValueError(f"request {load.request_id}: context KV has {kv.shape[2]} tokens, need {load.end}")
            self._step.append((load, kv, slot_mapping(load.block_ids, load.start, load.end, self._block_size)))
        self._forward_context = forward_context
        self._layers_left = set(self._kv_caches) if self._step else set()

    def wait_for_layer_load(self, layer_name: str) -> None:
        """Write this layer's context K/V into the paged cache, just before the layer attends."""
        if layer_name not in self._layers_left:
            return
        self._layers_left.discard(layer_name)
        attn = self._forward_context.no_compile_layers[layer_name]
        cache = self._kv_caches[layer_name]
        layer = extract_layer_index(layer_name)
        for load, kv, slots in self._step:
            k = kv[layer, 0, load.start : load.end].to(device=cache.device, dtype=self._dtype).contiguous()
            v = kv[layer, 1, load.start : load.end].to(device=cache.device, dtype=self._dtype).contiguous()
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
