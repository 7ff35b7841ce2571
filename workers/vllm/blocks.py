"""Block arithmetic of vLLM's paged KV cache: whole-block hits and token slots."""
import torch


def whole_block_tokens(context_tokens: int, prompt_tokens: int, block_size: int) -> int:
    """Context tokens that can be reported computed: whole blocks only, and never the prompt's last token.

    vLLM must still run at least one prompt token to produce logits, and a partial last block is left to
    vLLM's own prefill, so only blocks fully inside the context (and before the last token) count.
    """
    if block_size <= 0:
        raise ValueError(f"block_size must be positive, got {block_size}")
    usable = min(context_tokens, prompt_tokens - 1)
    return max(usable, 0) // block_size * block_size


def slot_mapping(block_ids: list[int], start: int, end: int, block_size: int) -> torch.Tensor:
    """Flat cache slots (block_id * block_size + offset) of token positions [start, end). # -> [end - start]"""
    if not 0 <= start <= end or end > len(block_ids) * block_size:
        raise ValueError(f"positions [{start}, {end}) do not fit {len(block_ids)} blocks of {block_size}")
    positions = torch.arange(start, end)
    blocks = torch.tensor(block_ids, dtype=torch.long)[positions // block_size]
    return blocks * block_size + positions % block_size
