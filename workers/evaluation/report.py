"""The evaluation's JSON document and its printed table."""
from pathlib import Path

import torch

from workers.dtype import measured_on

COLUMNS = ("f1", "agreement_f1", "first_token_kl", "ttft_s_median", "ttft_s_mean", "context_tokens_mean",
           "recomputed_fraction")


def eval_document(
    model: str, data: Path, num_records: int, modes: dict[str, dict[str, float]], dtype: torch.dtype
) -> dict:
    """The result in the documented shape, with the dtype and the hardware it was measured on."""
    return {"model": model, **measured_on(dtype), "data": str(data), "records": num_records, "modes": modes}


def format_table(modes: dict[str, dict[str, float]]) -> str:
    """A fixed-width text table, one row per mode."""
    width = max(len("mode"), *(len(m) for m in modes))
    lines = ["mode".ljust(width) + "".join(c.rjust(21) for c in COLUMNS)]
    for mode, row in modes.items():
        lines.append(mode.ljust(width) + "".join(f"{row[c]:21.4f}" for c in COLUMNS))
    return "\n".join(lines)
