"""A vLLM-style automatic prefix cache: KV of earlier prompts in fixed-size blocks keyed by chained hashes."""
from collections import OrderedDict

import torch
import xxhash


def block_hashes(token_ids: list[int], block_tokens: int) -> list[bytes]:
    """Hash of every full block, each chained to all blocks before it (so equal hash = equal prefix)."""
    hashes, previous = [], b""
    for start in range(0, len(token_ids) - block_tokens + 1, block_tokens):
        block = token_ids[start : start + block_tokens]
        previous = xxhash.xxh3_128_digest(previous + b"".join(t.to_bytes(4, "little") for t in block))
        hashes.append(previous)
    return hashes


class PrefixBlockCache:
    """LRU store of prefix blocks. # each block: [L, 2, block_tokens, H_kv, D]"""

    def __init__(self, block_tokens: int, capacity_blocks: int) -> None:
        self.block_tokens = block_tokens
        self.capacity_blocks = capacity_blocks
        self.blocks: OrderedDict[bytes, torch.Tensor] = OrderedDict()

    def match(self, hashes: list[bytes]) -> list[torch.Tensor]:
        """The cached blocks of the longest cached run of these chained block hashes, in order."""
        found = []
        for h in hashes:
            block = self.blocks.get(h)
            if block is None:
                break
            self.blocks.move_to_end(h)
            found.append(block)
        return found

    def insert(self, hashes: list[bytes], kv: torch.Tensor) -> None:
        """Remember a computed sequence's full blocks, given their hashes. kv: [L, 2, N, H_kv, D]"""
        for i, h in enumerate(hashes):
            if h in self.blocks:
                self.blocks.move_to_end(h)
                continue
            start = i * self.block_tokens
            self.blocks[h] = kv[:, :, start : start + self.block_tokens].clone()
            if len(self.blocks) > self.capacity_blocks:
                self.blocks.popitem(last=False)
