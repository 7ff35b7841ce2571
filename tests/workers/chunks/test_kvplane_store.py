"""The engine on kvplane's tiered store: misses written back, hits found again after a restart from SSD."""
from pathlib import Path

import pytest

from kvplane.store import TieredStore
from kvplane.tiers.spec import TierSpec
from workers.chunks.kvplane_store import KVPlaneChunkStore
from workers.engines.base import BlendRequest
from workers.engines.torch_engine import TorchEngine
from workers.generation.sampling import SamplingParams
from workers.model.checkpoint import Checkpoint

SHORT = SamplingParams(max_new_tokens=4)


def open_store(directory: Path) -> TieredStore:
    """A small RAM tier over a local-SSD tier in `directory`."""
    specs = [TierSpec("ram", "ram://", 64 << 20), TierSpec("ssd", f"file://{directory}", 1 << 30)]
    return TieredStore.from_specs(specs)


# make test's budget: recovery from SSD files runs by default in tests/kvplane/test_store.py and on Ray in
# tests/kvplane/ray/test_shard_recovery.py; the engine on a tiered store in tests/cluster/test_serving.py.
@pytest.mark.slow
def test_chunks_survive_a_restart_and_stay_per_model(checkpoint: Checkpoint, tmp_path: Path,
                                                     qa_records: list[dict]) -> None:
    documents, question = qa_records[0]["documents"], qa_records[0]["question"]
    with open_store(tmp_path) as store:
        engine = TorchEngine.from_checkpoint(checkpoint, store=KVPlaneChunkStore(store, checkpoint.fingerprint))
        first = engine.generate(BlendRequest(documents, question, "cacheblend", 1.0, SHORT))
        assert first.stats.reused_tokens == 0  # cold: every chunk missed, then was written back
        store.flush()

    with open_store(tmp_path) as store:  # a fresh RAM tier: every hit below comes from the SSD files
        assert store.recover() > 0
        engine = TorchEngine.from_checkpoint(checkpoint, store=KVPlaneChunkStore(store, checkpoint.fingerprint))
        again = engine.generate(BlendRequest(documents[::-1], question, "cacheblend", 1.0, SHORT))
        reference = engine.generate(BlendRequest(documents[::-1], question, "full_prefill", 1.0, SHORT))
        assert again.stats.reused_tokens == again.stats.context_tokens
        assert set(again.stats.reused_tokens_by_tier) == {"ssd"}  # the RAM tier started empty
        assert again.token_ids == reference.token_ids

        other_model = TorchEngine.from_checkpoint(checkpoint, store=KVPlaneChunkStore(store, "another-fingerprint"))
        cold = other_model.generate(BlendRequest(documents, question, "full_reuse", 0.0, SHORT))
        assert cold.stats.reused_tokens == 0


@pytest.mark.slow  # tenants stay apart end to end by default in tests/cluster/test_serving.py
def test_tenants_do_not_share_chunks(checkpoint: Checkpoint, tmp_path: Path, qa_records: list[dict]) -> None:
    documents, question = qa_records[1]["documents"], qa_records[1]["question"]
    with open_store(tmp_path) as store:
        engine = TorchEngine.from_checkpoint(checkpoint, store=KVPlaneChunkStore(store, checkpoint.fingerprint))
        engine.generate(BlendRequest(documents, question, "full_reuse", 0.0, SHORT, namespace="acme"))
        same = engine.generate(BlendRequest(documents, question, "full_reuse", 0.0, SHORT, namespace="acme"))
        other = engine.generate(BlendRequest(documents, question, "full_reuse", 0.0, SHORT, namespace="globex"))
        assert same.stats.reused_tokens_by_tier == {"ram": same.stats.context_tokens}
        assert other.stats.reused_tokens == 0
