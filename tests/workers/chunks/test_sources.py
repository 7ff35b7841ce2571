"""Which stored version of a chunk's KV each place in a request reads (pure policy, no model)."""
import pytest

from workers.chunks.sources import PREFIX_INDEX, WINDOWED_QUALIFIER, ChunkSources, past_the_prefix
from workers.generation.prompt import PromptLayout

WINDOW = 8


def layout(prefix_tokens: int, chunk_tokens: list[int]) -> PromptLayout:
    """A prompt with a prefix and chunks of the given lengths (token ids are their positions)."""
    start, chunks = prefix_tokens, []
    for n in chunk_tokens:
        chunks.append(list(range(start, start + n)))
        start += n
    return PromptLayout(list(range(prefix_tokens)), chunks, [start])


@pytest.mark.parametrize(
    ("start", "num_tokens", "expected"),
    [
        (3, 4, False),  # positions 3..6: every window holds the prefix's last token (position 2)
        (8, 4, False),  # 8, 9 see position 2; 10, 11 do not: half is not most
        (9, 4, True),  # only 9 sees position 2
        (10, 4, True),  # none sees the prefix
    ],
)
def test_past_the_prefix_counts_the_tokens_whose_window_has_left_it(
    start: int, num_tokens: int, expected: bool
) -> None:
    assert past_the_prefix(start, num_tokens, 3, WINDOW) is expected


def test_window_aware_reads_the_windowed_version_only_past_the_prefix() -> None:
    prompt = layout(3, [4, 4, 4, 4])  # chunks at 3, 7, 11, 15; the first position blind to the prefix is 10
    sources = ChunkSources("window_aware", WINDOW)
    read = [sources.read_at(index, prompt, "acme") for index in range(4)]
    assert [source.hides_context for source in read] == [False, False, True, True]
    assert [source.namespace for source in read] == ["acme", "acme"] + ["acme" + WINDOWED_QUALIFIER] * 2
    assert all(source.context_ids == prompt.prefix_ids for source in read)  # both computed at the same positions
    assert sources.versions(False, prompt, "acme")[1] == read[2]
    prefix = sources.read_at(PREFIX_INDEX, prompt, "acme")  # the prefix has no context: one version, at 0
    assert prefix.context_ids == [] and not prefix.hides_context
    assert len(sources.versions(True, prompt, "acme")) == 1


@pytest.mark.parametrize(
    "sources",
    [ChunkSources("prefix", WINDOW), ChunkSources("alone", WINDOW), ChunkSources("window_aware", None)],
    ids=["prefix", "alone", "no-window"],
)
def test_one_version_without_a_window_or_under_another_choice(sources: ChunkSources) -> None:
    prompt = layout(3, [4, 4, 4, 4])
    assert len(sources.versions(False, prompt, "acme")) == 1
    assert not any(sources.read_at(index, prompt, "acme").hides_context for index in range(4))
    expected_context = [] if sources.chunk_context == "alone" else prompt.prefix_ids
    assert sources.read_at(3, prompt, "acme").context_ids == expected_context


def test_a_prompt_without_prefix_has_no_windowed_version() -> None:
    prompt = layout(0, [20, 20])
    assert ChunkSources("window_aware", WINDOW).versions(False, prompt, "acme") == [
        ChunkSources("window_aware", WINDOW).base(False, prompt, "acme")
    ]


def test_bad_choices_are_refused() -> None:
    with pytest.raises(ValueError, match="chunk_context must be one of"):
        ChunkSources("suffix")
    with pytest.raises(ValueError, match="window_tokens"):
        ChunkSources("window_aware", 0)
