"""The planner's curves, measured at worker start on the worker's own engine: plain prefill and blending, by size."""
import logging
import statistics
from collections.abc import Sequence

from workers.engines.base import PLAIN_MODE, BlendRequest, Engine
from workers.generation.sampling import SamplingParams
from workers.loading.request_plan import PrefillCosts, PrefillCurve

CALIBRATION_NAMESPACE = "blendserve-calibration"
DEFAULT_CONTEXT_TOKENS = (128, 512, 1024, 2048)
DOCUMENT_TOKENS = 256  # about the size of a retrieved passage
SENTENCE_TOKENS = 22  # a sentence below, measured with SmolLM2's and Gemma 3's tokenizers (one token a digit)
_QUESTION = "Which species did the survey record most often?"

_log = logging.getLogger(__name__)


def synthetic_documents(num_tokens: int, tokens_per_document: int = DOCUMENT_TOKENS) -> list[str]:
    """Distinct passages of about `tokens_per_document` tokens and one shorter for the rest: about `num_tokens`."""
    sizes = [tokens_per_document] * (num_tokens // tokens_per_document)
    if num_tokens % tokens_per_document >= SENTENCE_TOKENS or not sizes:
        sizes.append(num_tokens % tokens_per_document)
    return [
        " ".join(
            f"Survey {doc}.{line} counted {7 * doc + 3 * line} mosses and {11 * line + doc} lichens on the ridge."
            for line in range(max(1, size // SENTENCE_TOKENS))
        )
        for doc, size in enumerate(sizes)
    ]


def time_to_first_token_s(engine: Engine, request: BlendRequest) -> tuple[int, float]:
    """The request's prompt tokens and its TTFT as the engine measures it (one token generated)."""
    generation = engine.open(request)
    for _ in generation:  # the one token; finishing the generation also runs its write-back
        pass
    return generation.stats.num_prompt_tokens, generation.stats.ttft_s


def calibrate_planner(
    engine: Engine,
    mode: str,
    recompute_ratio: float,
    context_tokens: Sequence[int] = DEFAULT_CONTEXT_TOKENS,
    repeats: int = 1,
) -> PrefillCosts:
    """Time plain and blended requests (every chunk cached) at each size, the median of `repeats` each.

    One untimed request first: an engine's first request pays for its warm-up.
    """
    if engine.planner is not None:
        raise ValueError("calibrate with the planner off: every request must run as asked")
    limit = engine.limits.max_context_tokens - 2 * DOCUMENT_TOKENS  # room for the template, question and answer
    sizes = sorted({min(size, limit) for size in context_tokens})
    if len(sizes) < 3:
        raise ValueError(f"need 3 distinct sizes under the context of {engine.limits.max_context_tokens}, got {sizes}")
    samples: dict[str, list[tuple[int, float]]] = {PLAIN_MODE: [], mode: []}
    sampling = SamplingParams(max_new_tokens=1)
    for index, size in enumerate(sizes):
        documents = synthetic_documents(size)
        engine.store_documents(documents, CALIBRATION_NAMESPACE)
        for run_mode, found in samples.items():
            request = BlendRequest(documents, _QUESTION, run_mode, recompute_ratio, sampling, CALIBRATION_NAMESPACE)
            if index == 0 and not found:
                time_to_first_token_s(engine, request)
            timed = [time_to_first_token_s(engine, request) for _ in range(repeats)]
            found.append((timed[0][0], statistics.median(seconds for _, seconds in timed)))
    costs = PrefillCosts(mode, recompute_ratio, PrefillCurve.fit(samples[PLAIN_MODE]), PrefillCurve.fit(samples[mode]))
    _log.info("blendserve: planner calibrated (prompt tokens, seconds): plain %s, %s %s", samples[PLAIN_MODE], mode,
              samples[mode])
    return costs
