"""Build an engine from a checkpoint path, or from the default model when none is given."""
from pathlib import Path

from workers.checkpoint import load_checkpoint
from workers.default_model import prepare_default_model
from workers.dtype import AUTO, resolve_dtype, torch_dtype
from workers.engine import BlendEngine
from workers.fusion.base import FusionOptions


def load_engine(
    model_path: Path | None = None,
    dtype: str = AUTO,
    options: FusionOptions = FusionOptions(),
    chunk_context: str = "prefix",
) -> BlendEngine:
    """Load weights once, in `dtype` made concrete for this CPU, and wrap them in the reference torch engine."""
    path = model_path or prepare_default_model()
    return BlendEngine(load_checkpoint(path, torch_dtype(resolve_dtype(dtype, path, on_gpu=False))), options,
                       chunk_context=chunk_context)
