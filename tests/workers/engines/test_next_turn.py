"""Between a conversation's turns the engine stores the prefix the next turn opens with (documents last)."""
from dataclasses import replace

import torch

from workers.engines.base import BlendRequest
from workers.engines.torch_engine import TorchEngine
from workers.generation.conversation import Conversation
from workers.generation.sampling import SamplingParams
from workers.model.checkpoint import Checkpoint
from workers.worker import Job, TextDelta, Worker

GREEDY = SamplingParams(max_new_tokens=8)
SYSTEM = "You answer in a few words."
FOLLOW_UP = "When was that?"


def _answer(worker: Worker, request: BlendRequest) -> str:
    """The answer as a client reads it off the stream (and sends it back as the assistant's turn)."""
    return "".join(event.text for event in worker.run(Job(request)) if isinstance(event, TextDelta))


def test_the_next_turn_reads_its_whole_prefix_and_answers_as_if_it_computed_it(
    checkpoint: Checkpoint, qa_records: list[dict]
) -> None:
    documents, question = qa_records[0]["documents"], qa_records[0]["question"]
    engine = TorchEngine.from_checkpoint(checkpoint)
    engine.store_documents(documents)
    first = BlendRequest(documents, question, "full_reuse", 0.0, GREEDY, conversation=Conversation(SYSTEM))
    answer = _answer(Worker(engine, "w"), first)
    second = replace(first, question=FOLLOW_UP, conversation=first.conversation.then(question, answer))
    prompt = engine.fuser.layout(documents, FOLLOW_UP, second.conversation)
    assert answer and answer in engine.tokenizer.decode(prompt.prefix_ids)  # the prefix holds the first exchange
    assert engine.fuser.missed_tokens(prompt) == 0  # stored before the second turn was asked

    stored = engine.open(second)
    assert list(stored) and stored.stats.reused_tokens == stored.stats.context_tokens  # prefix and every chunk

    computed_engine = TorchEngine.from_checkpoint(checkpoint)  # the same turn with its prefix computed in the pass
    computed_engine.store_documents(documents)
    assert computed_engine.fuser.missed_tokens(prompt) == len(prompt.prefix_ids)
    computed = computed_engine.open(second)
    assert computed.stats.reused_tokens == computed.stats.context_tokens - len(prompt.prefix_ids)
    torch.testing.assert_close(stored.stats.first_token_logprobs, computed.stats.first_token_logprobs,
                               atol=1e-4, rtol=0.0)


def test_a_mode_that_reads_no_stored_kv_stores_no_next_prefix(checkpoint: Checkpoint, qa_records: list[dict]) -> None:
    documents, question = qa_records[1]["documents"], qa_records[1]["question"]
    engine = TorchEngine.from_checkpoint(checkpoint)
    first = BlendRequest(documents, question, "full_prefill", 1.0, GREEDY, conversation=Conversation(SYSTEM))
    answer = _answer(Worker(engine, "w"), first)
    later = first.conversation.then(question, answer)
    prompt = engine.fuser.layout(documents, FOLLOW_UP, later)
    assert engine.fuser.missed_tokens(prompt) == len(prompt.token_ids) - len(prompt.suffix_ids)
