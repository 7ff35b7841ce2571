"""How far one next-token distribution is from another: the guardrails' and the evaluation's shared measure."""
import torch


def first_token_kl(reference: torch.Tensor, other: torch.Tensor) -> float:
    """KL(reference || other) of two first-token log-probability vectors. # [V], [V]"""
    return float((reference.exp() * (reference - other)).sum().clamp_min(0.0))
