"""The copy-rule study reads the windowed copy for exactly the chunks a rule names (pure policy, no model)."""
from bench.window_copy_rules import ChosenSources
from workers.chunks.sources import PREFIX_INDEX, ChunkSources
from workers.generation.prompt import PromptLayout


def test_chosen_chunks_read_the_windowed_copy_and_the_rest_the_prefix_copy() -> None:
    prompt = PromptLayout([1, 2, 3], [[4, 5], [6, 7], [8, 9]], [10])
    sources = ChosenSources("window_aware", 8, frozenset({0, 2}))
    assert [sources.read_at(i, prompt, "acme").hides_context for i in range(3)] == [True, False, True]
    assert not sources.read_at(PREFIX_INDEX, prompt, "acme").hides_context  # the prefix has one copy
    assert sources.versions(False, prompt, "acme") == ChunkSources("window_aware", 8).versions(False, prompt, "acme")
