"""Block arithmetic, the request message and the KV handoff (plain torch; run in every virtualenv)."""
import pytest
import torch

from workers.vllm import handoff
from workers.vllm.blocks import slot_mapping, whole_block_tokens
from workers.vllm.params import PARAMS_KEY, ContextKVParams


@pytest.mark.parametrize(
    ("context", "prompt", "expected"),
    [(0, 10, 0), (127, 200, 0), (128, 200, 128), (300, 400, 256), (256, 256, 128), (256, 257, 256), (1000, 3, 0)],
)
def test_only_whole_blocks_before_the_last_prompt_token_count(context: int, prompt: int, expected: int) -> None:
    assert whole_block_tokens(context, prompt, 128) == expected


def test_slot_mapping_follows_the_block_table() -> None:
    slots = slot_mapping([7, 2, 9], 3, 9, 4)
    assert slots.tolist() == [7 * 4 + 3, 2 * 4 + 0, 2 * 4 + 1, 2 * 4 + 2, 2 * 4 + 3, 9 * 4 + 0]
    with pytest.raises(ValueError):
        slot_mapping([1], 0, 5, 4)


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
