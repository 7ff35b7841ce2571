"""Where a request's time to the first token went: seconds per stage of its path through the worker."""
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

# The stages, in the order a request passes them.
LAYOUT = "layout"  # tokenizing the request under the template (none when the gateway laid it out)
PLAN = "plan"  # the planner's store lookups and its choice
ENGINE_WAIT = "engine_wait"  # waiting for the engine's thread (another request's step or fusion)
PREFIX_PROBE = "prefix_probe"  # asking vLLM's prefix cache how much of a fused context it still holds
LOOKUP = "lookup"  # opening the cached chunks: their headers, from whichever tier holds each
LOAD_WAIT = "load_wait"  # the pass waiting for a layer of chunk KV still being read
FUSION = "fusion"  # the fusion pass's own work (recompute, selection, placing KV)
# The rest: the engine prefills what the fusion left (vLLM: its connector first copies the fused KV into the paged
# cache, layer by layer), samples the first token and streams it.
FIRST_TOKEN = "first_token"
STAGES = (LAYOUT, PLAN, ENGINE_WAIT, PREFIX_PROBE, LOOKUP, LOAD_WAIT, FUSION, FIRST_TOKEN)


@dataclass(slots=True)
class StageClock:
    """Seconds per stage of one request, added as it goes; the rest of its TTFT is FIRST_TOKEN's."""

    seconds: dict[str, float] = field(default_factory=dict)

    def add(self, stage: str, seconds: float) -> None:
        """Count `seconds` more in `stage`."""
        if stage not in STAGES:
            raise ValueError(f"unknown stage {stage!r}; choose from {STAGES}")
        self.seconds[stage] = self.seconds.get(stage, 0.0) + max(seconds, 0.0)

    @contextmanager
    def timed(self, stage: str) -> Iterator[None]:
        """Count the block's wall time in `stage`."""
        began = time.perf_counter()
        try:
            yield
        finally:
            self.add(stage, time.perf_counter() - began)

    def add_fusion(self, total_s: float, lookup_s: float, load_wait_s: float) -> None:
        """A fusion's `total_s`, split into its lookup, its waits for layers and its own work."""
        self.add(LOOKUP, lookup_s)
        self.add(LOAD_WAIT, load_wait_s)
        self.add(FUSION, total_s - lookup_s - load_wait_s)

    def until_first_token(self, ttft_s: float) -> dict[str, float]:
        """Every stage's seconds, FIRST_TOKEN given what the others leave of `ttft_s`."""
        counted = sum(value for stage, value in self.seconds.items() if stage != FIRST_TOKEN)
        return {**self.seconds, FIRST_TOKEN: max(ttft_s - counted, 0.0)}
