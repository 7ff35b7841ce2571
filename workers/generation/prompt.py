"""Lay a RAG prompt out as token ids: prefix, one chunk per document (tokenized alone), suffix."""
from dataclasses import dataclass, field

from transformers import PreTrainedTokenizerBase

from workers.generation.conversation import CHUNK_CONTEXTS_WITH_SYSTEM, Conversation

DEFAULT_INSTRUCTION = (
    "You will be asked a question after reading several passages. Please directly answer the question based on "
    "the given passages. Do NOT repeat the question. The answer should be within 5 words.\nPassages:\n"
)
DEFAULT_QUESTION_TEMPLATE = (
    "Answer the question directly based on the given passages. Do NOT repeat the question. The answer should be "
    "within 5 words. \nQuestion: {question}\nAnswer:"
)
DOCUMENT_SEPARATOR = "\n\n"
_DOCUMENTS_MARKER = "\x00BLENDSERVE_DOCUMENTS\x00"


@dataclass(frozen=True, slots=True)
class PromptLayout:
    """Token ids of one request; the full-prefill baseline runs on exactly prefix + chunks + suffix."""

    prefix_ids: list[int]
    chunk_ids: list[list[int]]
    suffix_ids: list[int]
    # What chunk KV is computed after when not this prompt's own prefix: the default one-question prefix, so a
    # chunk keeps its key under any system prompt or earlier turns (None: the prefix itself).
    chunk_context: list[int] | None = None

    @property
    def token_ids(self) -> list[int]:
        """The whole prompt as one sequence."""
        return [t for part in (self.prefix_ids, *self.chunk_ids, self.suffix_ids) for t in part]

    @property
    def chunk_context_ids(self) -> list[int]:
        """The ids chunk KV is computed after (under a chunk context that computes it after a prefix)."""
        return self.prefix_ids if self.chunk_context is None else self.chunk_context

    @property
    def chunks_follow_prefix(self) -> bool:
        """Whether chunk KV is computed after this very prefix (so the first chunk's KV can be exact)."""
        return self.chunk_context is None or self.chunk_context == self.prefix_ids


@dataclass(frozen=True, slots=True)
class PromptTemplate:
    """Wraps instruction + documents + question in the model's chat template (one user message)."""

    tokenizer: PreTrainedTokenizerBase
    instruction: str = DEFAULT_INSTRUCTION
    question_template: str = DEFAULT_QUESTION_TEMPLATE
    use_chat_template: bool = True
    chunks_after: str = "default_prefix"  # or "request_prefix": a system prompt of its own makes chunks its own
    _default_prefix_ids: list[int] = field(init=False, repr=False)

    def __post_init__(self) -> None:
        if "{question}" not in self.question_template:
            raise ValueError("question_template must contain '{question}'")
        if self.chunks_after not in CHUNK_CONTEXTS_WITH_SYSTEM:
            raise ValueError(f"chunks_after must be one of {CHUNK_CONTEXTS_WITH_SYSTEM}, got {self.chunks_after!r}")
        object.__setattr__(self, "_default_prefix_ids", self._encode(self._frame(Conversation(), "")[0]))

    def layout(self, documents: list[str], question: str, conversation: Conversation | None = None) -> PromptLayout:
        """Each document becomes one chunk: its text plus a blank line, tokenized on its own (no BOS).

        With a conversation, the system prompt opens the prompt and the earlier turns follow the documents
        (`documents_at="start"`) or precede them (`"last"`); every user message goes through the question
        template, so a turn is laid out the same when it is the question and when it is an earlier turn.
        Under `chunks_after="default_prefix"` chunk KV is computed after the one-question prefix, whatever this
        prompt's is, so a chunk keeps its key (and its stored KV) under any system prompt and turns.
        """
        chunk_ids = [self._encode(doc + DOCUMENT_SEPARATOR) for doc in documents]
        if conversation is None or conversation.is_one_shot:  # the default prefix, tokenized once at construction
            tail = self._frame(Conversation(), question)[1]
            return PromptLayout(list(self._default_prefix_ids), chunk_ids, self._encode(tail))
        head, tail = self._frame(conversation, question)
        prefix_ids = self._encode(head)
        own = self.chunks_after == "request_prefix" or prefix_ids == self._default_prefix_ids
        return PromptLayout(prefix_ids, chunk_ids, self._encode(tail), None if own else self._default_prefix_ids)

    def next_turn_prefix(self, conversation: Conversation | None, question: str, answer: str) -> list[int] | None:
        """The prefix ids the conversation's next turn opens with once `answer` to `question` is sent back.

        None where the next turn's prefix is this one's: documents before the conversation, or no conversation.
        With the documents before the last question the prefix holds every earlier turn, so it grows each turn.
        """
        if conversation is None or conversation.documents_at != "last":
            return None
        return self._encode(self._frame(conversation.then(question, answer), "")[0])

    def _frame(self, conversation: Conversation, question: str) -> tuple[str, str]:
        """The prompt's text before and after the documents."""
        asked = [(t.role, self._asked(t.text) if t.role == "user" else t.text) for t in conversation.turns]
        asked.append(("user", self._asked(question)))
        at = next(i for i, (role, _) in enumerate(asked) if role == "user") if conversation.documents_at == "start" \
            else len(asked) - 1
        asked[at] = (asked[at][0], self.instruction + _DOCUMENTS_MARKER + asked[at][1])
        messages = ([{"role": "system", "content": conversation.system}] if conversation.system is not None else [])
        messages += [{"role": role, "content": text} for role, text in asked]
        if not (self.use_chat_template and self.tokenizer.chat_template):
            rendered = "".join(m["content"] + ("\n\n" if m["role"] != "user" or i < len(messages) - 1 else "")
                               for i, m in enumerate(messages))
        else:
            rendered = self.tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
        head, tail = rendered.split(_DOCUMENTS_MARKER)
        return head, tail

    def _asked(self, text: str) -> str:
        return self.question_template.format(question=text)

    def _encode(self, text: str) -> list[int]:
        return list(self.tokenizer(text, add_special_tokens=False).input_ids)
