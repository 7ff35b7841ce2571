"""Shadow comparison: a sampled fraction of blended requests also runs in full prefill, off the hot path."""
import logging
import queue
import random
import threading
from dataclasses import dataclass, replace

import torch

from workers.engines.base import BlendRequest, Engine, PrefillStats
from workers.generation.divergence import first_token_kl

REFERENCE_MODE = "full_prefill"

_log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class ShadowSummary:
    """Counters and gauges of the shadow comparison since start (Prometheus-friendly: counters only grow)."""

    requests_seen: int  # counter: blended requests offered to the sampler
    sampled: int  # counter: chosen for a shadow run
    completed: int  # counter: shadow runs compared
    dropped: int  # counter: chosen but the queue was full
    failed: int  # counter: shadow runs that raised
    top1_mismatches: int  # counter: first token differs from full prefill's
    first_token_kl_sum: float  # counter: sum of KL(full || blended) of the first token, in nats
    first_token_kl_max: float  # gauge: the largest KL seen
    last_first_token_kl: float  # gauge: the latest KL

    @property
    def first_token_kl_mean(self) -> float:
        """Mean first-token KL over completed comparisons (0 before any)."""
        return self.first_token_kl_sum / self.completed if self.completed else 0.0

    @property
    def top1_agreement(self) -> float:
        """Share of completed comparisons whose first token matched full prefill's (1 before any)."""
        return 1.0 - self.top1_mismatches / self.completed if self.completed else 1.0


class ShadowSampler:
    """Offer every served request with `observe`; a `fraction` of blended ones is re-run in full prefill on a
    background thread (at most `max_pending` waiting; more are dropped and counted) and compared."""

    def __init__(self, engine: Engine, fraction: float, max_pending: int = 4, seed: int | None = None) -> None:
        if not 0.0 <= fraction <= 1.0:
            raise ValueError(f"fraction must be in [0, 1], got {fraction}")
        if max_pending < 1:
            raise ValueError(f"max_pending must be >= 1, got {max_pending}")
        self.engine = engine
        self.fraction = fraction
        self._rng = random.Random(seed)
        self._queue: queue.Queue[tuple[BlendRequest, torch.Tensor] | None] = queue.Queue(max_pending)
        self._lock = threading.Lock()
        counters = ("requests_seen", "sampled", "completed", "dropped", "failed", "top1_mismatches")
        self._counts = dict.fromkeys(counters, 0)
        self._kl = {"sum": 0.0, "max": 0.0, "last": 0.0}
        self._thread = threading.Thread(target=self._run, name="blendserve-shadow", daemon=True)
        self._thread.start()

    def observe(self, request: BlendRequest, stats: PrefillStats) -> bool:
        """Offer a served request (its stats hold the blended first-token log-probs); whether it was sampled."""
        if stats.mode == REFERENCE_MODE:
            return False
        with self._lock:
            self._counts["requests_seen"] += 1
            if self._rng.random() >= self.fraction:
                return False
            self._counts["sampled"] += 1
        try:
            self._queue.put_nowait((request, stats.first_token_logprobs))
        except queue.Full:
            with self._lock:
                self._counts["dropped"] += 1
            return False
        return True

    def summary(self) -> ShadowSummary:
        """A snapshot of the counters."""
        with self._lock:
            return ShadowSummary(**self._counts, first_token_kl_sum=self._kl["sum"],
                                 first_token_kl_max=self._kl["max"], last_first_token_kl=self._kl["last"])

    def drain(self) -> None:
        """Wait until every queued comparison is done."""
        self._queue.join()

    def close(self) -> None:
        """Finish queued comparisons and stop the thread."""
        self._queue.put(None)
        self._thread.join()

    def _run(self) -> None:
        while (item := self._queue.get()) is not None:
            try:
                self._compare(*item)
            except Exception:  # a failed shadow run must never reach the served request
                _log.exception("blendserve: shadow comparison failed")
                with self._lock:
                    self._counts["failed"] += 1
            finally:
                self._queue.task_done()
        self._queue.task_done()

    def _compare(self, request: BlendRequest, blended: torch.Tensor) -> None:
        shadow = replace(request, mode=REFERENCE_MODE, recompute_ratio=1.0,
                         sampling=replace(request.sampling, max_new_tokens=1))
        reference = self.engine.open(shadow).stats.first_token_logprobs  # prefill only: never iterated
        kl = first_token_kl(reference, blended)
        with self._lock:
            self._counts["completed"] += 1
            self._counts["top1_mismatches"] += int(reference.argmax() != blended.argmax())
            self._kl["sum"] += kl
            self._kl["max"] = max(self._kl["max"], kl)
            self._kl["last"] = kl
