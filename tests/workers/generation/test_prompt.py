"""Prompt layout: documents are tokenized alone and the concatenation is exactly what full prefill sees."""
import pytest

from workers.generation.conversation import Conversation, Turn
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


DOCS = ["Alpha is a city.", "Beta is a river."]
SYSTEM = "You answer in one word."
TURNS = (Turn("user", "What is Alpha?"), Turn("assistant", "A city."))


def test_a_conversation_puts_the_system_prompt_first_and_the_turns_after_the_documents(checkpoint: Checkpoint) -> None:
    template = PromptTemplate(checkpoint.tokenizer)
    decode = checkpoint.tokenizer.decode
    one = template.layout(DOCS, "What is Beta?")
    chat = template.layout(DOCS, "What is Beta?", Conversation(SYSTEM, TURNS, "start"))
    assert template.layout(DOCS, "What is Beta?", Conversation()) == one  # no system, no turns: one question
    assert SYSTEM in decode(chat.prefix_ids) and DEFAULT_INSTRUCTION in decode(chat.prefix_ids)
    assert chat.chunk_ids == one.chunk_ids
    suffix = decode(chat.suffix_ids)
    assert suffix.index("What is Alpha?") < suffix.index("A city.") < suffix.index("What is Beta?")
    # every user turn goes through the question template, so turn N's prompt starts turn N+1's
    assert suffix.startswith(decode(one.suffix_ids).split("What is Beta?")[0] + "What is Alpha?")
    # chunk KV is computed after the one-question prefix: a system prompt leaves chunk keys as they are
    assert chat.chunk_context_ids == one.prefix_ids and not chat.chunks_follow_prefix
    assert one.chunk_context_ids == one.prefix_ids and one.chunks_follow_prefix


def test_chunks_after_the_request_prefix_and_documents_before_the_last_question(checkpoint: Checkpoint) -> None:
    exact = PromptTemplate(checkpoint.tokenizer, chunks_after="request_prefix")
    chat = exact.layout(DOCS, "What is Beta?", Conversation(SYSTEM, TURNS, "start"))
    assert chat.chunk_context_ids == chat.prefix_ids and chat.chunks_follow_prefix
    assert Conversation(SYSTEM, TURNS).documents_at == "last"  # the default: answers agree as a single question's
    last = PromptTemplate(checkpoint.tokenizer).layout(DOCS, "What is Beta?", Conversation(SYSTEM, TURNS))
    prefix, suffix = checkpoint.tokenizer.decode(last.prefix_ids), checkpoint.tokenizer.decode(last.suffix_ids)
    assert prefix.index(SYSTEM) < prefix.index("What is Alpha?") < prefix.index("A city.") < prefix.index(
        DEFAULT_INSTRUCTION)
    assert "What is Beta?" in suffix and "Alpha" not in suffix
    with pytest.raises(ValueError, match="chunks_after"):
        PromptTemplate(checkpoint.tokenizer, chunks_after="mine")
    with pytest.raises(ValueError, match="documents_at"):
        Conversation(documents_at="middle")
    with pytest.raises(ValueError, match="role"):
        Turn("system", "x")


def test_without_a_chat_template_turns_are_plain_text(checkpoint: Checkpoint) -> None:
    plain = PromptTemplate(checkpoint.tokenizer, use_chat_template=False)
    chat = plain.layout(DOCS, "What is Beta?", Conversation(SYSTEM, TURNS, "start"))
    text = checkpoint.tokenizer.decode(chat.token_ids)
    assert text.startswith(SYSTEM + "\n\n" + DEFAULT_INSTRUCTION) and text.endswith("What is Beta?\nAnswer:")
    assert "A city.\n\n" in text


def test_the_next_turns_prefix_is_this_conversation_one_exchange_later(checkpoint: Checkpoint) -> None:
    template = PromptTemplate(checkpoint.tokenizer)
    chat = Conversation("You answer in a few words.", (Turn("user", "Who built it?"), Turn("assistant", "Eiffel.")))
    following = template.layout(["doc one", "doc two"], "Where is it?", chat.then("When was it built?", "In 1889."))
    assert template.next_turn_prefix(chat, "When was it built?", "In 1889.") == following.prefix_ids
    assert "In 1889." in checkpoint.tokenizer.decode(following.prefix_ids)
    assert template.next_turn_prefix(None, "q?", "a.") is None  # a single question: none is laid out ahead
    at_start = Conversation("You answer in a few words.", documents_at="start")
    assert template.next_turn_prefix(at_start, "q?", "a.") is None  # the prefix stays this turn's
