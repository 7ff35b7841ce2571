"""Token arithmetic of vLLM's paged KV cache: how much context is injected, and its slots."""
import torch


def injectable_tokens(context_tokens: int, prompt_tokens: int) -> int:
    """Context tokens the connector reports computed: the whole context, but never the prompt's last token.

    vLLM must still run at least one prompt token to produce logits. The context may end inside a block:
    vLLM's scheduler takes an unaligned external hit and prefills the rest of that block from the question on.
    """
    return max(min(context_tokens, prompt_tokens - 1), 0)


def slot_mapping(block_ids: list[int], start: int, end: int, block_size: int) -> torch.Tensor:
    """Flat cache slots (block_id * block_size + offset) of token positions [start, end). # -> [end - start]"""
    if not 0 <= start <= end or end > len(block_ids) * block_size:
        raise ValueError(f"positions [{start}, {end}) do not fit {len(block_ids)} blocks of {block_size}")
    positions = torch.arange(start, end)
    blocks = torch.tensor(block_ids, dtype=torch.long)[positions // block_size]
    return blocks * block_size + positions % block_size


def written_range(start: int, end: int, num_skipped_blocks: int, block_size: int) -> tuple[int, int]:
    """The part of positions [start, end) that has real blocks: past the skipped (null) ones. -> [first, end)"""
    first = min(max(start, num_skipped_blocks * block_size), end)
    return first, end
