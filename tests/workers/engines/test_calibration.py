"""The planner's calibration prompts: within the token sizes asked for, so they fit a small model context."""
from workers.engines.calibration import DEFAULT_CONTEXT_TOKENS, synthetic_documents
from workers.model.checkpoint import Checkpoint


def test_synthetic_documents_stay_within_their_size_and_distinct_sizes_give_distinct_prompts(
    checkpoint: Checkpoint,
) -> None:
    sizes = sorted({128, 256, 384, 1536, *DEFAULT_CONTEXT_TOKENS})
    measured = []
    for size in sizes:
        documents = synthetic_documents(size)
        assert len(set(documents)) == len(documents)
        measured.append(sum(len(checkpoint.tokenizer.encode(d, add_special_tokens=False)) for d in documents))
    # The calibration of a 2,048-token context asks for up to 1,536: more would not leave room for the question.
    assert all(0.75 * size <= tokens <= size for size, tokens in zip(sizes, measured)), list(zip(sizes, measured))
    assert measured == sorted(set(measured))
