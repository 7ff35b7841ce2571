"""Cache-Craft's chunk context impact counts attention to other chunks only (pure function)."""
import torch

from workers.fusion.cachecraft import chunk_context_impact
from workers.fusion.layout import CHUNK, Segment


def _keys(prefix: float, first: float, second: float) -> torch.Tensor:
    """Keys along one direction: 4 prefix tokens, then two chunks of 4 tokens. # [12, 1, 2]"""
    scale = torch.tensor([prefix] * 4 + [first] * 4 + [second] * 4)
    return torch.stack([scale, torch.zeros(12)], dim=1)[:, None, :]


CHUNKS = [Segment(4, 8, CHUNK), Segment(8, 12, CHUNK)]
QUERIES = torch.tensor([[1.0, 0.0]]).expand(12, 2)[:, None, :]  # [12, 1, 2]: every query looks along that direction


def test_the_prompt_prefix_is_not_inter_chunk_context() -> None:
    # Every query attends mostly to the prefix (the attention sink); the second chunk barely to the first.
    impact = chunk_context_impact(QUERIES, _keys(prefix=6.0, first=-20.0, second=0.0), CHUNKS, num_queries=4)
    assert impact[0] == 0.0  # nothing but the prefix before it: its cached KV (computed after the prefix) is exact
    assert impact[1] < 0.01  # the prefix's attention counted as inter would make this ~1


def test_attention_to_an_earlier_chunk_is_inter() -> None:
    impact = chunk_context_impact(QUERIES, _keys(prefix=6.0, first=0.0, second=0.0), CHUNKS, num_queries=4)
    assert impact[0] == 0.0
    # equal keys: a query of the second chunk at offset i sees 4 earlier-chunk keys and i + 1 of its own
    expected = sum(4 / (4 + i + 1) for i in range(4)) / 4
    assert torch.isclose(impact[1], torch.tensor(expected), atol=1e-5)
