"""Which workers are up: each joins once its model is loaded and heartbeats; silent ones drop out."""
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import ray
from ray.actor import ActorHandle

from kvplane.checks import check, check_positive
from kvplane.ray.namespace import RAY_NAMESPACE

MEMBERSHIP_ACTOR_NAME = "blendserve-membership"


@dataclass(frozen=True, slots=True)
class WorkerReport:
    """What a worker tells with each heartbeat: how it computes, its cache evictions and its quality guardrails."""

    dtype: str = ""  # the concrete compute dtype, e.g. "bfloat16"
    model: str = ""  # the served model's name (its checkpoint folder)
    hardware: str = ""  # e.g. "cpu AVX2, emulated bf16"
    max_context_tokens: int = 0  # the engine's real context limit (prompt plus generated tokens); 0: not said
    evictions: dict[str, int] = field(default_factory=dict)  # tier -> chunks evicted so far
    blending_refused: bool = False  # the canary gate failed: the worker serves full prefill only
    shadow: dict[str, float] = field(default_factory=dict)  # shadow-comparison counters and gauges
    kv: dict[str, dict[str, float]] = field(default_factory=dict)  # tier -> kvplane fault events (kvplane.ray.health)


@dataclass(frozen=True, slots=True)
class Member:
    """One ready worker: its id, the node it runs on, the model it serves and its last report."""

    worker_id: str
    node_id: str
    fingerprint: str
    last_seen_s: float = 0.0
    report: WorkerReport = field(default_factory=WorkerReport)


class Membership:
    """Live workers by id; `now_s` is injectable so expiry is testable without sleeping."""

    def __init__(self, timeout_s: float = 10.0, now_s: Callable[[], float] = time.monotonic) -> None:
        check_positive("timeout_s", timeout_s)
        self._timeout_s = timeout_s
        self._now_s = now_s
        self._members: dict[str, Member] = {}
        self._dtypes: dict[str, str] = {}  # model name -> the dtype `auto` settled on

    def settle_dtype(self, model: str, proposed: str) -> str:
        """The cluster's one compute dtype for `model` under `auto`: what its live workers run, else `proposed`."""
        check(bool(proposed), "proposed", "a concrete dtype name", proposed)
        if model not in self._dtypes:  # a restarted actor learns it again from the workers' heartbeats
            running = [m.report.dtype for m in self.members() if m.report.dtype and m.report.model == model]
            self._dtypes[model] = running[0] if running else proposed
        return self._dtypes[model]

    def heartbeat(self, worker_id: str, node_id: str, fingerprint: str, report: WorkerReport) -> None:
        """A worker is alive (and ready); joining is the first heartbeat."""
        check(bool(worker_id), "worker_id", "a non-empty string", worker_id)
        self._members[worker_id] = Member(worker_id, node_id, fingerprint, self._now_s(), report)

    def leave(self, worker_id: str) -> None:
        """A worker shut down cleanly."""
        self._members.pop(worker_id, None)

    def members(self) -> list[Member]:
        """Workers heard from within the timeout, by id."""
        deadline_s = self._now_s() - self._timeout_s
        self._members = {w: m for w, m in self._members.items() if m.last_seen_s >= deadline_s}
        return sorted(self._members.values(), key=lambda m: m.worker_id)


@ray.remote(num_cpus=0, max_restarts=-1, max_task_retries=-1)
class MembershipActor(Membership):
    """Ray actor shell over Membership, named MEMBERSHIP_ACTOR_NAME; restarted empty if it dies (heartbeats refill)."""


def launch_membership() -> ActorHandle:
    """The cluster's membership actor, started (detached) if it is not running yet."""
    options = {"name": MEMBERSHIP_ACTOR_NAME, "namespace": RAY_NAMESPACE, "get_if_exists": True, "lifetime": "detached"}
    return MembershipActor.options(**options).remote()
