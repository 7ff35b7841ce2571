"""A worker's store without Ray: device tier (host memory here) over the shared object store."""
import pytest
import torch

from kvplane.ray.worker_store import open_worker_tiered_store
from kvplane.tiers.memory import MemoryTier
from kvplane.tiers.spec import TierSpec, open_tier
from tests.kvplane.conftest import EntryFactory


def test_device_tier_falls_back_to_host_memory_without_a_gpu() -> None:
    tier = open_tier(TierSpec("device", "device://", 1 << 20))
    assert isinstance(tier, MemoryTier)
    assert tier.device.type == ("cuda" if torch.cuda.is_available() else "cpu")
    assert open_tier(TierSpec("device", "device://cpu", 1 << 20)).device == torch.device("cpu")


def test_a_chunk_written_by_one_worker_is_found_via_s3(make_entry: EntryFactory, s3_spec: TierSpec) -> None:
    entry = make_entry(1, dtype=torch.bfloat16)
    with open_worker_tiered_store(1 << 20, object_store=s3_spec) as writer:
        writer.put(entry, priority=0.5)
        assert writer.locate(entry.key) == "device"
    with open_worker_tiered_store(1 << 20, object_store=s3_spec) as reader:
        assert reader.tier_names == ["device", "s3"]
        assert reader.locate(entry.key) == "s3"
        got = reader.get(entry.key)
        assert torch.equal(got.kv, entry.kv)
        reader.flush()
        assert reader.locate(entry.key) == "device"
        stats = reader.stats()
        assert stats.tiers["s3"].hits == 1 and stats.tiers["device"].promotions == 1


@pytest.mark.parametrize(
    "kwargs",
    [
        {"name": "", "url": "ram://", "capacity_bytes": 1},
        {"name": "ram", "url": "/no/scheme", "capacity_bytes": 1},
        {"name": "ram", "url": "ram://", "capacity_bytes": -1},
        {"name": "ram", "url": "ram://", "capacity_bytes": 1, "policy": "random"},
    ],
)
def test_tier_specs_are_validated(kwargs: dict) -> None:
    with pytest.raises(ValueError):
        TierSpec(**kwargs)
