"""How a corpus row becomes chunks: one row one chunk, or split to at most N tokens; the ids they keep."""
import re
from collections.abc import Callable
from dataclasses import dataclass

ID_RULE = "1 to 128 letters, digits, '-', '_', '.' or '~', starting with a letter or digit (URL-safe)"
_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._~-]{0,127}")
ROW_RULE = "row"


@dataclass(frozen=True, slots=True)
class ChunkRule:
    """One chunk per row (max_tokens None), or each row split into pieces of at most `max_tokens` tokens."""

    max_tokens: int | None = None

    def __post_init__(self) -> None:
        if self.max_tokens is not None and self.max_tokens < 1:
            raise ValueError(f"max_tokens must be >= 1 or None, got {self.max_tokens}")

    @classmethod
    def parse(cls, text: str) -> "ChunkRule":
        """`row`, or `tokens:N`."""
        if text == ROW_RULE:
            return cls()
        kind, _, count = text.partition(":")
        if kind != "tokens" or not count.isdigit() or int(count) < 1:
            raise ValueError(f"a chunk rule is 'row' or 'tokens:N' with N >= 1, got {text!r}")
        return cls(int(count))

    def __str__(self) -> str:
        return ROW_RULE if self.max_tokens is None else f"tokens:{self.max_tokens}"


def id_problem(value: str) -> str | None:
    """Why `value` cannot name a document (None when it can)."""
    if _ID.fullmatch(value):
        return None
    return f"id {value[:80]!r} must be {ID_RULE}"


def piece_id(document_id: str, index: int) -> str:
    """The id of piece `index` of a split document: `doc-17` -> `doc-17.0`, `doc-17.1`, ..."""
    return f"{document_id}.{index}"


def split_text(
    text: str, max_tokens: int, token_starts: Callable[[str], list[int]], count_tokens: Callable[[str], int]
) -> list[str]:
    """`text` in pieces of at most `max_tokens` tokens, cut where tokens start; the pieces join back into `text`.

    A piece tokenized on its own may take a token more than its share of the whole text (a word cut from its
    neighbour): such a piece ends a token earlier, until it fits.
    """
    if not text:
        return []
    starts = sorted({0} | {s for s in token_starts(text) if 0 < s < len(text)})
    pieces: list[str] = []
    first = 0  # index in `starts` of the next piece's first token
    while first < len(starts):
        take = min(max_tokens, len(starts) - first)
        while True:
            end = first + take
            piece = text[starts[first]: starts[end] if end < len(starts) else len(text)]
            if take == 1 or count_tokens(piece) <= max_tokens:
                break
            take -= 1
        pieces.append(piece)
        first += take
    return pieces
