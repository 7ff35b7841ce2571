"""Prompt layout: documents are tokenized alone and the concatenation is exactly what full prefill sees."""
from workers.generation.prompt import DEFAULT_INSTRUCTION, PromptTemplate
from workers.model.checkpoint import Checkpoint


def test_layout_concatenates_separately_tokenized_parts(checkpoint: Checkpoint) -> None:
    tokenizer = checkpoint.tokenizer
    template = PromptTemplate(tokenizer)
    documents = ["Paris is the capital of France.", "Berlin is the capital of Germany."]
    layout = template.layout(documents, "What is the capital of France?")
    assert layout.token_ids == layout.prefix_ids + layout.chunk_ids[0] + layout.chunk_ids[1] + layout.suffix_ids
    for doc, ids in zip(documents, layout.chunk_ids):
        assert ids == tokenizer(doc + "\n\n", add_special_tokens=False).input_ids
        assert ids[0] != tokenizer.bos_token_id
    text = tokenizer.decode(layout.token_ids)
    assert text.startswith("<|im_start|>system")
    assert DEFAULT_INSTRUCTION in text
    assert text.endswith("Question: What is the capital of France?\nAnswer:<|im_end|>\n<|im_start|>assistant\n")


def test_reordered_documents_reuse_the_same_chunk_ids(checkpoint: Checkpoint) -> None:
    template = PromptTemplate(checkpoint.tokenizer)
    forward = template.layout(["one", "two"], "q?")
    backward = template.layout(["two", "one"], "q?")
    assert forward.chunk_ids == backward.chunk_ids[::-1]
    assert template.layout([], "q?").chunk_ids == []
