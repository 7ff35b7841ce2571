"""CompressedView: chunks read exact, or exactly as a tier under a compression hands them back."""
import pytest
import torch

from kvplane.codec import decode, encode
from kvplane.entry import KVEntry
from kvplane.keys import chunk_key
from workers.chunks.compressed_view import CompressedView
from workers.chunks.kv import ChunkKV


def _chunk(tokens: int = 40) -> ChunkKV:
    generator = torch.Generator().manual_seed(3)
    return ChunkKV(list(range(tokens)), torch.randn(4, 2, tokens, 3, 16, generator=generator))


def test_reads_are_exact_until_a_compression_is_served_then_what_the_codec_decodes() -> None:
    view, chunk = CompressedView(["int8", "int4"]), _chunk()
    view.put(chunk, [7])
    assert torch.equal(view.get(chunk.token_ids, [7]).kv, chunk.kv)
    for name in ("int8", "int4"):
        entry = KVEntry(chunk_key("fp", "ns", chunk.token_ids), chunk.kv, chunk.token_ids, "fp")
        from_codec = decode(encode(entry, compression_name=name), entry.key)[1]
        with view.serving(name):
            served = view.get(chunk.token_ids, [7]).kv
            assert torch.equal(torch.stack(list(view.read_layers(chunk.token_ids, [7]).layers)), served)
        assert torch.equal(served, from_codec) and not torch.equal(served, chunk.kv)
    assert torch.equal(view.get(chunk.token_ids, [7]).kv, chunk.kv)  # exact again after the block


def test_only_the_compressions_it_was_built_with_can_be_served() -> None:
    view = CompressedView(["int8"])
    with pytest.raises(ValueError, match="int4"):
        with view.serving("int4"):
            pass
    with pytest.raises(ValueError, match="unknown compression"):
        CompressedView(["zstd"])
