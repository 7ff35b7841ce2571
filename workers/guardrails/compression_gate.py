"""The compression gate: fused prompts reading compressed chunk KV against reading it exact, on the loaded model."""
import json
from dataclasses import asdict, dataclass

import torch

from workers.chunks.compressed_view import CompressedView
from workers.fuser import Fuser
from workers.generation.decode import greedy_answer
from workers.generation.divergence import teacher_forced_divergence
from workers.generation.teacher_forced import answer_logprobs
from workers.guardrails.canary import CANARY_DOCUMENTS

# The canary's passages asked three ways and in two orders: every chunk is read at an offset other than the
# one its KV was computed at, and the answers need facts from different chunks.
CALIBRATION: tuple[tuple[tuple[str, ...], str], ...] = (
    (CANARY_DOCUMENTS, "On which river lies the city where Marie Curie was born?"),
    (CANARY_DOCUMENTS[::-1], "Into which sea does Europe's second-longest river flow?"),
    (CANARY_DOCUMENTS[1:] + CANARY_DOCUMENTS[:1], "In which two sciences did Marie Curie win Nobel Prizes?"),
)
ANSWER_TOKENS = 8
# Teacher-forced KL a compression may add to the fused prompts' (nats): the store targets of int8 and 4-bit.
DEFAULT_MAX_KL_INCREASE = {"int8": 0.005, "int4": 0.02}


@dataclass(frozen=True, slots=True)
class CompressionVerdict:
    """What a compression costs one model's fused prompts, and whether that is within the bound."""

    fingerprint: str
    compression: str
    mode: str
    tf_kl_exact: float  # mean teacher-forced KL(full prefill || fused, chunk KV exact), nats
    tf_kl_compressed: float  # the same with chunk KV read compressed
    first_token_agreement: float  # share of prompts whose first token is the same either way
    max_kl_increase: float

    def __post_init__(self) -> None:
        if not 0.0 <= self.first_token_agreement <= 1.0 or self.max_kl_increase < 0:
            raise ValueError("first_token_agreement must be in [0, 1] and max_kl_increase >= 0")

    @property
    def kl_increase(self) -> float:
        """How much teacher-forced KL the compression adds."""
        return self.tf_kl_compressed - self.tf_kl_exact

    @property
    def passed(self) -> bool:
        """Whether the added KL is within the bound."""
        return self.kl_increase <= self.max_kl_increase

    def as_record(self) -> dict[str, object]:
        """The verdict as it is recorded in a book: its fields, the KL increase and whether it passed."""
        return {**asdict(self), "kl_increase": self.kl_increase, "passed": self.passed}

    def to_json(self) -> str:
        """The verdict as it is recorded."""
        return json.dumps(asdict(self))

    @classmethod
    def from_json(cls, text: str | bytes) -> "CompressionVerdict":
        """A recorded verdict."""
        return cls(**json.loads(text))


@torch.inference_mode()
def measure_compression(
    fuser: Fuser, compression_name: str, max_kl_increase: float, mode: str = "cacheblend"
) -> CompressionVerdict:
    """Fuse the calibration prompts with `mode` as `fuser` would, reading chunk KV exact and compressed."""
    view = CompressedView([compression_name])  # private: the calibration's chunks never reach the serving store
    probe = Fuser(fuser.runner, fuser.options, store=view, template=fuser.template, chunk_context=fuser.chunk_context,
                  loader=fuser.loader)
    ratio = fuser.options.recompute_ratio
    exact_kl, packed_kl, agree = [], [], []
    for documents, question in CALIBRATION:
        prompt = probe.layout(list(documents), question)
        probe.precompute(prompt)
        end = len(prompt.token_ids)
        answer, _ = greedy_answer(probe.runner, prompt.token_ids, ANSWER_TOKENS)
        targets = torch.tensor(answer)
        reference = answer_logprobs(probe, prompt, "full_prefill", 1.0, answer, end)
        exact = answer_logprobs(probe, prompt, mode, ratio, answer, end)
        with view.serving(compression_name):
            packed = answer_logprobs(probe, prompt, mode, ratio, answer, end)
        exact_kl.append(teacher_forced_divergence(reference, exact, targets).kl)
        packed_kl.append(teacher_forced_divergence(reference, packed, targets).kl)
        agree.append(float(exact[0].argmax() == packed[0].argmax()))
    return CompressionVerdict(
        fuser.runner.checkpoint.fingerprint,
        compression_name,
        mode,
        sum(exact_kl) / len(exact_kl),
        sum(packed_kl) / len(packed_kl),
        sum(agree) / len(agree),
        max_kl_increase,
    )
