"""Token ids to text deltas for streaming: incremental detokenization that never emits part of a stop string."""
from transformers import PreTrainedTokenizerBase

_INCOMPLETE = "\ufffd"  # what a tokenizer decodes a cut multi-byte character to


class TextStream:
    """Feed token ids one by one; each `push` returns the text that is now safe to show."""

    def __init__(self, tokenizer: PreTrainedTokenizerBase, stop: tuple[str, ...] = ()) -> None:
        self._tokenizer = tokenizer
        self._stop = stop
        self._token_ids: list[int] = []
        self._num_emitted_chars = 0
        self.stopped = False

    def push(self, token_id: int) -> str:
        """Add one generated token; returns the new text (empty while it may still become a stop string)."""
        if self.stopped:
            return ""
        self._token_ids.append(token_id)
        text = self._text()
        cut = min((i for i in (text.find(s) for s in self._stop) if i >= 0), default=-1)
        if cut >= 0:
            self.stopped = True
            return self._emit(text[:cut])
        return self._emit(text[: len(text) - self._held_back(text)])

    def finish(self) -> str:
        """The text held back so far (none once a stop string was found)."""
        return "" if self.stopped else self._emit(self._text())

    def _text(self) -> str:
        # Leading whitespace is dropped, as the non-streaming answer does.
        return self._tokenizer.decode(self._token_ids, skip_special_tokens=True).lstrip()

    def _held_back(self, text: str) -> int:
        """Characters at the end that could be the start of a stop string or of a cut character."""
        if text.endswith(_INCOMPLETE):
            return len(text) - self._num_emitted_chars
        return max((n for s in self._stop for n in range(1, len(s)) if text.endswith(s[:n])), default=0)

    def _emit(self, text: str) -> str:
        delta = text[self._num_emitted_chars :]
        self._num_emitted_chars = max(self._num_emitted_chars, len(text))
        return delta
