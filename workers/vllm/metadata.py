"""What BlendKVConnector's scheduler side tells its worker side each step: which KV goes into which blocks."""
from dataclasses import dataclass, field

from vllm.distributed.kv_transfer.kv_connector.v1.base import KVConnectorMetadata

from workers.vllm.params import ContextKVParams


@dataclass(slots=True)
class GroupBlocks:
    """A request's blocks in one KV cache group; the first `num_skipped` are vLLM's shared null block.

    vLLM's hybrid KV cache manager gives a sliding-window group real blocks only from the one holding the
    first token inside the window on; the blocks before it are placeholders that must never be written.
    """

    block_ids: list[int]
    num_skipped: int = 0


@dataclass(slots=True)
class ContextLoad:
    """Write positions [start, end) of a request's context KV into its blocks, per KV cache group."""

    request_id: str
    params: ContextKVParams
    groups: list[GroupBlocks]
    start: int
    end: int


@dataclass
class BlendConnectorMetadata(KVConnectorMetadata):
    """The loads of one engine step (empty on most steps), and the KV cache groups they refer to.

    The groups come from the scheduler side's own engine: vLLM keeps one worker-side connector per process,
    built with the first engine's cache layout, so the worker side must not rely on its own.
    """

    loads: list[ContextLoad] = field(default_factory=list)
    group_of_layer: dict[str, int] = field(default_factory=dict)  # attention layer name -> KV cache group
    block_sizes: list[int] = field(default_factory=list)  # tokens per block, per group
