"""The layer pipeline: pipelined output equals non-pipelined output exactly, and loading hides behind recompute."""
import statistics
import time
from collections.abc import Iterator

import pytest
import torch

from kvplane.store import TieredStore
from kvplane.tiers.memory import MemoryTier
from workers.chunks.kvplane_store import KVPlaneChunkStore
from workers.chunks.store import LocalChunkStore
from workers.engines.base import BlendRequest
from workers.engines.torch_engine import TorchEngine
from workers.fusion.layer_feed import EagerLoader, PipelinedLoader
from workers.generation.prompt import PromptLayout
from workers.generation.sampling import SamplingParams
from workers.model.checkpoint import Checkpoint
from workers.model.kv_cache import KVCache

SHORT = SamplingParams(max_new_tokens=4)


class SlowTier(MemoryTier):
    """RAM that sleeps `delay_s` before each layer-sized read (header probes stay fast), like a remote tier."""

    def __init__(self, name: str, capacity_bytes: int) -> None:
        super().__init__(name, capacity_bytes)
        self.delay_s = 0.0

    def read(self, key: str, start: int = 0, end: int | None = None) -> torch.Tensor | None:
        if end is not None and end - start > 32 << 10:
            time.sleep(self.delay_s)
        return super().read(key, start, end)


# full_reuse, epic and cachecraft run the same layer loop as cacheblend; they are in the slow run (make test's budget).
MODES = [("cacheblend", 0.15), pytest.param("full_reuse", 0.0, marks=pytest.mark.slow),
         pytest.param("epic", 0.15, marks=pytest.mark.slow),
         pytest.param("cachecraft", 0.15, marks=pytest.mark.slow),
         pytest.param("query_driven", 0.15, marks=pytest.mark.slow)]  # cacheblend covers the scored path by default


@pytest.mark.parametrize("mode,ratio", MODES)
def test_pipelined_equals_non_pipelined_exactly(checkpoint: Checkpoint, qa_records: list[dict], mode: str,
                                               ratio: float) -> None:
    store = LocalChunkStore()
    engines = {name: TorchEngine.from_checkpoint(checkpoint, store=store, loader=loader)
               for name, loader in (("eager", EagerLoader()), ("pipelined", PipelinedLoader(depth=1)))}
    record = qa_records[0]
    documents = [record["documents"][2], record["documents"][0], record["documents"][1]]
    engines["eager"].fuser.precompute(engines["eager"].fuser.layout(documents, record["question"]))
    # a first use stores the chunks' impacts (cachecraft): both engines then start from the same store
    engines["eager"].fuser.fuse(engines["eager"].fuser.layout(documents, record["question"]), mode, ratio)
    caches, results = {}, {}
    for name, engine in engines.items():
        prompt = engine.fuser.layout(documents, record["question"])
        fused = engine.fuser.fuse(prompt, mode, ratio)
        caches[name] = fused.cache
        assert len(fused.layout.cached_segments()) == 4  # the prompt prefix and the three chunks
        results[name] = engine.generate(BlendRequest(documents, record["question"], mode, ratio, SHORT))
    assert torch.equal(caches["pipelined"].data, caches["eager"].data)  # bit for bit, every layer and slot
    assert results["pipelined"].token_ids == results["eager"].token_ids
    assert torch.equal(results["pipelined"].stats.first_token_logprobs, results["eager"].stats.first_token_logprobs)


def test_a_failed_fetch_reaches_the_request(checkpoint: Checkpoint, qa_records: list[dict]) -> None:
    class BrokenStore(LocalChunkStore):
        def read_layers(self, *args: object, **kwargs: object) -> object:
            found = super().read_layers(*args, **kwargs)
            if found is not None:
                found.layers = iter([next(found.layers)])  # one layer, then the stream ends
            return found

    engine = TorchEngine.from_checkpoint(checkpoint, store=BrokenStore(), loader=PipelinedLoader())
    record = qa_records[1]
    engine.fuser.precompute(engine.fuser.layout(record["documents"], record["question"]))
    with pytest.raises(StopIteration):
        engine.fuser.fuse(engine.fuser.layout(record["documents"], record["question"]), "cacheblend", 0.15)


def _fuse_s(engine: TorchEngine, prompt: PromptLayout) -> float:
    began = time.perf_counter()
    engine.fuser.fuse(prompt, "cacheblend", 0.15)
    return time.perf_counter() - began


def _load_s(store: TieredStore, keys: list[str]) -> float:
    """Seconds to read every layer of every chunk, chunk by chunk (what the loader does, without compute)."""
    began = time.perf_counter()
    for key in keys:
        stream = store.read_layers(key)
        assert stream is not None
        list(stream)
    return time.perf_counter() - began


@pytest.fixture
def one_thread() -> Iterator[None]:
    """One intra-op thread: two OpenMP threads stall at every barrier on a 2-core machine shared with other jobs."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.mark.usefixtures("one_thread")
@pytest.mark.slow  # the default run keeps make test within 15 minutes
def test_with_a_slow_tier_ttft_is_near_max_of_load_and_compute(checkpoint: Checkpoint, qa_records: list[dict]) -> None:
    tier = SlowTier("remote", 1 << 30)
    with TieredStore([tier], ["lru"]) as kvstore:
        store = KVPlaneChunkStore(kvstore, checkpoint.fingerprint)
        pipelined = TorchEngine.from_checkpoint(checkpoint, store=store, loader=PipelinedLoader())
        eager = TorchEngine.from_checkpoint(checkpoint, store=store, loader=EagerLoader())
        record = qa_records[2]
        prompt = pipelined.fuser.layout(record["documents"], record["question"])
        stored = pipelined.store_documents(record["documents"])
        pipelined.fuser.precompute(prompt)
        keys = [chunk.key for chunk in stored] + [store.key(prompt.prefix_ids, [])]
        _fuse_s(pipelined, prompt)  # warm-up
        compute_s = statistics.median(_fuse_s(pipelined, prompt) for _ in range(3))  # loads take ~nothing here
        fetches = len(keys) * checkpoint.config.num_layers
        tier.delay_s = compute_s / fetches  # loading alone now takes about as long as the compute
        load_s = statistics.median(_load_s(kvstore, keys) for _ in range(3))
        pipelined_s = statistics.median(_fuse_s(pipelined, prompt) for _ in range(3))
        eager_s = statistics.median(_fuse_s(eager, prompt) for _ in range(3))
    assert eager_s > 0.85 * (load_s + compute_s)  # no pipeline: the sum
    assert pipelined_s < 0.8 * (load_s + compute_s)
    assert pipelined_s < 1.3 * max(load_s, compute_s), (pipelined_s, load_s, compute_s)


@pytest.mark.slow  # make test's budget; the pipelined equality above runs in the default run
def test_fusing_into_a_reused_dirty_cache_equals_a_fresh_one(checkpoint: Checkpoint, qa_records: list[dict]) -> None:
    # The vLLM engine hands fusion the previous request's buffer (workers/vllm/kv_buffer.py): whatever it held
    # must not leak into the new request's KV.
    engine = TorchEngine.from_checkpoint(checkpoint)
    record = qa_records[0]
    documents = [record["documents"][1], record["documents"][0]]
    prompt = engine.fuser.layout(documents, record["question"])
    engine.fuser.precompute(prompt)
    fresh = engine.fuser.fuse(prompt, "cacheblend", 0.15).cache
    storage = torch.full((*fresh.data.shape[:2], fresh.capacity + 7, *fresh.data.shape[3:]), float("nan"),
                         dtype=fresh.data.dtype)
    reused = KVCache(checkpoint.config, fresh.capacity, fresh.data.dtype, storage=storage)
    filled = engine.fuser.fuse(prompt, "cacheblend", 0.15, cache=reused).cache
    assert filled is reused and filled.data.data_ptr() == storage.data_ptr()
    assert torch.equal(filled.data, fresh.data)
    with pytest.raises(ValueError, match="cannot hold"):
        small = KVCache(checkpoint.config, fresh.capacity - 1, fresh.data.dtype)
        engine.fuser.fuse(prompt, "cacheblend", 0.15, cache=small)
