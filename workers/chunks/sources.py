"""Which stored version of a part's KV a request reads: what it was computed after, and what its windows saw.

A chunk's KV is computed once, after the prompt prefix. On a model with sliding-window layers (Gemma 3: 512
tokens) the chunk's tokens then see the prefix and its BOS token (the attention sink) at every layer, yet deep
in a fused prompt their windows hold only the chunks before them. Under `window_aware` the store keeps a
second version computed with the prefix hidden from the sliding-window layers, read wherever most of the
chunk's tokens would see none of the prefix (docs/quality.md, Gemma 3: a third off full reuse's KL on musique).
"""
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # annotations only: the CLI reads the choices below without loading transformers
    from workers.generation.prompt import PromptLayout
    from workers.model.config import ModelConfig

CHUNK_CONTEXTS = ("alone", "prefix", "window_aware")  # after nothing; after the prefix; that, and windowed
DEFAULT_CHUNK_CONTEXT = "window_aware"  # the same as "prefix" on a model without sliding-window layers
PREFIX_INDEX = -1  # a request's prompt prefix among its parts (chunks count from 0)
WINDOWED_QUALIFIER = "\0windowed"  # kvplane.keys' `<tenant>\0<qualifier>`: filed apart, counted to the tenant


def after_prefix(chunk_context: str) -> bool:
    """Whether chunk KV is computed after the prompt prefix under this choice."""
    return chunk_context != "alone"


@dataclass(frozen=True, slots=True)
class ChunkSource:
    """One stored version of a part's KV: the context it was computed after and the namespace it is filed in."""

    context_ids: list[int]
    namespace: str
    hides_context: bool = False  # computed with the context hidden from sliding-window layers


@dataclass(frozen=True, slots=True)
class ChunkSources:
    """The versions of a part's KV the store keeps, and which one each place in a request reads."""

    chunk_context: str = DEFAULT_CHUNK_CONTEXT
    window_tokens: int | None = None  # the sliding-window layers' window (None: the model has none)

    def __post_init__(self) -> None:
        if self.chunk_context not in CHUNK_CONTEXTS:
            raise ValueError(f"chunk_context must be one of {CHUNK_CONTEXTS}, got {self.chunk_context!r}")
        if self.window_tokens is not None and self.window_tokens < 1:
            raise ValueError(f"window_tokens must be None or >= 1, got {self.window_tokens}")

    @classmethod
    def for_model(cls, chunk_context: str, config: "ModelConfig") -> "ChunkSources":
        """The versions for a model: its narrowest sliding window, if it has any."""
        windows = [kind.window_tokens for kind in config.layer_kinds if kind.window_tokens is not None]
        return cls(chunk_context, min(windows) if windows else None)

    def context_ids(self, is_prefix: bool, prompt: "PromptLayout") -> list[int]:
        """What every version of a part is computed after: the prompt's chunk context (never for the prefix itself)."""
        return prompt.chunk_context_ids if after_prefix(self.chunk_context) and not is_prefix else []

    def base(self, is_prefix: bool, prompt: "PromptLayout", namespace: str) -> ChunkSource:
        """The version every part has, filed under the namespace itself."""
        return ChunkSource(self.context_ids(is_prefix, prompt), namespace)

    def versions(self, is_prefix: bool, prompt: "PromptLayout", namespace: str) -> list[ChunkSource]:
        """Every version of a part the store keeps, the base one first."""
        base = self.base(is_prefix, prompt, namespace)
        if self.chunk_context != "window_aware" or self.window_tokens is None or not base.context_ids:
            return [base]
        return [base, ChunkSource(base.context_ids, namespace + WINDOWED_QUALIFIER, hides_context=True)]

    def read_at(self, index: int, prompt: "PromptLayout", namespace: str) -> ChunkSource:
        """The version part `index` (PREFIX_INDEX: the prefix) reads at its place in this prompt."""
        versions = self.versions(index == PREFIX_INDEX, prompt, namespace)
        if len(versions) == 1 or self.window_tokens is None:
            return versions[0]
        start = len(prompt.prefix_ids) + sum(len(ids) for ids in prompt.chunk_ids[:index])
        blind = past_the_prefix(start, len(prompt.chunk_ids[index]), len(prompt.prefix_ids), self.window_tokens)
        return versions[1] if blind else versions[0]


def prompt_parts(prompt: "PromptLayout") -> list[tuple[int, list[int]]]:
    """A prompt's cached parts in order, each with its index: the prefix (PREFIX_INDEX) if any, then the chunks."""
    return ([(PREFIX_INDEX, prompt.prefix_ids)] if prompt.prefix_ids else []) + list(enumerate(prompt.chunk_ids))


def past_the_prefix(start: int, num_tokens: int, num_prefix_tokens: int, window_tokens: int) -> bool:
    """Whether most of a chunk's tokens, at positions start.., see none of the prefix in a sliding window."""
    first_blind = num_prefix_tokens - 1 + window_tokens  # the first position whose window has left the prefix
    num_blind = max(0, start + num_tokens - max(start, first_blind))
    return 2 * num_blind > num_tokens
