"""Recompute delay per layer as a function of context and selected tokens, fitted to timings of the real runner."""
import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np
import torch

from workers.loading.cost_fit import fit_nonnegative
from workers.model.runner import ModelRunner

MeasureFn = Callable[[int, int], float]
"""Seconds one layer takes to recompute `selected_tokens` (args: context_tokens, selected_tokens)."""

# (context tokens, selected tokens): short and long contexts, each at sparse, CacheBlend-like and full recompute.
DEFAULT_SHAPES: tuple[tuple[int, int], ...] = (
    (256, 32),
    (256, 256),
    (1024, 64),
    (1024, 160),
    (1024, 1024),
    (2048, 300),
    (2048, 600),
    (2048, 2048),
)


@dataclass(frozen=True, slots=True)
class RecomputeDelayModel:
    """Per-layer seconds = fixed_s + per_token_s * selected + per_pair_s * selected * context, over num_layers."""

    num_layers: int
    fixed_s: float = 0.0  # launch and bookkeeping per layer
    per_token_s: float = 0.0  # projections and MLP, per recomputed token
    per_pair_s: float = 0.0  # attention, per (recomputed token, context token) pair

    def __post_init__(self) -> None:
        if self.num_layers < 1:
            raise ValueError(f"num_layers must be >= 1, got {self.num_layers}")
        if min(self.fixed_s, self.per_token_s, self.per_pair_s) < 0:
            raise ValueError("fixed_s, per_token_s and per_pair_s must be >= 0")

    def predict_s(self, context_tokens: int, selected_tokens: int) -> float:
        """Seconds one layer takes to recompute `selected_tokens` attending over `context_tokens`."""
        if selected_tokens <= 0:
            return 0.0
        return self.fixed_s + self.per_token_s * selected_tokens + self.per_pair_s * selected_tokens * context_tokens

    def full_prefill_s(self, context_tokens: int) -> float:
        """Seconds to recompute every token at every layer (no reuse at all)."""
        return self.num_layers * self.predict_s(context_tokens, context_tokens)


def fit_delay_model(samples: Sequence[tuple[int, int, float]], num_layers: int) -> RecomputeDelayModel:
    """Non-negative least squares in relative error over (context, selected, seconds) samples."""
    if len(samples) < 3:
        raise ValueError(f"need at least 3 samples to fit 3 coefficients, got {len(samples)}")
    if any(seconds <= 0 or selected <= 0 or context < selected for context, selected, seconds in samples):
        raise ValueError("every sample needs seconds > 0 and 0 < selected <= context")
    data = np.array(samples, dtype=np.float64)
    context, selected, seconds = data[:, 0], data[:, 1], data[:, 2]
    features = np.stack([np.ones_like(selected), selected, selected * context], axis=1)
    fixed_s, per_token_s, per_pair_s = (float(value) for value in fit_nonnegative(features, seconds))
    return RecomputeDelayModel(num_layers, fixed_s, per_token_s, per_pair_s)


def calibrate(
    measure_fn: MeasureFn, shapes: Sequence[tuple[int, int]], num_layers: int, repeats: int = 3
) -> RecomputeDelayModel:
    """Fit the model to the median of `repeats` timings of each (context, selected) shape."""
    if repeats < 1:
        raise ValueError(f"repeats must be >= 1, got {repeats}")
    samples = [
        (context, selected, statistics.median(measure_fn(context, selected) for _ in range(repeats)))
        for context, selected in shapes
    ]
    return fit_delay_model(samples, num_layers)


def layer_timer(runner: ModelRunner, max_context_tokens: int, layer: int | None = None) -> MeasureFn:
    """A measure_fn timing one real layer step (Q/K/V, cache write, attention, MLP) of the runner."""
    config = runner.config
    layer = config.num_layers // 2 if layer is None else layer
    cache = runner.new_cache(max_context_tokens)
    cache.data.zero_()  # attention reads context never written here: finite values keep the timing honest
    cache.length = max_context_tokens
    device = runner.weights.embed.device
    generator = torch.Generator().manual_seed(0)

    @torch.inference_mode()
    def measure(context_tokens: int, selected_tokens: int) -> float:
        if not 0 < selected_tokens <= context_tokens <= max_context_tokens:
            raise ValueError(
                f"need 0 < selected <= context <= {max_context_tokens}, got {selected_tokens}, {context_tokens}"
            )
        positions = spread_positions(context_tokens, selected_tokens)
        h = torch.randn(selected_tokens, config.hidden_size, generator=generator).to(device, runner.dtype)
        _synchronize(device)
        began = time.perf_counter()
        q, k, v = runner.qkv(layer, h, positions)
        cache.write(layer, positions, k, v)
        runner.attend_and_mlp(layer, h, q, positions, cache)
        _synchronize(device)
        return time.perf_counter() - began

    return measure


def calibrate_runner(
    runner: ModelRunner, shapes: Sequence[tuple[int, int]] = DEFAULT_SHAPES, repeats: int = 3
) -> RecomputeDelayModel:
    """Time real layer steps of the runner on a few shapes (clipped to its context) and fit the delay model."""
    limit = runner.config.max_position_embeddings
    fitted = sorted({(min(context, limit), min(selected, context, limit)) for context, selected in shapes})
    measure = layer_timer(runner, max(context for context, _ in fitted))
    measure(*fitted[0])  # warm-up: first calls pay for allocator and kernel set-up
    return calibrate(measure, fitted, runner.config.num_layers, repeats)


def spread_positions(context_tokens: int, selected_tokens: int) -> torch.Tensor:
    """`selected_tokens` ascending positions spread over the context, the last one always included. # [S]"""
    offsets = torch.arange(selected_tokens) * context_tokens // selected_tokens
    return (context_tokens - 1 - offsets).flip(0)


def _synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)
