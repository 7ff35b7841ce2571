"""How far next-token distributions are from a reference: the guardrails' and the evaluation's shared measures."""
from dataclasses import dataclass

import torch


def first_token_kl(reference: torch.Tensor, other: torch.Tensor) -> float:
    """KL(reference || other) of two first-token log-probability vectors. # [V], [V]"""
    return float((reference.exp() * (reference - other)).sum().clamp_min(0.0))


@dataclass(frozen=True, slots=True)
class TeacherForced:
    """Divergence along the reference answer: both caches fed the same (reference) tokens."""

    kl: float  # mean over the answer's positions of KL(reference || other), nats
    nll_gap: float  # mean over positions of NLL_other(token) - NLL_reference(token), nats
    first_token_kl: float  # the first position's KL alone

    def __post_init__(self) -> None:
        if self.kl < 0.0 or self.first_token_kl < 0.0:
            raise ValueError(f"KL cannot be negative, got {self.kl}, {self.first_token_kl}")


def teacher_forced_divergence(reference: torch.Tensor, other: torch.Tensor, targets: torch.Tensor) -> TeacherForced:
    """KL and NLL gap of `other` against `reference` at each position where `targets` was fed next.

    reference, other: [T, V] log-probabilities of the next token at T positions; targets: [T] the reference's tokens.
    """
    if reference.shape != other.shape or reference.shape[0] != targets.shape[0] or reference.dim() != 2:
        raise ValueError(f"shapes differ: {tuple(reference.shape)}, {tuple(other.shape)}, {tuple(targets.shape)}")
    reference, other = reference.double(), other.double()
    kl = (reference.exp() * (reference - other)).sum(dim=-1).clamp_min(0.0)  # [T]
    rows = torch.arange(targets.shape[0])
    gap = reference[rows, targets] - other[rows, targets]  # [T]: -log q(y) + log p(y)
    return TeacherForced(float(kl.mean()), float(gap.mean()), float(kl[0]))
