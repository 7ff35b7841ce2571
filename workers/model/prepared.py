"""The models blendserve prepares by name (`blendserve prepare-model --model NAME`, `make setup MODEL=NAME`)."""
from collections.abc import Callable
from pathlib import Path

from workers.model.default import prepare_default_model
from workers.model.gemma import prepare_gemma3

PREPARERS: dict[str, Callable[[Path | None], Path]] = {
    "smollm2-135m": prepare_default_model,
    "gemma3-270m": prepare_gemma3,
}
