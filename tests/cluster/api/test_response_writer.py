"""Server-sent events: a failure after the stream started is told as an error event, then [DONE]."""
import asyncio
import json
from collections.abc import AsyncIterator

from cluster.api.request_models import ApiError
from cluster.api.response_writer import DONE, ResponseFrame, blend_stats, sse
from workers.worker import Event, Finished, TextDelta


async def dying(error: Exception) -> AsyncIterator[Event]:
    yield TextDelta("Par")
    raise error


async def healthy() -> AsyncIterator[Event]:
    yield TextDelta("Paris")
    yield Finished("stop", 10, 2, 0.1, "cacheblend", 0.15, {}, 10, "w")


def events_of(frame: ResponseFrame, events: AsyncIterator[Event]) -> list[bytes]:
    async def drain() -> list[bytes]:
        return [chunk async for chunk in sse(frame, events, include_usage=True)]

    return asyncio.run(drain())


def test_a_worker_failure_mid_stream_ends_with_an_error_event_and_done() -> None:
    chunks = events_of(ResponseFrame(True, "m"), dying(ConnectionError("replica died")))
    assert chunks[-1] == DONE
    error = json.loads(chunks[-2].removeprefix(b"data: "))["error"]
    assert error["code"] == "worker_error" and error["type"] == "server_error"
    assert error["message"].startswith("the worker failed: ConnectionError")
    assert b'"Par"' in chunks[1]


def test_an_api_error_mid_stream_keeps_its_own_message() -> None:
    refusal = ApiError(503, "no worker is ready yet", None, "service_unavailable")
    chunks = events_of(ResponseFrame(False, "m"), dying(refusal))
    assert json.loads(chunks[-2].removeprefix(b"data: "))["error"]["message"] == "no worker is ready yet"
    assert chunks[-1] == DONE


def test_a_healthy_stream_has_no_error_event() -> None:
    chunks = events_of(ResponseFrame(True, "m"), healthy())
    assert chunks[-1] == DONE and not any(b'"error"' in chunk for chunk in chunks)
    assert len(chunks) == 5  # role, delta, closing chunk, usage, [DONE]


def test_the_blend_stats_name_the_plan_that_ran_and_its_prediction() -> None:
    planned = Finished("stop", 10, 2, 0.1, "full_prefill", 1.0, {}, 10, "w", "plain", 0.08)
    stats = blend_stats(planned)
    assert stats.plan == "plain" and stats.predicted_ttft_s == 0.08
    unplanned = blend_stats(Finished("stop", 10, 2, 0.1, "cacheblend", 0.15, {}, 10, "w"))
    assert unplanned.plan == "blend" and unplanned.predicted_ttft_s is None
