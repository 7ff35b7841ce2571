"""Any local checkpoint of a supported family loads and matches transformers; re-rotated chunk keys match a fresh
prefill at the offset, layer by layer with each layer's RoPE."""
import json
import re
import shutil
from collections.abc import Callable
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file
from transformers import PreTrainedModel

from tests.workers.model.tiny_checkpoints import FAMILIES, tiny_checkpoint
from workers.chunks.kv import compute_chunk_kv
from workers.model.checkpoint import load_checkpoint
from workers.model.config import UnsupportedModelError
from workers.model.runner import ModelRunner

ATOL = 1e-4
PROMPT = "Retrieval-augmented generation reuses the key-value cache of each retrieved chunk wherever it appears."
CHUNK = "The quick brown fox jumps over the lazy dog near the river bank at dawn."
OFFSETS = (0, 7, 300)


@pytest.fixture(scope="module", params=sorted(FAMILIES))
def family(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> tuple[str, PreTrainedModel, ModelRunner]:
    """One tiny checkpoint per family, saved and loaded back through our loader."""
    model, directory = tiny_checkpoint(request.param, tmp_path_factory.mktemp(request.param))
    runner = ModelRunner(load_checkpoint(directory, torch.float32))
    return request.param, model, runner


@pytest.fixture(scope="module")
def llama_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny Llama checkpoint directory that tests copy before changing."""
    return tiny_checkpoint("llama", tmp_path_factory.mktemp("llama_base"))[1]


def encode(runner: ModelRunner, text: str) -> torch.Tensor:
    """Token ids of text with the checkpoint's own tokenizer. # [T]"""
    ids = runner.checkpoint.tokenizer(text, add_special_tokens=False)["input_ids"]
    return torch.tensor(ids, dtype=torch.long)


def copy_checkpoint(source: Path, target: Path) -> Path:
    """A byte-identical copy of a checkpoint directory."""
    shutil.copytree(source, target)
    return target


def rewrite_weights(directory: Path, edit: Callable[[dict[str, torch.Tensor]], object]) -> None:
    """Apply edit to the checkpoint's tensors in place and save them back as safetensors."""
    state = load_file(str(directory / "model.safetensors"))
    edit(state)
    save_file(state, str(directory / "model.safetensors"), metadata={"format": "pt"})


def test_config_is_read_as_transformers_reads_it(family: tuple[str, PreTrainedModel, ModelRunner]) -> None:
    name, model, runner = family
    hf, ours = model.config, runner.config
    assert ours.architecture == type(model).__name__
    assert (ours.num_layers, ours.num_heads, ours.num_kv_heads, ours.head_dim) == (2, 4, 2, 16)
    assert ours.qkv_bias == (name == "qwen2")
    assert ours.tie_word_embeddings == hf.tie_word_embeddings
    for layer, kind in enumerate(ours.layer_kinds):
        layer_type = hf.layer_types[layer] if name == "gemma3" else None
        theirs = hf.rope_parameters[layer_type] if layer_type else hf.rope_parameters
        assert (kind.rope.theta, kind.rope.rope_type) == (theirs["rope_theta"], theirs["rope_type"])
        assert kind.window_tokens == (hf.sliding_window if layer_type == "sliding_attention" else None)
    assert (runner.weights.lm_head is runner.weights.embed) == (name in ("llama_tied", "gemma3"))


@torch.inference_mode()
def test_prefill_and_decode_logits_match_transformers(family: tuple[str, PreTrainedModel, ModelRunner]) -> None:
    _, model, runner = family
    ids = encode(runner, PROMPT)
    assert 15 <= len(ids) <= 30
    cache = runner.new_cache(len(ids) + 1)
    ours = runner.logits(runner.forward(ids, cache, 0))
    reference = model(ids[None], use_cache=True)
    theirs = reference.logits[0]
    assert ours.shape == theirs.shape == (len(ids), 49152)
    assert ours.abs().max() > 1.0  # the random init is loud enough for a wrong rotation or bias to show
    torch.testing.assert_close(ours, theirs, atol=ATOL, rtol=0)

    next_id = theirs[-1].argmax().reshape(1)
    ours_step = runner.logits(runner.forward(next_id, cache, len(ids)))
    theirs_step = model(next_id[None], past_key_values=reference.past_key_values, use_cache=True).logits[0]
    torch.testing.assert_close(ours_step, theirs_step, atol=ATOL, rtol=0)


@torch.inference_mode()
@pytest.mark.parametrize("offset", OFFSETS)
def test_rerotated_chunk_kv_matches_transformers_at_offset(
    family: tuple[str, PreTrainedModel, ModelRunner], offset: int
) -> None:
    _, model, runner = family
    ids = encode(runner, CHUNK)
    chunk = compute_chunk_kv(runner, ids.tolist())
    positions = offset + torch.arange(len(ids))
    cache = model(ids[None], position_ids=positions[None], use_cache=True).past_key_values
    assert len(cache.layers) == runner.config.num_layers
    for layer in range(runner.config.num_layers):
        their_k = cache.layers[layer].keys[0].transpose(0, 1)  # [B, H_kv, T, D] -> [T, H_kv, D]
        their_v = cache.layers[layer].values[0].transpose(0, 1)
        kept = their_k.shape[0]  # a sliding-window layer's cache keeps only the last window - 1 tokens
        assert kept == len(ids) or kept == runner.config.layer_kind(layer).window_tokens - 1
        cached_k, cached_v = chunk.kv[layer, 0, -kept:], chunk.kv[layer, 1, -kept:]
        torch.testing.assert_close(runner.rerotate_keys(layer, cached_k, offset), their_k, atol=ATOL, rtol=0)
        torch.testing.assert_close(cached_v, their_v, atol=ATOL, rtol=0)
        if offset:
            assert not torch.allclose(cached_k, their_k, atol=1e-2)  # re-rotation did real work


def test_fingerprint_is_stable_for_identical_bytes(llama_dir: Path, tmp_path: Path) -> None:
    copy = copy_checkpoint(llama_dir, tmp_path / "copy")
    assert load_checkpoint(copy, torch.float32).fingerprint == load_checkpoint(llama_dir, torch.float32).fingerprint


def test_fingerprint_changes_with_config(llama_dir: Path, tmp_path: Path) -> None:
    copy = copy_checkpoint(llama_dir, tmp_path / "copy")
    config = json.loads((copy / "config.json").read_text())
    config["rms_norm_eps"] = 1e-5
    (copy / "config.json").write_text(json.dumps(config, indent=2))
    changed = load_checkpoint(copy, torch.float32)
    assert changed.config.rms_norm_eps == 1e-5
    assert changed.fingerprint != load_checkpoint(llama_dir, torch.float32).fingerprint


def test_fingerprint_changes_with_weights(llama_dir: Path, tmp_path: Path) -> None:
    copy = copy_checkpoint(llama_dir, tmp_path / "copy")
    rewrite_weights(copy, lambda state: state["model.norm.weight"].add_(1e-3))
    changed = load_checkpoint(copy, torch.float32)
    original = load_checkpoint(llama_dir, torch.float32)
    assert not torch.equal(changed.weights.final_norm, original.weights.final_norm)
    assert changed.fingerprint != original.fingerprint


def test_directory_without_config_is_refused(llama_dir: Path, tmp_path: Path) -> None:
    copy = copy_checkpoint(llama_dir, tmp_path / "copy")
    (copy / "config.json").unlink()
    with pytest.raises(FileNotFoundError, match="config.json is missing"):
        load_checkpoint(copy, torch.float32)


def test_directory_without_safetensors_is_refused(llama_dir: Path, tmp_path: Path) -> None:
    copy = copy_checkpoint(llama_dir, tmp_path / "copy")
    (copy / "model.safetensors").rename(copy / "pytorch_model.bin")
    with pytest.raises(UnsupportedModelError, match=r"no \*\.safetensors weights"):
        load_checkpoint(copy, torch.float32)


@pytest.mark.parametrize("missing", ["lm_head.weight", "model.layers.1.mlp.up_proj.weight"])
def test_missing_tensor_is_refused_by_name(llama_dir: Path, tmp_path: Path, missing: str) -> None:
    """An untied model without lm_head is refused too, never silently run with the embedding as head."""
    copy = copy_checkpoint(llama_dir, tmp_path / "copy")
    rewrite_weights(copy, lambda state: state.pop(missing))
    with pytest.raises(UnsupportedModelError, match=re.escape(f"no tensor {missing!r}")):
        load_checkpoint(copy, torch.float32)


def test_llama_with_attention_bias_is_refused(tmp_path: Path) -> None:
    """Llama's attention_bias also biases o_proj, which the runner does not apply: refuse, never run it wrong."""
    _, directory = tiny_checkpoint("llama", tmp_path / "biased", attention_bias=True)
    with pytest.raises(UnsupportedModelError, match="attention_bias"):
        load_checkpoint(directory, torch.float32)


def test_mistral_with_sliding_window_is_refused(tmp_path: Path) -> None:
    _, directory = tiny_checkpoint("mistral", tmp_path / "sliding", sliding_window=8)
    with pytest.raises(UnsupportedModelError, match="sliding-window"):
        load_checkpoint(directory, torch.float32)
