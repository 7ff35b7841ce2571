"""Streaming detokenization on the real tokenizer: deltas add up to the answer and never show a stop string."""
import time

import pytest

from workers.generation.text_stream import TextStream


@pytest.fixture(scope="module")
def tokenizer(checkpoint):
    return checkpoint.tokenizer


def _stream(tokenizer, text: str, stop: tuple[str, ...] = ()) -> tuple[list[str], TextStream]:
    stream = TextStream(tokenizer, stop)
    deltas = [stream.push(t) for t in tokenizer(text, add_special_tokens=False).input_ids]
    deltas.append(stream.finish())
    return deltas, stream


def test_deltas_join_to_the_decoded_text(tokenizer):
    text = " The capital of France is Paris, a city of 2.1 million — café included."
    deltas, stream = _stream(tokenizer, text)
    assert "".join(deltas) == text.lstrip()
    assert not stream.stopped
    assert sum(1 for d in deltas if d) > 5  # it streams, not one blob at the end


def test_stop_string_cuts_the_text_and_is_never_emitted(tokenizer):
    deltas, stream = _stream(tokenizer, "Paris is nice.\nQuestion: what else?", stop=("\nQuestion",))
    assert "".join(deltas) == "Paris is nice."
    assert stream.stopped
    assert all("Question" not in d for d in deltas)


def test_text_that_only_starts_like_a_stop_string_is_released(tokenizer):
    deltas, stream = _stream(tokenizer, "Answer: Paris. Answ", stop=("Answer: London",))
    assert "".join(deltas) == "Answer: Paris. Answ"
    assert not stream.stopped


def test_long_stop_strings_cost_linear_work_per_token(tokenizer):
    # Text that keeps matching a long prefix of every stop string, the worst case of the held-back check.
    stops = tuple("ab" * 25_000 + tail for tail in "cdef")
    stream = TextStream(tokenizer, stops)
    token_ids = tokenizer("ab" * 30, add_special_tokens=False).input_ids
    start_s = time.monotonic()
    deltas = [stream.push(t) for t in token_ids]
    elapsed_s = time.monotonic() - start_s
    assert not any(deltas) and not stream.stopped  # everything may still become a stop string: held back
    assert stream.finish() == "ab" * 30
    assert elapsed_s < 1.0, f"{len(token_ids)} tokens took {elapsed_s:.1f} s"
