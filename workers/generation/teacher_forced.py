"""Next-token distributions of a fused prompt along a given answer, computed with the fusion's own runner."""
import torch

from workers.chunks.store import DEFAULT_NAMESPACE
from workers.fuser import Fuser
from workers.generation.prompt import PromptLayout


@torch.inference_mode()
def answer_logprobs(
    fuser: Fuser, prompt: PromptLayout, mode: str, ratio: float, answer_ids: list[int], kv_end: int,
    namespace: str = DEFAULT_NAMESPACE,
) -> torch.Tensor:
    """Log-probs of the next token after the prompt and after each answer token but the last, the answer fed.

    `mode` fuses the prompt's first `kv_end` tokens (as the engine would); the runner computes the rest of the
    prompt and the answer over that cache. Row t is the distribution the t-th answer token was drawn from.
    -> [len(answer_ids), V] float32
    """
    if not answer_ids:
        raise ValueError("an answer of at least one token is needed")
    num_prompt = len(prompt.token_ids)
    if not 0 < kv_end <= num_prompt:
        raise ValueError(f"kv_end must be in [1, {num_prompt}], got {kv_end}")
    runner = fuser.runner
    cache = runner.new_cache(num_prompt + len(answer_ids))
    fused = fuser.fuse(prompt, mode, ratio, namespace, cache, kv_end)
    rest = torch.tensor(prompt.token_ids[kv_end:] + answer_ids[:-1], dtype=torch.long)
    hidden = [fused.prefill.last_hidden[None]] if kv_end == num_prompt else []  # [1, hidden]: the prompt's last
    if rest.numel():
        computed = runner.forward(rest.to(runner.device), cache, kv_end)  # [len(rest), hidden]
        hidden.append(computed[max(0, num_prompt - 1 - kv_end) :])
    return runner.logits(torch.cat(hidden)).log_softmax(dim=-1).cpu()
