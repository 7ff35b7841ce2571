"""A discrete-event model of a blendserve cluster for projecting routing to more nodes than a test machine holds.

Each node runs one worker (its `device` tier) and one KV shard (`ram`); chunks live in the device tier of the
workers that used them and in their home shard (kvplane's rendezvous hashing over the nodes), and an optional
object tier holds every chunk ever written. Routing, admission and eviction are the real code: a
`scheduler` router over `scheduler.placement.worker_locations`, `scheduler.admission.Admission`, and kvplane's
eviction policies. Only the service times are a model (`ServiceModel`), fitted from measured runs: one
fusion at a time per worker (the vLLM engine serialises them), decode overlapping the next fusion.
"""
import heapq
import math
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from types import MappingProxyType

from kvplane.eviction.policy import EvictionPolicy, make_policy
from kvplane.rendezvous import home_shard
from scheduler.admission import Admission, AdmissionConfig, Rejected
from scheduler.placement import worker_locations
from scheduler.scoring import Chunk
from scheduler.simulation.routers import RoutingPolicy
from scheduler.weights import RouterWeights

DEVICE, LOCAL, REMOTE, OBJECT, MISS = "device", "ram", "remote", "object", "miss"
TIERS = (DEVICE, LOCAL, REMOTE, OBJECT)
SHARD_PREFIX = "kvshard-"


@dataclass(frozen=True, slots=True)
class ServiceModel:
    """Seconds of one request on its worker: a fixed part, per computed token, per reused token of each tier."""

    base_s: float
    compute_s_per_token: float
    reuse_s_per_token: Mapping[str, float] = field(default_factory=dict)
    decode_s: float = 0.0  # first token to last: holds a queue slot, and the worker too when serial_decode
    recompute_ratio: float = 0.15  # share of reused tokens the fusion still computes
    serial_decode: bool = False  # the torch engine decodes before it takes the next request; vLLM batches

    def __post_init__(self) -> None:
        for name in ("base_s", "compute_s_per_token", "decode_s"):
            if not getattr(self, name) >= 0:
                raise ValueError(f"{name} must be >= 0, got {getattr(self, name)}")
        if not 0.0 <= self.recompute_ratio <= 1.0:
            raise ValueError(f"recompute_ratio must be in [0, 1], got {self.recompute_ratio}")
        if any(not seconds >= 0 for seconds in self.reuse_s_per_token.values()):
            raise ValueError(f"reuse_s_per_token must be >= 0 per tier, got {dict(self.reuse_s_per_token)}")
        object.__setattr__(self, "reuse_s_per_token", MappingProxyType(dict(self.reuse_s_per_token)))

    def fusion_s(self, num_computed_tokens: int, reused_tokens: Mapping[str, int]) -> float:
        """Seconds to the first token of a request that computes and reuses these many tokens."""
        loads = sum(self.reuse_s_per_token.get(tier, 0.0) * n for tier, n in reused_tokens.items())
        return self.base_s + self.compute_s_per_token * num_computed_tokens + loads


@dataclass(frozen=True, slots=True)
class ClusterShape:
    """Nodes (one worker and one shard each) and the bytes each tier holds."""

    num_nodes: int
    device_bytes: int
    shard_bytes: int
    object_tier: bool = True
    policy: str = "tinylfu"

    def __post_init__(self) -> None:
        if self.num_nodes < 1:
            raise ValueError(f"num_nodes must be >= 1, got {self.num_nodes}")
        if self.device_bytes < 0 or self.shard_bytes < 0:
            raise ValueError("device_bytes and shard_bytes must be >= 0")


@dataclass(frozen=True, slots=True)
class SimRequest:
    """One request: when it arrives, its chunks (key, tokens) in prompt order, and its other prompt tokens."""

    arrival_s: float
    chunks: tuple[tuple[str, int], ...]
    num_other_tokens: int = 0


@dataclass(slots=True)
class SimOutcome:
    """What the model says happened to one request."""

    worker: str
    ttft_s: float
    tokens: dict[str, int]  # per tier of TIERS, and MISS for chunk tokens computed


@dataclass(slots=True)
class SimResult:
    """Per-request outcomes and the requests admission refused."""

    outcomes: list[SimOutcome]
    num_rejected: int
    bytes_per_token: int

    def hit_rates(self) -> dict[str, float]:
        """Share of chunk tokens served from each tier (and missed)."""
        totals: Counter[str] = Counter()
        for outcome in self.outcomes:
            totals.update(outcome.tokens)
        chunk_tokens = sum(totals.values())
        return {tier: round(totals[tier] / chunk_tokens, 4) if chunk_tokens else 0.0 for tier in (*TIERS, MISS)}

    def ttft_quantile(self, q: float) -> float:
        """The q-quantile of TTFT (nearest rank)."""
        values = sorted(o.ttft_s for o in self.outcomes)
        if not values:
            return math.nan
        return values[min(len(values) - 1, max(0, math.ceil(q * len(values)) - 1))]

    def remote_bytes(self) -> int:
        """Chunk bytes read from a shard on another node."""
        return sum(o.tokens.get(REMOTE, 0) for o in self.outcomes) * self.bytes_per_token


class _Node:
    """One node's caches: the worker's device tier and the shard's ram tier, as eviction policies only."""

    def __init__(self, name: str, shape: ClusterShape) -> None:
        self.worker = f"worker-{name}"
        self.shard = f"{SHARD_PREFIX}{name}"
        self.device: EvictionPolicy = make_policy(shape.policy, shape.device_bytes)
        self.ram: EvictionPolicy = make_policy(shape.policy, shape.shard_bytes)
        self.free_at_s = 0.0


def _place(policy: EvictionPolicy, key: str, num_bytes: int) -> list[str]:
    """Offer `key` to a tier; the keys it evicted (not the key itself when it was refused)."""
    if num_bytes == 0 or policy.contains(key):
        return []
    return [victim for victim in policy.admit(key, num_bytes, 1.0) if victim != key]


class ClusterModel:
    """The cluster's cache state and queues; `run` plays requests in arrival order."""

    def __init__(self, shape: ClusterShape, router: RoutingPolicy, service: ServiceModel, bytes_per_token: int,
                 admission: AdmissionConfig | None = None, weights: RouterWeights | None = None) -> None:
        if bytes_per_token < 1:
            raise ValueError(f"bytes_per_token must be >= 1, got {bytes_per_token}")
        self.shape, self.router, self.service, self.bytes_per_token = shape, router, service, bytes_per_token
        self.weights = weights or RouterWeights()
        self.admission = Admission(admission)
        self.nodes = {f"n{i:03d}": _Node(f"n{i:03d}", shape) for i in range(shape.num_nodes)}
        self.by_worker = {node.worker: node for node in self.nodes.values()}
        self.objects: set[str] = set()
        self._tokens: dict[str, int] = {}  # chunk key -> its tokens, as requests name them
        self._in_flight: dict[str, int] = Counter()

    def run(self, requests: Sequence[SimRequest]) -> SimResult:
        """Route, admit and serve each request; write-backs and finishes land at their time, not before."""
        pending: list[tuple[float, int, Callable[[], None]]] = []
        outcomes, rejected = [], 0
        for sequence, request in enumerate(sorted(requests, key=lambda r: r.arrival_s)):
            while pending and pending[0][0] <= request.arrival_s:
                heapq.heappop(pending)[2]()
            outcome = self._serve(request, pending, sequence)
            if outcome is None:
                rejected += 1
            else:
                outcomes.append(outcome)
        return SimResult(outcomes, rejected, self.bytes_per_token)

    def _serve(self, request: SimRequest, pending: list, sequence: int) -> SimOutcome | None:
        chunks = [Chunk(key, tokens * self.bytes_per_token) for key, tokens in request.chunks]
        loads = {w: self.admission.load(w, self._in_flight[w]) for w in self.by_worker}
        route = self.router.route(chunks, self._locations([c.key for c in chunks]), loads)
        if isinstance(self.admission.try_admit(route.worker_id), Rejected):
            return None
        node = self.by_worker[route.worker_id]
        self._tokens.update(request.chunks)
        tokens: Counter[str] = Counter()
        for key, num_tokens in dict(request.chunks).items():
            tokens[self._reach(node, key)] += num_tokens
        reused = {tier: n for tier, n in tokens.items() if tier != MISS}
        computed = request.num_other_tokens + tokens[MISS] + round(self.service.recompute_ratio * sum(reused.values()))
        start_s = max(request.arrival_s, node.free_at_s)
        first_token_s = start_s + self.service.fusion_s(computed, reused)
        finish_s = first_token_s + self.service.decode_s
        node.free_at_s = finish_s if self.service.serial_decode else first_token_s
        cost = sum(n for _, n in request.chunks) + request.num_other_tokens
        self._in_flight[node.worker] += cost
        heapq.heappush(pending, (first_token_s, 2 * sequence, lambda: self._write_back(node, request.chunks)))
        heapq.heappush(pending, (finish_s, 2 * sequence + 1,
                                 lambda: self._finish(node.worker, cost, finish_s - request.arrival_s)))
        return SimOutcome(node.worker, first_token_s - request.arrival_s, dict(tokens))

    def _reach(self, node: _Node, key: str) -> str:
        """The fastest tier `node`'s worker reads `key` from (promoting it into its device tier), or MISS."""
        home = self.nodes[self._home(key)]
        if node.device.contains(key):
            node.device.touch(key)
            return DEVICE
        if home.ram.contains(key):
            home.ram.touch(key)
            tier = LOCAL if home is node else REMOTE
        elif self.shape.object_tier and key in self.objects:
            tier = OBJECT
        else:
            return MISS
        self._into_device(node, key)
        return tier

    def _write_back(self, node: _Node, chunks: Sequence[tuple[str, int]]) -> None:
        """A request's chunks go to its worker's device tier, their home shard and the object tier."""
        for key, num_tokens in chunks:
            self._into_device(node, key)
            _place(self.nodes[self._home(key)].ram, key, num_tokens * self.bytes_per_token)
            if self.shape.object_tier:
                self.objects.add(key)

    def _into_device(self, node: _Node, key: str) -> None:
        for victim in _place(node.device, key, self._tokens[key] * self.bytes_per_token):
            # An entry evicted from the device tier is moved down to its home shard if that lost it.
            _place(self.nodes[self._home(victim)].ram, victim, self._tokens[victim] * self.bytes_per_token)

    def _finish(self, worker: str, cost: int, service_s: float) -> None:
        self.admission.finish(worker, service_s)
        self._in_flight[worker] -= cost

    def _home(self, key: str) -> str:
        return home_shard(key, self.nodes) or ""

    def _locations(self, keys: Sequence[str]) -> dict[str, dict[str, str]]:
        """What the location index would answer, turned into worker reach by the real placement code."""
        copies: dict[str, list[tuple[str, str]]] = {}
        for key in keys:
            holders = [(n.worker, DEVICE) for n in self.nodes.values() if n.device.contains(key)]
            home = self.nodes[self._home(key)]
            if home.ram.contains(key):
                holders.append((home.shard, LOCAL))
            copies[key] = holders
        worker_nodes = {node.worker: name for name, node in self.nodes.items()}
        shard_nodes = {node.shard: name for name, node in self.nodes.items()}
        return worker_locations(copies, worker_nodes, shard_nodes, self.weights)


def simulate(
    requests: Sequence[SimRequest], shape: ClusterShape, router: RoutingPolicy, service: ServiceModel,
    bytes_per_token: int, admission: AdmissionConfig | None = None, weights: RouterWeights | None = None,
) -> SimResult:
    """Play `requests` on a fresh cluster of `shape` routed by `router`."""
    return ClusterModel(shape, router, service, bytes_per_token, admission, weights).run(requests)
