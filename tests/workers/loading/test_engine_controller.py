"""The engine under a loading controller: its plan's ratio and per-chunk tier or recompute are what runs."""
import pytest
import torch

from kvplane.tiers.latency import LoadQuantiles, LoadTelemetry
from workers.chunks.kv import ChunkKV
from workers.chunks.store import DEFAULT_NAMESPACE, LOCAL_TIER, LocalChunkStore
from workers.engines.base import BlendRequest, BlendResult
from workers.engines.torch_engine import TorchEngine
from workers.generation.sampling import SamplingParams
from workers.loading.controller import DEFAULT_PRIOR, LoadingController
from workers.loading.delay_model import RecomputeDelayModel
from workers.loading.plan import ControllerOptions
from workers.model.checkpoint import Checkpoint

SHORT = SamplingParams(max_new_tokens=4)
DELAYS = RecomputeDelayModel(num_layers=30, fixed_s=1e-4, per_token_s=1e-5, per_pair_s=1e-8)
FREE = LoadQuantiles(1e-7, 1e-7, 1e-7)
GLACIAL = LoadQuantiles(5.0, 10.0, 20.0)


class CountingStore(LocalChunkStore):
    """Counts writes."""

    def __init__(self) -> None:
        super().__init__()
        self.puts = 0

    def put(self, chunk: ChunkKV, context_ids: list[int], namespace: str = DEFAULT_NAMESPACE) -> None:
        self.puts += 1
        super().put(chunk, context_ids, namespace)


def controlled(checkpoint: Checkpoint, local: LoadQuantiles) -> TorchEngine:
    """An engine whose controller prices the local store's fetches at `local` (a prior: nothing observed yet)."""
    telemetry = LoadTelemetry({LOCAL_TIER: local}, DEFAULT_PRIOR, min_observations=10**9)
    controller = LoadingController(DELAYS, telemetry, ControllerOptions())
    return TorchEngine.from_checkpoint(checkpoint, store=CountingStore(), controller=controller)


def ask(engine: TorchEngine, record: dict, mode: str = "cacheblend", ratio: float | None = None) -> BlendResult:
    return engine.generate(BlendRequest(record["documents"], record["question"], mode, ratio, SHORT))


def test_fast_loads_run_at_the_floor_and_match_the_uncontrolled_engine(checkpoint: Checkpoint,
                                                                       qa_records: list[dict]) -> None:
    engine, plain = controlled(checkpoint, FREE), TorchEngine.from_checkpoint(checkpoint)
    record = qa_records[0]
    for each in (engine, plain):
        each.fuser.precompute(each.fuser.layout(record["documents"], record["question"]))
    result, reference = ask(engine, record), ask(plain, record)
    assert engine.fuser.controller.last_plan.recompute_ratio == result.stats.recompute_ratio == 0.15
    assert not engine.fuser.controller.last_plan.recomputed
    assert result.stats.reused_tokens == result.stats.context_tokens
    assert result.token_ids == reference.token_ids
    assert torch.equal(result.stats.first_token_logprobs, reference.stats.first_token_logprobs)
    # Every layer-chunk fetch was timed for the sketches: 30 layers x (prefix + 3 chunks).
    assert engine.fuser.controller.telemetry.tier(LOCAL_TIER).num_observations == 30 * 4


@pytest.mark.slow  # the engine path is covered by the first test; these vary the plan
def test_a_request_ratio_above_the_floor_is_kept(checkpoint: Checkpoint, qa_records: list[dict]) -> None:
    engine = controlled(checkpoint, FREE)
    record = qa_records[2]
    engine.fuser.precompute(engine.fuser.layout(record["documents"], record["question"]))
    assert ask(engine, record, ratio=0.5).stats.recompute_ratio == pytest.approx(0.5)
    assert ask(engine, record, ratio=0.05).stats.recompute_ratio == 0.15  # never below r*


@pytest.mark.slow  # the engine path is covered by the first test; these vary the plan
def test_hopeless_loads_recompute_from_scratch_without_writing_back(checkpoint: Checkpoint,
                                                                    qa_records: list[dict]) -> None:
    engine = controlled(checkpoint, GLACIAL)
    record = qa_records[1]
    engine.fuser.precompute(engine.fuser.layout(record["documents"], record["question"]))
    assert engine.fuser.store.puts == 4
    result = ask(engine, record)
    reference = ask(engine, record, "full_prefill")
    assert len(engine.fuser.controller.last_plan.recomputed) == 4  # the prefix and every chunk
    assert result.stats.reused_tokens == 0
    assert result.token_ids == reference.token_ids
    assert engine.fuser.store.puts == 4  # nothing was written back: the chunks were held all along
