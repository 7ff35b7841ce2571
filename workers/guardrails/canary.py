"""The correctness gate a worker runs at start: a canary prompt fused vs full prefill on the loaded model."""
import logging
from dataclasses import dataclass

import torch

from workers.chunks.store import LocalChunkStore
from workers.fuser import Fuser
from workers.generation.divergence import first_token_kl

_log = logging.getLogger(__name__)

# Three short, unrelated passages and a question that needs the last two: the fused chunks sit at
# offsets far from where their KV was computed, so a wrong key re-rotation shows at once.
CANARY_DOCUMENTS = (
    "The Danube is Europe's second-longest river. It rises in the Black Forest in Germany and flows "
    "for about 2,850 kilometres through ten countries, among them Austria, Hungary, Serbia and Romania, "
    "before it empties into the Black Sea through a wide delta that is home to hundreds of bird species.",
    "Marie Curie was born in Warsaw in 1867 and moved to Paris to study physics and mathematics at the "
    "Sorbonne. With her husband Pierre she discovered the elements polonium and radium, and she became "
    "the first person to win Nobel Prizes in two different sciences, physics in 1903 and chemistry in 1911.",
    "The city of Warsaw is the capital of Poland and lies on the Vistula river. Its old town was almost "
    "entirely destroyed during the Second World War and was rebuilt in the following decades from "
    "paintings and drawings, a reconstruction that is now listed as a UNESCO World Heritage Site.",
)
CANARY_QUESTION = "On which river lies the city where Marie Curie was born?"
# Relative KV deviation of the fused canary from full prefill above which blending is refused. Measured on
# SmolLM2-135M (fp32 and bf16): 0.0066 with correct re-rotation; keys left unrotated 0.11, rotated the
# wrong way 0.12, off by one position 0.027. (The first-token KL barely moves: 0.013 vs 0.023.)
DEFAULT_MAX_DEVIATION = 0.02


@dataclass(frozen=True, slots=True)
class CanaryReport:
    """How far the fused canary is from full prefill (its context KV, its first token), and whether that passes."""

    mode: str
    recompute_ratio: float
    kv_deviation: float  # ||KV_fused - KV_full||^2 / ||KV_full||^2 over the context, averaged over layers, K and V
    first_token_kl: float
    top1_agrees: bool
    max_deviation: float

    def __post_init__(self) -> None:
        if min(self.kv_deviation, self.first_token_kl, self.max_deviation) < 0:
            raise ValueError("kv_deviation, first_token_kl and max_deviation must be >= 0")

    @property
    def passed(self) -> bool:
        """Whether the deviation is within the threshold."""
        return self.kv_deviation <= self.max_deviation


@torch.inference_mode()
def measure_canary(fuser: Fuser, mode: str = "cacheblend", recompute_ratio: float | None = None,
                   max_deviation: float = DEFAULT_MAX_DEVIATION) -> CanaryReport:
    """Fuse the canary with `mode` exactly as `fuser` would (runner, loader, template, options) and compare."""
    # A private store, so the canary's chunks never reach the serving store.
    probe = Fuser(
        fuser.runner,
        fuser.options,
        store=LocalChunkStore(),
        template=fuser.template,
        chunk_context=fuser.chunk_context,
        loader=fuser.loader,
    )
    recompute_ratio = fuser.options.recompute_ratio if recompute_ratio is None else recompute_ratio
    prompt = probe.layout(list(CANARY_DOCUMENTS), CANARY_QUESTION)
    probe.precompute(prompt)
    full = probe.fuse(prompt, "full_prefill", 1.0)
    fused = probe.fuse(prompt, mode, recompute_ratio)
    context = fused.layout.num_context_tokens
    reference = probe.runner.logits(full.prefill.last_hidden[None])[0].log_softmax(-1)
    blended = probe.runner.logits(fused.prefill.last_hidden[None])[0].log_softmax(-1)
    return CanaryReport(
        mode,
        recompute_ratio,
        kv_deviation(fused.cache.data[:, :, :context], full.cache.data[:, :, :context]),
        first_token_kl(reference, blended),
        bool(reference.argmax() == blended.argmax()),
        max_deviation,
    )


def kv_deviation(kv: torch.Tensor, reference: torch.Tensor) -> float:
    """Relative squared error of KV against a reference, per layer and K/V, averaged. # [L, 2, N, H_kv, D] x2"""
    error = (kv.float() - reference.float()).pow(2).sum(dim=(2, 3, 4))
    return float((error / reference.float().pow(2).sum(dim=(2, 3, 4)).clamp_min(1e-12)).mean())


def canary_verdict(fuser: Fuser, mode: str = "cacheblend", max_deviation: float = DEFAULT_MAX_DEVIATION) -> str | None:
    """Run the canary (at worker start): None when it passes, else why blending must be refused (logged)."""
    report = measure_canary(fuser, mode, max_deviation=max_deviation)
    model = fuser.runner.checkpoint.fingerprint
    if report.passed:
        _log.info("blendserve: canary gate passed for model %s: %s KV deviation %.4f <= %.4f (first-token KL %.4f)",
                  model, mode, report.kv_deviation, max_deviation, report.first_token_kl)
        return None
    reason = (f"canary gate: {mode} at ratio {report.recompute_ratio:.2f} deviates from full prefill by relative KV "
              f"deviation {report.kv_deviation:.4f} > {max_deviation:.4f} (first-token KL {report.first_token_kl:.4f}) "
              f"on model {model}")
    _log.error("blendserve: blending refused, serving full prefill only: %s", reason)
    return reason
