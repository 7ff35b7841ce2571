"""Per request: blend from cached chunk KV or prefill plainly, whichever is predicted to reach the first token first."""
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from workers.loading.cost_fit import fit_nonnegative

BLEND_PLAN = "blend"
PLAIN_PLAN = "plain"


@dataclass(frozen=True, slots=True)
class PrefillCurve:
    """Seconds to the first token of an n-token prompt: fixed_s + per_token_s * n + per_pair_s * n^2."""

    fixed_s: float
    per_token_s: float
    per_pair_s: float

    def __post_init__(self) -> None:
        if min(self.fixed_s, self.per_token_s, self.per_pair_s) < 0:
            raise ValueError("fixed_s, per_token_s and per_pair_s must be >= 0")

    def predict_s(self, num_tokens: int) -> float:
        """Predicted seconds for a prompt of `num_tokens`."""
        return self.fixed_s + self.per_token_s * num_tokens + self.per_pair_s * num_tokens * num_tokens

    @classmethod
    def fit(cls, samples: Sequence[tuple[int, float]]) -> "PrefillCurve":
        """Fitted to (prompt tokens, seconds) samples, in relative error."""
        if any(num_tokens < 1 for num_tokens, _ in samples):
            raise ValueError("every sample needs a prompt of at least one token")
        tokens = np.array([float(num_tokens) for num_tokens, _ in samples])
        seconds = np.array([float(value) for _, value in samples])
        features = np.stack([np.ones_like(tokens), tokens, tokens * tokens], axis=1)
        fixed_s, per_token_s, per_pair_s = (float(value) for value in fit_nonnegative(features, seconds))
        return cls(fixed_s, per_token_s, per_pair_s)


@dataclass(frozen=True, slots=True)
class RequestPlan:
    """The plan a request runs under, its predicted TTFT, and the prediction for the plan not taken."""

    name: str
    predicted_ttft_s: float
    other_ttft_s: float
    warm_chunks: bool = False  # plain now, but with the missed chunks stored blending would be faster
    factor: float = 1.0  # the correction in predicted_ttft_s (measured over the curve's prediction so far)

    @property
    def curve_ttft_s(self) -> float:
        """The prediction of the curve alone, before the correction."""
        return self.predicted_ttft_s / self.factor


@dataclass(frozen=True, slots=True)
class PrefillCosts:
    """A worker's measured curves for one fusion mode and ratio: plain prefill, and blending with all chunks cached."""

    mode: str
    recompute_ratio: float
    plain: PrefillCurve
    blend: PrefillCurve

    def prices(self, mode: str, recompute_ratio: float) -> bool:
        """Whether these curves were measured for this mode and ratio (others are served as asked)."""
        return mode == self.mode and abs(recompute_ratio - self.recompute_ratio) < 1e-9

    def blend_s(self, num_tokens: int, missed_tokens: int) -> float:
        """Predicted TTFT blending a prompt of which `missed_tokens` have no cached KV."""
        # A missed chunk is computed in full by the pass: priced at plain prefill's mean cost per token.
        plain_per_token_s = self.plain.predict_s(num_tokens) / max(num_tokens, 1)
        return self.blend.predict_s(num_tokens) + plain_per_token_s * missed_tokens

    def choose(
        self, num_tokens: int, missed_tokens: int, blend_factor: float = 1.0, plain_factor: float = 1.0
    ) -> RequestPlan:
        """The faster plan, each curve scaled by its factor (measured over predicted); a tie blends (it also
        keeps the chunks' KV warm)."""
        blend_s = blend_factor * self.blend_s(num_tokens, missed_tokens)
        plain_s = plain_factor * self.plain.predict_s(num_tokens)
        if plain_s < blend_s:
            warm = missed_tokens > 0 and blend_factor * self.blend_s(num_tokens, 0) < plain_s
            return RequestPlan(PLAIN_PLAN, plain_s, blend_s, warm, plain_factor)
        return RequestPlan(BLEND_PLAN, blend_s, plain_s, factor=blend_factor)
