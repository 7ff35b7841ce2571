"""The shared selective pass on the real model: the last layer's shortcut and cacheblend's check-layer schedules."""
import torch

from workers.chunks.kv import compute_chunk_kv
from workers.fusion.base import FusionOptions
from workers.fusion.cacheblend import CacheBlend
from workers.fusion.deviation import ratio_count
from workers.fusion.layout import BlendLayout
from workers.fusion.selective_pass import selective_prefill
from workers.generation.prompt import PromptLayout
from workers.model.checkpoint import Checkpoint
from workers.model.kv_cache import KVCache
from workers.model.runner import ModelRunner

CHUNKS = (
    "Marie Curie was born in Warsaw and later moved to Paris. ",
    "She won two Nobel prizes, in physics and chemistry. ",
)
QUESTION = "Where was Marie Curie born?"


class CountingRunner(ModelRunner):
    """The real runner, recording how many queries each layer's attention and MLP took."""

    def __init__(self, checkpoint: Checkpoint) -> None:
        super().__init__(checkpoint)
        self.queries_per_layer: list[int] = []

    def attend_and_mlp(
        self, layer: int, h: torch.Tensor, q: torch.Tensor, positions: torch.Tensor, cache: KVCache
    ) -> torch.Tensor:
        self.queries_per_layer.append(q.shape[0])
        return super().attend_and_mlp(layer, h, q, positions, cache)


def encode(checkpoint: Checkpoint, text: str) -> list[int]:
    return list(checkpoint.tokenizer(text, add_special_tokens=False).input_ids)


def test_last_layer_attends_only_for_the_last_token_and_matches_full_prefill(checkpoint: Checkpoint) -> None:
    runner = CountingRunner(checkpoint)
    ids = torch.tensor(encode(checkpoint, "".join(CHUNKS) + QUESTION))
    layout = BlendLayout(ids, [], len(ids))  # nothing cached: every token recomputed at every layer
    cache = runner.new_cache(len(ids))
    result = selective_prefill(runner, layout, cache, torch.arange(len(ids)))
    assert runner.queries_per_layer == [len(ids)] * (runner.config.num_layers - 1) + [1]
    reference_cache = runner.new_cache(len(ids))
    reference = runner.forward(ids, reference_cache, 0)
    torch.testing.assert_close(result.last_hidden, reference[-1], atol=1e-4, rtol=1e-4)
    torch.testing.assert_close(cache.data, reference_cache.data, atol=1e-4, rtol=1e-4)  # every layer's K/V written


def blended_work(checkpoint: Checkpoint, runner: ModelRunner, options: FusionOptions, ratio: float) -> tuple[int, int]:
    """Token-layers whose K/V cacheblend recomputed for two cached chunks + a question, and the chunks' size.

    The first chunk sits where its KV was computed (position 0, no prefix): exact, so never recomputed.
    """
    chunks = [encode(checkpoint, text) for text in CHUNKS]
    prompt = PromptLayout([], chunks, encode(checkpoint, QUESTION))
    layout = BlendLayout.build(prompt, [compute_chunk_kv(runner, ids) for ids in chunks], None)
    cache = runner.new_cache(layout.num_tokens)
    result = CacheBlend(options).prefill(runner, layout, cache, ratio)
    return result.recomputed_token_layers, sum(len(ids) for ids in chunks)


def test_one_check_layer_keeps_the_ratio_from_layer_one_on(checkpoint: Checkpoint, runner: ModelRunner) -> None:
    ratio, num_layers = 0.25, runner.config.num_layers
    single, num_chunk_tokens = blended_work(checkpoint, runner, FusionOptions(selection_span_tokens=1), ratio)
    gradual_options = FusionOptions(selection_span_tokens=1).with_gradual_filtering()
    gradual, _ = blended_work(checkpoint, runner, gradual_options, ratio)
    kept = ratio_count(ratio, num_chunk_tokens)  # the budget counts every reusable token, the exact ones too
    inexact = num_chunk_tokens - len(encode(checkpoint, CHUNKS[0]))
    # layer 0 and the check layer's K/V for every inexact chunk token, then the kept tokens at every later layer
    assert single == 2 * inexact + (num_layers - 2) * kept
    second = min(inexact, ratio_count(2 * ratio, num_chunk_tokens))  # twice the ratio, of the inexact tokens at most
    assert gradual == 2 * inexact + second + (num_layers - 3) * kept
