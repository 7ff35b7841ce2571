"""Token ids to text deltas for streaming: incremental detokenization that never emits part of a stop string."""
from transformers import PreTrainedTokenizerBase

_INCOMPLETE = "\ufffd"  # what a tokenizer decodes a cut multi-byte character to


class TextStream:
    """Feed token ids one by one; each `push` returns the text that is now safe to show."""

    def __init__(self, tokenizer: PreTrainedTokenizerBase, stop: tuple[str, ...] = ()) -> None:
        self._tokenizer = tokenizer
        self._stop = stop
        self._borders = [_borders(s) for s in stop]
        self._token_ids: list[int] = []
        self._num_emitted_chars = 0
        self.stopped = False

    def push(self, token_id: int) -> str:
        """Add one generated token; returns the new text (empty while it may still become a stop string)."""
        if self.stopped:
            return ""
        self._token_ids.append(token_id)
        text = self._text()
        # Emitted text holds no stop string, so only the last len(s) - 1 emitted characters can start one.
        starts = (max(0, self._num_emitted_chars - len(s) + 1) for s in self._stop)
        cut = min((i for i in (text.find(s, start) for s, start in zip(self._stop, starts)) if i >= 0), default=-1)
        if cut >= 0:
            self.stopped = True
            return self._emit(text[:cut])
        return self._emit(text[: len(text) - self._held_back(text)])

    def finish(self) -> str:
        """The text held back so far (none once a stop string was found)."""
        return "" if self.stopped else self._emit(self._text())

    def _text(self) -> str:
        return answer_text(self._tokenizer, self._token_ids)

    def _held_back(self, text: str) -> int:
        """Characters at the end that could be the start of a stop string or of a cut character."""
        if text.endswith(_INCOMPLETE):
            return len(text) - self._num_emitted_chars
        return max((_partial_match(text, s, b) for s, b in zip(self._stop, self._borders)), default=0)

    def _emit(self, text: str) -> str:
        delta = text[self._num_emitted_chars :]
        self._num_emitted_chars = max(self._num_emitted_chars, len(text))
        return delta


def answer_text(tokenizer: PreTrainedTokenizerBase, token_ids: list[int]) -> str:
    """The text a client is streamed for these generated ids (leading whitespace dropped, as the answer does)."""
    return tokenizer.decode(token_ids, skip_special_tokens=True).lstrip()


def _borders(stop: str) -> list[int]:
    """KMP failure table: for each prefix of `stop`, the length of its longest proper border."""
    table = [0] * len(stop)
    length = 0
    for i in range(1, len(stop)):
        while length and stop[i] != stop[length]:
            length = table[length - 1]
        if stop[i] == stop[length]:
            length += 1
        table[i] = length
    return table


def _partial_match(text: str, stop: str, borders: list[int]) -> int:
    """Length of the longest suffix of `text` that is a proper prefix of `stop`, in O(len(stop)) steps."""
    # Only the last len(stop) - 1 characters can take part; a KMP scan over them ends in that state.
    matched = 0
    for char in text[max(0, len(text) - len(stop) + 1) :]:
        while matched and char != stop[matched]:
            matched = borders[matched - 1]
        if char == stop[matched]:
            matched += 1
    return matched
