"""What BlendKVConnector's scheduler side tells its worker side each step: which KV goes into which blocks."""
from dataclasses import dataclass, field

from vllm.distributed.kv_transfer.kv_connector.v1.base import KVConnectorMetadata

from workers.vllm.params import ContextKVParams


@dataclass(slots=True)
class ContextLoad:
    """Write positions [start, end) of a request's context KV into its blocks (block ids of KV group 0)."""

    request_id: str
    params: ContextKVParams
    block_ids: list[int]
    start: int
    end: int


@dataclass
class BlendConnectorMetadata(KVConnectorMetadata):
    """The loads of one engine step (empty on most steps)."""

    loads: list[ContextLoad] = field(default_factory=list)
