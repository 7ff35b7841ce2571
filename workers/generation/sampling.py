"""Next-token choice: greedy, or temperature and top-p sampling."""
from dataclasses import dataclass

import torch

from kvplane.checks import check, check_count, check_non_negative


@dataclass(frozen=True, slots=True)
class SamplingParams:
    """How many tokens to generate and how to pick each."""

    max_new_tokens: int = 32
    temperature: float = 0.0
    top_p: float = 1.0
    stop_token_ids: tuple[int, ...] = ()
    seed: int | None = None

    def __post_init__(self) -> None:
        check_count("max_new_tokens", self.max_new_tokens, 1)
        check_non_negative("temperature", self.temperature)
        check(0.0 < self.top_p <= 1.0, "top_p", "in (0, 1]", self.top_p)


def until_stop(token_ids: list[int], stop_token_ids: tuple[int, ...]) -> list[int]:
    """The generated ids before the first stop token: the answer a client is shown."""
    stops = set(stop_token_ids)
    return next((token_ids[:i] for i, token_id in enumerate(token_ids) if token_id in stops), token_ids)


def next_token(logits: torch.Tensor, params: SamplingParams, generator: torch.Generator | None) -> int:
    """Pick one token id from float32 logits. # [V] -> int"""
    logits = logits.cpu()  # the generator is a CPU one, wherever the model runs
    if params.temperature == 0.0:
        return int(logits.argmax())
    probs = (logits / params.temperature).softmax(dim=-1)
    if params.top_p < 1.0:
        sorted_probs, order = probs.sort(descending=True)
        outside = sorted_probs.cumsum(-1) - sorted_probs >= params.top_p  # keep the smallest set reaching top_p
        probs = torch.zeros_like(probs).scatter(0, order, sorted_probs.masked_fill(outside, 0.0))
    return int(torch.multinomial(probs, 1, generator=generator))
