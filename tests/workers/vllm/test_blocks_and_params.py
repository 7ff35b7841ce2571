"""Block arithmetic, the request message and the KV handoff (plain torch; run in every virtualenv)."""
import pytest
import torch

from workers.vllm import handoff
from workers.vllm.blocks import injectable_tokens, slot_mapping, written_range
from workers.vllm.paged_attention import query_runs
from workers.vllm.params import PARAMS_KEY, ContextKVParams


@pytest.mark.parametrize(
    ("context", "prompt", "expected"),
    [(0, 10, 0), (127, 200, 127), (300, 400, 300), (256, 256, 255), (256, 257, 256), (1000, 3, 2), (5, 0, 0)],
)
def test_the_context_is_injected_but_never_the_last_prompt_token(context: int, prompt: int, expected: int) -> None:
    assert injectable_tokens(context, prompt) == expected


def test_query_runs_are_the_consecutive_positions() -> None:
    starts, seq_lens = query_runs(torch.tensor([0, 1, 2, 5, 7, 8, 10]))
    assert starts.tolist() == [0, 3, 4, 6, 7]  # offsets of each run into the queries, then the total
    assert seq_lens.tolist() == [3, 6, 9, 11]  # each run is a sequence ending at its last position
    assert [t.tolist() for t in query_runs(torch.tensor([4]))] == [[0, 1], [5]]


def test_slot_mapping_follows_the_block_table() -> None:
    slots = slot_mapping([7, 2, 9], 3, 9, 4)
    assert slots.tolist() == [7 * 4 + 3, 2 * 4 + 0, 2 * 4 + 1, 2 * 4 + 2, 2 * 4 + 3, 9 * 4 + 0]
    with pytest.raises(ValueError):
        slot_mapping([1], 0, 5, 4)


@pytest.mark.parametrize(
    ("start", "end", "skipped", "expected"),
    [(0, 1000, 0, (0, 1000)), (0, 1000, 3, (384, 1000)), (500, 1000, 3, (500, 1000)), (0, 300, 3, (300, 300))],
)
def test_only_positions_with_real_blocks_are_written(
    start: int, end: int, skipped: int, expected: tuple[int, int]
) -> None:
    """A sliding-window group's first `skipped` blocks are vLLM's null block: nothing is written there."""
    assert written_range(start, end, skipped, 128) == expected


def test_params_round_trip_through_kv_transfer_params() -> None:
    params = ContextKVParams(300, key="abc")
    extra = params.as_extra_args()
    assert ContextKVParams.from_kv_transfer_params(extra["kv_transfer_params"]) == params
    assert ContextKVParams.from_kv_transfer_params(None) is None
    assert ContextKVParams.from_kv_transfer_params({"other": 1}) is None
    with pytest.raises(ValueError):
        ContextKVParams(3)
    with pytest.raises(ValueError):
        ContextKVParams(3, key="a", path="/x")
    assert PARAMS_KEY in extra["kv_transfer_params"]


def test_registry_and_file_handoff_return_the_same_tensor(tmp_path) -> None:
    kv = torch.randn(2, 2, 5, 3, 4).to(torch.bfloat16)
    key = handoff.put_kv(kv)
    in_process = ContextKVParams(5, key=key)
    assert in_process.is_available() and torch.equal(in_process.resolve(), kv)
    handoff.drop_kv(key)
    assert not in_process.is_available()
    on_disk = ContextKVParams(5, path=str(handoff.save_kv_file(kv, tmp_path / "kv.safetensors")))
    assert on_disk.is_available() and torch.equal(on_disk.resolve(), kv)
    with pytest.raises(ValueError):
        handoff.put_kv(torch.zeros(2, 3, 4))
