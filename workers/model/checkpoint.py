"""Load a local Hugging Face checkpoint directory: config, weights, tokenizer and fingerprint."""
import json
from dataclasses import dataclass
from pathlib import Path

import torch
from safetensors.torch import load_file
from transformers import AutoTokenizer, PreTrainedTokenizerBase

from workers.model.config import ModelConfig, UnsupportedModelError
from workers.model.fingerprint import model_fingerprint
from workers.model.weights import ModelWeights


@dataclass(slots=True)
class Checkpoint:
    """A loaded model: what it is, its tensors, its tokenizer, and the identity of cached KV made with it."""

    path: Path
    config: ModelConfig
    weights: ModelWeights
    tokenizer: PreTrainedTokenizerBase
    fingerprint: str


def load_model_card(path: Path) -> tuple[ModelConfig, PreTrainedTokenizerBase]:
    """The config and tokenizer of a local checkpoint directory, without its weights."""
    path = Path(path)
    config_file = path / "config.json"
    if not config_file.is_file():
        raise FileNotFoundError(f"{path} is not a checkpoint directory: config.json is missing")
    config = ModelConfig.from_hf(json.loads(config_file.read_text()))
    return config, AutoTokenizer.from_pretrained(str(path), local_files_only=True)


def load_checkpoint(path: Path, dtype: torch.dtype = torch.bfloat16, device: torch.device | str = "cpu") -> Checkpoint:
    """Read config.json, *.safetensors and the tokenizer from a local directory (never a hub), weights on `device`."""
    path = Path(path)
    config, tokenizer = load_model_card(path)
    weight_files = sorted(path.glob("*.safetensors"))
    if not weight_files:
        raise UnsupportedModelError(f"{path} has no *.safetensors weights (only safetensors checkpoints load)")
    state: dict[str, torch.Tensor] = {}
    for f in weight_files:
        state.update(load_file(str(f)))
    weights = ModelWeights.from_state_dict(config, state, dtype, device)
    return Checkpoint(path, config, weights, tokenizer, model_fingerprint(path, str(dtype).removeprefix("torch.")))
