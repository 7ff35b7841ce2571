"""Streaming HTTP requests for the serving benchmark, timed the way `vllm bench serve` times them.

Plain vLLM is driven by vLLM's own request function (`async_request_openai_completions`, the prompt as token
ids); blendserve by a thin one of the same shape that also sends `documents` and keeps the `blend` stats,
which vLLM's function has no field for. Both take TTFT at the first streamed chunk with a choice and the
inter-token latencies between later ones.
"""
import json
import time
import traceback
from dataclasses import dataclass, field
from typing import Any

import aiohttp

from cluster.bench.workload import document_id

DEFAULT_TIMEOUT = aiohttp.ClientTimeout(total=3600)


@dataclass(slots=True)
class Outcome:
    """What one request measured: send time (s from the run's start), TTFT, ITLs, end-to-end, text, stats."""

    request_id: str
    sent_s: float = 0.0
    ok: bool = False
    ttft_s: float = 0.0
    itl_s: list[float] = field(default_factory=list)
    latency_s: float = 0.0
    prompt_tokens: int = 0
    output_tokens: int = 0
    text: str = ""
    blend: dict[str, Any] | None = None
    error: str = ""

    def to_json(self) -> dict[str, Any]:
        """The per-request record of the result file."""
        return {
            "id": self.request_id, "sent_s": round(self.sent_s, 4), "ok": self.ok, "ttft_s": round(self.ttft_s, 4),
            "latency_s": round(self.latency_s, 4), "prompt_tokens": self.prompt_tokens,
            "output_tokens": self.output_tokens, "itl_s_mean": round(sum(self.itl_s) / len(self.itl_s), 5)
            if self.itl_s else None, "text": self.text, "blend": self.blend, "error": self.error,
        }


async def blendserve_completion(
    session: aiohttp.ClientSession, base_url: str, model: str, question: str, documents: list[str],
    max_tokens: int, blend: dict[str, Any] | None = None, by_id: bool = False,
) -> Outcome:
    """POST /v1/completions with `documents` (their text, or `by_id` their ids), streamed; `blend` and `usage` last."""
    from vllm.benchmarks.lib.endpoint_request_func import StreamedResponseHandler

    named = [{"id": document_id(d)} if by_id else {"text": d} for d in documents]
    payload: dict[str, Any] = {
        "model": model, "prompt": question, "documents": named,
        "max_tokens": max_tokens, "stream": True, "stream_options": {"include_usage": True},
    }
    if blend:
        payload["blend"] = blend
    outcome = Outcome("")
    start = last = time.perf_counter()
    parts: list[str] = []
    try:
        async with session.post(f"{base_url}/v1/completions", json=payload) as response:
            if response.status != 200:
                outcome.error = f"HTTP {response.status}: {(await response.text())[:300]}"
                return outcome
            handler = StreamedResponseHandler()
            async for raw in response.content.iter_any():
                for message in handler.add_chunk(raw):
                    data = message.removeprefix("data: ")
                    if message.startswith(":") or data == "[DONE]":
                        continue
                    chunk = json.loads(data)
                    if "error" in chunk:
                        outcome.error = json.dumps(chunk["error"])[:300]
                        return outcome
                    outcome.blend = chunk.get("blend") or outcome.blend
                    if usage := chunk.get("usage"):
                        outcome.prompt_tokens = usage["prompt_tokens"]
                        outcome.output_tokens = usage["completion_tokens"]
                    if choices := chunk.get("choices"):
                        now = time.perf_counter()
                        if outcome.ttft_s == 0.0:
                            outcome.ttft_s = now - start
                        else:
                            outcome.itl_s.append(now - last)
                        last = now
                        parts.append(choices[0].get("text") or "")
        outcome.ok = outcome.ttft_s > 0.0
        outcome.error = "" if outcome.ok else "no chunk with a choice arrived"
    except Exception:  # a benchmark records a failed request and goes on
        outcome.error = traceback.format_exc(limit=2)[-300:]
    outcome.text = "".join(parts)
    outcome.latency_s = last - start
    return outcome


async def vllm_completion(
    session: aiohttp.ClientSession, base_url: str, model: str, prompt_ids: list[int], max_tokens: int
) -> Outcome:
    """vLLM's own benchmark request function on the same prompt tokens, greedy."""
    from vllm.benchmarks.lib.endpoint_request_func import RequestFuncInput, async_request_openai_completions

    request = RequestFuncInput(
        prompt=prompt_ids, api_url=f"{base_url}/v1/completions", prompt_len=len(prompt_ids), output_len=max_tokens,
        model=model, extra_body={"temperature": 0.0},
    )
    output = await async_request_openai_completions(request, session)
    return Outcome(
        "", ok=output.success, ttft_s=output.ttft, itl_s=list(output.itl), latency_s=output.latency,
        prompt_tokens=output.prompt_len, output_tokens=output.output_tokens or 0, text=output.generated_text,
        error=output.error[-300:],
    )
