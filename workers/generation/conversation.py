"""A chat request beyond one question: a system prompt, earlier turns, and where the documents go."""
from dataclasses import dataclass

ROLES = ("user", "assistant")
DOCUMENT_PLACES = ("last", "start")  # before the last question (the default), or before the conversation
CHUNK_CONTEXTS_WITH_SYSTEM = ("default_prefix", "request_prefix")  # what chunk KV is computed after


@dataclass(frozen=True, slots=True)
class Turn:
    """One earlier message of the conversation."""

    role: str
    text: str

    def __post_init__(self) -> None:
        if self.role not in ROLES:
            raise ValueError(f"a turn's role must be one of {ROLES}, got {self.role!r}")


@dataclass(frozen=True, slots=True)
class Conversation:
    """What comes with the question: the system prompt (None: the template's default) and earlier turns in order."""

    system: str | None = None
    turns: tuple[Turn, ...] = ()
    documents_at: str = "last"

    def __post_init__(self) -> None:
        if self.documents_at not in DOCUMENT_PLACES:
            raise ValueError(f"documents_at must be one of {DOCUMENT_PLACES}, got {self.documents_at!r}")

    def then(self, question: str, answer: str) -> "Conversation":
        """This conversation one exchange later: `question` asked and `answer` given, as the client sends them back."""
        return Conversation(self.system, (*self.turns, Turn("user", question), Turn("assistant", answer)),
                            self.documents_at)

    @property
    def is_one_shot(self) -> bool:
        """No system prompt and no earlier turn: the prompt is laid out as a single question."""
        return self.system is None and not self.turns
