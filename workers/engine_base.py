"""The interface a worker serves through: the reference torch engine and the vLLM engine implement it."""
from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import torch
from transformers import PreTrainedTokenizerBase

if TYPE_CHECKING:
    from workers.engine import BlendRequest, Generation


@dataclass(slots=True)
class StoredChunk:
    """One document's chunk after `store_documents`: its key, size, whether it was computed now, where it is."""

    num_tokens: int
    computed: bool
    key: str = ""
    tiers: list[str] = field(default_factory=list)


class Engine(ABC):
    """Prefill a RAG request from cached chunk KV, decode it, and keep documents' KV ahead of time."""

    stop_token_ids: tuple[int, ...]  # end-of-sequence ids used when a request names none
    max_concurrent_jobs: int = 1  # jobs its worker may run at once (an engine that batches says more)

    @property
    @abstractmethod
    def tokenizer(self) -> PreTrainedTokenizerBase:
        """The served model's tokenizer."""

    @property
    @abstractmethod
    def dtype(self) -> torch.dtype:
        """The dtype the engine computes and caches KV in."""

    @property
    @abstractmethod
    def max_context_tokens(self) -> int:
        """Prompt plus generated tokens the model can attend over."""

    @abstractmethod
    def open(self, request: "BlendRequest") -> "Generation":
        """Prefill `request`; the generation yields token ids as they are decoded."""

    @abstractmethod
    def store_documents(self, documents: list[str], namespace: str) -> list[StoredChunk]:
        """Compute (if missing) and store each document's chunk KV, in order."""

    def close(self) -> None:
        """Release what the engine holds (threads, a vLLM engine); nothing by default."""
