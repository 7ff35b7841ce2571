"""The plain worker on the real model: streamed deltas equal the engine's answer; stop strings end decoding."""
import time

import pytest

from workers.engines.base import BlendRequest
from workers.engines.torch_engine import TorchEngine
from workers.generation.sampling import SamplingParams
from workers.model.checkpoint import Checkpoint
from workers.worker import Finished, Job, TextDelta, Worker

GREEDY = SamplingParams(max_new_tokens=12)


def _run(worker: Worker, job: Job) -> tuple[str, Finished]:
    events = list(worker.run(job))
    assert all(isinstance(e, TextDelta) for e in events[:-1])
    assert isinstance(events[-1], Finished)
    return "".join(e.text for e in events[:-1]), events[-1]


# make test's budget: streamed deltas and the reuse stats run by default through the served app's workers
# (tests/cluster/test_serving.py: streamed equals unstreamed, reuse on the second request).
@pytest.mark.slow
def test_streamed_text_is_the_engine_answer_and_stats_count_reuse(checkpoint: Checkpoint, qa_records: list[dict]):
    record = qa_records[0]
    request = BlendRequest(record["documents"], record["question"], "cacheblend", 0.15, GREEDY)
    expected = TorchEngine.from_checkpoint(checkpoint).generate(request)
    worker = Worker(TorchEngine.from_checkpoint(checkpoint), "worker-a")
    text, first = _run(worker, Job(request))
    assert text.strip() == expected.text
    assert first.worker == "worker-a"
    assert first.reused_tokens == {}  # cold
    assert first.num_completion_tokens == len(expected.token_ids)
    assert first.finish_reason in ("stop", "length")
    assert first.recomputed_tokens == first.num_prompt_tokens  # cold: every token computed

    _, again = _run(worker, Job(request))
    assert sum(again.reused_tokens.values()) > 0  # written back after the first answer
    assert again.recomputed_tokens < first.recomputed_tokens


def test_stop_string_ends_decoding_early(checkpoint: Checkpoint, qa_records: list[dict]):
    record = qa_records[1]
    long_run = SamplingParams(max_new_tokens=24)
    request = BlendRequest(record["documents"], record["question"], "full_prefill", 1.0, long_run)
    worker = Worker(TorchEngine.from_checkpoint(checkpoint), "worker-b")
    full_text, full = _run(worker, Job(request))
    stop = full_text.strip().split()[1]  # the second word of the full answer
    text, stopped = _run(worker, Job(request, stop=(stop,)))
    assert stop not in text
    assert full_text.startswith(text)
    assert stopped.finish_reason == "stop"
    assert stopped.num_completion_tokens < full.num_completion_tokens


def test_ttft_counts_from_the_jobs_arrival_at_the_worker(checkpoint: Checkpoint, qa_records: list[dict]):
    record = qa_records[2]
    request = BlendRequest(record["documents"], record["question"], "full_prefill", 1.0, GREEDY)
    worker = Worker(TorchEngine.from_checkpoint(checkpoint), "worker-c")
    received_s = time.perf_counter() - 0.5  # as if it had waited half a second for a slot
    events = list(worker.run(Job(request), received_s))
    finished = events[-1]
    assert isinstance(finished, Finished) and finished.queued_s >= 0.5
    assert finished.ttft_s > finished.queued_s  # the engine's own time to the first token comes on top
