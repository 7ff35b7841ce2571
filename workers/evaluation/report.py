"""The evaluation's JSON document and its printed table."""
from pathlib import Path
from typing import Any

import torch

from workers.model.dtype import measured_on

COLUMNS = ("agreement_f1", "exact_match", "first_token_agreement", "first_token_kl", "tf_kl", "tf_nll_gap", "f1",
           "accuracy", "relative_accuracy")
PLAIN_COLUMNS = ("ttft_s_median", "recomputed_fraction")


def eval_document(
    model: str, engine: str, data: Path, num_records: int, modes: dict[str, dict[str, Any]], dtype: torch.dtype
) -> dict[str, Any]:
    """The result in the documented shape, with the engine, the dtype and the hardware it was measured on."""
    return {"model": model, "engine": engine, **measured_on(dtype), "data": str(data), "records": num_records,
            "modes": modes}


def format_interval(row: dict[str, Any], metric: str) -> str:
    """`mean [low, high]` of a metric with its interval, `-` when it was not measured."""
    if metric not in row:
        return "-"
    low, high = row[f"{metric}_ci95"]
    return f"{row[metric]:.3f} [{low:.3f}, {high:.3f}]"


def format_table(modes: dict[str, dict[str, Any]]) -> str:
    """A Markdown table, one row per mode: each quality metric's mean [95% interval], TTFT median, recompute."""
    header = ["mode", *COLUMNS, *PLAIN_COLUMNS]
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for label, row in modes.items():
        cells = [label, *(format_interval(row, c) for c in COLUMNS), *(f"{row[c]:.3f}" for c in PLAIN_COLUMNS)]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)
