"""Run fusion modes side by side on the same records and summarise quality and TTFT."""
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass, field


from workers.engine_base import BlendRequest, BlendResult
from workers.torch_engine import TorchEngine
from workers.evaluation.dataset import QARecord
from workers.evaluation.divergence import first_token_kl
from workers.evaluation.scoring import best_f1, token_f1
from workers.sampling import SamplingParams

REFERENCE_MODE = "full_prefill"


@dataclass(frozen=True, slots=True)
class EvalRun:
    """One column of the comparison: a mode at a ratio, reported under `label`."""

    label: str
    mode: str
    ratio: float


@dataclass(slots=True)
class RunScores:
    """Per-record measurements of one run."""

    f1: list[float] = field(default_factory=list)
    agreement_f1: list[float] = field(default_factory=list)
    first_token_kl: list[float] = field(default_factory=list)
    ttft_s: list[float] = field(default_factory=list)
    context_tokens: list[int] = field(default_factory=list)
    recomputed_fraction: list[float] = field(default_factory=list)

    def summary(self) -> dict[str, float]:
        """Means (and the TTFT median) in the evaluation JSON's shape."""
        return {
            "f1": statistics.fmean(self.f1),
            "agreement_f1": statistics.fmean(self.agreement_f1),
            "first_token_kl": statistics.fmean(self.first_token_kl),
            "ttft_s_median": statistics.median(self.ttft_s),
            "ttft_s_mean": statistics.fmean(self.ttft_s),
            "context_tokens_mean": statistics.fmean(self.context_tokens),
            "recomputed_fraction": statistics.fmean(self.recomputed_fraction),
        }


def evaluate(
    engine: TorchEngine,
    records: list[QARecord],
    runs: list[EvalRun],
    max_new_tokens: int = 32,
    on_record: Callable[[int, float], None] | None = None,
) -> tuple[dict[str, dict[str, float]], float]:
    """Score every run on every record against gold answers and the full-prefill answer.

    Chunk KV is precomputed before any timed request. Returns per-label summaries and precompute seconds.
    """
    sampling = SamplingParams(max_new_tokens=max_new_tokens)
    scores = {run.label: RunScores() for run in runs}
    reference_run = EvalRun(REFERENCE_MODE, REFERENCE_MODE, 1.0)
    engine.generate(BlendRequest(["warm-up"], "warm-up?", REFERENCE_MODE, sampling=SamplingParams(max_new_tokens=2)))
    precompute_s = 0.0
    for index, record in enumerate(records):
        start_s = time.perf_counter()
        engine.fuser.precompute(engine.fuser.layout(record.documents, record.question))
        precompute_s += time.perf_counter() - start_s
        reference = _answer(engine, record, reference_run, sampling)
        for run in runs:
            result = reference if run.mode == REFERENCE_MODE else _answer(engine, record, run, sampling)
            s = scores[run.label]
            s.f1.append(best_f1(result.text, record.answers))
            s.agreement_f1.append(token_f1(result.text, reference.text))
            kl = first_token_kl(reference.stats.first_token_logprobs, result.stats.first_token_logprobs)
            s.first_token_kl.append(kl)
            s.ttft_s.append(result.stats.ttft_s)
            s.context_tokens.append(result.stats.context_tokens)
            s.recomputed_fraction.append(result.stats.recomputed_fraction)
        if on_record is not None:
            on_record(index, precompute_s)
    return {label: s.summary() for label, s in scores.items()}, precompute_s


def _answer(engine: TorchEngine, record: QARecord, run: EvalRun, sampling: SamplingParams) -> BlendResult:
    return engine.generate(BlendRequest(record.documents, record.question, run.mode, run.ratio, sampling))
