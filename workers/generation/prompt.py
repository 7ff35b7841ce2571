"""Lay a RAG prompt out as token ids: prefix, one chunk per document (tokenized alone), suffix."""
from dataclasses import dataclass

from transformers import PreTrainedTokenizerBase

DEFAULT_INSTRUCTION = (
    "You will be asked a question after reading several passages. Please directly answer the question based on "
    "the given passages. Do NOT repeat the question. The answer should be within 5 words.\nPassages:\n"
)
DEFAULT_QUESTION_TEMPLATE = (
    "Answer the question directly based on the given passages. Do NOT repeat the question. The answer should be "
    "within 5 words. \nQuestion: {question}\nAnswer:"
)
DOCUMENT_SEPARATOR = "\n\n"
_CONTENT_MARKER = "\x00BLENDSERVE_USER_CONTENT\x00"


@dataclass(frozen=True, slots=True)
class PromptLayout:
    """Token ids of one request; the full-prefill baseline runs on exactly prefix + chunks + suffix."""

    prefix_ids: list[int]
    chunk_ids: list[list[int]]
    suffix_ids: list[int]

    @property
    def token_ids(self) -> list[int]:
        """The whole prompt as one sequence."""
        return [t for part in (self.prefix_ids, *self.chunk_ids, self.suffix_ids) for t in part]


@dataclass(frozen=True, slots=True)
class PromptTemplate:
    """Wraps instruction + documents + question in the model's chat template (one user message)."""

    tokenizer: PreTrainedTokenizerBase
    instruction: str = DEFAULT_INSTRUCTION
    question_template: str = DEFAULT_QUESTION_TEMPLATE
    use_chat_template: bool = True

    def __post_init__(self) -> None:
        if "{question}" not in self.question_template:
            raise ValueError("question_template must contain '{question}'")

    def layout(self, documents: list[str], question: str) -> PromptLayout:
        """Each document becomes one chunk: its text plus a blank line, tokenized on its own (no BOS)."""
        head, tail = self._chat_frame()
        return PromptLayout(
            prefix_ids=self._encode(head + self.instruction),
            chunk_ids=[self._encode(doc + DOCUMENT_SEPARATOR) for doc in documents],
            suffix_ids=self._encode(self.question_template.format(question=question) + tail),
        )

    def _chat_frame(self) -> tuple[str, str]:
        """The chat template's text before and after the user message (with the generation prompt)."""
        if not (self.use_chat_template and self.tokenizer.chat_template):
            return "", ""
        rendered = self.tokenizer.apply_chat_template(
            [{"role": "user", "content": _CONTENT_MARKER}], tokenize=False, add_generation_prompt=True
        )
        head, tail = rendered.split(_CONTENT_MARKER)
        return head, tail

    def _encode(self, text: str) -> list[int]:
        return list(self.tokenizer(text, add_special_tokens=False).input_ids)
